"""Shared fixtures. Tests load the kernel the way users do: through
`kernels.get_kernel(<repo-id>, version=1)` with LOCAL_KERNELS pointing at
this checkout's build/ (so `ltx-build build` must have run), or, with
`--dev-build`, at the development build in _build/dev/ (`ltx-build build
--dev`): the same kernels plus the path probes and the tuning overrides that
the `dev_kernel` and `tuning` fixtures stand for.

The tests marked `kernels_ci` (test_kernels_ci.py) are the ones kernel-builder's
`nix run .#ci-test` runs (`pytest tests -m kernels_ci`) in a Python holding only
torch, kernels and pytest, with LOCAL_KERNELS set to the Nix build. So this file
imports only the standard library, pytest and torch at module level, and where
the dev tools (ltx_build) are missing it collects only the modules that use that
marker: the others import ltx_build, ltx_dev, diffusers or hypothesis."""

from __future__ import annotations

import ast
import contextlib
import os
import tomllib
from pathlib import Path

import pytest

try:
    from ltx_build import config as build_config
except ModuleNotFoundError as e:  # the Nix test Python; any other missing module is a real error
    if e.name != "ltx_build":
        raise
    build_config = None

ROOT = Path(__file__).resolve().parent.parent
BUILD_TOML = tomllib.loads((ROOT / "build.toml").read_text())  # read without ltx_build (Nix)
REPO_ID = BUILD_TOML["general"]["hub"]["repo-id"]
CFG = build_config.load(ROOT) if build_config else None  # ltx_build's view of build.toml, where it imports
DEV_ROOT = ROOT / "_build" / "dev"
KERNEL_ROOT = ROOT  # the repository root the tests load the kernel from: DEV_ROOT with --dev-build
VECTORIZED, FALLBACK = 0, 1  # what the `<op>_path` probes return

cuda = pytest.mark.skipif(
    not (__import__("torch").cuda.is_available()), reason="needs a CUDA GPU (run on the GPU machine)"
)


def pytest_addoption(parser):
    parser.addoption("--dev-build", action="store_true",
                     help="load the development build (_build/dev, `ltx-build build --dev`) instead of build/")


def pytest_configure(config):
    global KERNEL_ROOT
    config.addinivalue_line("markers", "kernels_ci: run by kernel-builder's `nix run .#ci-test` "
                                       "(only stdlib, torch, kernels and pytest may be imported)")
    if config.getoption("--dev-build"):
        KERNEL_ROOT = DEV_ROOT


def uses_kernels_ci_marker(path: Path) -> bool:
    """Whether a module names `pytest.mark.kernels_ci` (or any `<x>.kernels_ci`) anywhere."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(n, ast.Attribute) and n.attr == "kernels_ci" for n in ast.walk(tree))


def pytest_ignore_collect(collection_path: Path, config):
    """Without the dev tools, collect only the modules with kernels_ci tests; with them, everything
    (a broken dev environment must fail loudly, not shrink the suite)."""
    if build_config is None and collection_path.suffix == ".py" and collection_path.name != "conftest.py" \
            and not uses_kernels_ci_marker(collection_path):
        return True
    return None


def _get_kernel():
    import kernels

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return kernels.get_kernel(REPO_ID, version=BUILD_TOML["general"]["version"], trust_remote_code=True)


@pytest.fixture(scope="session")
def kernel():
    """The built variant for the installed torch, loaded through kernels."""
    from ltx_build import variant

    var = variant.current_variant()
    if not (KERNEL_ROOT / "build" / var / "metadata.json").is_file():
        dev = " --dev" if KERNEL_ROOT == DEV_ROOT else ""
        pytest.fail(f"{KERNEL_ROOT / 'build' / var} is missing: run `ltx-build build{dev}` first")
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={KERNEL_ROOT}"
    return _get_kernel()


def local_kernels_names_this_kernel() -> bool:
    entries = os.environ.get("LOCAL_KERNELS", "").split(":")
    return any(e.partition("=")[0] == REPO_ID and e.partition("=")[2] for e in entries)


@pytest.fixture(scope="session")
def ci_kernel(request):
    """The kernel as `nix run .#ci-test` hands it over: LOCAL_KERNELS as the Nix runner set it (to the
    Nix build). Where nothing set it for this repo id, this checkout's build/ (or _build/dev/ with
    --dev-build), as the `kernel` fixture loads it."""
    if local_kernels_names_this_kernel() and not request.config.getoption("--dev-build"):
        return _get_kernel()
    if build_config is None:  # no ltx_build to check the variant with: let kernels say what is missing
        os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={KERNEL_ROOT}"
        return _get_kernel()
    return request.getfixturevalue("kernel")


def is_dev_build(kernel) -> bool:
    return hasattr(kernel.ops, "set_tuning")


@pytest.fixture
def dev_kernel(kernel):
    """The kernel, when it is a development build (path probes, tuning overrides); else the test skips."""
    if not is_dev_build(kernel):
        pytest.skip("needs the development build: `ltx-build build --dev`, then pytest --dev-build")
    return kernel


@pytest.fixture
def tuning(dev_kernel):
    """tuning({"fused_norm.prefetch": 0}) forces launch choices (kernel_src/common/tuning.h) for the rest
    of the test; they are cleared when it ends."""
    from ltx_dev.tuning import override

    with contextlib.ExitStack() as stack:
        yield lambda knobs: stack.enter_context(override(dev_kernel, knobs))


@pytest.fixture(params=[True, False], ids=["dependent_launch", "plain_launch"])
def launch_mode(request):
    """Chained-launch tests run with programmatic dependent launch (what every build does) and, on a
    development build, without it (the `dependent_launch` override)."""
    if not request.param:
        request.getfixturevalue("tuning")({"dependent_launch": 0})
    return request.param


def expect_path(kernel, probe: str, args: tuple, expected: int) -> None:
    """Assert which kernel `kernel.ops.<probe>(*args)` says a call takes. Only development builds
    register the probes; on a release build this checks nothing and the rest of the test (the
    results) still runs."""
    if is_dev_build(kernel):
        assert getattr(kernel.ops, probe)(*args) == expected, probe


A100, H100, B200 = ((8, 0), "NVIDIA A100-SXM4-80GB"), ((9, 0), "NVIDIA H100 80GB HBM3"), ((10, 0), "NVIDIA B200")


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu((capability, name)) makes torch (and kernelize's capability lookup) see one CUDA
    device of that capability as cuda:0; fake_gpu(None) makes them see none. Nothing runs on it:
    for the checks that decide whether the kernels may run."""
    import torch

    def fake(gpu):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
        if gpu is None:
            return
        (major, minor), name = gpu
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        with contextlib.suppress(ImportError):
            import kernels.layer.repos

            monkeypatch.setattr(kernels.layer.repos, "_find_capability", lambda: major * 10 + minor)

    return fake
