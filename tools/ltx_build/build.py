"""Build a variant for the installed torch: plan the steps, run what is stale,
install ``<base>/build/<variant>/``, check it.

One plan serves every flavour: the release build (``build/``), the dev build
(``--dev``: ``-DLTX_KERNELS_DEV``, ``_build/dev/``, its own op namespace) and
compile on first use (``jit.py``: the same build into a cache directory)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import BuildError, checks, config, layout, toolchain, variant
from .compile import Digests, Runner, Step

CUDA_STD = "-std=c++17"
CXX_STD = "-std=c++20"  # what torch's own extension builder uses for its headers
BACKEND = "cuda"
DEV_DEFINE = "-DLTX_KERNELS_DEV"  # test probe ops and A/B-only kernels
# Bumped when the recipe changes in a way the commands do not show.
RECIPE = "2"


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


def flavour_dir(base: Path, dev: bool) -> Path:
    """Where a flavour's build/<variant>/ and objects go: dev builds never share
    (or overwrite) the release build's."""
    return base / "_build" / "dev" if dev else base


@dataclass
class Plan:
    cfg: config.BuildConfig
    variant: str
    ops_name: str
    out_dir: Path  # holds build/<variant>/ (what kernels.get_local_kernel takes) and _build/<variant>/
    dev: bool
    fingerprint: str
    steps: list[Step]  # the compiles
    link: Step
    toolchain: toolchain.Toolchain
    git: variant.GitState | None = None  # the checkout built from: metadata.json's provenance

    @property
    def root(self) -> Path:
        return self.cfg.root

    @property
    def variant_dir(self) -> Path:
        return self.out_dir / "build" / self.variant

    def problem(self) -> str | None:
        """The first stale step and why; None when nothing needs to run."""
        digests = Digests()
        for step in [*self.steps, self.link]:
            why = step.problem(self.fingerprint, digests)
            if why is not None:
                return f"{step.label}: {why}"
        return None


