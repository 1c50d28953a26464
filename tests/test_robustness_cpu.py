"""Robustness properties that need no GPU (issue 7, items 2, 3 and 7; runs in CI).

Over the registry of every exported op (ltx_dev/registry.py):
- the registry has an entry for every exported op, and docs/input-contract.md a row;
- on fake CUDA tensors (what torch.compile traces) every random valid problem
  gives outputs of the documented shapes and dtypes;
- on CPU tensors every random valid problem, in any memory layout, passes every
  check that runs before the device check and is refused only for its device;
- each rejection that is checked before the device check fires on CPU tensors
  with the error the GPU tests expect;
- shape rules as properties: inplace_add's broadcasting is torch's, rope_3d's grid
  must cover seq, query and key must share no element, rmsnorm's weight and out
  shapes, pixel_norm's dim range, even widths for the pair ops;
- the arena the GPU sweeps build their tensors with makes the layouts it names and
  notices a write outside a view.

Hypothesis examples per property: LTX_ROBUSTNESS_CPU_EXAMPLES (default 25)."""

from __future__ import annotations

import os
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ltx_dev.registry import BF16, CONTIGUOUS, NOT_OPS, OPS, Arena, DrawPick, Source

from .conftest import ROOT

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("LTX_ROBUSTNESS_CPU_EXAMPLES", "25"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
CONTRACT = ROOT / "docs" / "input-contract.md"
# Ops with no output argument and no layout they refuse (the GEMM takes any strides; the fp8 producers
# copy misaligned or strided inputs): no "stride" rejection to test.
ACCEPTS_EVERY_LAYOUT = {"linear_gelu", "quantize_fp8", "gelu_tanh_fp8", "adaln_rmsnorm_fp8",
                        "gated_residual_rmsnorm_fp8", "gated_residual_fp8", "adaln_layernorm_fp8",
                        "gated_residual_layernorm_fp8"}
DEVICE_REFUSAL = re.compile(r"must be a CUDA tensor")


def ids(specs):
    return [s.name for s in specs]


def raises(error, message):
    return pytest.raises(error, match=re.escape(message) if message else None)


# --- the registry and the contract cover every op ------------------------------------------------

def test_registry_has_an_entry_for_every_exported_op(kernel):
    exported = set(kernel.__all__) - NOT_OPS
    covered = {spec.api for spec in OPS}
    assert exported == covered, (f"exported ops without an OpSpec in ltx_dev/registry.py: {exported - covered}; "
                                 f"OpSpecs of names not exported: {covered - exported} (or list helpers in NOT_OPS)")


def test_input_contract_has_a_row_for_every_op():
    rows = set(re.findall(r"^\| `([a-z0-9_]+)`", CONTRACT.read_text(), flags=re.M))
    assert rows == {spec.api for spec in OPS}


@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
def test_every_op_has_rejections_of_each_kind(spec):
    kinds = {bad.kind for bad in spec.errors}
    needed = {"device", "dtype", "shape"} | (set() if spec.api in ACCEPTS_EVERY_LAYOUT else {"stride"})
    assert needed <= kinds, f"{spec.name}: no rejected call of kind {needed - kinds}"


# --- every valid problem: fake CUDA shapes, CPU validation ---------------------------------------

@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
@PROPERTY
@given(data=st.data())
def test_fake_cuda_outputs_have_the_shapes_and_dtypes_of_the_reference(kernel, spec, data):
    problem = spec.random_problem(DrawPick(data))
    dtype = data.draw(st.sampled_from(spec.dtypes))
    with FakeTensorMode():
        args, _ = spec.build(problem, dtype, Source(device="cuda", shape_only=True))
        expected = spec.reference(args)
        outputs = spec.call(kernel, args)
        assert len(outputs) == len(expected)
        for out, exp in zip(outputs, expected):
            assert (tuple(out.shape), out.dtype, out.device.type) == (tuple(exp.value.shape), exp.dtype, "cuda")


@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
@PROPERTY
@given(data=st.data())
def test_valid_cpu_inputs_in_any_layout_are_refused_only_for_their_device(kernel, spec, data):
    problem = spec.random_problem(DrawPick(data))
    dtype = data.draw(st.sampled_from(spec.dtypes))
    args, _ = spec.build(problem, dtype, Source(data.draw(st.integers(0, 2**31)), "cpu"))
    with pytest.raises(RuntimeError, match=DEVICE_REFUSAL):
        spec.call(kernel, args)


EARLY = [(spec, bad) for spec in OPS for bad in spec.errors if bad.before_device]


@pytest.mark.parametrize("spec, bad", EARLY, ids=[f"{s.name}-{b.label}" for s, b in EARLY])
def test_rejections_checked_before_the_device_fire_on_cpu_tensors(kernel, spec, bad):
    args, _ = spec.build(spec.canonical("small", "vector"), BF16, Source(0, "cpu"))
    with raises(bad.error, bad.message):
        bad.run(kernel, spec, args)


@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
@PROPERTY
@given(data=st.data())
def test_a_refusal_names_the_public_function_that_was_called(kernel, spec, data):
    """Raised from Python or from the binding, the message starts with `ltx_kernels.<the function called>:`
    (the binding's schemas carry the public names)."""
    problem = spec.random_problem(DrawPick(data))
    args, _ = spec.build(problem, data.draw(st.sampled_from(spec.dtypes)), Source(0, "cpu"))
    with pytest.raises(RuntimeError) as refused:
        spec.call(kernel, args)
    assert str(refused.value).startswith(f"ltx_kernels.{spec.api}: "), str(refused.value)


# --- shape rules as properties --------------------------------------------------------------------

small_dims = st.lists(st.integers(0, 4), min_size=0, max_size=5)


@PROPERTY
@given(x_shape=small_dims.filter(len), y_shape=small_dims)
def test_inplace_add_accepts_exactly_the_shapes_torch_broadcasts_to_x(kernel, x_shape, y_shape):
    x, y = torch.ones(x_shape, dtype=BF16), torch.ones(y_shape, dtype=BF16)
    try:
        broadcasts = torch.broadcast_shapes(x.shape, y.shape) == x.shape
    except RuntimeError:
        broadcasts = False
    with pytest.raises(RuntimeError, match="must be a CUDA tensor" if broadcasts else "cannot be broadcast"):
        kernel.inplace_add(x, y)


@PROPERTY
@given(grid=st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)), seq=st.integers(0, 40))
def test_rope_3d_accepts_exactly_the_grids_that_cover_seq(kernel, grid, seq):
    q = torch.ones(1, seq, 2, 8, dtype=BF16)
    covers = grid[0] * grid[1] * grid[2] == seq
    with pytest.raises(RuntimeError, match="must be a CUDA tensor" if covers else "must equal the seq dim"):
        kernel.rope_3d(q, q.clone(), *grid)


