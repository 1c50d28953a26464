"""Load ltx-kernels at the exact Hub commit kernels.lock names, then use it.

    python3 examples/consumer/consumer.py

Online this downloads only the build variant for the local torch/CUDA of that
commit into the kernels cache; with HF_HUB_OFFLINE=1 it loads it from the
cache without the network. The kernels.lock in this directory holds a
placeholder commit (40 zeros) until the kernel is published: regenerate it
with `kernels lock examples/consumer` after `python3 -m ltx_build upload`.
"""

from pathlib import Path

import torch
from kernels import get_locked_kernel

REPO_ID = "ltx-kernels/ltx-kernels"
LOCKFILE = Path(__file__).resolve().with_name("kernels.lock")

# trust_remote_code: the publisher is not a trusted kernel publisher on the Hub.
ltx = get_locked_kernel(REPO_ID, lockfile=LOCKFILE, trust_remote_code=True)
print(f"loaded {ltx.__name__} pinned by {LOCKFILE.name}")

if torch.cuda.is_available():
    x = torch.randn(2, 2688, 2048, device="cuda", dtype=torch.bfloat16)
    y = ltx.rmsnorm(x, None, eps=1e-6)
    print(f"rmsnorm {list(x.shape)} -> {list(y.shape)} on {torch.cuda.get_device_name()}")
