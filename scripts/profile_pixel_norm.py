"""Run pixel_norm in both roundings at the VAE shapes of bench_vae.py, twice
each, for a profiler (`ncu --kernel-name regex:pixel_norm python3
scripts/profile_pixel_norm.py`)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_vae import PIXEL_NORM_SHAPES  # noqa: E402
from common import load_kernel  # noqa: E402

k = load_kernel()
for shape in PIXEL_NORM_SHAPES[1:]:  # the three VAE shapes (the first is the tiny one)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for rounding in ("diffusers", "original"):
        for _ in range(2):
            k.pixel_norm(x, 1, 1e-8, rounding=rounding)
torch.cuda.synchronize()
