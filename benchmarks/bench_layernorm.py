"""LayerNorm family benchmark (issue 35, item 2): layernorm, adaln_layernorm and
gated_residual_layernorm against the models' own eager code around their
LayerNorms and that code under torch.compile (and Liger's LayerNorm where it is
installed), bf16 activations, at the models' shapes, each op in the rounding its
model uses:

  Wan 2.1 1.3B [2, 32760, 1536], Wan 14B [1, 32760, 5120] (480p) and
  [1, 75600, 5120] (720p): float32 modulation [B, 1, D], norm2 with float32
  weight and bias; Wan 2.2 TI2V [1, 27280, 3072]: per-token float32 modulation;
  Flux [1, 4096, 3072] (image) and [1, 512, 3072] (text), HunyuanVideo 720p
  [1, 118800, 3072]: bf16 modulation [B, D], no affine norm.

Bytes counted: each row tensor read once and each output written once; per-token
modulation counts its float32 bytes, [B, 1, D] and [B, D] modulation and the
norm's parameters are negligible. Timing as in bench_rmsnorm.py: `us` steady
state (CUDA graph over inputs spanning 4x L2, outputs in fresh memory),
`us_flushed` triton do_bench with L2 flushed; fractions of the copy rate
measured in the same process; speedups over the model's eager code.

Backward rows (ops "<op> backward", issue 36; "<op> backward (rows only)": the row tensors' grads alone, weights
and modulation frozen, as in LoRA training) at Wan 1.3B [2, 32760, 1536] in
Wan's rounding (float32 [B, 1, D] modulation, norm2's float32 weight and bias)
and at LTX-Video 2B [2, 2688, 2048] and Flux [1, 4096, 3072] in Flux's (bf16
[B, D] modulation, no affine): each implementation's own forward runs outside
the timing, then only `torch.autograd.grad(outputs, inputs, grads)` is timed,
against eager autograd of the model code, torch.compile's backward and Liger's
LayerNorm (plain layernorm). Bytes counted (the floor): every row tensor the
backward needs read once (upstream grad(s), the normalised rows; the seam's y
for the gate's grad), every row grad written once, the float32 mean and rstd
per row; the [D] and [B, D] vectors and their grads, and our float32 partial
sums ([<= 1024 blocks, D] per reduced grad), are not counted. The backward's
launch knobs (development builds) sweep with --sweep-tuning, e.g.
`--only "layernorm backward" --sweep-tuning layernorm.bwd_threads=96,128,192,256`
(also layernorm.bwd_min_rows and layernorm.bwd_max_blocks: the row split).

    python3 -m benchmarks.bench_layernorm [--out DIR] [--quick] [--dev-build --sweep]   (--help: every option)
"""

from __future__ import annotations

import math

import torch

from ltx_dev.bench.backward import measure_backward
from ltx_dev.bench.harness import measure, save, shapes, start, tuned
from ltx_dev.reference import fused_norm as fref
from ltx_dev.reference import layernorm as ref

EPS = 1e-6
WAN = [(2, 32760, 1536), (1, 32760, 5120), (1, 75600, 5120)]
WAN_TI2V = [(1, 27280, 3072)]
FLUX = [(1, 4096, 3072), (1, 512, 3072), (1, 118800, 3072)]  # Flux image, Flux text, HunyuanVideo 720p
BF16, F32 = torch.bfloat16, torch.float32


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def _rows(shape, i, n):
    g = torch.Generator(device="cuda").manual_seed(i)
    return [torch.randn(shape, generator=g, device="cuda").to(BF16) for _ in range(n)]


def _mods(shape, i, n, form, dtype):
    """Modulation tensors: "batch" [B, D] (Flux), "batch1" [B, 1, D] (Wan 2.1), "token" [B, S, D] (Wan 2.2)."""
    B, S, D = shape
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    s = {"batch": (B, D), "batch1": (B, 1, D), "token": (B, S, D)}[form]
    return [(torch.randn(s, generator=g, device="cuda") * 0.3).to(dtype) for _ in range(n)]


