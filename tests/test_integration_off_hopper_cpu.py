"""The diffusers integration off Hopper: on a GPU of another compute capability
(an A100), with a torch or CUDA that no variant is built for, and on a machine
without a CUDA GPU, optimize_ltx returns the stock model and kernel_mapping +
kernelize keep every stock forward, after exactly one KernelUnavailableWarning
that names the GPU's capability (or "no CUDA GPU"), torch and its CUDA, and the
variants on offer. The GPU, torch's versions and the Hub are faked; the
variants are a local build of metadata.json files (kernels resolves them and
runs its own arch check on them, then stops before importing anything)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor  # noqa: E402

from ltx_build import layout  # noqa: E402
from ltx_build.variant import current_variant  # noqa: E402
from ltx_kernels_diffusers import (KERNEL_CUDA_CAPABILITIES, KernelUnavailableWarning, is_optimized,  # noqa: E402
                                   kernel_device, kernel_mapping, optimize, optimize_ltx)
from ltx_kernels_diffusers.kernelize import LAYER_CLASSES  # noqa: E402

from . import conftest  # noqa: E402
from .conftest import A100, CFG, H100  # noqa: E402
from .integration_support import marked, tiny_flux, tiny_ltx2, tiny_mochi, tiny_model  # noqa: E402, F401

THIS_TORCH = current_variant()  # e.g. torch214-cxx11-cu130-x86_64-linux
THIS_TORCH_MM = ".".join(torch.__version__.split("+")[0].split(".")[:2])  # read before any test fakes it
THIS_CUDA = torch.version.cuda
OTHER_TORCH = THIS_TORCH.replace(THIS_TORCH.split("-")[0], "torch212", 1)
LAYER_NAMES = {name for _, name, _ in LAYER_CLASSES}

# case -> (the GPU, torch.__version__ / torch.version.cuda overrides, what the warning must say)
CASES = {
    "a100": (A100, {}, ["cuda:0 (NVIDIA A100-SXM4-80GB), compute capability 8.0",
                        "the kernels are built for compute capability 9.0, not 8.0"]),
    "torch 2.9": (H100, {"__version__": "2.9.1+cu130"}, [
        "kernels found no variant for this machine", "torch 2.9.1+cu130 (CUDA",
        f"Torch version ({THIS_TORCH_MM}) does not match environment Torch version (2.9)"]),
    "cuda 12.8": (H100, {"cuda": "12.8"}, [
        "kernels found no variant for this machine", "(CUDA 12.8)",
        f"CUDA version ({THIS_CUDA}) is not compatible with system CUDA version (12.8)"]),
    "no gpu": (None, {}, ["no CUDA GPU, torch", "the kernels need a CUDA GPU of compute capability 9.0"]),
}


def write_build(root, variants, archs=("9.0",)):
    """A checkout whose build/ holds only the metadata.json of each variant (and a torch-ext/, which
    kernels would parse as a variant name)."""
    (root / "torch-ext" / "ltx_kernels").mkdir(parents=True)
    for name in variants:
        (root / "build" / name).mkdir(parents=True)
        meta = layout.metadata(CFG, "_ltx_kernels_cuda_0000000", list(archs))
        (root / "build" / name / "metadata.json").write_text(json.dumps(meta))
    return root


@pytest.fixture
def machine(fake_gpu, monkeypatch, tmp_path):
    """machine(case) fakes that case, with a local build of this torch's and another torch's variant
    (LOCAL_KERNELS); returns the phrases its warning must hold."""

    def setup(case, archs=("9.0",)):
        gpu, versions, phrases = CASES[case]
        fake_gpu(gpu)
        if "__version__" in versions:
            monkeypatch.setattr(torch, "__version__", versions["__version__"])
        if "cuda" in versions:
            monkeypatch.setattr(torch.version, "cuda", versions["cuda"])
        build = write_build(tmp_path / "checkout", [THIS_TORCH, OTHER_TORCH], archs)
        monkeypatch.setenv("LOCAL_KERNELS", f"{CFG.repo_id}={build}")
        return phrases

    return setup


def warned_once(call):
    """call()'s result and the one warning it gave (every warning is recorded: there must be one)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    assert [w.category for w in caught] == [KernelUnavailableWarning], [str(w.message) for w in caught]
    return result, caught[0]


