"""RoPE benchmark (issue 4, item 1): LTX-Video's interleaved rotary embedding
(`apply_rotary_emb`) against diffusers' eager `apply_rotary_emb` and
torch.compile of it, at LTX's [B, S, 2048] with the fp32 tables
`ltx_rope_cos_sin` builds (batch dim expanded, stride 0, as the tables of one
video are the same for every sample). The fused q/k norm + RoPE is
bench_qk_rmsnorm_rope.py.
Bytes: x read + written (bf16) + cos and sin read once (fp32).
Timing as in bench_rmsnorm.py.

Backward rows ("apply_rotary_emb backward", issue 36) at LTX-Video 2B [2, 2688, 2048] and the Wan
1.3B token count [2, 32760, 1536] (ltx_dev/bench/backward.py): our transposed rotation against
eager autograd of diffusers' code and torch.compile's backward (Liger has no interleaved RoPE: see
bench_rope_axes.py for its rotate-half row). Bytes (the floor): dy read, dx written (bf16), cos and
sin read once (fp32, shared by the batch).

    python3 -m benchmarks.bench_rope [--out DIR] [--quick]   (--help: every option)
"""

from __future__ import annotations

import torch

from ltx_dev.bench.harness import measure, save, start
from ltx_dev.reference.rope import diffusers_ltx_apply_rotary_emb

from ltx_dev.bench.backward import measure_backward

# (batch, frames, height, width, dim): LTX-Video 2B at 49 frames 512x768, and Wan 1.3B's token count
BACKWARD_SHAPES = [(2, 7, 16, 24, 2048), (2, 21, 30, 52, 1536)]


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
    for batch, frames, height, width, dim in BACKWARD_SHAPES:
        seq = frames * height * width
        cos, sin = k.ltx_rope_cos_sin(frames, height, width, (8 / 25, 32, 32), dim, batch_size=batch, device="cuda")
        forwards = {"ltx_kernels": lambda x, c=cos, s=sin: k.apply_rotary_emb(x, c, s),
                    "eager (diffusers)": lambda x, c=cos, s=sin: eager(x, (c, s)),
                    "torch.compile(diffusers)": lambda x, c=cos, s=sin: compiled(x, (c, s))}
        measure_backward(rows, ceiling, "apply_rotary_emb", (batch, seq, dim), forwards,
                         lambda: (torch.randn(batch, seq, dim, device="cuda").bfloat16(),),
                         2 * 2 * batch * seq * dim + 2 * 4 * seq * dim)
    save("rope", env, ceiling, rows, args.out)


if __name__ == "__main__":
    main()
