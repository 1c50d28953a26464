"""Run GEGLU / SwiGLU (ours and torch.compile's) and RMSNorm at [2, 4096, 3072]
a few times, for a profiler:
`ncu --kernel-name regex:'gated_vectorized|triton|rms_norm_vectorized' python3 scripts/profile_activation.py`."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import load_kernel  # noqa: E402

k = load_kernel()
x = torch.randn(2, 2688, 16384, device="cuda", dtype=torch.bfloat16)
h = torch.randn(2, 4096, 3072, device="cuda", dtype=torch.bfloat16)
w = torch.rand(3072, device="cuda", dtype=torch.bfloat16)


def geglu(t):
    a, b = t.chunk(2, -1)
    return F.gelu(a, approximate="tanh") * b


compiled = torch.compile(geglu)
for _ in range(2):
    k.geglu(x)
    k.swiglu(x)
    compiled(x)
    k.rmsnorm(h, w, 1e-6)
torch.cuda.synchronize()
