"""Load the built ltx-kernels and normalise an LTX-Video-shaped activation.

    python3 example.py

Loads build/<variant> through kernels.get_kernel (LOCAL_KERNELS, offline).
Without a GPU it stops after loading and says so.
"""

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from ltx_build import config  # noqa: E402

cfg = config.load(ROOT)
os.environ.setdefault("LOCAL_KERNELS", f"{cfg.repo_id}={ROOT}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import kernels  # noqa: E402

ltx = kernels.get_kernel(cfg.repo_id, version=cfg.version, trust_remote_code=True)
print(f"loaded {ltx.__name__}: {', '.join(ltx.__all__)}")
if not torch.cuda.is_available():
    print("no CUDA GPU here: built, ABI-checked and loaded; the GPU part of the example was skipped")
    sys.exit(0)

# LTX-Video 2B, 49 frames at 512x768, batch 2 (classifier-free guidance): [2, 2688, 2048] bf16.
x = torch.randn(2, 2688, 2048, device="cuda", dtype=torch.bfloat16)
y = ltx.rmsnorm(x, None, eps=1e-6)  # LTX block norms have no weight
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
print(f"{torch.cuda.get_device_name()}: rmsnorm {list(x.shape)} bf16, max |y - ref| = "
      f"{(y.float() - ref.float()).abs().max().item():.3g}")