def _affine(shape, i):
    g = torch.Generator(device="cuda").manual_seed(2000 + i)
    D = shape[-1]
    return (1 + 0.1 * torch.randn(D, generator=g, device="cuda"), 0.1 * torch.randn(D, generator=g, device="cuda"))


def recipes(k):
    """[(op, shapes, row bytes per element, argument maker, {impl: fn})]: each op in its model's rounding."""
    wan_norm = ref.torch_layer_norm(EPS)  # FP32LayerNorm on float32 input, no affine: F.layer_norm itself

    def wan_norm2(x, w, b):
        return ref.wan_norm2(ref.fp32_layer_norm(EPS, w, b), x)

    def flux_norm(x):
        return ref.torch_layer_norm(EPS)(x)

    def wan_adaln(x, s, sh):
        return ref.wan_modulated_norm(wan_norm, x, s, sh)

    def flux_adaln(x, s, sh):
        return ref.flux_modulated_norm(ref.torch_layer_norm(EPS), x, s, sh)

    def wan_seam_norm2(x, y, g, w, b):  # after self-attention: gated residual, then norm2 (affine)
        h = fref.wan_gated_residual(x, y, g)
        return wan_norm2(h, w, b), h

    def wan_seam_norm3(x, y, s, sh):  # after cross-attention: plain residual, then norm3 modulated
        h = x + y
        return wan_adaln(h, s, sh), h

    def flux_seam(x, y, g, s, sh):  # the block's norm2 after the attention's gated residual
        h = ref.flux_gated_residual(x, y, g)
        return flux_adaln(h, s, sh), h

    def ours(*modes):
        return {f"ltx_kernels ({m})": m == "exact" for m in modes}

    table = []

    def add(op, shape_list, per_element, make, fn_ours, eager, modes=("exact",), extra=None):
        impls = {name: (lambda exact: lambda *a: fn_ours(exact, *a))(exact) for name, exact in ours(*modes).items()}
        impls["eager (model code)"] = eager
        impls["torch.compile(model code)"] = _compiled(eager)
        impls.update(extra or {})
        table.append((op, shape_list, per_element, make, impls))

    add("layernorm", WAN, 4, lambda s, i: (*_rows(s, i, 1), *_affine(s, i)),
        lambda exact, x, w, b: k.layernorm(x, w, b, EPS), wan_norm2, extra=liger(lambda x, w, b: (x, w, b)))
    add("layernorm", FLUX, 4, lambda s, i: tuple(_rows(s, i, 1)), lambda exact, x: k.layernorm(x, None, None, EPS),
        flux_norm, extra=liger(lambda x: (x, torch.ones(x.shape[-1], device="cuda", dtype=BF16),
                                          torch.zeros(x.shape[-1], device="cuda", dtype=BF16))))
    add("adaln_layernorm", WAN, 4, lambda s, i: (*_rows(s, i, 1), *_mods(s, i, 2, "batch1", F32)),
        lambda exact, x, s, sh: k.adaln_layernorm(x, s, sh, EPS, exact_mode=exact), wan_adaln)
    add("adaln_layernorm", WAN_TI2V, 12, lambda s, i: (*_rows(s, i, 1), *_mods(s, i, 2, "token", F32)),
        lambda exact, x, s, sh: k.adaln_layernorm(x, s, sh, EPS, exact_mode=exact), wan_adaln)
    add("adaln_layernorm", FLUX, 4, lambda s, i: (*_rows(s, i, 1), *_mods(s, i, 2, "batch", BF16)),
        lambda exact, x, s, sh: k.adaln_layernorm(x, s, sh, EPS, exact_mode=exact), flux_adaln,
        modes=("exact", "fast"))
    add("gated_residual_layernorm", WAN, 8,
        lambda s, i: (*_rows(s, i, 2), *_mods(s, i, 1, "batch1", F32), *_affine(s, i)),
        lambda exact, x, y, g, w, b: k.gated_residual_layernorm(x, y, g, EPS, weight=w, bias=b, exact_mode=exact),
        wan_seam_norm2)
    add("gated_residual_layernorm (norm3)", WAN, 8, lambda s, i: (*_rows(s, i, 2), *_mods(s, i, 2, "batch1", F32)),
        lambda exact, x, y, s, sh: k.gated_residual_layernorm(x, y, None, EPS, scale=s, shift=sh, exact_mode=exact),
        wan_seam_norm3)
    add("gated_residual_layernorm", FLUX, 8, lambda s, i: (*_rows(s, i, 2), *_mods(s, i, 3, "batch", BF16)),
        lambda exact, x, y, g, s, sh: k.gated_residual_layernorm(x, y, g, EPS, scale=s, shift=sh, exact_mode=exact),
        flux_seam, modes=("exact", "fast"))
    return table