@PROPERTY
@given(heads=st.integers(1, 8), q_range=st.tuples(st.integers(0, 8), st.integers(0, 8)),
       k_range=st.tuples(st.integers(0, 8), st.integers(0, 8)), transposed=st.booleans())
def test_rope_refuses_query_and_key_exactly_when_their_heads_overlap(kernel, heads, q_range, k_range, transposed):
    """Head slices of one [B, S, H, D] (or [B, H, S, D] transposed) buffer: the
    binding decides views of one tensor exactly."""
    buf = torch.ones(2, heads, 5, 8, dtype=BF16).transpose(1, 2) if transposed else torch.ones(2, 5, heads, 8,
                                                                                             dtype=BF16)
    (qa, qb), (ka, kb) = (sorted(min(v, heads) for v in r) for r in (q_range, k_range))
    q, k = buf[:, :, qa:qb], buf[:, :, ka:kb]
    overlap = max(qa, ka) < min(qb, kb)
    with pytest.raises(RuntimeError, match="overlap in memory" if overlap else "must be a CUDA tensor"):
        kernel.rope_1d(q, k)


@PROPERTY
@given(hidden=st.integers(1, 40), weight_len=st.integers(0, 41), out_len=st.integers(1, 41))
def test_rmsnorm_accepts_exactly_a_weight_and_out_of_the_input_width(kernel, hidden, weight_len, out_len):
    x = torch.ones(3, hidden, dtype=BF16)
    message = ("`weight` has shape" if weight_len != hidden else
               "`out` has shape" if out_len != hidden else "must be a CUDA tensor")
    with pytest.raises(RuntimeError, match=re.escape(message)):
        kernel.rmsnorm(x, torch.ones(weight_len, dtype=BF16), out=torch.empty(3, out_len, dtype=BF16))


