"""1-D / 3-D RoPE (rope_3d, rope_1d) without a GPU: every argument error of
the binding (validation runs before the device check, so CPU tensors reach
it), the fake implementation on meta tensors and a fullgraph trace (what
torch.compile sees), the op schemas, and the float64 reference against
Wan 2.1's own formulations. Loads the built variant through
kernels.get_kernel (LOCAL_KERNELS)."""

from __future__ import annotations

import importlib
import math
import re

import pytest
import torch

from ltx_dev.reference.rope_axes import (angles_1d, diffusers_wan_rotary_apply, diffusers_wan_tables, rope_1d_f64,
                                         rope_3d_f64, rope_3d_split, rotate_f64, wan_original_rope)

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(scope="session")
def ra(kernel):
    """ltx_kernels.rope_axes of the built variant (imported directly, so these
    tests do not depend on what __init__.py re-exports)."""
    return importlib.import_module(kernel.__name__ + ".rope_axes")


def qk(shape_q=(2, 60, 4, 64), heads_k=None, dtype=BF16):
    q = torch.randn(shape_q).to(dtype)
    k = torch.randn(*shape_q[:2], shape_q[2] if heads_k is None else heads_k, shape_q[3]).to(dtype)
    return q, k


def raises(exc, message):
    return pytest.raises(exc, match=re.escape(message))


# --- the split and the references ---------------------------------------------------

@pytest.mark.parametrize("head_dim, split", [(128, (44, 42, 42)), (64, (24, 20, 20)), (96, (32, 32, 32)),
                                             (80, (28, 26, 26)), (2, (2, 0, 0)), (12, (4, 4, 4))])
def test_split_is_wans(ra, head_dim, split):
    assert ra.rope_3d_split(head_dim) == split == rope_3d_split(head_dim)


def test_split_matches_diffusers_wan_rotary_pos_embed():
    try:
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    except Exception as e:  # noqa: BLE001 - diffusers, or one of its own dependencies, is missing
        pytest.skip(f"diffusers is not importable here: {e!r}")
    for head_dim in (128, 64, 96, 80, 36):
        m = WanRotaryPosEmbed(head_dim, (1, 2, 2), 1024)
        assert (m.t_dim, m.h_dim, m.w_dim) == rope_3d_split(head_dim)


@pytest.mark.parametrize("head_dim", [128, 64, 80])
def test_reference_is_wans_original_complex_multiply(head_dim):
    q = torch.randn(2, 3 * 5 * 7, 4, head_dim, dtype=torch.float64)
    ref, _ = rope_3d_f64(q, q[:, :, :1], 3, 5, 7)
    torch.testing.assert_close(ref, wan_original_rope(q, 3, 5, 7), rtol=0, atol=1e-12)


@pytest.mark.parametrize("head_dim", [128, 64])
def test_reference_is_diffusers_wan_rotation(head_dim):
    try:
        cos, sin = diffusers_wan_tables(head_dim, 3, 5, 7)
    except ImportError as e:
        pytest.skip(f"diffusers is not importable here: {e!r}")
    q = torch.randn(2, 3 * 5 * 7, 4, head_dim)
    ref, _ = rope_3d_f64(q, q[:, :, :1], 3, 5, 7)
    # diffusers rounds the tables and the products to float32
    torch.testing.assert_close(diffusers_wan_rotary_apply(q, cos, sin).double(), ref, rtol=0, atol=1e-5)


def test_reference_1d_is_the_1d_formula():
    q = torch.randn(1, 9, 2, 8, dtype=torch.float64)
    ref, _ = rope_1d_f64(q, q)
    s, j = 7, 3
    angle = s * 10000.0 ** (-2 * j / 8)
    x0, x1 = q[0, s, 1, 2 * j].item(), q[0, s, 1, 2 * j + 1].item()
    assert ref[0, s, 1, 2 * j].item() == pytest.approx(x0 * math.cos(angle) - x1 * math.sin(angle), abs=1e-12)
    assert ref[0, s, 1, 2 * j + 1].item() == pytest.approx(x1 * math.cos(angle) + x0 * math.sin(angle), abs=1e-12)
    assert torch.equal(rotate_f64(q, angles_1d(9, 8)), ref)