def make_plan(root: Path, *, dev: bool = False, base: Path | None = None, uid: str | None = None,
              torch: variant.Torch | None = None, tc: toolchain.Toolchain | None = None,
              env: dict[str, str] | None = None) -> Plan:
    """The compile and link steps for build.toml's sources. `base` is where
    build/<variant>/ goes (default: the repository), `uid` the namespace id
    (default: the git tree id, see variant.unique_id)."""
    root = Path(root).resolve()
    env = os.environ if env is None else env
    cfg = config.load(root)
    errors = config.source_errors(cfg)
    if errors:
        raise BuildError("build.toml sources:\n  " + "\n  ".join(errors))
    torch = torch or variant.Torch.installed()
    tc = tc or toolchain.detect(torch.cuda, env)
    git = variant.git_state(root)
    uid = (uid or variant.unique_id(root, git)) + ("_dev" if dev else "")
    ops_name = variant.ops_namespace(cfg.python_name, BACKEND, uid)
    out_dir = flavour_dir(Path(base or root).resolve(), dev)
    obj_dir = out_dir / "_build" / torch.variant
    dev_flags = [DEV_DEFINE] if dev else []
    # Generated like kernel-builder's (git-ignored); the same for every flavour.
    layout.write_if_changed(root / "torch-ext" / "registration.h", layout.REGISTRATION_H)

    def compile_step(tool: str, src: str, out: Path, flags: list[str]) -> Step:
        depfile = out.with_name(out.name + ".d")
        return Step(f"{tool} {src}", out, [*flags, "-MD", "-MF", str(depfile), "-c", str(root / src), "-o", str(out)],
                    [(root / src).resolve()], depfile, cwd=root)

    steps: list[Step] = []
    for k in (k for k in cfg.kernels if k.backend == BACKEND):
        flags = [str(tc.nvcc), CUDA_STD, "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fno-gnu-unique",
                 "-DCUDA_KERNEL", "-DUSE_CUDA=1", *dev_flags, *gencode_flags(list(k.capabilities)), *k.cuda_flags,
                 *(f"-I{root / i}" for i in k.include)]
        for src in (s for s in k.src if s.endswith(".cu")):
            # Kernel objects do not depend on the namespace: a new commit recompiles only the binding.
            steps.append(compile_step("nvcc", src, obj_dir / (src.replace("/", "__") + ".o"), flags))

    torch_include = torch.dir / "include"
    flags = [tc.cxx, CXX_STD, "-O2", "-fPIC", "-fno-gnu-unique", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.cxx11_abi)}",
             "-DPy_LIMITED_API=0x03090000", f"-DTORCH_EXTENSION_NAME={ops_name}", "-DCUDA_KERNEL", "-DUSE_CUDA=1",
             *dev_flags, f"-I{torch_include}", f"-I{torch_include / 'torch/csrc/api/include'}",
             f"-I{tc.cuda_home / 'include'}", f"-I{sysconfig.get_paths()['include']}", f"-I{root / 'torch-ext'}",
             *(f"-I{root / i}" for i in cfg.torch_include), *cfg.torch_cxx_flags, *shlex.split(env.get("CXXFLAGS", ""))]
    for src in (s for s in cfg.torch_src if s.endswith(".cpp")):
        steps.append(compile_step("c++", src, obj_dir / (src.replace("/", "__") + f".{ops_name}.o"), flags))

    so_path = obj_dir / f"{ops_name}.abi3.so"
    objects = [s.output for s in steps]
    link_cmd = [tc.cxx, "-shared", "-o", str(so_path), *map(str, objects),
                *toolchain.shared_libstdcxx_args(tc.cxx), f"-L{torch.dir / 'lib'}", "-lc10", "-lc10_cuda", "-ltorch",
                "-ltorch_cpu", f"-L{tc.cuda_home / 'lib64'}", "-lcudart", *shlex.split(env.get("LDFLAGS", ""))]
    link = Step(f"link {so_path.name}", so_path, link_cmd, objects, cwd=root)
    fingerprint = "\n".join([f"recipe {RECIPE}", f"python {sys.version.split()[0]}", torch.fingerprint,
                             tc.fingerprint])
    return Plan(cfg, torch.variant, ops_name, out_dir, dev, fingerprint, steps, link, tc, git)


@dataclass
class BuildResult:
    variant: str
    ops_name: str
    out_dir: Path
    variant_dir: Path
    so_path: Path
    rebuilt: list[str]
    files: list[str]
    seconds: float


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def run(plan: Plan, *, jobs: int | None = None, verbose: bool = False,
        log: Callable[[str], None] = print) -> BuildResult:
    """Compile and link what is stale (stopping at the first error), then
    install build/<variant>/."""
    start = time.monotonic()
    jobs = jobs or os.cpu_count() or 1
    tc = plan.toolchain
    log(f"ltx_build: building {plan.variant}{' (dev)' if plan.dev else ''} into "
        f"{_shown(plan.variant_dir, plan.root)}: ops {plan.ops_name}, nvcc {tc.nvcc_build or tc.nvcc_version} "
        f"({tc.cuda_home}), capabilities {', '.join(plan.cfg.capabilities)}, {len(plan.steps) + 1} steps, "
        f"{jobs} jobs")
    runner = Runner(plan.fingerprint, jobs, len(plan.steps) + 1, verbose=verbose, log=log)
    runner.run(plan.steps)
    runner.run([plan.link])
    _drop_older_namespaces(plan)
    if plan.out_dir == plan.root:  # the release build's _ops.py in torch-ext/, as kernel-builder writes it
        source_ops = plan.root / "torch-ext" / plan.cfg.python_name / "_ops.py"
        layout.write_if_changed(source_ops, layout.ops_py(plan.ops_name))

    step_start = time.monotonic()
    meta = layout.metadata(plan.cfg, plan.ops_name, plan.cfg.capabilities, layout.provenance(plan.git), dev=plan.dev)
    files = layout.install_variant(plan.cfg, plan.variant_dir, plan.link.output, plan.ops_name, meta)
    log(f"ltx_build: wrote {_shown(plan.variant_dir, plan.root)} ({', '.join(files)}) "
        f"{time.monotonic() - step_start:.1f} s")
    seconds = time.monotonic() - start
    log(f"ltx_build: compiled {len(runner.rebuilt)} of {runner.total} steps "
        f"({', '.join(runner.rebuilt) if runner.rebuilt else 'all up to date'}) in {seconds:.1f} s")
    return BuildResult(plan.variant, plan.ops_name, plan.out_dir, plan.variant_dir,
                       plan.variant_dir / plan.link.output.name, runner.rebuilt, files, seconds)


