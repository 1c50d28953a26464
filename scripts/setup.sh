#!/usr/bin/env bash
# Set-up command 1 (README): install torch (when missing) and the tools, build
# the variant for the installed torch, check its ABI, load it through
# `kernels`, then run the example. Needs Python 3 and the CUDA toolkit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install_and_build.sh "$@"
python3 example.py
