"""Compile on first use, for working from the source tree::

    from ltx_build import jit
    ltx = jit.load_kernel()              # or load_kernel(root, dev=True)

builds the variant for the installed torch with the plan and rebuild key of
``ltx-build build`` (so only what is stale compiles), into a cache directory
instead of build/, and loads it as users load a kernel
(``kernels.get_local_kernel``). Nothing of this ships in the Hub package.

Cache: ``{cache}/<package>/build/<variant>/`` (dev: under ``_build/dev/``),
objects and their records in ``_build/<variant>/`` beside it. ``{cache}`` is
``LTX_KERNELS_CACHE_DIR``, else ``TORCH_EXTENSIONS_DIR``, else
``~/.cache/torch_extensions/py<ver>_cu<ver>/`` (torch's own JIT directory,
``XDG_CACHE_HOME`` honoured as torch does). A file lock serialises processes:
one compiles, the others wait, then load its result. The op namespace is fixed
(``_<package>_cuda_jit``, ``..._jit_dev``): a commit does not recompile the
bindings, and a process can load this beside build/'s variant.

``LTX_KERNELS_NO_COMPILE=1`` turns compiling off: an up-to-date cache still
loads, a stale one is an error that says what to run.
``RUNWARE_LTX_TORCH_COMPILE_DIR`` and ``RUNWARE_LTX_NO_COMPILE_KERNELS`` are
accepted as older names of the two variables.
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping

from . import BuildError, build, config, variant

CACHE_DIR_VARS = ("LTX_KERNELS_CACHE_DIR", "RUNWARE_LTX_TORCH_COMPILE_DIR")
NO_COMPILE_VARS = ("LTX_KERNELS_NO_COMPILE", "RUNWARE_LTX_NO_COMPILE_KERNELS")
UID = "jit"


class KernelNotCompiledError(BuildError):
    """Compiling is off and the cache is stale."""


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def compile_disabled(env: Mapping[str, str] | None = None) -> bool:
    value = _first_set(os.environ if env is None else env, NO_COMPILE_VARS)
    return value is not None and value.strip().lower() not in ("0", "false", "no", "off", "")


def cache_root(env: Mapping[str, str] | None = None, torch_cuda: str | None = None) -> Path:
    """The directory that holds ``<package>/``, chosen as the module docstring says."""
    env = os.environ if env is None else env
    explicit = _first_set(env, CACHE_DIR_VARS) or env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    torch_cuda = torch_cuda or variant.Torch.installed().cuda
    base = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or Path.home()) / ".cache")
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return base / "torch_extensions" / f"{python}_cu{torch_cuda.replace('.', '')}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def cached_build(root: Path | None = None, *, dev: bool = False, env: Mapping[str, str] | None = None,
                 log: Callable[[str], None] = _stderr, torch: variant.Torch | None = None,
                 **plan_args) -> Iterator[build.Plan]:
    """Bring the cache's build of `root` (default: config.find_root()) up to
    date; the lock is held until the block ends, so load it inside."""
    env = os.environ if env is None else env
    root = Path(root).resolve() if root else config.find_root()
    name = config.load(root).python_name
    torch = torch or variant.Torch.installed()
    base = cache_root(env, torch.cuda) / name
    with _locked(base / f"{name}.lock"):
        plan = build.make_plan(root, dev=dev, base=base, uid=UID, torch=torch, env=dict(env), **plan_args)
        problem = plan.problem()
        if problem and compile_disabled(env):
            raise KernelNotCompiledError(
                f"the compile-on-first-use build in {plan.out_dir} is stale ({problem}) and compiling is off "
                f"(LTX_KERNELS_NO_COMPILE is set). Compile it once with `ltx-build jit{' --dev' if dev else ''}` "
                "(or unset LTX_KERNELS_NO_COMPILE), or load a built variant: `ltx-build build`, then "
                "kernels.get_local_kernel(<repository root>)")
        if problem:
            log(f"ltx_build: compiling {name} on first use ({problem}) into {plan.out_dir}: minutes the first "
                "time, later only what changed")
        build.run(plan, log=log if problem else lambda message: None)  # installs even when nothing compiles
        yield plan


def load_kernel(root: Path | None = None, *, dev: bool = False):
    """The kernel module of the source tree at `root` (default: found from the
    current directory), compiled first if stale."""
    import kernels

    with cached_build(root, dev=dev) as plan:
        return kernels.get_local_kernel(plan.out_dir)