# --- argument errors (CPU tensors reach the binding's checks) -------------------------

def test_cpu_tensors_are_refused_naming_query(ra, kernel):
    q, k = qk()
    with raises(RuntimeError, "ltx_kernels.rope_3d: `query` must be a CUDA tensor, got a tensor on cpu"):
        ra.rope_3d(q, k, 3, 4, 5)
    with raises(RuntimeError, "ltx_kernels.rope_1d: `query` must be a CUDA tensor, got a tensor on cpu"):
        ra.rope_1d(q, k)


def test_path_probe_refuses_cpu_tensors_naming_query(dev_kernel):
    q, k = qk()
    with raises(RuntimeError, "ltx_kernels.rope_axes_path: `query` must be a CUDA tensor"):
        dev_kernel.ops.rope_axes_path(q, k)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64])
def test_unsupported_dtype_lists_the_supported_ones(ra, dtype):
    q, k = qk(dtype=dtype)
    msg = r"`query` has dtype .*; supported dtypes are torch\.bfloat16, torch\.float16 and torch\.float32"
    with pytest.raises(TypeError, match=msg):
        ra.rope_3d(q, k, 3, 4, 5)
    with pytest.raises(TypeError, match=msg.replace("query", "key")):
        ra.rope_1d(q.to(BF16), k)


def test_key_of_another_dtype_is_refused_naming_key(ra):
    q, k = qk()
    with raises(TypeError, "ltx_kernels.rope_3d: `key` has dtype Half but `query` has dtype BFloat16; they must "
                "match"):
        ra.rope_3d(q, k.half(), 3, 4, 5)


@pytest.mark.parametrize("which", ["query", "key"])
def test_non_4d_input_is_refused_naming_it(ra, which):
    q, k = qk()
    args = {"query": q[0], "key": k} if which == "query" else {"query": q, "key": k.flatten(2)}
    shape = list(args[which].shape)
    with raises(RuntimeError, f"`{which}` must be [batch, seq, heads, head_dim], got shape {shape}"):
        ra.rope_1d(args["query"], args["key"])


@pytest.mark.parametrize("k_shape", [(1, 60, 4, 64), (2, 59, 4, 64), (2, 60, 4, 32)])
def test_key_must_match_batch_seq_and_head_dim(ra, k_shape):
    q = torch.randn(2, 60, 4, 64, dtype=BF16)
    k = torch.randn(k_shape, dtype=BF16)
    with raises(RuntimeError, f"`key` has shape {list(k_shape)} but `query` has shape [2, 60, 4, 64]; batch, seq "
                "and head_dim must match (the head counts may differ)"):
        ra.rope_1d(q, k)


@pytest.mark.parametrize("heads_q, heads_k", [(8, 2), (2, 8), (3, 0), (0, 3)])
def test_different_head_counts_pass_validation(ra, heads_q, heads_k):
    q, k = qk((2, 60, heads_q, 64), heads_k)
    with raises(RuntimeError, "`query` must be a CUDA tensor"):  # the last check: everything else passed
        ra.rope_3d(q, k, 3, 4, 5)


def test_odd_head_dim_is_refused(ra):
    q, k = qk((2, 60, 4, 63))
    with raises(RuntimeError, "ltx_kernels.rope_3d: the head_dim of `query` and `key` must be even (interleaved "
                "pairs), got 63"):
        ra.rope_3d(q, k, 3, 4, 5)


def test_head_dim_above_512_is_refused(ra):
    q, k = qk((1, 2, 1, 514))
    with raises(RuntimeError, "the head_dim of `query` and `key` must be at most 512, got 514"):
        ra.rope_1d(q, k)


