"""The error model of test_backward_gpu's float64 comparison (reference_grads), on CPU: the reference
itself runs anywhere. A row whose normalised value cancels to near zero moves its grads by more than
any tolerance on their size when one input moves by one rounding, which is what the kernel's own
roundings of h = x + gate * y do; the reference's spread under such moves is the slack it gets. A
well-conditioned problem keeps the plain tolerance."""

from __future__ import annotations

import torch

from ltx_dev.registry import BF16, F16, OPS, Source

from .test_backward_gpu import ROUNDOFF, TOLERANCE, float64_grads, grad_names, reference_grads

C = ("contiguous", 0)
SEAM = {"eps": 1e-06, "mod_dtype": "same", "x_layout": C, "y_layout": C, "gate_layout": C, "scale_layout": C,
        "shift_layout": C, "weight_layout": C}


def spec_named(name):
    return next(s for s in OPS if s.name == name)


def problem_grads(spec, problem, dtype, seed):
    args, _ = spec.build(problem, dtype, Source(seed, "cpu"))
    names = grad_names(spec, args)
    gen = torch.Generator().manual_seed(seed)
    dys = [torch.randn(e.value.shape, generator=gen).to(dtype) for e in spec.reference(args)]
    return args, names, dys


def test_a_row_cancelling_to_zero_gets_the_spread_of_one_rounding_as_slack():
    spec = spec_named("gated_residual_rmsnorm")
    problem = {**SEAM, "shape": (11, 1), "exact": True, "gate": (11, 1), "scale": (1,), "shift": None, "weight": True}
    args, names, dys = problem_grads(spec, problem, BF16, 3)
    # h = x + gate * y within a few roundings of zero on every row (hidden 1: the norm is h / sqrt(h^2 + eps))
    args["x"] = (-(args["gate"].double() * args["y"].double()) + 2e-3).to(BF16)
    grads, scales, spreads = reference_grads(spec, args, names, dys)
    # what a kernel rounding h differently gives: x moved by one rounding of bf16
    moved = {**args, "x": args["x"].double() * (1 + ROUNDOFF[BF16])}
    _, kernel = float64_grads(spec, args, names, moved, [d.double() for d in dys])
    i = names.index("x")
    err = (kernel[i] - grads[i]).abs().max().item()
    assert err > TOLERANCE[BF16] * scales[i]  # the size-only tolerance would fail a correct kernel
    assert err <= TOLERANCE[BF16] * scales[i] + 2 * spreads[i]


def test_a_well_conditioned_problem_keeps_its_tolerance():
    spec = spec_named("gated_residual_layernorm")
    problem = {**SEAM, "shape": (2, 64, 256), "exact": False, "gate": (256,), "scale": (256,), "shift": (256,),
               "weight": "same", "bias": None, "bias_layout": C}
    for seed in range(3):
        args, names, dys = problem_grads(spec, problem, F16, seed)
        _, scales, spreads = reference_grads(spec, args, names, dys)
        for name, scale, spread in zip(names, scales, spreads):
            assert 2 * spread <= TOLERANCE[F16] * scale, (seed, name, spread, scale)
