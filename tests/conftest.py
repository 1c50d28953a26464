"""Shared fixtures. Tests load the kernel the way users do: through
`kernels.get_kernel(<repo-id>, version=1)` with LOCAL_KERNELS pointing at
this checkout's build/ (so `ltx-build build` must have run), or, with
`--dev-build`, at the development build in _build/dev/ (`ltx-build build
--dev`): the same kernels plus the path probes and the tuning overrides that
the `dev_kernel` and `tuning` fixtures stand for."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from ltx_build import config as build_config

ROOT = Path(__file__).resolve().parent.parent
CFG = build_config.load(ROOT)
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
    if config.getoption("--dev-build"):
        KERNEL_ROOT = DEV_ROOT


@pytest.fixture(scope="session")
def kernel():
    """The built variant for the installed torch, loaded through kernels."""
    import kernels
    from ltx_build import variant

    var = variant.current_variant()
    if not (KERNEL_ROOT / "build" / var / "metadata.json").is_file():
        dev = " --dev" if KERNEL_ROOT == DEV_ROOT else ""
        pytest.fail(f"{KERNEL_ROOT / 'build' / var} is missing: run `ltx-build build{dev}` first")
    os.environ["LOCAL_KERNELS"] = f"{CFG.repo_id}={KERNEL_ROOT}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return kernels.get_kernel(CFG.repo_id, version=CFG.version, trust_remote_code=True)


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
