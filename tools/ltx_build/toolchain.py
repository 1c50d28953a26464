"""Find the CUDA toolkit and host compiler, and refuse mismatches early with
a message that names the fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import BuildError


@dataclass(frozen=True)
class Toolchain:
    cuda_home: Path
    nvcc: Path
    nvcc_version: str  # "13.0": the release, whose major must be torch's
    cxx: str
    cxx_version: str
    nvcc_build: str = ""  # "V13.0.88": down to the patch level, for the rebuild key

    @property
    def fingerprint(self) -> str:
        return f"nvcc {self.nvcc_build or self.nvcc_version} @ {self.nvcc}\nc++ {self.cxx_version} @ {self.cxx}"


def is_toolkit(path: Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda_runtime.h").is_file()


def nvcc_release(nvcc: Path) -> tuple[str, str]:
    """("13.0", "V13.0.88") from `nvcc --version`."""
    try:
        out = subprocess.run([str(nvcc), "--version"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"{nvcc} --version failed ({e}); reinstall the CUDA toolkit or set CUDA_HOME") from None
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise BuildError(f"cannot read the CUDA release from `{nvcc} --version`:\n{out}")
    build = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    return m.group(1), build.group(0) if build else out.strip()


def find_cuda_home(env: dict[str, str] | None = None) -> Path:
    """CUDA_HOME (or CUDA_PATH) when set, else the toolkit of the nvcc on PATH,
    else /usr/local/cuda. A set-but-wrong CUDA_HOME is an error, not a hint."""
    env = os.environ if env is None else env
    fallback = Path("/usr/local/cuda")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            home = Path(env[var])
            if is_toolkit(home):
                return home
            hint = (f"a toolkit was found at {fallback}: `export {var}={fallback}`" if is_toolkit(fallback)
                    else "point it at the directory that holds bin/nvcc and include/cuda_runtime.h")
            raise BuildError(f"{var}={home} is not a CUDA toolkit (no bin/nvcc or include/cuda_runtime.h); {hint}")
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    candidates = []
    if on_path:
        # nvcc on PATH may be a wrapper script (here /usr/local/bin/nvcc, which
        # makes torch guess CUDA_HOME=/usr/local): try its parent and its target.
        candidates += [Path(on_path).parent.parent, Path(os.path.realpath(on_path)).parent.parent]
    candidates.append(fallback)
    for c in candidates:
        if is_toolkit(c):
            return c
    raise BuildError(
        "nvcc not found: install the CUDA toolkit matching torch.version.cuda and either put its bin/ on PATH "
        "or set CUDA_HOME (e.g. `export CUDA_HOME=/usr/local/cuda`)"
    )


def detect(torch_cuda: str, env: dict[str, str] | None = None) -> Toolchain:
    """Check nvcc's CUDA major equals torch's and a C++ compiler exists."""
    env = os.environ if env is None else env
    home = find_cuda_home(env)
    nvcc = home / "bin" / "nvcc"
    release, build = nvcc_release(nvcc)
    if release.split(".")[0] != torch_cuda.split(".")[0]:
        raise BuildError(
            f"nvcc at {nvcc} is CUDA {release} but torch was built with CUDA {torch_cuda}: the majors must match. "
            f"Set CUDA_HOME to a CUDA {torch_cuda.split('.')[0]}.x toolkit, or install a torch built for CUDA "
            f"{release.split('.')[0]}"
        )
    cxx = env.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise BuildError("no C++ compiler found: install g++ (e.g. `apt-get install g++`) or set CXX")
    cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return Toolchain(cuda_home=home, nvcc=nvcc, nvcc_version=release, cxx=cxx, cxx_version=cxx_version,
                     nvcc_build=build)


def shared_libstdcxx_args(cxx: str) -> list[str]:
    """Link arguments that make the binding use the shared libstdc++.

    When the compiler's libstdc++.so development link is missing (seen with
    g++ 13 on Ubuntu 24.04 images that only ship libstdc++.a for it), g++
    links libstdc++ statically and the extension carries a second copy of the
    C++ runtime next to the one torch uses; two copies keep separate locale
    registries (README, "Known issues"). Naming the runtime's libstdc++.so.6
    first makes the linker take every C++ runtime symbol from it, so the
    implicit static -lstdc++ contributes nothing.
    """
    found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
    if found and Path(found).is_file():
        return []
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which(
        "ldconfig") else ""
    candidates = re.findall(r"libstdc\+\+\.so\.6 \(libc6,x86-64\) => (\S+)", ldconfig)
    candidates += [p for p in ("/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib64/libstdc++.so.6")]
    for c in candidates:
        if Path(c).is_file():
            return [c]
    return []
