"""Activation benchmark (issue 4, items 4-5): GELU-tanh, GEGLU and SwiGLU
against eager PyTorch and torch.compile at the DiT feed-forward shapes,
LTX-2's per-head attention gate (head_gate, x [B, T, 32 * D] by logits
[B, T, 32]) against diffusers' eager chain and torch.compile of it at the
video (D = 128) and audio (D = 64) shapes and one of 256 MiB, and
Linear + bias + GELU-tanh (cuBLASLt epilogue) against F.linear then F.gelu
and torch.compile of the pair at LTX's [5376, 2048] x [2048, 8192] (target
>= 1.1x the separate pair). Timing as in bench_rmsnorm.py; for the GEMM the
byte count (inputs + output) only scales the TB/s column.

Backward rows (op "<op> backward", issue 36), as bench_rmsnorm.py's: each
implementation's forward outside the timing, then only `torch.autograd.grad`
timed, against eager autograd of the models' code, torch.compile's backward and
Liger's (GEGLU and SwiGLU, on the halves as separate tensors). GELU-tanh at
LTX-Video 2B's feed-forward [2, 2688, 8192] and Wan 1.3B's [2, 32760, 8960];
the gated ones at [2, 2688, 2 * 8192] in -> [..., 8192] and [2, 32760, 8960] in
(half 4480: 24 timed calls keep their grads alive, and 2 * 8960 would need
56 GB of them); head_gate at LTX-2's [2, 6144, 32 * 128]. Bytes counted (the
floor): dy and the input read, the input's grad written (head_gate: also the
logits read and their grad written).

    python3 -m benchmarks.bench_activation [--out DIR] [--quick]   (--help: every option)
"""

from __future__ import annotations

import math

import torch

from ltx_dev.bench.harness import measure, save, shapes, start
from ltx_dev.reference.activation import (geglu_eager, gelu_tanh_eager, head_gate_eager, linear_gelu_eager,
                                          swiglu_eager)

GATE_HEADS = 32  # LTX-2's heads, video and audio


BACKWARD_SHAPES = {"gelu_tanh": [(2, 2688, 8192), (2, 32760, 8960)],  # LTX-Video 2B, Wan 1.3B feed-forward
                   "geglu": [(2, 2688, 2 * 8192), (2, 32760, 8960)], "swiglu": [(2, 2688, 2 * 8192), (2, 32760, 8960)],
                   "head_gate": [(2, 6144, GATE_HEADS * 128)]}


