"""Fused q/k RMSNorm + RoPE benchmark (issue 4, item 2): `qk_rmsnorm_rope`
against the eager chain (torch.nn.RMSNorm over all heads, then diffusers'
LTX-Video apply_rotary_emb, for q and k) and torch.compile of it, at LTX's
shapes; and in the per-head form (diffusers RMSNorm per head of 128, Flux's
interleaved RoPE with [S, 128] tables) at [2, 2688, 32, 128] and Flux's
[1, 4096 + 512, 24, 128]; and in Wan's form (torch.nn.RMSNorm over all heads, then its
processor's float32 rotation with one head's [1, S, 1, 128] tables) at batch 1 (Wan runs its
guidance passes one at a time): 1.3B [1, 32760, 1536], 2.2 5B [1, 27280, 3072], 14B
[1, 32760, 5120].
Bytes: q and k read + written (bf16) + cos and sin read once (fp32).
Timing as in bench_rmsnorm.py. The per-head form runs the one-word kernel;
`--sweep-tuning qk_rmsnorm_rope.one_word=0,1` adds rows of the general kernel (0)
beside it, and the `--sweep` rows force the general kernel at each threads per
row (qk_rmsnorm_rope.threads_per_row). Both need --dev-build.

Backward rows (issue 36; ltx_dev/bench/backward.py): "qk_rmsnorm_rope backward" in LTX-Video 2B's form
[2, 2688, 2048] (norm over the row, [B, S, D] tables), and "qk_rmsnorm_rope backward (Wan)" in Wan's form
at 1.3B's [2, 32760, 1536] (its two guidance passes as one batch, as its LoRA step), grads of q, k and both
weights, against eager autograd of the chain and torch.compile's backward (Liger has no fused norm + RoPE).
Bytes (the floor): dq, dk, q and k read, their grads written (bf16), cos and sin read once (fp32), weights
and their grads; not our float32 dw partials.

    python3 -m benchmarks.bench_qk_rmsnorm_rope [--out DIR] [--quick] [--dev-build --sweep]   (--help: every option)
"""

from __future__ import annotations

import torch

from ltx_dev.bench.harness import measure, save, start, tuned
from ltx_dev.reference.qk_rmsnorm_rope import flux_qk_eager, ltx_qk_eager, wan_qk_eager
from ltx_dev.reference.rope import diffusers_ltx_apply_rotary_emb

from ltx_dev.bench.backward import measure_backward

BF16 = torch.bfloat16
TPR_KNOB = "qk_rmsnorm_rope.threads_per_row"


def main() -> None:
    args, k, env, ceiling = start(__doc__, "one shape per form", "also time qk_rmsnorm_rope at each threads per row")
    rows: list[dict] = []
    rope_eager = diffusers_ltx_apply_rotary_emb()
    # LTX: torch.nn.RMSNorm(D, eps=1e-5) over all heads, then the interleaved RoPE with [B, S, D] tables;
    # 2B (D 2048) at 49 and 121 frames, 13B (D 4096) at 49 frames, and batch 1 (no CFG: distilled models)
    shapes = [(2, 7, 16, 24, 2048), (2, 7, 16, 24, 4096), (2, 16, 24, 40, 2048), (1, 7, 16, 24, 2048)]
    for batch, frames, height, width, dim in shapes[: 1 if args.quick else None]:
        ltx_form(k, rows, ceiling, rope_eager, args.sweep, batch, frames, height, width, dim)
    # per head: diffusers RMSNorm(128, eps=1e-6), interleaved RoPE with [S, 128] tables, at the issue's
    # [2, 2688, 32, 128] and Flux's [1, 4096 + 512, 24, 128]
    for batch, seq, heads in [(2, 2688, 32), (1, 4096 + 512, 24)][: 1 if args.quick else None]:
        per_head(k, rows, ceiling, args.sweep, batch, seq, heads)
    for seq, dim in [(32760, 1536), (27280, 3072), (32760, 5120)][: 1 if args.quick else None]:
        wan_form(k, rows, ceiling, seq, dim)
    backward_form(k, rows, ceiling, rope_eager, 2, 7, 16, 24, 2048)
    wan_backward_form(k, rows, ceiling, 2, 32760, 1536)
    save("qk_rmsnorm_rope", env, ceiling, rows, args.out)