def build(root: Path, *, jobs: int | None = None, verbose: bool = False, log: Callable[[str], None] = print,
          **plan_args) -> BuildResult:
    return run(make_plan(root, **plan_args), jobs=jobs, verbose=verbose, log=log)


def _drop_older_namespaces(plan: Plan) -> None:
    """Remove `<ns>.abi3.so` and the binding objects `<src>.<ns>.o` (with their
    records and depfiles) of other namespaces. The namespace is matched whole,
    so `<id>` and `<id>_dirty` are different namespaces."""
    ns_output = re.compile(rf"^(?:.*\.)?(_{re.escape(plan.cfg.python_name)}_{BACKEND}_\w+?)"
                           r"\.(?:abi3\.so|o)(?:\.sha256|\.d)?$")
    for stale in plan.link.output.parent.iterdir():
        m = ns_output.match(stale.name)
        if m and m.group(1) != plan.ops_name and stale.is_file():
            stale.unlink()


def _timed(log: Callable[[str], None], what: Callable[[], str]) -> None:
    start = time.monotonic()
    message = what()
    log(f"{message} {time.monotonic() - start:.1f} s")


def check(root: Path, result: BuildResult, allow_newer_glibc: bool = False,
          log: Callable[[str], None] = print) -> None:
    """ABI check, then load through kernels both ways; raises on any failure.

    `allow_newer_glibc` turns manylinux_2_28 violations into warnings (a local
    build on a host whose glibc headers are newer than 2.28); abi3 violations
    always fail."""
    cfg = config.load(root)

    def abi() -> str:
        manylinux, abi3 = checks.abi_violations(result.so_path)
        if manylinux and allow_newer_glibc:
            log(f"ltx_build: warning: {result.so_path.name} needs a newer glibc than {checks.MANYLINUX} "
                "(--allow-newer-glibc; fine locally, not for publishing):\n  " + "\n  ".join(manylinux))
            manylinux = []
        violations = manylinux + abi3
        if violations:
            raise BuildError(f"ABI check of {result.so_path.name} failed ({checks.MANYLINUX}, abi3 >= "
                             f"{checks.PYTHON_ABI}):\n  " + "\n  ".join(violations)
                             + ("\nOn a host with glibc > 2.28, pass --allow-newer-glibc for a local-only build "
                                "(README, ABI exceptions)." if manylinux else ""))
        return (f"ltx_build: ABI check passed ({'abi3 only' if allow_newer_glibc else checks.MANYLINUX + ', abi3'} "
                f">= {checks.PYTHON_ABI}): {result.so_path.name}")

    _timed(log, abi)
    _timed(log, lambda: f"ltx_build: kernels.get_local_kernel loaded {checks.load_local(result.out_dir)}")
    _timed(log, lambda: f"ltx_build: kernels.get_kernel('{cfg.repo_id}', version={cfg.version}) loaded "
                        f"{checks.load_hub(result.out_dir, cfg.repo_id, cfg.version)} through LOCAL_KERNELS (offline)")
