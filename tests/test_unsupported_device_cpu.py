"""Off Hopper, the ops refuse with the facts instead of CUDA's "no kernel image"
(torch-ext/ltx_kernels/_device.py): on a GPU of another compute capability
every op that launches a kernel raises UnsupportedDeviceError naming the
device's capability, the build's archs (its metadata.json), torch and CUDA, and
where the variants are listed; on a machine without a CUDA GPU the refusal of a
CPU tensor says the same. The GPU is faked (conftest.fake_gpu) and the calls
take fake CUDA tensors, so nothing is launched: this runs without a GPU."""

from __future__ import annotations

import importlib
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ltx_dev.registry import BF16, OPS, Source

from .conftest import A100, B200, CFG, H100

# linear_gelu is torch's cuBLASLt GEMM with the GELU epilogue: no kernel of this build, it runs on any GPU.
LAUNCHING = [spec for spec in OPS if spec.api != "linear_gelu"]


@pytest.fixture
def device_check(kernel, monkeypatch):
    """The package's _device module with no device checked yet."""
    module = importlib.import_module(kernel.__name__ + "._device")
    monkeypatch.setattr(module, "_CHECKED", {-1})
    return module


def call_on_fake_cuda(kernel, spec):
    with FakeTensorMode():
        args, _ = spec.build(spec.canonical("small", "vector"), BF16, Source(device="cuda", shape_only=True))
        return spec.call(kernel, args)


def assert_names_the_build_torch_and_variants(message: str, kernel) -> None:
    assert "runs on compute capability 9.0" in message
    assert f"torch {torch.__version__} (CUDA {torch.version.cuda})" in message
    assert 'kernels.get_kernel_variants("ltx-kernels/ltx-kernels", version=1)' in message
    variant_dir = importlib.import_module(kernel.__name__ + "._device")._PACKAGE_DIR
    assert f"{variant_dir.parent} holds {variant_dir.name}" in message


@pytest.mark.parametrize("spec", LAUNCHING, ids=[s.name for s in LAUNCHING])
def test_every_op_refuses_an_a100_naming_its_capability_the_build_and_torch(kernel, device_check, fake_gpu, spec):
    fake_gpu(A100)
    with pytest.raises(device_check.UnsupportedDeviceError) as refused:
        call_on_fake_cuda(kernel, spec)
    message = str(refused.value)
    assert message.startswith(f"ltx_kernels.{spec.api}: cuda:0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0")
    assert_names_the_build_torch_and_variants(message, kernel)
    assert isinstance(refused.value, RuntimeError)
    assert kernel.UnsupportedDeviceError is device_check.UnsupportedDeviceError


def test_a_blackwell_gpu_is_refused_too_since_the_build_has_no_ptx(kernel, device_check, fake_gpu):
    fake_gpu(B200)
    with pytest.raises(device_check.UnsupportedDeviceError, match=re.escape("has compute capability 10.0")):
        call_on_fake_cuda(kernel, next(s for s in OPS if s.api == "rmsnorm"))


def test_on_a_hopper_the_ops_run_and_the_capability_is_read_once_per_device(kernel, device_check, fake_gpu,
                                                                             monkeypatch):
    fake_gpu(H100)
    queried = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: queried.append(device) or (9, 0))
    for spec in LAUNCHING:
        call_on_fake_cuda(kernel, spec)
    assert queried == [0]
    assert device_check._CHECKED == {-1, 0}


def test_a_refused_device_is_asked_again_not_remembered_as_good(kernel, device_check, fake_gpu):
    fake_gpu(A100)
    spec = next(s for s in OPS if s.api == "rmsnorm")
    for _ in range(2):
        with pytest.raises(device_check.UnsupportedDeviceError):
            call_on_fake_cuda(kernel, spec)
    assert 0 not in device_check._CHECKED


@pytest.mark.parametrize("api", ["rmsnorm", "adaln_rmsnorm", "pixel_norm", "rope_3d", "linear_gelu"])
def test_without_a_cuda_gpu_the_cpu_refusal_says_so_with_the_build_torch_and_variants(kernel, device_check, fake_gpu,
                                                                                      api):
    """rmsnorm and pixel_norm refuse the CPU tensor in Python, adaln_rmsnorm and rope_3d in the binding,
    linear_gelu before torch's GEMM: each refusal gets the facts."""
    fake_gpu(None)
    spec = next(s for s in OPS if s.api == api)
    args, _ = spec.build(spec.canonical("small", "vector"), BF16, Source(0, "cpu"))
    with pytest.raises(device_check.UnsupportedDeviceError) as refused:
        spec.call(kernel, args)
    message = str(refused.value)
    assert re.match(rf"ltx_kernels\.{api}: `\w+` must be a CUDA tensor, got a tensor on cpu; "
                    r"this machine has no CUDA GPU, and ", message), message
    assert_names_the_build_torch_and_variants(message, kernel)


def test_with_a_hopper_present_a_cpu_tensor_gets_the_plain_refusal(kernel, device_check, fake_gpu):
    fake_gpu(H100)
    with pytest.raises(RuntimeError) as refused:
        kernel.adaln_rmsnorm(torch.randn(2, 8, dtype=BF16), None, torch.randn(8, dtype=BF16), None)
    assert type(refused.value) is RuntimeError
    assert str(refused.value) == "ltx_kernels.adaln_rmsnorm: `input` must be a CUDA tensor, got a tensor on cpu"


def test_build_archs_come_from_the_metadata_beside_the_package(device_check):
    assert device_check.build_archs() == tuple(CFG.capabilities)
    assert device_check._metadata()["backend"]["archs"] == list(CFG.capabilities)


def test_without_metadata_the_package_assumes_build_toml_archs_and_lists_no_local_variants(device_check, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setattr(device_check, "_PACKAGE_DIR", tmp_path / "ltx_kernels")  # the source tree: no metadata.json
    device_check._metadata.cache_clear()
    try:
        assert device_check.build_archs() == device_check.DEFAULT_ARCHS == tuple(CFG.capabilities)
        facts = device_check.facts()
        assert " holds " not in facts and "this build runs on compute capability 9.0" in facts
    finally:
        device_check._metadata.cache_clear()


def test_the_hub_repository_named_is_the_one_build_toml_publishes_to(device_check):
    assert (device_check.HUB_REPO_ID, device_check.DEFAULT_VERSION) == (CFG.repo_id, CFG.version)