@pytest.mark.parametrize("grid", [(3, 4, 4), (4, 3, 4), (60, 1, 2), (0, 4, 5)])
def test_grid_must_cover_seq(ra, grid):
    q, k = qk()
    f, h, w = grid
    with raises(RuntimeError, f"ltx_kernels.rope_3d: `num_frames` * `height` * `width` ({f} * {h} * {w}) must "
                "equal the seq dim of `query` and `key`, 60"):
        ra.rope_3d(q, k, f, h, w)


@pytest.mark.parametrize("name, grid, bad", [("num_frames", (-1, 4, 5), -1), ("height", (3, -4, 5), -4),
                                             ("width", (1, 1, 2 ** 24 + 1), 2 ** 24 + 1)])
def test_axis_sizes_out_of_range_are_named(ra, name, grid, bad):
    q, k = qk()
    with raises(RuntimeError, f"`{name}` must be in [0, 2^24] (positions exact in float32), got {bad}"):
        ra.rope_3d(q, k, *grid)


def test_1d_seq_above_2_pow_24_is_refused(ra):
    q = torch.zeros(1, 1, 1, 2, dtype=BF16).expand(1, 2 ** 24 + 1, 1, 2)  # no memory behind it
    with raises(RuntimeError, "ltx_kernels.rope_1d: the seq dim of `query` and `key` must be at most 2^24 "
                "(positions exact in float32), got 16777217"):
        ra.rope_1d(q, q)


@pytest.mark.parametrize("theta", [0.0, -10000.0, float("nan"), float("inf")])
def test_bad_theta_base_is_refused(ra, theta):
    q, k = qk()
    with raises(RuntimeError, "`theta_base` must be finite and > 0, got"):
        ra.rope_3d(q, k, 3, 4, 5, theta)
    with raises(RuntimeError, "`theta_base` must be finite and > 0, got"):
        ra.rope_1d(q, k, theta)


@pytest.mark.parametrize("which", ["query", "key"])
def test_non_contiguous_last_dim_is_refused_naming_it(ra, which):
    q, k = qk()
    strided = torch.randn(2, 60, 4, 128, dtype=BF16)[..., ::2]
    args = {"query": q, "key": k, which: strided}
    with raises(RuntimeError, f"`{which}` must have a contiguous last dim (stride 1), got strides "
                "[30720, 512, 128, 2] for shape [2, 60, 4, 64]"):
        ra.rope_3d(args["query"], args["key"], 3, 4, 5)


def test_expanded_input_is_refused_as_overlapping(ra):
    q, k = qk()
    expanded = torch.randn(2, 60, 1, 64, dtype=BF16).expand(2, 60, 4, 64)
    with raises(RuntimeError, "`key` has overlapping elements or an interleaved layout (shape [2, 60, 4, 64], "
                "strides [3840, 64, 0, 1])"):
        ra.rope_3d(q, expanded, 3, 4, 5)


def test_query_and_key_sharing_elements_are_refused(ra):
    q, _ = qk()
    msg = "`query` and `key` overlap in memory; both are rotated in place"
    with raises(RuntimeError, msg):
        ra.rope_1d(q, q)
    with raises(RuntimeError, msg):  # overlapping head ranges of one tensor
        ra.rope_1d(q[:, :, :2], q[:, :, 1:3])
    with raises(RuntimeError, msg):  # the same memory through another view
        ra.rope_1d(q, q.view(2, 60, 4, 64)[:, :, :1])


@pytest.mark.parametrize("layout", ["fused qkv [B,S,3,H,D]", "packed GQA [B,S,Hq+2Hk,D]", "heads interleaved",
                                    "[B,H,S,D] transposed", "halves of one buffer"])