def measure_backward(rows: list, ceiling: float, k, args, liger_geglu: dict, liger_swiglu: dict) -> None:
    """The "<op> backward" rows: forward(x) outside the timing, torch.autograd.grad(y, x, dy) timed."""
    def randn(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda") * scale).bfloat16()

    def timed(y, inputs, dy):
        return torch.autograd.grad(y, inputs, dy, retain_graph=True)

    def single(forward, shape, out_last):
        def make_args(i):
            x = randn(*shape).requires_grad_()
            return forward(x), x, randn(*shape[:-1], out_last)
        return make_args

    def halves(forward, shape):  # Liger: the halves as two tensors that require grad
        def make_args(i):
            a, b = (randn(*shape[:-1], shape[-1] // 2).requires_grad_() for _ in range(2))
            return forward(a, b), (a, b), randn(*shape[:-1], shape[-1] // 2)
        return make_args

    gated = {"geglu": (k.geglu, geglu_eager, liger_geglu), "swiglu": (k.swiglu, swiglu_eager, liger_swiglu)}
    for op, op_shapes in BACKWARD_SHAPES.items():
        for shape in shapes(op_shapes, op_shapes[:1], args):
            n = math.prod(shape)
            if op == "gelu_tanh":
                forwards = {"ltx_kernels": k.gelu_tanh, "eager F.gelu(tanh)": gelu_tanh_eager,
                            "torch.compile": torch.compile(gelu_tanh_eager)}
                nbytes, out_last, liger = 3 * 2 * n, shape[-1], {}
            elif op == "head_gate":
                heads = GATE_HEADS if shape[-1] % GATE_HEADS == 0 else 1
                lead = tuple(shape[:-1])

                def gate_args(forward):
                    def make_args(i):
                        x, logits = randn(*shape).requires_grad_(), randn(*lead, heads, scale=2.0).requires_grad_()
                        return forward(x, logits), (x, logits), randn(*shape)
                    return make_args

                forwards = {"ltx_kernels": k.head_gate, "eager": head_gate_eager,
                            "torch.compile": torch.compile(head_gate_eager)}
                nbytes = 2 * (3 * n + 2 * math.prod(lead) * heads)
                for name, forward in forwards.items():
                    measure(rows, ceiling, "head_gate backward", shape, {name: timed}, gate_args(forward), nbytes)
                continue
            else:
                ours, eager, liger = gated[op]
                forwards = {"ltx_kernels": ours, "eager": eager, "torch.compile": torch.compile(eager)}
                nbytes, out_last = 2 * (n // 2 + 2 * n), shape[-1] // 2  # dy (half), x read, dx written
            for name, forward in forwards.items():
                measure(rows, ceiling, f"{op} backward", shape, {name: timed}, single(forward, shape, out_last), nbytes)
            for name, fn in liger.items():
                measure(rows, ceiling, f"{op} backward", shape, {name: timed},
                        halves(getattr(fn, "liger_function"), shape), nbytes)


def main() -> None:
    args, k, env, ceiling = start(__doc__, "one shape per op")
    rows: list[dict] = []

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda") * scale).bfloat16()

    # Liger's gated kernels take the two halves as separate contiguous tensors (Llama's gate/up
    # layout): give it such a pair per input, the same bytes as the halves of our [.., 2H] input.
    halves: dict[int, tuple] = {}

    def liger(fn):
        def run(x):
            if x.data_ptr() not in halves:
                halves[x.data_ptr()] = tuple(h.contiguous() for h in x.chunk(2, dim=-1))
            return fn(*halves[x.data_ptr()])
        run.liger_function = fn  # the backward rows call it on two tensors that require grad
        return run

    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        liger_geglu = {"Liger (halves separate)": liger(LigerGELUMulFunction.apply)}
        liger_swiglu = {"Liger (halves separate)": liger(LigerSiLUMulFunction.apply)}
    except ImportError:
        liger_geglu = liger_swiglu = {}
    cases = [
        ("gelu_tanh", [(2, 2688, 8192), (2, 8160, 8192)], 2, {
            "ltx_kernels": k.gelu_tanh, "ltx_kernels (fast)": lambda x: k.gelu_tanh(x, fast=True),
            "eager F.gelu(tanh)": gelu_tanh_eager, "torch.compile": torch.compile(gelu_tanh_eager)}),
        ("geglu", [(2, 2688, 16384)], 1.5, {
            "ltx_kernels": k.geglu, "ltx_kernels (fast)": lambda x: k.geglu(x, fast=True), "eager": geglu_eager,
            "torch.compile": torch.compile(geglu_eager),
            **liger_geglu}),
        ("swiglu", [(2, 2048, 16384), (1, 44520, 16384)], 1.5, {
            "ltx_kernels": k.swiglu, "ltx_kernels (fast)": lambda x: k.swiglu(x, fast=True), "eager": swiglu_eager,
            "torch.compile": torch.compile(swiglu_eager),
            **liger_swiglu}),
    ]
    for op, op_shapes, factor, impls in cases:
        for shape in shapes(op_shapes, op_shapes[:1], args):
            nbytes = int(factor * 2 * shape[0] * shape[1] * shape[2])  # input read + output written
            measure(rows, ceiling, op, shape, impls, lambda i, shape=shape: (randn(*shape),), nbytes)

    # x read and written, the logits read; a --shape whose last dim 32 heads do not divide gets one head
    gate_impls = {"ltx_kernels": k.head_gate,
                  "ltx_kernels (fast)": lambda x, logits: k.head_gate(x, logits, exact_mode=False),
                  "eager": head_gate_eager, "torch.compile": torch.compile(head_gate_eager)}
    gate_shapes = [(2, 6144, GATE_HEADS * 128), (2, 126, GATE_HEADS * 64), (2, 16384, GATE_HEADS * 128)]
    for shape in shapes(gate_shapes, gate_shapes[:2], args):
        heads = GATE_HEADS if shape[-1] % GATE_HEADS == 0 else 1
        lead = tuple(shape[:-1])
        nbytes = 2 * (2 * math.prod(shape) + math.prod(lead) * heads)
        measure(rows, ceiling, "head_gate", shape, gate_impls,
                lambda i, shape=shape, lead=lead, heads=heads: (randn(*shape), randn(*lead, heads, scale=2.0)), nbytes)

    M, K, N = 5376, 2048, 8192
    impls = {"ltx_kernels linear_gelu": k.linear_gelu, "eager F.linear + F.gelu": linear_gelu_eager,
             "torch.compile(pair)": torch.compile(linear_gelu_eager)}
    added = measure(rows, ceiling, "linear_gelu", (M, K, N), impls,
                    lambda i: (randn(M, K), randn(N, K, scale=0.02), randn(N, scale=0.1)), 2 * (M * K + K * N + M * N))
    eager = next((r for r in added if r["impl"].startswith("eager")), None)
    for r in added:
        if eager:
            r["speedup_vs_eager"] = round(eager["us"] / r["us"], 2)
        r["tflops"] = round(2 * M * K * N / (r["us"] * 1e-6) / 1e12, 1)
        print(f"  linear_gelu {r['impl']:28s} {r['tflops']:7.1f} TFLOP/s  {r.get('speedup_vs_eager', 0):.2f}x pair")
    measure_backward(rows, ceiling, k, args, liger_geglu, liger_swiglu)
    save("activation", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
