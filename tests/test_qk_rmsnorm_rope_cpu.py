"""Fused q/k RMSNorm + RoPE without a GPU: argument errors that name the
argument, and the fake implementation's shapes (meta tensors, as
torch.compile traces them)."""

from __future__ import annotations

import pytest
import torch


def tables(S, C, device="cpu"):
    return torch.ones(1, S, C, device=device), torch.zeros(1, S, C, device=device)


def test_cpu_tensors_are_refused_naming_q(kernel):
    q = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="`q` must be a CUDA tensor"):
        kernel.qk_rmsnorm_rope(q, q.clone(), None, None, *tables(4, 64))


@pytest.mark.parametrize("kwargs, message", [
    ({"rotation": "complex"}, "`rotation` must be one of"),
    ({"rounding": "A+B"}, "`rounding` must be 'torch' or 'diffusers'"),
])
def test_unknown_modes_are_refused(kernel, kwargs, message):
    q = torch.randn(2, 4, 64, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tables(4, 64, "meta"), **kwargs)


def test_four_dim_input_with_another_head_dim_is_refused(kernel):
    q = torch.randn(2, 4, 2, 32, device="meta", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Dh=32 but head_dim=16"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tables(4, 32, "meta"), head_dim=16)


def test_two_dim_input_is_refused(kernel):
    q = torch.randn(4, 64, device="meta", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"must be \[B, S, D\] or \[B, S, H, Dh\]"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tables(4, 64, "meta"))


@pytest.mark.parametrize("shape, head_dim", [((2, 8, 256), None), ((2, 8, 256), 64), ((2, 8, 4, 64), None)])
def test_fake_gives_outputs_of_the_input_shape(kernel, shape, head_dim):
    q = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    k = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    C = head_dim or shape[-1]
    qo, ko = kernel.qk_rmsnorm_rope(q, k, None, None, *tables(8, C, "meta"), head_dim=head_dim)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == torch.bfloat16


def test_in_place_on_a_layout_that_cannot_be_viewed_is_refused(kernel):
    # [B, S, H, Dh] with heads not adjacent in memory: flattening would copy, so
    # an in-place result could not land in q.
    q = torch.empty(2, 4, 8, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    with pytest.raises(RuntimeError, match="view"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tables(8, 64, "meta"), inplace=True)
