"""RoPE benchmark (issue 4, items 1-2): LTX-Video's interleaved rotary embedding
(`apply_rotary_emb`) against diffusers' eager `apply_rotary_emb` and
torch.compile of it, at LTX's [B, S, 2048] with the fp32 tables
`ltx_rope_cos_sin` builds (batch dim expanded, stride 0, as the tables of one
video are the same for every sample); and the fused q/k RMSNorm + RoPE
(`qk_rmsnorm_rope`) against the eager chain (torch.nn.RMSNorm over all heads,
then apply_rotary_emb, for q and k) and torch.compile of it, at LTX's shape,
and in the per-head form (diffusers RMSNorm per head of 128, Flux's
interleaved RoPE with [S, 128] tables) at [2, 2688, 32, 128] and Flux's
[1, 4096 + 512, 24, 128].
Bytes: q/k (or x) read + written (bf16) + cos and sin read once (fp32).
Timing as in bench_rmsnorm.py. The per-head form runs the one-word kernel (v7);
`--sweep-env LTX_KERNELS_QK_ONE_WORD=0,1` adds rows of the v6 kernel (0) beside it, and the
`--sweep` tpr rows are v6 at that tpr (an explicit LTX_KERNELS_QK_TPR selects v6).

    python3 benchmarks/bench_rope.py [--out DIR] [--quick] [--sweep] [--sweep-env VAR=V1,V2]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measure, save, start, with_env  # noqa: E402


def diffusers_apply_rotary_emb():
    try:
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb
    except ImportError:  # same code, for machines without diffusers
        def apply_rotary_emb(x, freqs):
            cos, sin = freqs
            x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
            x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
            return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
    return apply_rotary_emb


def main() -> None:
    args, k, env, ceiling = start(__doc__, "one shape", "also time qk_rmsnorm_rope at each threads-per-row (LTX_KERNELS_QK_TPR)")
    rows: list[dict] = []
    eager = diffusers_apply_rotary_emb()
    compiled = torch.compile(eager)
    # (batch, frames, height, width): 49 frames at 512x768 and 121 frames at 768x1280 (latent grids)
    for batch, frames, height, width in [(2, 7, 16, 24), (2, 16, 24, 40)][: 1 if args.quick else None]:
        dim, seq = 2048, frames * height * width
        cos, sin = k.ltx_rope_cos_sin(frames, height, width, (8 / 25, 32, 32), dim, batch_size=batch, device="cuda")
        impls = {"ltx_kernels": lambda x: k.apply_rotary_emb(x, cos, sin),
                 "eager (diffusers)": lambda x: eager(x, (cos, sin)),
                 "torch.compile(diffusers)": lambda x: compiled(x, (cos, sin))}
        nbytes = 2 * 2 * batch * seq * dim + 2 * 4 * seq * dim
        measure(rows, ceiling, "apply_rotary_emb", (batch, seq, dim), impls,
                lambda i: (torch.randn(batch, seq, dim, device="cuda").bfloat16(),), nbytes)
    qk_norm_rope(k, rows, ceiling, eager, args.quick, args.sweep)
    save("rope", env, ceiling, rows, args.out)


def qk_norm_rope(k, rows, ceiling, rope_eager, quick, sweep) -> None:
    bf16 = torch.bfloat16

    # LTX: torch.nn.RMSNorm(D, eps=1e-5) over all heads, then the interleaved RoPE with [B, S, D] tables;
    # 2B (D 2048) at 49 and 121 frames, 13B (D 4096) at 49 frames, and batch 1 (no CFG: distilled models)
    shapes = [(2, 7, 16, 24, 2048), (2, 7, 16, 24, 4096), (2, 16, 24, 40, 2048), (1, 7, 16, 24, 2048)]
    for batch, frames, height, width, dim in shapes[: 1 if quick else None]:
        seq = frames * height * width
        cos, sin = k.ltx_rope_cos_sin(frames, height, width, (8 / 25, 32, 32), dim, batch_size=batch, device="cuda")
        norm_q = torch.nn.RMSNorm(dim, eps=1e-5, device="cuda", dtype=bf16)
        norm_k = torch.nn.RMSNorm(dim, eps=1e-5, device="cuda", dtype=bf16)

        def ltx_eager(q, kk):
            return rope_eager(norm_q(q), (cos, sin)), rope_eager(norm_k(kk), (cos, sin))

        impls = {"ltx_kernels": lambda q, kk: k.qk_rmsnorm_rope(q, kk, norm_q.weight, norm_k.weight, cos, sin, 1e-5),
                 "eager (nn.RMSNorm + diffusers rope)": ltx_eager,
                 "torch.compile(eager)": torch.compile(ltx_eager)}
        for tpr in (32, 64, 128, 256, 512) if sweep else ():
            impls[f"ltx_kernels tpr={tpr}"] = with_env("LTX_KERNELS_QK_TPR", tpr, impls["ltx_kernels"])
        nbytes = 4 * 2 * batch * seq * dim + 2 * 4 * seq * dim
        with torch.no_grad():
            measure(rows, ceiling, "qk_rmsnorm_rope", (batch, seq, dim), impls,
                    lambda i: (torch.randn(batch, seq, dim, device="cuda").to(bf16),
                               torch.randn(batch, seq, dim, device="cuda").to(bf16)), nbytes)

    # per head: diffusers RMSNorm(128, eps=1e-6), interleaved RoPE with [S, 128] tables, at the issue's
    # [2, 2688, 32, 128] and Flux's [1, 4096 + 512, 24, 128]
    for batch, seq, heads in [(2, 2688, 32), (1, 4096 + 512, 24)][: 1 if quick else None]:
        per_head(k, rows, ceiling, sweep, batch, seq, heads)


def per_head(k, rows, ceiling, sweep, batch, seq, heads) -> None:
    bf16, head_dim = torch.bfloat16, 128
    angle = torch.rand(seq, head_dim, device="cuda") * 6.3
    cos, sin = angle.cos(), angle.sin()
    wq = (torch.rand(head_dim, device="cuda") + 0.5).to(bf16)
    wk = (torch.rand(head_dim, device="cuda") + 0.5).to(bf16)

    def diffusers_rmsnorm(x, w):
        h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return h.to(bf16) * w

    def flux_rope(x):  # embeddings.apply_rotary_emb, use_real_unbind_dim=-1, on [B, H, S, D]
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
        return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)

    def flux_eager(q, kk):  # [B, H, S, D], as Flux's attention processor holds them
        return flux_rope(diffusers_rmsnorm(q, wq)), flux_rope(diffusers_rmsnorm(kk, wk))

    def ours(q, kk):
        return k.qk_rmsnorm_rope(q, kk, wq, wk, cos, sin, 1e-6, rounding="diffusers")

    nbytes = 4 * 2 * batch * seq * heads * head_dim + 2 * 4 * seq * head_dim
    # ours takes [B, S, H, D] (token-major), eager the [B, H, S, D] view of the same data
    impls = {"ltx_kernels (per head)": ours,
             **{f"ltx_kernels (per head) tpr={t}": with_env("LTX_KERNELS_QK_TPR", t, ours)
                for t in ((16, 32, 64, 128, 256) if sweep else ())},
             "eager (diffusers RMSNorm + rope)": lambda q, kk: flux_eager(q.transpose(1, 2), kk.transpose(1, 2)),
             "torch.compile(eager)": (lambda f: lambda q, kk: f(q.transpose(1, 2), kk.transpose(1, 2)))(
                 torch.compile(flux_eager))}
    with torch.no_grad():
        measure(rows, ceiling, "qk_rmsnorm_rope per head", (batch, seq, heads, head_dim), impls,
                lambda i: (torch.randn(batch, seq, heads, head_dim, device="cuda").to(bf16),
                           torch.randn(batch, seq, heads, head_dim, device="cuda").to(bf16)), nbytes)


if __name__ == "__main__":
    main()
