"""Run qk_rmsnorm_rope at LTX's shape and in the per-head form a few times,
for a profiler (`ncu --kernel-name regex:qk_norm_rope python3 scripts/profile_qk.py`)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import load_kernel  # noqa: E402

k = load_kernel()
bf16 = torch.bfloat16
q, kk = (torch.randn(2, 2688, 2048, device="cuda", dtype=bf16) for _ in range(2))
w = torch.rand(2048, device="cuda", dtype=bf16)
cos, sin = k.ltx_rope_cos_sin(7, 16, 24, (8 / 25, 32, 32), 2048, batch_size=2, device="cuda")
qh, kh = (torch.randn(1, 4608, 24, 128, device="cuda", dtype=bf16) for _ in range(2))
wh = torch.rand(128, device="cuda", dtype=bf16)
ch, sh = torch.rand(4608, 128, device="cuda"), torch.rand(4608, 128, device="cuda")
for _ in range(2):
    k.qk_rmsnorm_rope(q, kk, w, w, cos, sin)
    k.qk_rmsnorm_rope(qh, kh, wh, wh, ch, sh, 1e-6, rounding="diffusers")
torch.cuda.synchronize()