def liger(args_of):
    """Liger's LayerNorm (weight and bias of x's dtype; ones and zeros for a norm without them) where
    liger_kernel is installed."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except Exception as e:  # noqa: BLE001 - report and go on without it
        print(f"Liger LayerNorm unavailable: {e!r}", flush=True)
        return {}

    def run(*a):
        x, w, b = args_of(*a)
        return LigerLayerNormFunction.apply(x, w.to(x.dtype), b.to(x.dtype), EPS)
    return {"Liger LayerNorm": run}


# --- backward (issue 36) -------------------------------------------------------------------------------
BACKWARD_WAN = [(2, 32760, 1536)]                    # Wan 1.3B
BACKWARD_FLUX = [(2, 2688, 2048), (1, 4096, 3072)]   # LTX-Video 2B's shape, Flux image


def backward_recipes(k):
    """[(op, shapes, bytes per element, argument maker, {impl: forward}, row leaves)]: each forward
    returns a tuple of outputs; the argument maker gives the leaves, all requiring grad, or (row
    leaves = n) only the first n, the row tensors: LoRA training's case."""
    wan_norm = ref.torch_layer_norm(EPS)

    def wan_norm2(x, w, b):
        return (ref.wan_norm2(ref.fp32_layer_norm(EPS, w, b), x),)

    def flux_norm(x):
        return (ref.torch_layer_norm(EPS)(x),)

    def wan_adaln(x, s, sh):
        return (ref.wan_modulated_norm(wan_norm, x, s, sh),)

    def flux_adaln(x, s, sh):
        return (ref.flux_modulated_norm(ref.torch_layer_norm(EPS), x, s, sh),)

    def wan_seam_norm2(x, y, g, w, b):
        h = fref.wan_gated_residual(x, y, g)
        return wan_norm2(h, w, b)[0], h

    def flux_seam(x, y, g, s, sh):
        h = ref.flux_gated_residual(x, y, g)
        return flux_adaln(h, s, sh)[0], h

    def table_row(op, shape_list, per_element, make, fn_ours, eager, extra=None):
        impls = {"ltx_kernels": fn_ours, "eager (model code)": eager, "torch.compile(model code)": _compiled(eager)}
        impls.update(extra or {})
        return op, shape_list, per_element, make, impls

    # bytes per element: dy and the normalised rows read, dx written (bf16); the seam also the grad of x_new
    # and y read (y: for the gate's grad), dy written
    full = [
        table_row("layernorm", BACKWARD_WAN, 6, lambda s, i: (*_rows(s, i, 1), *_affine(s, i)),
                  lambda x, w, b: (k.layernorm(x, w, b, EPS),), wan_norm2,
                  extra=liger_forward(lambda x, w, b: (x, w, b))),
        table_row("layernorm", BACKWARD_FLUX, 6, lambda s, i: tuple(_rows(s, i, 1)),
                  lambda x: (k.layernorm(x, None, None, EPS),), flux_norm, extra=liger_forward(
                      lambda x: (x, torch.ones(x.shape[-1], device="cuda", dtype=BF16),
                                 torch.zeros(x.shape[-1], device="cuda", dtype=BF16)))),
        table_row("adaln_layernorm", BACKWARD_WAN, 6,
                  lambda s, i: (*_rows(s, i, 1), *_mods(s, i, 2, "batch1", F32)),
                  lambda x, s, sh: (k.adaln_layernorm(x, s, sh, EPS),), wan_adaln),
        table_row("adaln_layernorm", BACKWARD_FLUX, 6,
                  lambda s, i: (*_rows(s, i, 1), *_mods(s, i, 2, "batch", BF16)),
                  lambda x, s, sh: (k.adaln_layernorm(x, s, sh, EPS),), flux_adaln),
        table_row("gated_residual_layernorm", BACKWARD_WAN, 12,
                  lambda s, i: (*_rows(s, i, 2), *_mods(s, i, 1, "batch1", F32), *_affine(s, i)),
                  lambda x, y, g, w, b: k.gated_residual_layernorm(x, y, g, EPS, weight=w, bias=b), wan_seam_norm2),
        table_row("gated_residual_layernorm", BACKWARD_FLUX, 12,
                  lambda s, i: (*_rows(s, i, 2), *_mods(s, i, 3, "batch", BF16)),
                  lambda x, y, g, s, sh: k.gated_residual_layernorm(x, y, g, EPS, scale=s, shift=sh), flux_seam),
    ]
    # LoRA training (frozen weights and modulation): the row grads alone (x, and the seam's y), at Wan's shape
    lora = [(op, shapes, 10 if "gated" in op else 6, make, impls, 2 if "gated" in op else 1)
            for op, shapes, _, make, impls in full if shapes is BACKWARD_WAN]
    return [(*recipe, None) for recipe in full] + lora


