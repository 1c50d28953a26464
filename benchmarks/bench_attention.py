"""Attention backends at LTX-Video's shapes (issue 4, item 6). The package
ships no attention kernel: this measures what `F.scaled_dot_product_attention`
already offers (cuDNN, flash, memory-efficient, math) so the integration can
pick the fastest one that supports the call.

Shapes (bf16, [B, H, S, D]): LTX 2B self-attention [2, 32, 2688, 64]; its
cross-attention to 128 text tokens with LTX's additive mask ([B, 1, 1, 128],
-10000 on padding), and without a mask; LTX 13B self-attention
[2, 32, 2688, 128]. FLOPs 4·B·H·Sq·Sk·D (two GEMMs). Time: triton do_bench
median with L2 flushed. A backend that refuses the call is recorded as such.

    python3 -m benchmarks.bench_attention [--out DIR] [--quick] [--commit SHA]
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ltx_dev.bench.harness import TIMING, median_us, start, write_json

BACKENDS = {"default (no sdpa_kernel)": None, "cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def cases(quick: bool):
    yield "self-attention (LTX 2B)", (2, 32, 2688, 64), 2688, False
    if quick:
        return
    yield "cross-attention, 128 text tokens, additive mask", (2, 32, 2688, 64), 128, True
    yield "cross-attention, 128 text tokens, no mask", (2, 32, 2688, 64), 128, False
    yield "self-attention (LTX 13B)", (2, 32, 2688, 128), 2688, False


def main() -> None:
    args, _, env, _ = start(__doc__, "self-attention only", kernel=False)
    rows = []
    for name, (B, H, S, D), kv_len, masked in cases(args.quick):
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, H, kv_len, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, H, kv_len, D, device="cuda", dtype=torch.bfloat16)
        mask = None
        if masked:  # LTX: (1 - mask) * -10000, broadcast over heads and queries; the last 32 tokens are padding
            keep = torch.ones(B, kv_len, device="cuda")
            keep[:, -32:] = 0
            mask = ((1 - keep) * -10000.0).to(torch.bfloat16).view(B, 1, 1, kv_len)
        flops = 4 * B * H * S * kv_len * D
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                   attn_mask=None if mask is None else mask.float())
        for backend, enum in BACKENDS.items():
            row = {"op": name, "shape": [[B, H, S, D], [B, H, kv_len, D]], "dtype": "bfloat16", "impl": backend,
                   "masked": masked}
            try:
                with sdpa_kernel(enum) if enum is not None else contextlib.nullcontext():
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    err = ((out.float() - reference).norm() / reference.norm()).item()
                    us = median_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            except RuntimeError as e:  # the backend does not support this call
                row["unsupported"] = str(e).splitlines()[0][:200]
                print(f"  {name:48s} {backend:10s} unsupported: {row['unsupported'][:80]}", flush=True)
                rows.append(row)
                continue
            row.update(us_flushed=round(us, 2), us=round(us, 2), tflops=round(flops / (us * 1e-6) / 1e12, 1),
                       rel_l2_vs_fp32=float(f"{err:.2e}"))
            rows.append(row)
            print(f"  {name:48s} {backend:10s} {us:9.1f} us {row['tflops']:7.1f} TFLOP/s  rel err {err:.1e}",
                  flush=True)
    payload = {"env": env, "timing": {"us": TIMING["us_flushed"]}, "rows": rows}
    print(f"wrote {write_json('attention', payload, args.out)}")


if __name__ == "__main__":
    main()
