"""RoPE application without a GPU: errors naming the argument and the fake
implementation's shape (meta tensors, as torch.compile traces them)."""

from __future__ import annotations

import pytest
import torch


def test_apply_rotary_emb_on_cpu_tensors_names_the_argument(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(1, 2, 4, None, 64, batch_size=2)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="`x` must be a CUDA tensor"):
        kernel.apply_rotary_emb(x, cos, sin)


def test_apply_rotary_emb_fake_gives_the_output_shape(kernel):
    x = torch.empty(2, 8, 64, dtype=torch.bfloat16, device="meta")
    t = torch.empty(1, 8, 64, device="meta")
    assert kernel.apply_rotary_emb(x, t, t).shape == (2, 8, 64)


# --- the differentiable path (issue 36) ------------------------------------------

def meta(shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.empty(shape, dtype=dtype, device="meta").requires_grad_(requires_grad)


def test_autograd_records_apply_rotary_emb_and_backward_gives_x_its_grad(kernel):
    """The registered backward runs on meta tensors, through the functional ops' fakes."""
    x = meta((2, 6, 64), requires_grad=True)
    y = kernel.apply_rotary_emb(x, meta((1, 6, 64), torch.float32), meta((1, 6, 64), torch.float32))
    assert y.grad_fn is not None and y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    assert (x.grad.shape, x.grad.dtype) == (x.shape, x.dtype)


def test_the_differentiable_path_refuses_cpu_tensors_and_out(kernel):
    x = torch.zeros(1, 2, 8, dtype=torch.bfloat16, requires_grad=True)
    cos = sin = torch.zeros(1, 2, 8)
    with pytest.raises(RuntimeError, match=r"ltx_kernels.apply_rotary_emb: `x` must be a CUDA tensor"):
        kernel.apply_rotary_emb(x, cos, sin)
    with pytest.raises(kernel.NoBackwardError, match=r"`x` requires grad.*`out`"):
        kernel.apply_rotary_emb(x, cos, sin, out=torch.empty_like(x))
    with pytest.raises(RuntimeError, match=r"apply_rotary_emb_bwd: `x` must be a CUDA tensor"):
        kernel.ops.apply_rotary_emb_bwd(x.detach(), cos, sin)
