"""RoPE benchmark (issue 4, item 1): LTX-Video's interleaved rotary embedding
(`apply_rotary_emb`) against diffusers' eager `apply_rotary_emb` and
torch.compile of it, at LTX's [B, S, 2048] with the fp32 tables
`ltx_rope_cos_sin` builds (batch dim expanded, stride 0, as the tables of one
video are the same for every sample). The fused q/k norm + RoPE is
bench_qk_rmsnorm_rope.py.
Bytes: x read + written (bf16) + cos and sin read once (fp32).
Timing as in bench_rmsnorm.py.

    python3 -m benchmarks.bench_rope [--out DIR] [--quick]   (--help: every option)
"""

from __future__ import annotations

import torch

from ltx_dev.bench.harness import measure, save, start
from ltx_dev.reference.rope import diffusers_ltx_apply_rotary_emb


def main() -> None:
    args, k, env, ceiling = start(__doc__, "one shape")
    rows: list[dict] = []
    eager = diffusers_ltx_apply_rotary_emb()
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
    save("rope", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
