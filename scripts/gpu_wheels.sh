#!/usr/bin/env bash
# Download into .wheels/ (git-excluded; pass carry: [".wheels"] to the GPU machine)
# every wheel the offline GPU machine (Python 3.12, torch 2.11) lacks for building,
# loading, testing and benchmarking: kernels and its CLI (`kernels benchmark` imports
# sigstore for signature checks), the ABI checker, diffusers and Liger (baselines).
# scripts/gpu_session.sh installs them with pip --no-deps.
#   usage: bash scripts/gpu_wheels.sh [DEST]   (default .wheels)
set -euo pipefail
dest=${1:-.wheels}
mkdir -p "$dest"
wheels=(
  kernels==0.17.2 tomlkit kernel-abi-check diffusers==0.42.1 liger-kernel==0.8.5 safetensors
  # kernels' CLI: cryptography and sigstore with what the GPU image does not already have
  cryptography cffi pycparser sigstore==4.5.1 sigstore-models sigstore-rekor-types id platformdirs
  pydantic pydantic-core annotated-types typing-inspection pyjwt rfc3161-client rfc8785 tuf
  securesystemslib email-validator dnspython
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${wheels[@]}" 2>&1 | grep -v WARNING || true
ls "$dest"