def assert_stock(model):
    marked_classes = tuple(cls for cls, _, _ in LAYER_CLASSES)
    patched = [name for name, m in model.named_modules()
               if isinstance(m, marked_classes + (type(model),)) or hasattr(m, "processor")
               if getattr(m.forward, "__func__", None) is not type(m).forward]
    assert patched == []
    assert all(type(m.processor) is LTXVideoAttnProcessor for m in model.modules() if hasattr(m, "processor"))


# --- optimize_ltx ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_optimize_ltx_leaves_the_stock_model_with_one_warning_naming_gpu_torch_and_variants(machine, case):
    phrases = machine(case)
    model = tiny_model()
    returned, warning = warned_once(lambda: optimize_ltx(model))
    assert returned is model and not is_optimized(model)
    assert_stock(model)
    message = str(warning.message)
    for phrase in phrases + [f"(CUDA {torch.version.cuda})", f"torch {torch.__version__}", f"{THIS_TORCH} [9.0]",
                             f"{OTHER_TORCH} [9.0]: Torch version (2.12)"]:
        assert phrase in message, (phrase, message)
    assert "/checkout/build: " in message and "torch-ext" not in message
    assert warning.filename == __file__  # it points at the caller's line


@pytest.mark.parametrize("case", ["a100", "no gpu"])
@pytest.mark.parametrize("build", [tiny_ltx2, tiny_mochi, tiny_flux], ids=["ltx2", "mochi", "flux"])
def test_optimize_leaves_a_hooked_model_stock_with_the_same_one_warning(machine, case, build):
    phrases = machine(case)
    model = build()
    processors = [m.processor for m in model.modules() if hasattr(m, "processor")]
    returned, warning = warned_once(lambda: optimize(model))
    assert returned is model and not is_optimized(model)
    assert not any(hasattr(m, "_diffusers_hook") or "forward" in m.__dict__ for m in model.modules())
    assert [m.processor for m in model.modules() if hasattr(m, "processor")] == processors
    assert all(phrase in str(warning.message) for phrase in phrases)
    assert warning.filename == __file__


def test_kernels_own_arch_check_is_a_reason_to_step_aside_too(fake_gpu, monkeypatch, tmp_path):
    """A build whose metadata.json declares other archs than the integration expects: kernels refuses it."""
    fake_gpu(H100)
    build = write_build(tmp_path, [THIS_TORCH], archs=("10.0",))
    monkeypatch.setenv("LOCAL_KERNELS", f"{CFG.repo_id}={build}")
    model = tiny_model()
    _, warning = warned_once(lambda: optimize_ltx(model))
    message = str(warning.message)
    assert (f"kernels refused the build (Kernel 'ltx-kernels' variant '{THIS_TORCH}' does not support the current "
            "device: CUDA capability 9.0 of the current device is not supported by the architectures of the build: "
            "10.0)") in message
    assert f"{THIS_TORCH} [10.0]: compatible" in message
    assert_stock(model)


@pytest.mark.parametrize("failure", [ConnectionError("no route to the Hub"), RuntimeError("undefined symbol: x")])
def test_other_loading_failures_are_raised_not_hidden(fake_gpu, monkeypatch, failure):
    import kernels

    def load(*args, **kwargs):
        raise failure

    fake_gpu(H100)
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "get_kernel", load)
    with pytest.raises(type(failure), match=str(failure)):
        optimize_ltx(tiny_model())


# --- the Hub's variants -------------------------------------------------------------------------------------

def hub_trace(names):
    """What kernels.get_kernel_variants returns for a repository holding `names`."""
    from kernels.variants import parse_variant, resolve_variants

    return resolve_variants([parse_variant(n) for n in names])[1]


def test_from_the_hub_the_warning_lists_the_repositorys_variants_and_nothing_is_downloaded(fake_gpu, monkeypatch):
    import kernels

    fake_gpu(None)
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    asked = []
    monkeypatch.setattr(kernels, "get_kernel_variants",
                        lambda repo_id, **kw: asked.append((repo_id, kw)) or hub_trace([THIS_TORCH, OTHER_TORCH]))
    monkeypatch.setattr(kernels, "get_kernel", lambda *a, **kw: pytest.fail("no GPU: nothing is loaded"))
    model = tiny_model()
    _, warning = warned_once(lambda: optimize_ltx(model))
    assert asked == [(CFG.repo_id, {"version": CFG.version})]
    message = str(warning.message)
    assert f"Variants of {CFG.repo_id} (version {CFG.version}): {THIS_TORCH}: compatible; " in message
    assert f"{OTHER_TORCH}: Torch version (2.12) does not match" in message
    assert_stock(model)


