"""The LTX-Video layers of ltx_kernels.layers and the kernel mapping, without a
GPU: the layers pass kernels' layer rules against the diffusers classes they
replace, their forwards equal diffusers' modules (with a pure-PyTorch
reference of the op API), and kernelize with the documented mapping swaps
them in for Mode.INFERENCE and Mode.INFERENCE | Mode.TORCH_COMPILE (the
kernelized model then runs, and compiles, on meta tensors through the ops'
fake implementations)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers.models.activations import GELU as DiffusersGELU  # noqa: E402
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm  # noqa: E402
from diffusers.models.transformers.transformer_ltx import LTXAttention, LTXVideoTransformerBlock  # noqa: E402

from ltx_kernels_diffusers import kernel_device, kernel_mapping  # noqa: E402
from ltx_kernels_diffusers.kernelize import LAYER_CLASSES  # noqa: E402

from . import conftest
from .conftest import ROOT  # noqa: E402
from .integration_support import (TINY_CONFIG, TINY_VIDEO, ReferenceKernel, ltx_inputs, marked,  # noqa: E402, F401
                                  tiny_model)

LTX_LAYERS = {  # layer class -> the diffusers class whose forward it replaces
    "LTXVideoTransformerBlock": LTXVideoTransformerBlock, "LTXVideoTransformerBlockFast": LTXVideoTransformerBlock,
    "LTXAttention": LTXAttention, "LTXAttentionFast": LTXAttention,
    "GELU": DiffusersGELU, "LinearGELU": DiffusersGELU, "RMSNorm": DiffusersRMSNorm,
}


@pytest.fixture
def cuda_capability_90(monkeypatch):
    """kernelize looks up CUDA mappings by the device's capability; pretend an H100."""
    import kernels.layer.repos as repos

    monkeypatch.setattr(repos, "_find_capability", lambda: 90)


def kernelize_tiny(model, mode, **mapping_options):
    """kernelize under the mapping of the local build; check=False: the mapping is built as on a Hopper
    (test_integration_off_hopper_cpu.py covers the check), only kernels' capability lookup is faked."""
    from kernels import kernelize, use_kernel_mapping

    mapping = kernel_mapping(local_path=conftest.KERNEL_ROOT, check=False, **mapping_options)
    with use_kernel_mapping(mapping, inherit_mapping=False):
        return kernelize(model, mode=mode, device="cuda")


# --- kernels' layer rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LTX_LAYERS))
def test_layer_passes_kernels_validation_against_the_diffusers_class(kernel, name):
    from kernels.layer.layer import _validate_layer

    _validate_layer(check_cls=LTX_LAYERS[name], cls=getattr(kernel.layers, name), repo="x")


@pytest.mark.parametrize("name", sorted(LTX_LAYERS))
def test_layer_is_stateless_compile_capable_and_inference_only(kernel, name):
    cls = getattr(kernel.layers, name)
    assert cls.__init__ is nn.Module.__init__
    assert cls.can_torch_compile is True and cls.has_backward is False


def test_layers_module_exports_every_ltx_layer(kernel):
    assert set(LTX_LAYERS) <= set(kernel.layers.__all__)


def test_layers_call_the_fused_qk_norm_rope_of_the_package(kernel):
    assert kernel.layers.PackageOps.qk_rmsnorm_rope is kernel.qk_rmsnorm_rope


# --- the fused forwards equal diffusers' modules --------------------------------------------------

@pytest.fixture
def block_inputs():
    """A tiny bf16 model and the arguments its first block receives."""
    model = tiny_model(torch.bfloat16)
    inputs = ltx_inputs(model, **TINY_VIDEO)
    captured = {}
    block = model.transformer_blocks[0]
    handle = block.register_forward_pre_hook(lambda m, args, kwargs: captured.update(kwargs), with_kwargs=True)
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    return model, captured


@pytest.mark.parametrize("exact_mode", [True, False])
def test_block_forward_equals_the_diffusers_block(kernel, block_inputs, exact_mode):
    model, kwargs = block_inputs
    block = model.transformer_blocks[0]
    with torch.no_grad():
        expected = block(**kwargs)
        got = kernel.layers.ltx_block_forward(block, **kwargs, kernel=ReferenceKernel(kernel), exact_mode=exact_mode)
    assert torch.equal(got, expected) if exact_mode else (got.float() - expected.float()).abs().max() < 0.1


def test_chained_block_forward_hands_the_next_norm_on(kernel, block_inputs):
    model, kwargs = block_inputs
    first, second = model.transformer_blocks[0], model.transformer_blocks[1]
    reference = ReferenceKernel(kernel)
    with torch.no_grad():
        expected = second(**{**kwargs, "hidden_states": first(**kwargs)})
        hidden, norm = kernel.layers.ltx_block_forward(first, **kwargs, kernel=reference, next_block=second)
        got = kernel.layers.ltx_block_forward(second, **{**kwargs, "hidden_states": hidden}, kernel=reference,
                                              norm_hidden_states=norm)
    assert torch.equal(got, expected)


def test_attention_forward_equals_diffusers_with_and_without_rope(kernel, block_inputs):
    model, kwargs = block_inputs
    attn1, attn2 = model.transformer_blocks[0].attn1, model.transformer_blocks[0].attn2
    reference = ReferenceKernel(kernel)
    x, text = kwargs["hidden_states"], kwargs["encoder_hidden_states"]
    rope, mask = kwargs["image_rotary_emb"], kwargs["encoder_attention_mask"]
    with torch.no_grad():
        assert torch.equal(kernel.layers.ltx_attention_forward(attn1, x, None, None, rope, kernel=reference),
                           attn1(x, image_rotary_emb=rope))
        assert torch.equal(kernel.layers.ltx_attention_forward(attn2, x, text, mask, None, kernel=reference),
                           attn2(x, encoder_hidden_states=text, attention_mask=mask))


