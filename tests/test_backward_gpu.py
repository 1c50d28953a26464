"""Backward sweeps over the registry (issue 36, item 3): every op in
`ltx_kernels.DIFFERENTIABLE` (the registry's OpSpecs whose `api` it names).
Skipped without CUDA.

- Random problems (hypothesis; LTX_BACKWARD_EXAMPLES per op, default 500): the
  grads of every argument in `spec.grad_args` (default: every floating tensor
  argument), for a random grad of every output, against autograd through the
  op's float64 reference on float64 copies of the same inputs. Any dtype,
  layout (views, broadcast modulation, offsets) and width the forward sweep draws.
- Determinism: the same call twice gives the same bits in every grad.
- No fill kernels: a backward launches no zero fill (autograd's, for a grad it was not given).
- One column sum: a backward adds all its grads reduced over rows in one launch.
- CUDA graphs: forward + backward captured once; a replay equals eager and reads
  new values written into the captured inputs.
- Dependent launch: backward row kernels and their column sums, back to back, each
  reading the grads the one before wrote, with it on and off, eagerly and in a graph.
"""

from __future__ import annotations

import os

import pytest
import torch

from ltx_dev.registry import BF16, F16, F32, OPS, Source

from .backward_support import launched_kernels
from .conftest import cuda
from .stream_chain import assert_chain_sees_each_output
from .sweep_support import ids, random_problems_test
from .test_no_backward_cpu import DIFFERENTIABLE_OPS

pytestmark = cuda

EXAMPLES = int(os.environ.get("LTX_BACKWARD_EXAMPLES", "500"))
SPECS = [spec for spec in OPS if spec.api in DIFFERENTIABLE_OPS]
# |grad - grad64| <= tolerance * magnitude + 2 * spread per grad (reference_grads; half types: a few
# roundings of the inputs, of the saved forward values and of the grad itself; float32: sums over rows
# of up to ~70k terms).
TOLERANCE = {BF16: 3e-2, F16: 4e-3, F32: 1e-4}