def test_a_hub_variant_list_that_cannot_be_read_is_said_so(fake_gpu, monkeypatch):
    import kernels

    fake_gpu(H100)
    monkeypatch.setattr(torch, "__version__", "2.9.1")
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)

    def no_variant(*args, **kwargs):  # what kernels raises when no variant matches this torch
        raise FileNotFoundError(f"Cannot find a build variant for this system in {CFG.repo_id} (revision: v1):\n\n...")

    def offline(*args, **kwargs):
        raise OSError("offline mode is enabled")

    monkeypatch.setattr(kernels, "get_kernel", no_variant)
    monkeypatch.setattr(kernels, "get_kernel_variants", offline)
    _, warning = warned_once(lambda: optimize_ltx(tiny_model()))
    message = str(warning.message)
    assert f"Cannot find a build variant for this system in {CFG.repo_id} (revision: v1))" in message
    assert f"{CFG.repo_id} (version 1): not listed (OSError: offline mode is enabled)" in message


# --- kernel_mapping and kernelize ---------------------------------------------------------------------------

def kernelize_stock(model, mapping, **options):
    from kernels import Mode, kernelize, use_kernel_mapping

    with use_kernel_mapping(mapping, inherit_mapping=False):
        return kernelize(model, mode=Mode.INFERENCE, device="cuda", **options)


@pytest.mark.parametrize("case", CASES)
def test_kernel_mapping_warns_once_and_kernelize_keeps_every_stock_forward(machine, marked, case, caplog):
    phrases = machine(case)
    mapping, warning = warned_once(lambda: kernel_mapping())
    assert mapping == {name: {} for name in LAYER_NAMES}  # no device: kernelize's NO_DEVICE fallback
    assert all(phrase in str(warning.message) for phrase in phrases)
    model = tiny_model()
    with caplog.at_level(logging.INFO, logger="kernels"):
        kernelize_stock(model, mapping)
    assert_stock(model)
    # kernels' and ours only: diffusers may warn about the tiny model itself
    assert not [r for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.split(".")[0] in ("kernels", "ltx_kernels_diffusers")]


def test_the_mapping_is_for_compute_capability_9_0_only():
    from kernels import CUDAProperties, Device

    assert kernel_device() == Device(type="cuda", properties=CUDAProperties(min_capability=90, max_capability=90))
    assert KERNEL_CUDA_CAPABILITIES == tuple(CFG.capabilities)


def test_on_another_gpu_kernelize_falls_back_by_itself_without_loading(fake_gpu, marked, tmp_path):
    from kernels import KernelizeFallback

    fake_gpu(A100)
    mapping = kernel_mapping(local_path=tmp_path / "no-build", check=False)  # loading it would raise
    model = tiny_model()
    kernelize_stock(model, mapping)
    assert_stock(model)
    with pytest.raises(ValueError, match="with the right properties"):  # kernels' NO_COMPATIBLE_PROPERTIES case
        kernelize_stock(tiny_model(), mapping, use_fallback=KernelizeFallback.NONE)


def test_unchecked_a_kernel_that_cannot_load_raises_unless_kernelize_may_fall_back(machine, marked):
    from kernels import KernelizeFallback

    machine("torch 2.9")
    mapping = kernel_mapping(check=False)
    with pytest.raises(FileNotFoundError, match="Cannot find a build variant"):
        kernelize_stock(tiny_model(), mapping)
    model = tiny_model()
    kernelize_stock(model, mapping, use_fallback=KernelizeFallback.ALL)  # CANNOT_LOAD
    assert_stock(model)


def test_on_a_hopper_the_checked_mapping_loads_the_build_and_maps_every_layer(kernel, fake_gpu):
    fake_gpu(H100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelUnavailableWarning)
        mapping = kernel_mapping(local_path=conftest.KERNEL_ROOT)
    assert set(mapping) == LAYER_NAMES
    assert all(list(devices) == [kernel_device()] for devices in mapping.values())