def test_gelu_forward_equals_diffusers_gelu_and_the_epilogue_is_close(kernel):
    torch.manual_seed(0)
    gelu = DiffusersGELU(16, 64, approximate="tanh").bfloat16()
    x = torch.randn(2, 5, 16).bfloat16()
    reference = ReferenceKernel(kernel)
    with torch.no_grad():
        expected = gelu(x)
        assert torch.equal(kernel.layers.gelu_forward(gelu, x, kernel=reference), expected)
        fused = kernel.layers.gelu_forward(gelu, x, kernel=reference, epilogue=True)
    assert (fused.float() - expected.float()).abs().max() <= 2 ** -6 * expected.float().abs().max()


# --- the mapping and kernelize ---------------------------------------------------------------------

@pytest.mark.parametrize("exact_mode, gelu_epilogue, expected", [
    (True, True, {"LTXVideoTransformerBlock": "LTXVideoTransformerBlock", "LTXAttention": "LTXAttention",
                  "GELU": "LinearGELU", "RMSNorm": "RMSNorm"}),
    (False, False, {"LTXVideoTransformerBlock": "LTXVideoTransformerBlockFast", "LTXAttention": "LTXAttentionFast",
                    "GELU": "GELU", "RMSNorm": "RMSNorm"}),
])
def test_mapping_names_a_layer_of_the_package_for_each_diffusers_class(kernel, exact_mode, gelu_epilogue,
                                                                        expected):
    mapping = kernel_mapping(exact_mode=exact_mode, gelu_epilogue=gelu_epilogue, local_path=conftest.KERNEL_ROOT,
                             check=False)
    assert {key: repos[kernel_device()].layer_name for key, repos in mapping.items()} == expected
    assert all(hasattr(kernel.layers, name) for name in expected.values())
    assert {name for _, name, _ in LAYER_CLASSES} == set(mapping)


def test_mapping_uses_the_local_build_that_local_kernels_names(monkeypatch):
    from kernels import LayerRepository, LocalLayerRepository

    monkeypatch.setenv("LOCAL_KERNELS", f"other/kernel=/x:ltx-kernels/ltx-kernels={ROOT}")
    local = kernel_mapping(check=False)["RMSNorm"][kernel_device()]
    assert isinstance(local, LocalLayerRepository) and Path(local._repo_path) == ROOT
    monkeypatch.delenv("LOCAL_KERNELS")
    hub = kernel_mapping(check=False)["RMSNorm"][kernel_device()]
    assert isinstance(hub, LayerRepository) and hub._version == 1 and hub._repo_id == "ltx-kernels/ltx-kernels"


@pytest.mark.parametrize("compile_mode", [False, True])
def test_kernelize_swaps_in_the_layers_for_inference(kernel, marked, cuda_capability_90, compile_mode):
    from kernels import Mode

    model = tiny_model(torch.bfloat16)
    mode = Mode.INFERENCE | Mode.TORCH_COMPILE if compile_mode else Mode.INFERENCE
    kernelize_tiny(model, mode)
    block = model.transformer_blocks[0]
    layer_names = {"block": block, "attn1": block.attn1, "attn2": block.attn2, "gelu": block.ff.net[0],
                   "norm1": block.norm1}
    assert {key: m.forward.__func__.__qualname__ for key, m in layer_names.items()} == {
        "block": "LTXVideoTransformerBlock.forward", "attn1": "LTXAttention.forward",
        "attn2": "LTXAttention.forward", "gelu": "LinearGELU.forward", "norm1": "RMSNorm.forward"}
    assert block.forward.__func__ is kernel.layers.LTXVideoTransformerBlock.forward


def test_kernelize_for_training_keeps_the_stock_forwards(kernel, marked, cuda_capability_90):
    from kernels import Mode

    model = tiny_model()
    kernelize_tiny(model, Mode.TRAINING)
    block = model.transformer_blocks[0]
    assert block.forward.__func__ is LTXVideoTransformerBlock.forward
    assert block.attn1.forward.__func__ is LTXAttention.forward


def test_kernelize_leaves_modules_the_layers_do_not_fit(kernel, marked, cuda_capability_90):
    from kernels import Mode

    model = tiny_model()
    model.transformer_blocks[1].norm2 = nn.LayerNorm(16)
    kernelize_tiny(model, Mode.INFERENCE)
    assert model.transformer_blocks[0].forward.__func__ is kernel.layers.LTXVideoTransformerBlock.forward
    assert model.transformer_blocks[1].forward.__func__ is LTXVideoTransformerBlock.forward


@pytest.mark.parametrize("exact_mode", [True, False])
def test_kernelized_model_runs_and_compiles_through_the_real_ops(kernel, marked, cuda_capability_90, exact_mode):
    from kernels import Mode

    model = tiny_model(torch.bfloat16).to("meta")
    inputs = ltx_inputs(model, **TINY_VIDEO, device="meta")
    # linear_gelu refuses non-CUDA tensors, meta included: the GELU layer without epilogue here
    kernelize_tiny(model, Mode.INFERENCE | Mode.TORCH_COMPILE, exact_mode=exact_mode, gelu_epilogue=False)
    expected_shape = (TINY_VIDEO["batch"], 24, TINY_CONFIG["out_channels"])
    with torch.no_grad():
        assert model(**inputs)[0].shape == expected_shape
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        assert compiled(**inputs)[0].shape == expected_shape
