"""``build --all-variants``: build every variant of ltx_build/variants.toml
into build/, each in its own virtual environment filled from the package
indexes pip is configured with.

Per variant: the CUDA toolkit first (the host's, or pip wheels merged into a
toolkit directory; cheap, so a toolkit that cannot work fails before torch is
downloaded), then the environment (_build/venvs/<label>/: torch and what the
builder's checks import), then ``python -m ltx_build build`` inside it, which
compiles, ABI-checks and loads the variant through `kernels` as a plain build
does. A variant whose torch is the one running here is built with this Python,
no environment needed. Each step's output goes to _build/variants/<label>.log;
the summary (time and .so size per variant) to _build/variants/report.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import venv
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from . import BuildError
from .toolchain import is_toolkit

MATRIX = Path(__file__).with_name("variants.toml")
# What `python -m ltx_build build` imports besides torch (its checks load the
# variant through kernels and run kernel-abi-check); pinned in tools/pyproject.toml.
BUILDER_PACKAGES = ("kernels", "kernel-abi-check")


@dataclass(frozen=True)
class VariantSpec:
    label: str
    torch: str
    expect: str
    cuda_toolkit: str | tuple[str, ...] = "host"
    index_url: str | None = None


@dataclass
class VariantResult:
    label: str
    expect: str
    ok: bool = False
    variant: str = ""
    environment: str = ""  # "host python" or the venv path
    cuda_home: str = ""
    setup_seconds: float = 0.0  # toolkit + environment
    build_seconds: float = 0.0  # compile, ABI check, load check
    so_name: str = ""
    so_bytes: int = 0
    error: str = ""
    log: str = ""


def load_matrix(path: Path = MATRIX) -> list[VariantSpec]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise BuildError(f"cannot read the variant matrix {path}: {e}") from None
    specs, errors = [], []
    for i, entry in enumerate(data.get("variant", [])):
        where = f"{path.name} [[variant]] #{i + 1}"
        unknown = set(entry) - {"label", "torch", "expect", "cuda-toolkit", "index-url"}
        errors += [f"{where}: unknown key '{k}'" for k in sorted(unknown)]
        missing = [k for k in ("label", "torch", "expect") if not isinstance(entry.get(k), str)]
        errors += [f"{where}: '{k}' (a string) is required" for k in missing]
        toolkit = entry.get("cuda-toolkit", "host")
        if not (toolkit == "host" or (isinstance(toolkit, list) and toolkit and all(isinstance(t, str) for t in toolkit))):
            errors.append(f"{where}: cuda-toolkit must be \"host\" or a list of pip requirements")
        if missing or unknown:
            continue
        specs.append(VariantSpec(entry["label"], entry["torch"], entry["expect"],
                                 toolkit if toolkit == "host" else tuple(toolkit), entry.get("index-url")))
    labels = [s.label for s in specs]
    errors += [f"{path.name}: label '{l}' is used twice" for l in sorted({l for l in labels if labels.count(l) > 1})]
    if errors:
        raise BuildError("variant matrix:\n  " + "\n  ".join(errors))
    if not specs:
        raise BuildError(f"{path} lists no [[variant]]")
    return specs


TOOLS_PYPROJECT = "tools/pyproject.toml"  # the tools package (ltx_build, ltx_dev); not at the root, where
# kernel-builder's create-pyproject writes its own pyproject.toml during a Nix build


def builder_requirements(root: Path) -> list[str]:
    """The pins of BUILDER_PACKAGES in tools/pyproject.toml's dependencies (unpinned when absent)."""
    try:
        project = tomllib.loads((root / TOOLS_PYPROJECT).read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    listed = [*project.get("dependencies", []), *(r for extra in project.get("optional-dependencies", {}).values()
                                                  for r in extra)]
    pins = {re.split(r"[=<>!~\[; ]", r.strip(), maxsplit=1)[0].lower(): r.strip() for r in listed}
    return [pins.get(p, p) for p in BUILDER_PACKAGES]


Runner = Callable[[list[str], dict[str, str], Path], None]


def run_logged(cmd: list[str], env: dict[str, str], log: Path) -> None:
    """Run ``cmd``, appending its output to ``log``; a failure names the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise BuildError(f"`{' '.join(cmd[:4])} ...` failed (exit {proc.returncode}); end of {log}:\n{tail}")


def host_torch() -> tuple[str, str | None]:
    import torch

    return torch.__version__.split("+")[0], torch.version.cuda


def assemble_toolkit(spec: VariantSpec, root: Path, run: Runner, log: Path) -> Path:
    """pip-install the spec's toolkit wheels and merge their ``nvidia/<component>/``
    trees into one CUDA_HOME layout (bin/, include/, lib64/, nvvm/)."""
    base = root / "_build" / "toolkits" / spec.label
    wheels, home = base / "wheels", base / "cuda"
    shutil.rmtree(base, ignore_errors=True)
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(wheels), *spec.cuda_toolkit],
        dict(os.environ), log)
    components = sorted(p for p in (wheels / "nvidia").iterdir() if p.is_dir()) if (wheels / "nvidia").is_dir() else []
    for component in components:
        for sub in ("bin", "include", "lib", "nvvm"):
            if (component / sub).is_dir():
                shutil.copytree(component / sub, home / sub, dirs_exist_ok=True, copy_function=_link_or_copy,
                                ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    if (home / "lib").is_dir():
        (home / "lib64").symlink_to("lib")
        for versioned in (home / "lib").glob("lib*.so.*"):  # the linker wants libcudart.so
            plain = versioned.with_name(versioned.name.split(".so.")[0] + ".so")
            if not plain.exists():
                plain.symlink_to(versioned.name)
    if not is_toolkit(home):
        has = sorted(p.name for p in (home / "bin").iterdir()) if (home / "bin").is_dir() else []
        raise BuildError(
            f"the wheels {', '.join(spec.cuda_toolkit)} do not make a CUDA toolkit: {home} has no bin/nvcc"
            f"{'' if (home / 'include' / 'cuda_runtime.h').is_file() else ' and no include/cuda_runtime.h'} "
            f"(bin/ holds: {', '.join(has) or 'nothing'}). These wheels ship ptxas and libnvvm for JIT "
            f"compilers, not nvcc. Name a CUDA toolkit installed another way: --cuda-home {spec.label}=<dir>")
    return home


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def ensure_venv(spec: VariantSpec, root: Path, run: Runner, log: Path) -> Path:
    """The variant's environment with torch==spec.torch and the builder's packages."""
    env_dir = root / "_build" / "venvs" / spec.label
    python = env_dir / "bin" / "python"
    if not python.is_file():
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    index = ["--extra-index-url", spec.index_url] if spec.index_url else []
    run([*pip, *index, f"torch=={spec.torch}", *builder_requirements(root)], dict(os.environ), log)
    return python


def _build_env(root: Path, cuda_home: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)  # ltx_build
    if cuda_home is not None:
        env["CUDA_HOME"] = str(cuda_home)
        env["PATH"] = f"{cuda_home / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def build_variant(spec: VariantSpec, root: Path, *, run: Runner = run_logged, jobs: int | None = None,
                  allow_newer_glibc: bool = False, cuda_home: Path | None = None,
                  host: tuple[str, str | None] | None = None) -> VariantResult:
    log = root / "_build" / "variants" / f"{spec.label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"variant {spec.label}: torch {spec.torch}, expect {spec.expect}\n")
    result = VariantResult(spec.label, spec.expect, log=str(log))
    host = host or host_torch()
    start = time.monotonic()
    try:
        if cuda_home is None and spec.cuda_toolkit != "host":
            cuda_home = assemble_toolkit(spec, root, run, log)
        result.cuda_home = str(cuda_home or "host")
        if host[0] == spec.torch and host[1] is not None:
            python, result.environment = Path(sys.executable), "host python"
        else:
            python = ensure_venv(spec, root, run, log)
            result.environment = str(python.parent.parent)
        result.setup_seconds = time.monotonic() - start
        start = time.monotonic()
        cmd = [str(python), "-m", "ltx_build", "build", "--root", str(root)]
        cmd += (["-j", str(jobs)] if jobs else []) + (["--allow-newer-glibc"] if allow_newer_glibc else [])
        run(cmd, _build_env(root, cuda_home), log)
        result.build_seconds = time.monotonic() - start
        wrote = re.findall(r"ltx_build: wrote (?:\S*/)?build/(\S+) ", log.read_text())
        result.variant = wrote[-1] if wrote else ""
        if result.variant != spec.expect:
            raise BuildError(f"expected build/{spec.expect}, the build wrote build/{result.variant or '?'}")
        libraries = sorted((root / "build" / result.variant).glob("*.so"))
        if libraries:
            result.so_name, result.so_bytes = libraries[0].name, libraries[0].stat().st_size
        result.ok = True
    except BuildError as e:
        result.error = str(e)
        if not result.setup_seconds:
            result.setup_seconds = time.monotonic() - start
        elif not result.build_seconds:
            result.build_seconds = time.monotonic() - start
    return result


def report(results: list[VariantResult]) -> str:
    lines = ["| variant | environment | CUDA toolkit | setup | build + checks | .so size | result |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        size = f"{r.so_bytes / 2**20:.1f} MiB" if r.so_bytes else "–"
        verdict = "built, ABI check and load passed" if r.ok else "failed: " + r.error.splitlines()[0][:160]
        lines.append(f"| {r.variant or r.expect} | {r.environment or '–'} | {r.cuda_home or '–'} | "
                     f"{r.setup_seconds:.0f} s | {r.build_seconds:.0f} s | {size} | {verdict} |")
    return "\n".join(lines)


def build_all(root: Path, specs: list[VariantSpec], *, cuda_homes: dict[str, Path] | None = None,
              **kwargs) -> list[VariantResult]:
    cuda_homes = cuda_homes or {}
    unknown = set(cuda_homes) - {s.label for s in specs}
    if unknown:
        raise BuildError(f"--cuda-home names unknown variant label(s): {', '.join(sorted(unknown))}")
    results = []
    for spec in specs:
        print(f"ltx_build: variant {spec.label} (torch {spec.torch}) ...", flush=True)
        r = build_variant(spec, root, cuda_home=cuda_homes.get(spec.label), **kwargs)
        print(f"ltx_build: {spec.label}: " + (f"built {r.variant} ({r.so_bytes / 2**20:.1f} MiB) in "
                                              f"{r.build_seconds:.0f} s" if r.ok else f"FAILED: {r.error}"),
              flush=True)
        results.append(r)
    out = root / "_build" / "variants" / "report.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return results
