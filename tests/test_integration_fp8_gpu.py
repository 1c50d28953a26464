"""optimize(..., fp8=True) on LTX-Video 0.9 (issue 37), on the GPU (skipped without CUDA): the 2B
config with random weights at a reduced depth, inputs of 49 frames at 512x768.

The block linears become Fp8Linear, fed e4m3 rows by the norms and GELU that produce their
inputs; the output's relative L2 to an fp32 run is within 3x stock bf16's; restore gives the stock
model back bit for bit; regional torch.compile (fullgraph) gives the eager FP8 output."""

from __future__ import annotations

import copy

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from ltx_kernels_diffusers import UnsupportedModelError, optimize, restore  # noqa: E402
from ltx_kernels_diffusers.models.ltx_video import FP8_LINEARS  # noqa: E402

from .hook_support import check_quality_target, run  # noqa: E402
from .integration_support import LTX_2B_VIDEO, ltx_inputs, rel_l2  # noqa: E402
from .test_integration_gpu import ltx_model  # noqa: E402

LAYERS = 4


@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_is_within_3x_stock_bf16_error_of_fp32(kernel, fast_accum):
    fp32 = ltx_model(torch.float32, num_layers=LAYERS)
    model = copy.deepcopy(fp32).to(torch.bfloat16)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    ours, stock = check_quality_target(kernel, fp32, model, inputs, True, bar=3.0, fp8=True,
                                       fp8_fast_accum=fast_accum)
    print(f"relative L2 to fp32: fp8 {ours:.4g}, stock bf16 {stock:.4g} ({ours / stock:.2f}x)")


def test_fp8_converts_the_block_linears_and_feeds_them_e4m3_rows(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    optimize(model, kernel=kernel, fp8=True)
    for block in model.transformer_blocks:
        for path in FP8_LINEARS:
            assert isinstance(block.get_submodule(path), kernel.Fp8Linear), path
        assert type(block.attn2.to_k) is torch.nn.Linear  # the text side stays bf16
    seen = []
    block = model.transformer_blocks[1]
    handles = [linear.register_forward_pre_hook(lambda module, args: seen.append(type(args[0]).__name__))
               for linear in (block.attn1.to_q, block.attn2.to_q, block.ff.net[2])]
    run(model, inputs)
    for handle in handles:
        handle.remove()
    # chained: block 0's seam wrote block 1's norm1 output in e4m3; the residual after self-attention and
    # the GELU wrote theirs
    assert seen == ["Fp8Rows"] * 3


def test_restore_after_fp8_gives_the_stock_model_back(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    expected = run(model, inputs)
    optimize(model, kernel=kernel, fp8=True)
    fp8 = run(model, inputs)
    assert 0 < rel_l2(fp8, expected) < 0.1
    restore(model)
    assert type(model.transformer_blocks[0].ff.net[2]) is torch.nn.Linear
    assert torch.equal(run(model, inputs), expected)


def test_fp8_under_regional_compile_gives_the_eager_output(kernel):
    model = ltx_model(torch.bfloat16, num_layers=3)
    inputs = ltx_inputs(model, **LTX_2B_VIDEO)
    optimize(model, kernel=kernel, fp8=True)
    eager = run(model, inputs)
    torch._dynamo.reset()
    model.compile_repeated_blocks(fullgraph=True)
    compiled = run(model, inputs)
    assert rel_l2(compiled, eager) < 2e-2


def test_fp8_refuses_a_lora_wrapped_linear_before_changing_anything(kernel):
    model = ltx_model(torch.bfloat16, num_layers=2)
    block = model.transformer_blocks[0]
    original = block.attn1.to_q

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    block.attn1.to_q = Wrapped(original)
    with pytest.raises(UnsupportedModelError, match="attn1.to_q is a Wrapped"):
        optimize(model, kernel=kernel, fp8=True)
    assert type(block.attn1.to_k) is torch.nn.Linear and "forward" not in block.__dict__
