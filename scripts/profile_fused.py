"""Run each fused norm op a few times at the LTX shape, for a profiler
(`ncu --kernel-name regex:fused_norm python3 scripts/profile_fused.py`)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import load_kernel  # noqa: E402

k = load_kernel()
B, S, D = 2, 2688, 2048
x, y = (torch.randn(B, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
g, s, sh = (torch.randn(B, 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
s32 = s.float()  # Mochi's modulation is float32
for _ in range(2):
    k.gated_residual(x, y, g)
    k.adaln_rmsnorm(x, None, s, sh, exact_mode=False)
    k.adaln_rmsnorm(x, None, s, sh, exact_mode=True)
    k.modulated_rmsnorm(x, s32)
    k.gated_residual_rmsnorm(x, y, g, s, sh)
    k.rmsnorm(x)
torch.cuda.synchronize()