def test_disjoint_views_pass_validation(ra, layout):
    b, s, h, d = 2, 60, 4, 64
    if layout.startswith("fused"):
        q, k, _ = torch.randn(b, s, 3, h, d, dtype=BF16).unbind(2)
    elif layout.startswith("packed"):
        x = torch.randn(b, s, 8 + 2 * 2, d, dtype=BF16)
        q, k = x[:, :, :8], x[:, :, 8:10]
    elif layout.startswith("heads"):
        x = torch.randn(b, s, h, 2, d, dtype=BF16)
        q, k = x[:, :, :, 0], x[:, :, :, 1]
    elif layout.startswith("[B,H"):
        q, k = (t.transpose(1, 2) for t in torch.randn(2, b, h, s, d, dtype=BF16))
    else:
        q, k = torch.randn(2 * b, s, h, d, dtype=BF16).chunk(2)
    with raises(RuntimeError, "`query` must be a CUDA tensor"):  # the last check: everything else passed
        ra.rope_3d(q, k, 3, 4, 5)


# --- fake implementation, compile, schemas -----------------------------------------------

def test_meta_tensors_return_the_inputs(ra):
    q = torch.empty(2, 60, 8, 128, dtype=BF16, device="meta")
    k = torch.empty(2, 60, 2, 128, dtype=BF16, device="meta")
    q2, k2 = ra.rope_3d(q, k, 3, 4, 5)
    assert q2 is q and k2 is k
    q3, k3 = ra.rope_1d(q, k, 500.0)
    assert q3 is q and k3 is k


def test_fullgraph_trace_keeps_both_ops(ra, kernel):
    """What torch.compile(fullgraph=True) sees: no graph break, both custom ops in
    the graph (meta tensors: no GPU)."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    def f(q, k, qt, kt):
        q, k = ra.rope_3d(q, k, 3, 4, 5)
        qt, kt = ra.rope_1d(qt, kt, theta_base=500.0)
        return q.sum() + k.sum() + qt.sum() + kt.sum()

    m = dict(dtype=BF16, device="meta")
    out = torch.compile(f, backend=backend, fullgraph=True)(torch.empty(2, 60, 8, 64, **m),
                                                            torch.empty(2, 60, 2, 64, **m),
                                                            torch.empty(2, 16, 4, 64, **m),
                                                            torch.empty(2, 16, 4, 64, **m))
    assert out.device.type == "meta"
    code = seen[0].code
    ns = kernel.__name__.split(".")[-1]
    assert f"{ns}.rope_3d" in code and f"{ns}.rope_1d" in code, code


def test_schemas_declare_the_in_place_arguments(kernel):
    s3 = str(kernel.ops.rope_3d.default._schema)
    s1 = str(kernel.ops.rope_1d.default._schema)
    assert "Tensor(a!) query, Tensor(b!) key, int num_frames, int height, int width, float theta_base) -> ()" in s3
    assert "Tensor(a!) query, Tensor(b!) key, float theta_base) -> ()" in s1


# --- the differentiable path (issue 36) ------------------------------------------

@pytest.mark.parametrize("three_d", [True, False])
def test_autograd_records_out_of_place_and_backward_gives_query_and_key_grads(ra, three_d):
    """On meta tensors through the functional op's fake: new results in the graph, inputs untouched."""
    q = torch.empty(2, 12, 4, 64, dtype=BF16, device="meta", requires_grad=True)
    k = torch.empty(2, 12, 2, 64, dtype=BF16, device="meta", requires_grad=True)
    out = ra.rope_3d(q, k, 2, 2, 3) if three_d else ra.rope_1d(q, k)
    assert out[0] is not q and out[1] is not k and all(t.grad_fn is not None for t in out)
    (out[0].sum() + out[1].sum()).backward()
    assert (q.grad.shape, q.grad.dtype, k.grad.shape) == (q.shape, BF16, k.shape)


def test_the_functional_op_checks_arguments_like_the_in_place_one(kernel):
    q = torch.zeros(1, 6, 2, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match=re.escape("`num_frames` * `height` * `width` (1 * 2 * 2)")):
        kernel.ops.rope_axes_fwd(q, q, 1, 2, 2, 10000.0, True, False)
    with pytest.raises(RuntimeError, match="rope_1d: `query` must be a CUDA tensor"):
        kernel.ops.rope_axes_fwd(q, q, 0, 1, 1, 10000.0, False, True)  # reading one tensor twice is fine
