"""Compile on first use, for ``import ltx_kernels`` from the source tree.

A built variant (``build/<variant>/``, the Hub) ships its compiled library
beside a generated ``_ops.py``. The source tree (``torch-ext/ltx_kernels/``)
has no library, so ``__init__.py`` falls back to :func:`install_ops_module`,
which compiles ``build.toml``'s sources once into a cache and loads the result
with ``torch.ops.load_library``. This module uses only the standard library
and torch, like the rest of the package, and is inert in a built variant.

Cache: ``{cache}/ltx_kernels/ltx_kernels.so`` and ``ltx_kernels.sha256``.
``{cache}`` is ``LTX_KERNELS_CACHE_DIR``, else ``TORCH_EXTENSIONS_DIR``, else
``~/.cache/torch_extensions/py{major}{minor}{abiflags}_cu{version}/`` (torch's
own JIT directory, ``XDG_CACHE_HOME`` honoured as torch does). The
``.sha256`` file holds the build key (SHA-256 over every source, the full
compile and link commands and the toolchain's versions) and the ``.so``'s own
SHA-256 in ``sha256sum`` format, so ``sha256sum -c ltx_kernels.sha256`` checks
it by hand. A library whose key differs is rebuilt; one whose checksum differs
(truncated, modified) is rebuilt too. A file lock serialises builders, and the
library is replaced by an atomic rename, so concurrent processes neither
compile twice nor see a half-written file.

``LTX_KERNELS_NO_COMPILE=1`` turns compilation off: a valid cached library
still loads, anything else is an ImportError that says what to run.
``RUNWARE_LTX_TORCH_COMPILE_DIR`` and ``RUNWARE_LTX_NO_COMPILE_KERNELS`` are
the older names of the two variables and are honoured as aliases.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional

KERNEL = "ltx_kernels"
OPS_NAMESPACE = "_ltx_kernels_cuda_jit"
# Bumped when the recipe below changes in a way the commands do not show.
RECIPE_VERSION = "1"

CACHE_DIR_VARS = ("LTX_KERNELS_CACHE_DIR", "RUNWARE_LTX_TORCH_COMPILE_DIR")
NO_COMPILE_VARS = ("LTX_KERNELS_NO_COMPILE", "RUNWARE_LTX_NO_COMPILE_KERNELS")
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")
HEADER_SUFFIXES = (".cuh", ".h", ".hpp")

# The binding includes "registration.h", which ltx_build generates next to it.
# A fresh checkout has none, so the JIT build supplies one. The library is
# loaded with dlopen (torch.ops.load_library), never imported as a Python
# module, so REGISTER_EXTENSION has nothing to define.
JIT_REGISTRATION_H = """\
// Written by ltx_kernels._jit for a compile-on-first-use build.
#pragma once
#include <torch/library.h>
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)
#define REGISTER_EXTENSION(NAME)
"""


class KernelNotCompiledError(ImportError):
    """Compilation is off and the cache holds no valid library."""


class CompileError(ImportError):
    """The toolchain is missing or a compile step failed."""


# --------------------------------------------------------------------------- environment


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> Optional[str]:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def compile_disabled(env: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if env is None else env
    value = _first_set(env, NO_COMPILE_VARS)
    return value is not None and value.strip().lower() not in ("0", "false", "no", "off", "")


def cache_root(env: Optional[Mapping[str, str]] = None, torch_cuda: Optional[str] = None) -> Path:
    """The directory that holds ``{KERNEL}/``, chosen as the module docstring says."""
    env = os.environ if env is None else env
    explicit = _first_set(env, CACHE_DIR_VARS) or env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    if torch_cuda is None:
        import torch

        torch_cuda = torch.version.cuda
    accelerator = f"cu{torch_cuda.replace('.', '')}" if torch_cuda else "cpu"
    base = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return base / "torch_extensions" / f"{python}_{accelerator}"


def find_source_root(package_dir: Path) -> Optional[Path]:
    """The repository root when ``package_dir`` is ``<root>/torch-ext/<pkg>``, else None."""
    package_dir = Path(package_dir).resolve()
    root = package_dir.parent.parent
    if package_dir.parent.name == "torch-ext" and (root / "build.toml").is_file():
        return root
    return None


# --------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    cuda_home: Path
    nvcc: Path
    cxx: str
    description: tuple[str, ...]  # version lines; part of the key


def _is_toolkit(path: Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda_runtime.h").is_file()


def find_toolchain(env: Optional[Mapping[str, str]] = None) -> Toolchain:
    env = os.environ if env is None else env
    candidates = [Path(env[v]) for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        # nvcc on PATH can be a wrapper script outside the toolkit (/usr/local/bin/nvcc).
        candidates += [Path(on_path).parent.parent, Path(os.path.realpath(on_path)).parent.parent]
    candidates.append(Path("/usr/local/cuda"))
    home = next((c for c in candidates if _is_toolkit(c)), None)
    if home is None:
        raise CompileError(
            "ltx_kernels: cannot compile on first use: no CUDA toolkit found (looked for bin/nvcc and "
            f"include/cuda_runtime.h in {', '.join(map(str, candidates))}). Set CUDA_HOME to the toolkit of "
            "torch's CUDA major, or build a variant with `python3 -m ltx_build build` and load it through kernels")
    cxx = env.get("CXX") or shutil.which("c++", path=env.get("PATH")) or shutil.which("g++", path=env.get("PATH"))
    if not cxx:
        raise CompileError("ltx_kernels: cannot compile on first use: no C++ compiler (install g++ or set CXX)")
    nvcc = home / "bin" / "nvcc"
    nvcc_version = _run_text([str(nvcc), "--version"])
    cxx_version = _run_text([cxx, "--version"]).splitlines()[:1]
    return Toolchain(home, nvcc, cxx, (f"nvcc {nvcc}", *nvcc_version.splitlines(), f"cxx {cxx}", *cxx_version))


def _run_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise CompileError(f"ltx_kernels: `{' '.join(argv)}` failed: {e}") from None


def loaded_libstdcxx() -> Optional[str]:
    """Path of the libstdc++.so.6 this process has mapped (torch loads it)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"(\S*/libstdc\+\+\.so\.6[\d.]*)\s*$", maps, re.M)
    return found.group(1) if found else None


