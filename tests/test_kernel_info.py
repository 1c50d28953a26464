"""kernel_info() of the built variant (torch-ext/ltx_kernels/info.py) and
`python3 -m ltx_build info`: which ops the build registers, its variant and
archs, the GPU, and whether (or why not) each op runs on it."""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ltx_build import variant

from . import conftest
from .conftest import CFG, cuda

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def info(kernel):
    return importlib.import_module(f"{kernel.__name__}.info")


ARCHS = ["9.0", "9.0a", "9.0+PTX", "10.0f", "8.0", "12.0a+PTX", "10.3a", "sm_90", "9"]
CAPABILITIES = [(8, 0), (8, 6), (9, 0), (10, 0), (10, 3), (12, 0)]


def test_arch_rules_are_the_ones_kernels_applies_before_loading(info):
    from kernels.archs import _cuda_arch_supports

    for arch, cap in itertools.product(ARCHS, CAPABILITIES):
        assert info.arch_runs_on(arch, cap) == _cuda_arch_supports(arch, cap), (arch, cap)


def test_reports_the_variant_its_archs_and_every_op_of_its_namespace(info, kernel):
    report = info.kernel_info()
    assert report.variant == variant.current_variant()
    assert report.archs == list(CFG.capabilities)
    assert report.ops_namespace == kernel.__name__
    assert Path(report.library).name.startswith(kernel.__name__) and Path(report.library).is_file()
    names = {o.name for o in report.ops}
    assert {"rmsnorm", "adaln_rmsnorm", "apply_rotary_emb", "rope_3d", "pixel_norm"} <= names
    # every op but a development build's tuning ops (no tensors: one implementation for every key)
    assert all("CUDA" in o.kernels for o in report.ops if o.name not in ("set_tuning", "tuning_knobs"))
    assert "rmsnorm" in report.functions and "add_op_namespace_prefix" not in report.functions


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_without_a_gpu_no_op_runs_and_the_reason_says_so(info):
    report = info.kernel_info()
    assert report.device is None and report.capability is None
    assert report.ops and not any(o.runs for o in report.ops)
    assert all("no CUDA device is visible" in o.reason for o in report.ops)
    assert "0 of" in report.report() and "no CUDA device is visible" in report.report()


@cuda
def test_on_the_gpu_each_op_runs_when_the_archs_cover_its_capability(info):
    report = info.kernel_info()
    expected = info.archs_run_on(report.archs, report.capability)
    assert all(o.runs == expected for o in report.ops)


def test_an_op_on_a_gpu_outside_the_build_archs_does_not_run_and_names_both(info, kernel):
    qualified = f"{kernel.__name__}::rmsnorm"
    on_a100 = info._op_status(qualified, ["9.0"], None, (8, 0))
    assert not on_a100.runs
    assert "built for 9.0" in on_a100.reason and "capability 8.0" in on_a100.reason
    assert info._op_status(qualified, ["9.0"], None, (9, 0)).runs
    assert not info._op_status(qualified, ["9.0"], None, (10, 0)).runs  # no PTX: Blackwell cannot JIT it


def test_an_op_without_a_cuda_kernel_does_not_run(info):
    status = info._op_status("aten::_foobar", ["9.0"], None, (9, 0))  # a CPU-only test op of torch
    assert not status.runs and "no CUDA kernel" in status.reason


def info_cli(*args: str) -> subprocess.CompletedProcess:
    """`ltx_build info` on the build the session loaded (--dev for the development build)."""
    dev = ["--dev"] if conftest.KERNEL_ROOT == conftest.DEV_ROOT else []
    return subprocess.run([sys.executable, "-m", "ltx_build", "info", *args, *dev], cwd=ROOT, capture_output=True,
                          text=True)


def test_cli_prints_the_same_information_as_json():
    proc = info_cli("--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["variant"] == variant.current_variant()
    assert data["archs"] == list(CFG.capabilities)
    assert {o["name"] for o in data["ops"]} >= {"rmsnorm", "qk_rmsnorm_rope"}
    assert all(set(o) == {"name", "runs", "reason", "kernels"} for o in data["ops"])


def test_cli_text_report_lists_ops_and_gpu():
    proc = info_cli()
    assert proc.returncode == 0, proc.stderr
    assert "variant     " + variant.current_variant() in proc.stdout
    assert "rmsnorm" in proc.stdout and "GPU " in proc.stdout