@PROPERTY
@given(rank=st.integers(2, 5), dim=st.integers(-7, 6))
def test_pixel_norm_accepts_exactly_the_dims_of_x(kernel, rank, dim):
    x = torch.ones((2,) * rank, dtype=BF16)
    in_range = -rank <= dim < rank
    with pytest.raises(RuntimeError if in_range else IndexError,
                       match="must be a CUDA tensor" if in_range else "`dim` is out of range"):
        kernel.pixel_norm(x, dim)


@PROPERTY
@given(width=st.integers(1, 40))
def test_pair_ops_accept_exactly_even_widths(kernel, width):
    x = torch.ones(2, 3, width, dtype=BF16)
    table = torch.ones(1, 3, width)
    message = "must be a CUDA tensor" if width % 2 == 0 else "must be even"
    for call in (lambda: kernel.apply_rotary_emb(x, table, table), lambda: kernel.geglu(x),
                 lambda: kernel.swiglu(x)):
        with pytest.raises(RuntimeError, match=message):
            call()


@pytest.mark.parametrize("shape", [(0, 4, 2, 8), (2, 0, 2, 8)])
def test_qk_rmsnorm_rope_accepts_zero_size_per_head_input(kernel, shape):
    q = torch.empty(shape, dtype=BF16, device="meta")
    table = torch.empty(1, shape[1], 8, device="meta")
    q_out, k_out = kernel.qk_rmsnorm_rope(q, q, None, None, table, table)
    assert q_out.shape == shape and k_out.shape == shape


# --- the arena the GPU sweeps rely on --------------------------------------------------------------

def test_arena_layouts_are_the_memory_layouts_they_name():
    arena = Arena(Source(0, "cpu"))
    shape = (3, 4, 16)
    t = {kind: arena.tensor(shape, BF16, (kind, param)) for kind, param in
         (("contiguous", 0), ("offset", 1), ("front_pad", 3), ("outer_gap", 2), ("transposed", 0), ("step2", 0),
          ("expanded", 0))}
    assert all(v.shape == shape for v in t.values())
    assert t["contiguous"].is_contiguous() and t["contiguous"].storage_offset() == 0
    assert t["offset"].is_contiguous() and t["offset"].storage_offset() == 1
    assert t["front_pad"].stride() == (4 * 19, 19, 1)
    assert t["outer_gap"].stride(0) == 6 * 16  # rows that do not flatten into one stride
    assert t["transposed"].stride()[:2] == (16, 3 * 16)
    assert t["step2"].stride(-1) == 2
    assert t["expanded"].stride(0) == 0 and torch.equal(t["expanded"][0], t["expanded"][2])
    magnitudes = torch.cat([v.reshape(-1).float().abs() for v in t.values()])
    assert magnitudes.min() >= 0.25 and magnitudes.max() <= 2.5


def test_arena_notices_writes_outside_the_views_and_into_read_only_inputs():
    arena = Arena(Source(0, "cpu"))
    out = arena.output((2, 8), BF16, ("front_pad", 2))
    x = arena.tensor((2, 8), BF16, CONTIGUOUS)
    arena.snapshot()
    out.fill_(1.0)  # the op may write its output
    arena.assert_untouched()
    with pytest.raises(AssertionError, match="changed"):
        arena.assert_untouched(writes_allowed=False)
    arena.restore()
    out.as_strided((2, 10), (10, 1), out.storage_offset() - 2)[:, 0].fill_(1.0)  # the padding before a row
    with pytest.raises(AssertionError, match="buffer 0"):
        arena.assert_untouched()
    arena.restore()
    x[0, 0] = 7.0
    with pytest.raises(AssertionError, match="buffer 1"):
        arena.assert_untouched()


def test_outputs_the_api_allocates_are_contiguous_in_the_input_shape_whatever_its_layout(kernel):
    x = torch.randn(4, 6, 8).transpose(0, 2)  # non-contiguous: torch.empty_like alone would copy its strides
    out = kernel._alloc.new_output(x)
    assert out.is_contiguous() and out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    widened = kernel._alloc.new_output(x.bfloat16(), torch.float32)
    assert widened.is_contiguous() and widened.shape == x.shape and widened.dtype == torch.float32