def liger_forward(args_of):
    """Liger's LayerNorm as a forward returning a tuple (see liger)."""
    return {name: (lambda fn: lambda *a: (fn(*a),))(fn) for name, fn in liger(args_of).items()}


def main() -> None:
    args, kernel, env, ceiling = start(__doc__, "the first shape of each op only",
                                       "also sweep threads per row (layernorm.threads_per_row)")
    table = recipes(kernel)
    rows: list[dict] = []
    for op, shape_list, per_element, make, impls in table:
        if args.sweep:
            mine = [(n, f) for n, f in impls.items() if n.startswith("ltx_kernels")]
            for knob, values in (("layernorm.threads_per_row", (96, 128, 192, 256, 320, 384, 512, 640)),
                                 ("layernorm.grid_plan", (0, 3, 6))):
                impls = {**impls, **dict(tuned(n, {knob: v}, f) for n, f in mine for v in values)}
        for shape in shapes(shape_list, shape_list[:1], args):
            nbytes = per_element * math.prod(shape)
            added = measure(rows, ceiling, op, shape, impls, lambda i, shape=shape: make(shape, i), nbytes)
            eager = next((r for r in added if r["impl"].startswith("eager")), None)
            for row in added if eager else ():
                row["speedup_vs_eager"] = round(eager["us"] / row["us"], 2)
                row["speedup_vs_eager_flushed"] = round(eager["us_flushed"] / row["us_flushed"], 2)
    for op, shape_list, per_element, make, forwards, row_leaves in backward_recipes(kernel):
        for shape in shapes(shape_list, shape_list[:1], args):
            n = shape[0] * shape[1]
            nbytes = per_element * n * shape[2] + 2 * 4 * n  # + mean and rstd (float32 per row)
            measure_backward(rows, ceiling, op, shape, forwards, lambda shape=shape, make=make: make(shape, 0),
                             nbytes, row_leaves, " (rows only)" if row_leaves else "")
    save("layernorm", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