def shared_libstdcxx_link(cxx: str) -> list[str]:
    """Without a libstdc++.so development link g++ links libstdc++.a into the
    library, and two C++ runtimes in one process crash on a thrown error
    (README, Known issues): then link the runtime the process uses, by path."""
    dev_link = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
    if dev_link and Path(dev_link).is_file():
        return []
    runtime = loaded_libstdcxx()
    return [runtime] if runtime else []


# --------------------------------------------------------------------------- build plan


@dataclass
class Step:
    label: str
    output: Path
    argv: list[str]
    inputs: list[Path]
    salt: str = ""  # toolchain and torch versions: a new nvcc at the same path recompiles

    def key(self) -> str:
        h = hashlib.sha256(self.salt.encode())
        h.update("\0".join(self.argv).encode())
        for p in self.inputs:
            h.update(f"\0{p}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
        return h.hexdigest()


@dataclass
class BuildPlan:
    root: Path
    build_dir: Path
    compile_steps: list[Step]
    link: Step
    capabilities: list[str]
    manifest: list[str] = field(default_factory=list)  # what the key is computed from

    @property
    def key(self) -> str:
        return hashlib.sha256("\n".join(self.manifest).encode()).hexdigest()


def _gencode(capabilities: list[str]) -> list[str]:
    flags = []
    for cap in capabilities:
        num = cap.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if cap.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def _source_files(root: Path, listed: list[str], include_dirs: list[Path]) -> list[Path]:
    """Every C++/CUDA file in the directories that hold the listed sources and
    in the include directories: the key covers headers nobody lists."""
    dirs = {(root / s).parent for s in listed} | set(include_dirs)
    files = {p.resolve() for d in dirs if d.is_dir() for p in d.iterdir() if p.suffix in SOURCE_SUFFIXES}
    return sorted(files)


def make_plan(root: Path, build_dir: Path, toolchain: Toolchain, env: Optional[Mapping[str, str]] = None) -> BuildPlan:
    """Commands that compile build.toml's CUDA kernels and torch binding into one library."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise CompileError("ltx_kernels: compiling from the source tree needs Python >= 3.11 (tomllib)") from None
    import torch

    env = os.environ if env is None else env
    config = tomllib.loads((root / "build.toml").read_text())
    torch_cfg = config.get("torch", {})
    kernels = [k for k in config.get("kernel", {}).values() if k.get("backend") == "cuda"]
    listed = list(torch_cfg.get("src", [])) + [s for k in kernels for s in k.get("src", [])]
    torch_includes = [root / i for i in torch_cfg.get("include", [])]
    kernel_includes = [root / i for k in kernels for i in k.get("include", [])]
    sources = _source_files(root, listed, [root / "torch-ext", *torch_includes, *kernel_includes])
    headers = [p for p in sources if p.suffix in HEADER_SUFFIXES]

    torch_dir = Path(torch.__file__).parent
    capabilities: list[str] = []
    steps: list[Step] = []
    for k in kernels:
        capabilities += [c for c in k.get("cuda-capabilities", []) if c not in capabilities]
        for src in (s for s in k.get("src", []) if s.endswith(".cu")):
            out = build_dir / (src.replace("/", "__") + ".o")
            argv = [str(toolchain.nvcc), "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fno-gnu-unique",
                    "-DCUDA_KERNEL", "-DUSE_CUDA=1", *_gencode(k.get("cuda-capabilities", [])),
                    *k.get("cuda-flags", []), *(f"-I{root / i}" for i in k.get("include", [])),
                    "-c", str(root / src), "-o", str(out)]
            steps.append(Step(f"nvcc {src}", out, argv, [(root / src).resolve(), *headers]))
    abi = "1" if torch.compiled_with_cxx11_abi() else "0"
    for src in (s for s in torch_cfg.get("src", []) if s.endswith(".cpp")):
        out = build_dir / (src.replace("/", "__") + ".o")
        argv = [toolchain.cxx, "-std=c++20", "-O2", "-fPIC", "-fno-gnu-unique", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                f"-DTORCH_EXTENSION_NAME={OPS_NAMESPACE}", "-DCUDA_KERNEL", "-DUSE_CUDA=1",
                f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include/torch/csrc/api/include'}",
                f"-I{toolchain.cuda_home / 'include'}", f"-I{sysconfig.get_paths()['include']}",
                f"-I{root / 'torch-ext'}", *(f"-I{i}" for i in torch_includes), f"-I{build_dir}",
                *torch_cfg.get("cxx-flags", []), *shlex.split(env.get("CXXFLAGS", "")),
                "-c", str(root / src), "-o", str(out)]
        steps.append(Step(f"c++ {src}", out, argv, [(root / src).resolve(), *headers]))
    if not steps:
        raise CompileError(f"ltx_kernels: {root / 'build.toml'} lists no CUDA or binding sources to compile")
    versions = [f"recipe {RECIPE_VERSION}", f"python {sys.version.split()[0]}{getattr(sys, 'abiflags', '')}",
                f"torch {torch.__version__} cuda {torch.version.cuda} git {getattr(torch.version, 'git_version', '')}",
                *(f"toolchain {line}" for line in toolchain.description)]
    for step in steps:
        step.salt = "\n".join(versions)

    so_tmp = build_dir / f"{KERNEL}.so.tmp"
    link_argv = [toolchain.cxx, "-shared", "-o", str(so_tmp), *(str(s.output) for s in steps),
                 *shared_libstdcxx_link(toolchain.cxx), f"-L{torch_dir / 'lib'}", "-lc10", "-lc10_cuda", "-ltorch",
                 "-ltorch_cpu", f"-L{toolchain.cuda_home / 'lib64'}", "-lcudart", *shlex.split(env.get("LDFLAGS", ""))]
    link = Step(f"link {KERNEL}.so", so_tmp, link_argv, [])

    manifest = [*versions, *(f"command {shlex.join(s.argv)}" for s in steps), f"command {shlex.join(link_argv)}",
                f"generated registration.h {hashlib.sha256(JIT_REGISTRATION_H.encode()).hexdigest()}",
                *(f"source {_rel(p, root)} {hashlib.sha256(p.read_bytes()).hexdigest()}" for p in sources)]
    return BuildPlan(root, build_dir, steps, link, capabilities, manifest)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def run_plan(plan: BuildPlan, log: Callable[[str], None]) -> Path:
    """Compile (objects whose own inputs are unchanged are reused) and link;
    returns the freshly linked library, not yet in its cache place."""
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    (plan.build_dir / "registration.h").write_text(JIT_REGISTRATION_H)
    total = len(plan.compile_steps) + 1
    counter = iter(range(1, total + 1))

    def run(step: Step) -> None:
        stamp = step.output.with_name(step.output.name + ".sha256")
        key = step.key()
        if step.output.is_file() and stamp.is_file() and stamp.read_text() == key:
            next(counter)  # reused silently: only what is compiled is worth a line
            return
        start = time.monotonic()
        proc = subprocess.run(step.argv, capture_output=True, text=True)
        if proc.returncode != 0:
            stamp.unlink(missing_ok=True)
            raise CompileError(f"ltx_kernels: {step.label} failed (exit {proc.returncode}):\n$ "
                               f"{shlex.join(step.argv)}\n{proc.stdout}{proc.stderr}")
        stamp.write_text(key)
        log(f"[{next(counter)}/{total}] {step.label} ({time.monotonic() - start:.0f} s)")

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for future in [pool.submit(run, s) for s in plan.compile_steps]:
            future.result()
    plan.link.output.unlink(missing_ok=True)
    run_link = subprocess.run(plan.link.argv, capture_output=True, text=True)
    if run_link.returncode != 0:
        raise CompileError(f"ltx_kernels: link failed:\n$ {shlex.join(plan.link.argv)}\n"
                           f"{run_link.stdout}{run_link.stderr}")
    log(f"[{next(counter)}/{total}] {plan.link.label}")
    return plan.link.output


# --------------------------------------------------------------------------- cache entry


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """``{directory}/{KERNEL}.so`` and its ``.sha256`` record."""

    directory: Path

    @property
    def library(self) -> Path:
        return self.directory / f"{KERNEL}.so"

    @property
    def record(self) -> Path:
        return self.directory / f"{KERNEL}.sha256"

    @property
    def lock_file(self) -> Path:
        return self.directory / f"{KERNEL}.lock"

    @property
    def manifest_file(self) -> Path:
        return self.directory / f"{KERNEL}.key.txt"

    @property
    def build_dir(self) -> Path:
        return self.directory / "build"

    def read_record(self) -> tuple[Optional[str], Optional[str]]:
        """(build key, library SHA-256) from the record; None for what is missing."""
        try:
            text = self.record.read_text()
        except OSError:
            return None, None
        key = re.search(r"^# key: ([0-9a-f]{64})$", text, re.M)
        digest = re.search(rf"^([0-9a-f]{{64}})  {re.escape(KERNEL)}\.so$", text, re.M)
        return (key.group(1) if key else None), (digest.group(1) if digest else None)

    def problem(self, key: str, manifest: Optional[list[str]] = None) -> Optional[str]:
        """Why the cached library cannot be used for ``key``; None when it can."""
        recorded_key, recorded_digest = self.read_record()
        if not self.library.is_file():
            return "no cached library"
        if recorded_key is None or recorded_digest is None:
            return f"{self.record.name} is missing or unreadable"
        if recorded_key != key:
            return "sources, flags or toolchain changed" + self._changes(manifest)
        if file_sha256(self.library) != recorded_digest:
            return f"{self.library.name} does not match its recorded SHA-256 (truncated or modified)"
        return None

    def _changes(self, manifest: Optional[list[str]]) -> str:
        """What differs from the manifest of the cached build, briefly."""
        if manifest is None or not self.manifest_file.is_file():
            return ""
        old = set(self.manifest_file.read_text().splitlines())
        changed = sorted({line.split(" ")[1] if line.startswith("source ") else line.split(" ", 1)[0]
                          for line in manifest if line not in old})
        return f": {', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''}" if changed else ""

    def install(self, built: Path, key: str, manifest: list[str]) -> None:
        """Move ``built`` into place, then write the record; both by atomic rename,
        so a reader sees the old entry or the complete new one."""
        digest = file_sha256(built)
        os.replace(built, self.library)
        tmp = self.record.with_name(self.record.name + ".tmp")
        tmp.write_text(f"# {KERNEL} compiled on first use; key = SHA-256 of its sources, flags and toolchain\n"
                       f"# key: {key}\n{digest}  {KERNEL}.so\n")
        os.replace(tmp, self.record)
        tmp = self.manifest_file.with_name(self.manifest_file.name + ".tmp")
        tmp.write_text("\n".join(manifest) + "\n")
        os.replace(tmp, self.manifest_file)

    @contextmanager
    def locked(self, exclusive: bool) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_library(
    entry: CacheEntry,
    plan: BuildPlan,
    *,
    no_compile: bool = False,
    build: Callable[[BuildPlan, Callable[[str], None]], Path] = run_plan,
    load: Callable[[Path], None] = lambda path: None,
    log: Callable[[str], None] = _stderr,
) -> Path:
    """Make ``entry`` hold a valid library for ``plan`` and ``load`` it.

    ``load`` runs while the lock is held, so no other process replaces the
    file between its check and its loading."""
    key = plan.key
    with entry.locked(exclusive=False):
        problem = entry.problem(key, plan.manifest)
        if problem is None:
            load(entry.library)
            return entry.library
    if no_compile:
        raise KernelNotCompiledError(
            f"ltx_kernels: cannot use the compiled library in {entry.directory} ({problem}) and compilation "
            f"on first use is off ({' or '.join(NO_COMPILE_VARS)} is set). Compile it once with "
            "`python3 -m ltx_build jit` (or unset the variable), or load a built variant instead: "
            "`python3 -m ltx_build build`, then kernels.get_local_kernel(<repo root>)")
    with entry.locked(exclusive=True):
        problem = entry.problem(key, plan.manifest)  # another process may have built it meanwhile
        if problem is not None:
            log(f"ltx_kernels: compiling the CUDA kernels ({problem}) into {entry.directory}: the first "
                "compile takes minutes, later ones only what changed; imports after that reuse the library")
            start = time.monotonic()
            built = build(plan, log)
            entry.install(built, key, plan.manifest)
            log(f"ltx_kernels: compiled {entry.library} in {time.monotonic() - start:.0f} s")
        load(entry.library)
    return entry.library


# --------------------------------------------------------------------------- import hook


def prepare(root: Path, env: Optional[Mapping[str, str]] = None) -> tuple[CacheEntry, BuildPlan]:
    env = os.environ if env is None else env
    entry = CacheEntry(cache_root(env) / KERNEL)
    return entry, make_plan(root, entry.build_dir, find_toolchain(env), env)


def install_ops_module(package: str, cause: Optional[BaseException] = None) -> types.ModuleType:
    """Compile (or reuse) the library for the source tree of ``package``, load
    it, and register ``{package}._ops`` with ``ops`` and ``add_op_namespace_prefix``
    as a built variant's generated ``_ops.py`` has them.

    Outside a source tree (a built variant whose own ``_ops`` failed to
    import) the original error ``cause`` is raised again."""
    import torch

    package_dir = Path(sys.modules[package].__file__).parent
    root = find_source_root(package_dir)
    if root is None:
        if cause is not None:
            raise cause
        raise ImportError(f"ltx_kernels: {package_dir} is not torch-ext/<package> of a source tree")
    entry, plan = prepare(root)
    library = ensure_library(entry, plan, no_compile=compile_disabled(),
                             load=lambda path: torch.ops.load_library(str(path)))

    module = types.ModuleType(f"{package}._ops", "Ops of the library compiled on first use (ltx_kernels._jit).")
    module.ops = getattr(torch.ops, OPS_NAMESPACE)
    module.add_op_namespace_prefix = add_op_namespace_prefix
    module.LIBRARY = str(library)
    module.ARCHS = list(plan.capabilities)
    module.VARIANT = "source tree (compiled on first use)"
    sys.modules[module.__name__] = module
    setattr(sys.modules[package], "_ops", module)
    return module


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{OPS_NAMESPACE}::{op_name}"