def backward_form(k, rows, ceiling, rope_eager, batch, frames, height, width, dim) -> None:
    seq = frames * height * width
    cos, sin = k.ltx_rope_cos_sin(frames, height, width, (8 / 25, 32, 32), dim, batch_size=batch, device="cuda")

    def eager(q, kk, wq, wk):
        return (rope_eager(torch.nn.functional.rms_norm(q, (dim,), wq, 1e-5), (cos, sin)),
                rope_eager(torch.nn.functional.rms_norm(kk, (dim,), wk, 1e-5), (cos, sin)))

    forwards = {"ltx_kernels": lambda q, kk, wq, wk: k.qk_rmsnorm_rope(q, kk, wq, wk, cos, sin, 1e-5),
                "eager (nn.RMSNorm + diffusers rope)": eager, "torch.compile(eager)": torch.compile(eager)}
    nbytes = 6 * 2 * batch * seq * dim + 2 * 4 * seq * dim + 4 * 2 * dim
    measure_backward(rows, ceiling, "qk_rmsnorm_rope", (batch, seq, dim), forwards,
                     lambda: (torch.randn(batch, seq, dim, device="cuda").to(BF16),
                              torch.randn(batch, seq, dim, device="cuda").to(BF16),
                              (torch.rand(dim, device="cuda") + 0.5).to(BF16),
                              (torch.rand(dim, device="cuda") + 0.5).to(BF16)), nbytes)


def wan_tables(seq):
    """Random angles as Wan's rotary embedding hands them over: [1, S, 1, 128] float32 cos and sin."""
    angle = torch.rand(1, seq, 1, 128, device="cuda") * 6.3
    return angle.cos(), angle.sin()