def grad_names(spec, args):
    names = spec.grad_args if spec.grad_args is not None else [
        k for k, v in args.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return [k for k in names if isinstance(args.get(k), torch.Tensor)]


def recording_args(spec, problem, dtype, seed):
    """The call's arguments with `out` and in-place writes dropped (a recorded call may not
    write into its inputs) and
    detached aliases (same layout) that require grad for the grad arguments."""
    args, _ = spec.build(problem, dtype, Source(seed, "cuda"))
    if "out" in args:
        args["out"] = None
    if args.get("in_place"):  # writing into a leaf that requires grad is refused, as by torch's in-place ops
        args["in_place"] = False
    names = grad_names(spec, args)
    return {k: (v.detach().requires_grad_() if k in names else v) for k, v in args.items()}, names


def random_grads(outputs, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(o.shape, device="cuda", generator=gen).to(o.dtype) for o in outputs]


def grads_of(spec, kernel, args, names, seed, dys=None):
    """The op's outputs, their grads (seeded random unless given) and the grads of `names`."""
    outputs = [o for o in spec.call(kernel, args) if o.requires_grad]
    dys = random_grads(outputs, seed) if dys is None else dys
    grads = torch.autograd.grad(outputs, [args[k] for k in names], dys, allow_unused=True)
    return outputs, dys, grads


def storage_view(t):
    """`t` with its broadcast (stride-0) dims cut to 1: a view that can be written."""
    return t.as_strided([1 if st == 0 else n for n, st in zip(t.shape, t.stride())], t.stride())


def norm_terms(spec, args64, dys64, names, values):
    """For a normalising op (it takes `eps`) without its own grad_scale: a row's dx is a difference
    of terms of size r * |dy| * |multipliers| (r = rsqrt(mean(h^2) + eps), LayerNorm's of the
    centred row), which cancel on very short rows; bound them by the largest r of any row-shaped
    argument or output (`values`, the reference's: the seams' normalised row h = x + gate * y is
    one, and it can cancel to near zero where x and y do not) times max |dy| times the largest of
    every other argument (at least 1). Grads of other shapes (reduced ones) keep max |grad|."""
    if "eps" not in args64:
        return {}
    main = args64[spec.main]
    if main.numel() == 0:
        return {}
    rows = [v.detach().double() for v in (*args64.values(), *values)
            if isinstance(v, torch.Tensor) and v.shape == main.shape and v.is_floating_point()]
    centred = "layernorm" in spec.api
    r = max(float(torch.rsqrt((v - v.mean(-1, keepdim=True) if centred else v).pow(2).mean(-1) + args64["eps"]).max())
            for v in rows)
    others = [float(v.detach().double().abs().max()) for v in args64.values() if isinstance(v, torch.Tensor)
              and v.is_floating_point() and v.shape != main.shape and v.numel()]
    dy = max([0.0] + [float(d.abs().max()) for d in dys64 if d.numel()])
    bound = r * dy * max([1.0] + others) * (1.0 + max([1.0] + others))
    return {k: bound for k in names if args64[k].shape == main.shape}


def random_signs(shape, gen, device):
    """float64 +1 / -1 of `shape`, drawn from `gen`."""
    return torch.randint(0, 2, shape, generator=gen, device=device).double() * 2 - 1


def row_signs(dys64, seed):
    """A random sign per row (all but the last dim) of the outputs' grads, one draw shared by the
    outputs (they have the same rows), or None where their row shapes differ."""
    rows = {tuple(d.shape[:-1]) for d in dys64}
    if len(rows) != 1 or not dys64[0].dim():
        return None
    gen = torch.Generator(device=dys64[0].device).manual_seed(seed)
    return random_signs((*rows.pop(), 1), gen, dys64[0].device)


def float64_grads(spec, args, names, inputs, upstream):
    """The reference's outputs and their float64 grads for `names`, taken at `inputs` (those names'
    values; the other arguments from `args`), for the upstream grads `upstream`."""
    leaves = {k: inputs[k].detach().double().requires_grad_() for k in names}
    values = [e.value for e in spec.reference({**args, **leaves})][:len(upstream)]
    return values, torch.autograd.grad(values, [leaves[k] for k in names], upstream, allow_unused=True)


# Unit roundoff of each dtype: the relative rounding of an input reference_grads perturbs by.
ROUNDOFF = {BF16: 2.0 ** -8, F16: 2.0 ** -11, F32: 2.0 ** -24}


def reference_grads(spec, args, names, dys, sign_draws=2, rounding_draws=2):
    """The float64 grads, the magnitude each one's error is measured against, and the reference's own
    spread. A grad reduced over rows (weight, gate, scale, shift) is a sum of per-row terms, each
    carrying its row's error, and those terms may cancel: its magnitude is also taken with the rows'
    upstream grads under random signs (`sign_draws` draws), which keeps the terms' size and loses the
    cancellation. The spread is how far the float64 grads move when every input moves by one rounding
    of its dtype (random signs, `rounding_draws` draws): the kernel rounds its intermediates (the seams'
    h = x + gate * y, in the model's order), and where a row is ill-conditioned (h cancelling to near
    zero, or to a near-constant row under LayerNorm, on rows of 1-3 elements) that rounding alone moves
    the grads by more than any tolerance on their size."""
    dys64 = [d.double() for d in dys]

    def grads_at(inputs, upstream):
        return float64_grads(spec, args, names, inputs, upstream)

    def biggest(g):
        return g.abs().max().item() if g is not None and g.numel() else 0.0

    args64 = {**args, **{k: args[k].detach().double() for k in names}}
    values, grads = grads_at(args, dys64)
    terms = (spec.grad_scale(args64, dys64) if spec.grad_scale is not None
             else norm_terms(spec, args64, dys64, names, values))
    main_shape = args64[spec.main].shape
    reduced = [i for i, k in enumerate(names) if args64[k].shape != main_shape and biggest(grads[i])]
    for draw in range(sign_draws if reduced else 0):
        signs = row_signs(dys64, draw)
        if signs is None:
            break
        for i, g in enumerate(grads_at(args, [d * signs for d in dys64])[1]):
            if i in reduced:
                terms[names[i]] = max(terms.get(names[i], 0.0), biggest(g))
    scales = [max(terms.get(k, 0.0), biggest(g), 1e-30) for k, g in zip(names, grads)]
    spreads = [0.0] * len(names)
    for draw in range(rounding_draws):
        gen = torch.Generator(device=dys64[0].device if dys64 else "cpu").manual_seed(1000 + draw)
        moved = {k: args64[k] * (1 + ROUNDOFF[args[k].dtype] * random_signs(args64[k].shape, gen, args64[k].device))
                 for k in names}
        for i, (g, e) in enumerate(zip(grads_at(moved, dys64)[1], grads)):
            if g is not None and e is not None and e.numel():
                spreads[i] = max(spreads[i], (g - e).abs().max().item())
    return grads, scales, spreads


def assert_grads_match(got, expected, names, dtype, what):
    """|grad - grad64| <= tolerance * magnitude + twice the reference's spread (reference_grads)."""
    grads, scales, spreads = expected
    for name, g, e, scale, spread in zip(names, got, grads, scales, spreads):
        if e is None:
            assert g is None or not bool(g.any()), f"{what}: grad of `{name}` should be zero"
            continue
        assert g is not None, f"{what}: no grad for `{name}`"
        assert g.shape == e.shape, f"{what}: grad of `{name}` has shape {list(g.shape)}, expected {list(e.shape)}"
        if e.numel() == 0:
            continue
        limit = TOLERANCE[dtype] * scale + 2 * spread
        err = (g.double() - e).abs()
        assert bool((err <= limit).all()), (  # NaN fails too
            f"{what}: grad of `{name}` off by {err.max().item():.3g} > {limit:.3g} (tolerance {TOLERANCE[dtype]:g} "
            f"x scale {scale:.3g} + 2 x spread {spread:.3g})")


def check_random_problem(kernel, spec, pick, dtype, seed):
    problem = spec.random_problem(pick)
    args, names = recording_args(spec, problem, dtype, seed)
    outputs, dys, grads = grads_of(spec, kernel, args, names, seed)
    if not outputs:
        return
    assert_grads_match(grads, reference_grads(spec, args, names, dys), names, dtype, f"{spec.name} {problem}")


def test_every_differentiable_op_has_a_registry_entry():
    assert {spec.api for spec in SPECS} == set(DIFFERENTIABLE_OPS)


test_random_problems_give_the_float64_grads = random_problems_test(SPECS, EXAMPLES, check_random_problem)


@pytest.mark.parametrize("path", ["vector", "fallback"])
@pytest.mark.parametrize("spec", SPECS, ids=ids(SPECS))
def test_the_same_call_gives_the_same_grad_bits(kernel, spec, path):
    problem = spec.canonical("ltx", path) or spec.canonical("medium", path)
    if problem is None:
        pytest.skip(f"{spec.name} has no {path} problem")
    runs = []
    for _ in range(2):
        args, names = recording_args(spec, problem, BF16, 3)
        runs.append(grads_of(spec, kernel, args, names, 3)[2])
    for name, a, b in zip(names, *runs):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"grad of `{name}` differs"


def backward_kernel_names(kernel, spec):
    """The names of the GPU kernels (and memsets) one backward of spec's medium problem launches."""
    args, names = recording_args(spec, spec.canonical("medium", "vector"), BF16, 4)
    outputs = [o for o in spec.call(kernel, args) if o.requires_grad]
    dys = random_grads(outputs, 4)
    return launched_kernels(lambda: torch.autograd.grad(outputs, [args[k] for k in names], dys, allow_unused=True))


@pytest.mark.parametrize("spec", SPECS, ids=ids(SPECS))
def test_a_backward_launches_no_fill_kernels(kernel, spec):
    # Autograd fills zeros for a saved statistic's grad unless the setup_context opts out (~1 us a fill).
    fills = [n for n in backward_kernel_names(kernel, spec) if "FillFunctor" in n or n.startswith("Memset")]
    assert not fills, f"{spec.name}'s backward launched {fills}"


@pytest.mark.parametrize("spec", SPECS, ids=ids(SPECS))
def test_a_backward_sums_its_reduced_grads_in_one_launch(kernel, spec):
    # column_sums adds every grad summed over rows (weight, scale, shift, gate) in one launch: a launch a grad
    # cost 1.5-3 us each at LTX-Video's rows. qk_rmsnorm_rope may add a second level (its runs' sums).
    sums = [n for n in backward_kernel_names(kernel, spec) if "column_sum_kernel" in n]
    assert len(sums) <= (2 if spec.name.startswith("qk_rmsnorm_rope") else 1), f"{spec.name}'s backward: {sums}"


@pytest.mark.parametrize("spec", SPECS, ids=ids(SPECS))
def test_a_graph_of_forward_and_backward_replays_eager_on_new_inputs(kernel, spec):
    problem = spec.canonical("medium", "vector")
    args, names = recording_args(spec, problem, BF16, 5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the capture stream (autograd runs a backward on its forward's)
        _, dys, before = grads_of(spec, kernel, args, names, 5)
        before = [None if g is None else g.clone() for g in before]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        _, _, captured = grads_of(spec, kernel, args, names, 5, dys)
    fresh, _ = recording_args(spec, problem, BF16, 6)
    with torch.no_grad():  # new inputs and new output grads (a linear op's grads depend on the latter alone)
        for k in names:
            storage_view(args[k]).copy_(storage_view(fresh[k]))
        for d, new in zip(dys, random_grads(dys, 7)):
            d.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    expected = grads_of(spec, kernel, args, names, 5, dys)[2]
    for name, g, e in zip(names, captured, expected):
        assert (g is None) == (e is None) and (g is None or torch.equal(g, e)), f"replayed grad of `{name}` differs"
    assert any(g is not None and not torch.equal(g, b) for g, b in zip(captured, before)), \
        "the replay did not read the new inputs"


def test_back_to_back_backwards_see_each_others_grads_with_and_without_dependent_launch(kernel, launch_mode):
    # Each stage's backward (a row kernel, then a column sum per reduced grad) reads the grad that the
    # stage after it wrote. Under dependent launch each column sum is scheduled at its row kernel's tail.
    gen = torch.Generator(device="cuda").manual_seed(8)

    def rand(*shape):
        return torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)

    B, S, D = 2, 7 * 16 * 24, 2048
    x, w, bias, scale, shift = rand(B, S, D), 1 + 0.1 * rand(D), rand(D), 0.1 * rand(B, 1, D), rand(B, 1, D)
    wq, wk, dq, dk = 1 + 0.1 * rand(D // 2), 1 + 0.1 * rand(D // 2), rand(B, S, D // 2), rand(B, S, D // 2)
    cos, sin = kernel.ltx_rope_cos_sin(7, 16, 24, None, D // 2, device="cuda")
    for t in (x, w, bias, scale, shift, wq, wk):
        t.requires_grad_()

    def chain(sync):
        def step(grads):
            if sync:
                torch.cuda.synchronize()
            return grads

        a = kernel.rmsnorm(x, w)
        b = kernel.adaln_rmsnorm(a, None, scale, shift)
        c = kernel.layernorm(b, w, bias)
        q, k = kernel.qk_rmsnorm_rope(c[..., :D // 2].contiguous(), c[..., D // 2:].contiguous(), wq, wk, cos, sin)
        dc = step(torch.autograd.grad((q, k), (c, wq, wk), (dq, dk), retain_graph=True))
        db = step(torch.autograd.grad(c, (b, w, bias), dc[0], retain_graph=True))
        da = step(torch.autograd.grad(b, (a, scale, shift), db[0], retain_graph=True))
        return [*dc, *db, *da, *step(torch.autograd.grad(a, (x, w), da[0]))]

    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in chain(True))
    assert_chain_sees_each_output(chain)
