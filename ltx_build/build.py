"""Build the variant for the installed torch into build/<variant>/."""

from __future__ import annotations

import os
import shlex
import re
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from . import BuildError, checks, config, layout, toolchain, variant
from .compile import Runner, Step, local_headers

CUDA_STD = "-std=c++17"
CXX_STD = "-std=c++20"  # what torch's own extension builder uses for its headers
BACKEND = "cuda"


def gencode_flags(capabilities: list[str]) -> list[str]:
    """nvcc -gencode flags for build.toml capabilities ("9.0", "9.0a", "9.0+PTX")."""
    flags = []
    for cap in capabilities:
        ptx = cap.endswith("+PTX")
        base = cap.removesuffix("+PTX")
        num = base.replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


@dataclass
class BuildResult:
    variant: str
    ops_name: str
    variant_dir: Path
    so_path: Path
    rebuilt: list[str]
    files: list[str]
    seconds: float


def build(root: Path, jobs: int | None = None, verbose: bool = False, build_dir: Path | None = None) -> BuildResult:
    start = time.monotonic()
    root = Path(root).resolve()
    cfg = config.load(root)
    errors = config.source_errors(cfg)
    if errors:
        raise BuildError("build.toml sources:\n  " + "\n  ".join(errors))
    try:
        import torch
    except ImportError:
        raise BuildError("torch is not installed in this Python: `pip install torch` (a CUDA build) first") from None
    var = variant.current_variant()
    tc = toolchain.detect(torch.version.cuda)
    ops_name = variant.ops_namespace(cfg.python_name, BACKEND, variant.unique_id(root))
    print(f"ltx_build: variant {var}, ops {ops_name}, nvcc {tc.nvcc_version} ({tc.cuda_home}), "
          f"capabilities {', '.join(cfg.capabilities)}", flush=True)

    # Generated sources (kernel-builder writes these into torch-ext/ too; both are git-ignored).
    layout.write_if_changed(root / "torch-ext" / "registration.h", layout.REGISTRATION_H)
    layout.write_if_changed(root / "torch-ext" / cfg.python_name / "_ops.py", layout.ops_py(ops_name))

    obj_dir = root / "_build" / var
    torch_dir = Path(torch.__file__).parent
    kernel_steps: list[Step] = []
    for k in cfg.kernels:
        if k.backend != BACKEND:
            continue
        inc = [root / i for i in k.include]
        for src in (s for s in k.src if s.endswith(".cu")):
            source = root / src
            out = obj_dir / (src.replace("/", "__") + ".o")
            cmd = [str(tc.nvcc), CUDA_STD, "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fno-gnu-unique",
                   "-DCUDA_KERNEL", "-DUSE_CUDA=1", *gencode_flags(list(k.capabilities)), *k.cuda_flags,
                   *(f"-I{i}" for i in inc), "-c", str(source), "-o", str(out)]
            kernel_steps.append(Step(f"nvcc {src}", out, cmd, [source, *local_headers(source, inc)]))

    py_include = sysconfig.get_paths()["include"]
    abi = "1" if torch.compiled_with_cxx11_abi() else "0"
    binding_steps: list[Step] = []
    for src in (s for s in cfg.torch_src if s.endswith(".cpp")):
        source = root / src
        out = obj_dir / (src.replace("/", "__") + f".{ops_name}.o")
        inc = [root / "torch-ext", *(root / i for i in cfg.torch_include)]
        cmd = [tc.cxx, CXX_STD, "-O2", "-fPIC", "-fno-gnu-unique", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               "-DPy_LIMITED_API=0x03090000", f"-DTORCH_EXTENSION_NAME={ops_name}", "-DCUDA_KERNEL",
               "-DUSE_CUDA=1", f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include/torch/csrc/api/include'}",
               f"-I{tc.cuda_home / 'include'}", f"-I{py_include}", *(f"-I{i}" for i in inc),
               *cfg.torch_cxx_flags, *shlex.split(os.environ.get("CXXFLAGS", "")), "-c", str(source), "-o", str(out)]
        binding_steps.append(Step(f"c++ {src}", out, cmd, [source, *local_headers(source, inc)]))

    so_path = obj_dir / f"{ops_name}.abi3.so"
    objects = [s.output for s in kernel_steps + binding_steps]
    link_cmd = [tc.cxx, "-shared", "-o", str(so_path), *map(str, objects),
                *toolchain.shared_libstdcxx_args(tc.cxx), f"-L{torch_dir / 'lib'}", "-lc10",
                "-lc10_cuda", "-ltorch", "-ltorch_cpu", f"-L{tc.cuda_home / 'lib64'}", "-lcudart",
                *shlex.split(os.environ.get("LDFLAGS", ""))]
    link = Step(f"link {so_path.name}", so_path, link_cmd, objects)

    runner = Runner(tc.fingerprint, jobs or os.cpu_count() or 1, len(kernel_steps) + len(binding_steps) + 1, verbose)
    runner.run_parallel(kernel_steps + binding_steps)
    runner.run_one(link)
    # Drop the outputs of older namespaces: `<ns>.abi3.so` and the binding
    # objects `<src>.<ns>.o` (and their stamps). The namespace is matched
    # whole, so `<id>` and `<id>_dirty` are different namespaces.
    ns_output = re.compile(rf"^(?:.*\.)?(_{re.escape(cfg.python_name)}_{BACKEND}_[a-z0-9]{{7}}(?:_dirty)?)"
                           r"\.(?:abi3\.so|o)(?:\.sha256)?$")
    for stale in obj_dir.iterdir():
        m = ns_output.match(stale.name)
        if m and m.group(1) != ops_name and stale.is_file():
            stale.unlink()

    meta = layout.metadata(cfg, ops_name, cfg.capabilities)
    variant_dir = (build_dir or root / "build") / var
    files = layout.install_variant(cfg, variant_dir, so_path, ops_name, meta)
    print(f"ltx_build: wrote {variant_dir.relative_to(root) if variant_dir.is_relative_to(root) else variant_dir} "
          f"({', '.join(files)})", flush=True)
    return BuildResult(var, ops_name, variant_dir, variant_dir / so_path.name, runner.rebuilt, files,
                       time.monotonic() - start)


