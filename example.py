"""Load the locally built ltx-kernels and check two ops against eager PyTorch.

    bash scripts/setup.sh      # builds build/<variant>/ and runs this file
    python3 example.py         # again, from anywhere

Without a CUDA GPU it loads the kernel, says the GPU part was skipped and exits 0.
"""

import sys
from pathlib import Path

import kernels
import torch

ROOT = Path(__file__).resolve().parent  # the repository root; the build is in ROOT/build/<variant>/

if not (ROOT / "build").is_dir():
    sys.exit(f"no build/ in {ROOT}: run `bash scripts/setup.sh` first")

ltx = kernels.get_local_kernel(ROOT)
print(f"loaded {ltx.__name__} from {ROOT / 'build'}")
print(f"ops: {', '.join(ltx.__all__)}")

if not torch.cuda.is_available():
    print("no CUDA GPU here: the kernel loads; the GPU part of the example was skipped")
    sys.exit(0)


def compare(name: str, ours: torch.Tensor, eager: torch.Tensor) -> None:
    """Print how far our result is from the eager one."""
    if torch.equal(ours, eager):
        print(f"{name}: bitwise equal to eager PyTorch")
        return
    diff = (ours.float() - eager.float()).abs()
    differ = int((diff > 0).sum())
    print(f"{name}: max |ours - eager| = {diff.max().item():.3g} on {differ} of {diff.numel()} elements "
          "(the mean-square sum runs in another order: an ulp on a few elements)")


torch.manual_seed(0)
device, bf16 = "cuda", torch.bfloat16
print(f"GPU: {torch.cuda.get_device_name()}")

# LTX-Video 2B, 49 frames at 512x768, batch 2 (classifier-free guidance): [2, 2688, 2048] bf16.
x = torch.randn(2, 2688, 2048, device=device, dtype=bf16)

# 1. RMSNorm with a weight, rounded as torch.nn.RMSNorm (LTX's q/k norms: eps 1e-5).
weight = torch.randn(2048, device=device, dtype=bf16)
y = ltx.rmsnorm(x, weight, eps=1e-5)
y_eager = torch.nn.functional.rms_norm(x, (2048,), weight, eps=1e-5)
compare("rmsnorm vs F.rms_norm", y, y_eager)

# 2. LTX's norm1 + AdaLN modulation in one pass, with the eager chain's roundings (exact_mode=True).
scale = 0.1 * torch.randn(2, 1, 2048, device=device, dtype=bf16)
shift = 0.1 * torch.randn(2, 1, 2048, device=device, dtype=bf16)
n = ltx.adaln_rmsnorm(x, None, scale, shift, eps=1e-6)
xf = x.float()
norm = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16)  # diffusers RMSNorm, no weight
n_eager = norm * (1 + scale) + shift                                          # LTX's block, in bf16
compare("adaln_rmsnorm vs the LTX eager chain", n, n_eager)