def wan_backward_form(k, rows, ceiling, batch, seq, dim) -> None:
    """Wan's form (as wan_form) at batch 2: its LoRA step runs the two guidance passes as one batch."""
    cos, sin = wan_tables(seq)

    def eager(q, kk, wq, wk):
        return wan_qk_eager(q, kk, lambda x: torch.nn.functional.rms_norm(x, (dim,), wq, 1e-6),
                            lambda x: torch.nn.functional.rms_norm(x, (dim,), wk, 1e-6), cos, sin, dim // 128)

    forwards = {"ltx_kernels": lambda q, kk, wq, wk: k.qk_rmsnorm_rope(q, kk, wq, wk, cos.flatten(2), sin.flatten(2),
                                                                       1e-6),
                "eager (nn.RMSNorm + Wan rope)": eager, "torch.compile(eager)": torch.compile(eager)}
    nbytes = 6 * 2 * batch * seq * dim + 2 * 4 * seq * 128 + 4 * 2 * dim
    measure_backward(rows, ceiling, "qk_rmsnorm_rope", (batch, seq, dim), forwards,
                     lambda: (torch.randn(batch, seq, dim, device="cuda").to(BF16),
                              torch.randn(batch, seq, dim, device="cuda").to(BF16),
                              (torch.rand(dim, device="cuda") + 0.5).to(BF16),
                              (torch.rand(dim, device="cuda") + 0.5).to(BF16)), nbytes, label=" (Wan)")


def ltx_form(k, rows, ceiling, rope_eager, sweep, batch, frames, height, width, dim) -> None:
    seq = frames * height * width
    cos, sin = k.ltx_rope_cos_sin(frames, height, width, (8 / 25, 32, 32), dim, batch_size=batch, device="cuda")
    norm_q = torch.nn.RMSNorm(dim, eps=1e-5, device="cuda", dtype=BF16)
    norm_k = torch.nn.RMSNorm(dim, eps=1e-5, device="cuda", dtype=BF16)

    def eager(q, kk):
        return ltx_qk_eager(q, kk, norm_q, norm_k, cos, sin, rope_eager)

    def ours(q, kk):
        return k.qk_rmsnorm_rope(q, kk, norm_q.weight, norm_k.weight, cos, sin, 1e-5)

    impls = {"ltx_kernels": ours, "eager (nn.RMSNorm + diffusers rope)": eager,
             "torch.compile(eager)": torch.compile(eager)}
    impls.update(tuned("ltx_kernels", {TPR_KNOB: tpr}, ours) for tpr in ((32, 64, 128, 256, 512) if sweep else ()))
    nbytes = 4 * 2 * batch * seq * dim + 2 * 4 * seq * dim
    with torch.no_grad():
        measure(rows, ceiling, "qk_rmsnorm_rope", (batch, seq, dim), impls,
                lambda i: (torch.randn(batch, seq, dim, device="cuda").to(BF16),
                           torch.randn(batch, seq, dim, device="cuda").to(BF16)), nbytes)


def wan_form(k, rows, ceiling, seq, dim) -> None:
    """Wan's self-attention q/k norms and RoPE at batch 1 (heads of 128)."""
    cos, sin = wan_tables(seq)
    norm_q = torch.nn.RMSNorm(dim, eps=1e-6, device="cuda", dtype=BF16)
    norm_k = torch.nn.RMSNorm(dim, eps=1e-6, device="cuda", dtype=BF16)

    def eager(q, kk):
        return wan_qk_eager(q, kk, norm_q, norm_k, cos, sin, dim // 128)

    def ours(q, kk):  # as the Wan integration calls it (its tables flattened to [1, S, 128])
        return k.qk_rmsnorm_rope(q, kk, norm_q.weight, norm_k.weight, cos.flatten(2), sin.flatten(2), 1e-6)

    impls = {"ltx_kernels": ours, "eager (nn.RMSNorm + Wan rope)": eager, "torch.compile(eager)": torch.compile(eager)}
    nbytes = 4 * 2 * seq * dim + 2 * 4 * seq * 128
    with torch.no_grad():
        measure(rows, ceiling, "qk_rmsnorm_rope (Wan)", (1, seq, dim), impls,
                lambda i: (torch.randn(1, seq, dim, device="cuda").to(BF16),
                           torch.randn(1, seq, dim, device="cuda").to(BF16)), nbytes)


def per_head(k, rows, ceiling, sweep, batch, seq, heads) -> None:
    head_dim = 128
    angle = torch.rand(seq, head_dim, device="cuda") * 6.3
    cos, sin = angle.cos(), angle.sin()
    wq = (torch.rand(head_dim, device="cuda") + 0.5).to(BF16)
    wk = (torch.rand(head_dim, device="cuda") + 0.5).to(BF16)

    def ours(q, kk):
        return k.qk_rmsnorm_rope(q, kk, wq, wk, cos, sin, 1e-6, rounding="diffusers")

    def flux_eager(q, kk):  # [B, H, S, D], as Flux's attention processor holds them
        return flux_qk_eager(q, kk, wq, wk, cos, sin)

    nbytes = 4 * 2 * batch * seq * heads * head_dim + 2 * 4 * seq * head_dim
    # ours takes [B, S, H, D] (token-major), eager the [B, H, S, D] view of the same data
    compiled = torch.compile(flux_eager)
    impls = {"ltx_kernels (per head)": ours,
             **dict(tuned("ltx_kernels (per head)", {TPR_KNOB: t}, ours) for t in ((16, 32, 64, 128, 256) if sweep
                                                                                  else ())),
             "eager (diffusers RMSNorm + rope)": lambda q, kk: flux_eager(q.transpose(1, 2), kk.transpose(1, 2)),
             "torch.compile(eager)": lambda q, kk: compiled(q.transpose(1, 2), kk.transpose(1, 2))}
    with torch.no_grad():
        measure(rows, ceiling, "qk_rmsnorm_rope per head", (batch, seq, heads, head_dim), impls,
                lambda i: (torch.randn(batch, seq, heads, head_dim, device="cuda").to(BF16),
                           torch.randn(batch, seq, heads, head_dim, device="cuda").to(BF16)), nbytes)


if __name__ == "__main__":
    main()