def check(root: Path, result: BuildResult, allow_newer_glibc: bool = False) -> None:
    """ABI check, then load through kernels both ways; raises on any failure.

    `allow_newer_glibc` turns manylinux_2_28 violations into warnings (a local
    build on a host whose glibc headers are newer than 2.28); abi3 violations
    always fail."""
    cfg = config.load(root)
    manylinux, abi3 = checks.abi_violations(result.so_path)
    if manylinux and allow_newer_glibc:
        print(f"ltx_build: warning: {result.so_path.name} needs a newer glibc than {checks.MANYLINUX} "
              "(--allow-newer-glibc; fine locally, not for publishing):\n  " + "\n  ".join(manylinux), flush=True)
        manylinux = []
    violations = manylinux + abi3
    if violations:
        raise BuildError(f"ABI check of {result.so_path.name} failed ({checks.MANYLINUX}, abi3 >= "
                         f"{checks.PYTHON_ABI}):\n  " + "\n  ".join(violations)
                         + ("\nOn a host with glibc > 2.28, pass --allow-newer-glibc for a local-only build "
                            "(README, ABI exceptions)." if manylinux else ""))
    print(f"ltx_build: ABI check passed ({'abi3 only' if allow_newer_glibc else checks.MANYLINUX + ', abi3'} "
          f">= {checks.PYTHON_ABI}): {result.so_path.name}", flush=True)
    name = checks.load_local(root)
    print(f"ltx_build: kernels.get_local_kernel loaded {name}", flush=True)
    name = checks.load_hub(root, cfg.repo_id, cfg.version)
    print(f"ltx_build: kernels.get_kernel('{cfg.repo_id}', version={cfg.version}) loaded {name} "
          "through LOCAL_KERNELS (offline)", flush=True)
