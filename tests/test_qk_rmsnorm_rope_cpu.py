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


def test_out_is_refused_with_inplace_unless_a_pair_of_q_shaped_q_typed_per_token_contiguous_tensors(kernel):
    q = torch.empty(2, 4, 8, 64, dtype=torch.bfloat16, device="meta")
    tab = tables(4, 64, "meta")
    with pytest.raises(ValueError, match="give `out` or `inplace=True`, not both"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tab, out=(q, q), inplace=True)
    with pytest.raises(TypeError, match="`out` must be a pair of tensors"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tab, out=q)
    with pytest.raises(RuntimeError, match=r"`out\[1\]` has shape \[2, 5, 8, 64\] but `q` has shape"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tab, out=(q, torch.empty_like(q)[:, :1].expand(2, 5, 8, 64)))
    with pytest.raises(TypeError, match=r"`out\[1\]` is torch.float32 on meta but `q` is torch.bfloat16 on meta"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tab, out=(q, q.float()))
    heads_apart = torch.empty(2, 8, 4, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    with pytest.raises(RuntimeError, match=r"`out\[0\]` must hold each token's channels contiguously"):
        kernel.qk_rmsnorm_rope(q, q, None, None, *tab, out=(heads_apart, q))


def test_out_may_be_the_video_part_of_a_joint_tensor(kernel):
    """Mochi's joint [video | text] q and k: the fused pass writes the video rows in place (meta: the
    wrapper's checks and views; the values are the GPU test's)."""
    q = torch.empty(2, 4, 8, 64, dtype=torch.bfloat16, device="meta")
    joint = torch.empty(2, 4 + 3, 8, 64, dtype=torch.bfloat16, device="meta")
    out = (joint[:, :4], joint.clone()[:, :4])
    got = kernel.qk_rmsnorm_rope(q, q, None, None, *tables(4, 64, "meta"), head_dim=64, out=out)
    assert got[0] is out[0] and got[1] is out[1]


# --- the differentiable path (issue 36) ------------------------------------------

@pytest.mark.parametrize("needs", [("q",), ("q_weight",), ("q", "k", "q_weight", "k_weight")])
def test_autograd_records_and_backward_gives_each_grad_asked_for(kernel, needs):
    """The registered backward runs on meta tensors (the functional ops' fakes): grads of the right
    shapes and dtypes for the tensors that require grad, none for the others."""
    def leaf(name, shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta").requires_grad_(name in needs)

    q, k = leaf("q", (2, 5, 4, 64), torch.bfloat16), leaf("k", (2, 5, 4, 64), torch.bfloat16)
    wq, wk = leaf("q_weight", (64,), torch.float32), leaf("k_weight", (64,), torch.float32)
    cos, sin = tables(5, 64, device="meta")
    qo, ko = kernel.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, head_dim=64)
    assert qo.shape == q.shape and qo.grad_fn is not None
    (qo.sum() + ko.sum()).backward()
    for name, t in (("q", q), ("k", k), ("q_weight", wq), ("k_weight", wk)):
        assert (t.grad is None) == (name not in needs), name
        if t.grad is not None:
            assert (t.grad.shape, t.grad.dtype) == (t.shape, t.dtype), name


def test_the_differentiable_path_refuses_cpu_tensors_inplace_and_out(kernel):
    q = torch.zeros(1, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = tables(2, 64)
    with pytest.raises(RuntimeError, match="ltx_kernels.qk_rmsnorm_rope: `q` must be a CUDA tensor"):
        kernel.qk_rmsnorm_rope(q, q.detach(), None, None, cos, sin)
    with pytest.raises(kernel.NoBackwardError, match=r"`q` requires grad.*`inplace`"):
        kernel.qk_rmsnorm_rope(q, q.detach(), None, None, cos, sin, inplace=True)
    with pytest.raises(kernel.NoBackwardError, match=r"`q` requires grad.*`out`"):
        kernel.qk_rmsnorm_rope(q, q.detach(), None, None, cos, sin, out=(torch.empty_like(q), torch.empty_like(q)))
