"""`ltx-dev sanitize-summary` (ltx_dev/sanitize.py) attributes each compute-sanitizer report to the
op that was running and to the kernel it names (ours, namespace ltx::, or a library
kernel), and only calls a run clean when no report names one of our kernels and
every report was attributed. Log lines below follow compute-sanitizer 2025.3's format."""

from __future__ import annotations

import types

from ltx_dev import sanitize as sanitize_ops

HEADER = "[ltx-sanitize] device: NVIDIA H200, torch 2.11.0+cu130, date 2026-11-22, tool {tool}\n"
DONE = "[ltx-sanitize] done: 2 cases, 0 failed, 1.0 s\n"

OUR_MEMCHECK_REPORT = """\
[ltx-sanitize] begin rmsnorm small vector bfloat16
========= Invalid __global__ read of size 16 bytes
=========     at void ltx::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16, 8>(const T1 *, T1 *)+0x1f0
=========     by thread (3,0,0) in block (0,0,0)
[ltx-sanitize] end rmsnorm
"""
LIBRARY_INITCHECK_REPORT = """\
[ltx-sanitize] begin linear_gelu small vector bfloat16
========= Uninitialized __global__ memory read of size 2 bytes
=========     at void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int, T1)+0x870
=========     by thread (96,0,0) in block (0,0,0)
[ltx-sanitize] end linear_gelu
"""
LIBRARY_RACE_REPORT = """\
[ltx-sanitize] begin linear_gelu ltx vector bfloat16
========= Error: Race reported between Read access at nvjet_sm90_tst_176x128_gelubias_TNN+0x9b0
=========     and Write access at nvjet_sm90_tst_176x128_gelubias_TNN+0x8d30 [199792 hazards]
[ltx-sanitize] end linear_gelu
"""


def summary(tmp_path, logs: dict) -> tuple[int, str]:
    paths = []
    for name, text in logs.items():
        path = tmp_path / f"{name}.log"
        path.write_text(text)
        paths.append(str(path))
    md = tmp_path / "summary.md"
    rc = sanitize_ops.summarize(types.SimpleNamespace(logs=paths, markdown=str(md)))
    return rc, md.read_text()


def test_a_report_in_one_of_our_kernels_is_not_clean(tmp_path):
    log = HEADER.format(tool="memcheck") + OUR_MEMCHECK_REPORT + DONE + "========= ERROR SUMMARY: 1 error\n"
    rc, text = summary(tmp_path, {"memcheck": log})
    assert rc == 1
    assert "| memcheck | 1 | 1 | 0 |" in text
    assert "| rmsnorm | 1 |" in text
    assert "NOT CLEAN" in text


def test_reports_only_in_library_kernels_are_listed_and_the_run_is_clean_for_ours(tmp_path):
    init = HEADER.format(tool="initcheck") + LIBRARY_INITCHECK_REPORT + DONE + "========= ERROR SUMMARY: 1 error\n"
    race = (HEADER.format(tool="racecheck") + LIBRARY_RACE_REPORT + DONE
            + "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    rc, text = summary(tmp_path, {"initcheck": init, "racecheck": race, "control-racecheck": race})
    assert rc == 0
    assert "| initcheck | 1 | 0 | 1 |" in text and "| racecheck | 1 | 0 | 1 |" in text
    assert "- at::native::unrolled_elementwise_kernel: 1" in text
    assert "- nvjet_sm90_tst_176x128_gelubias_TNN: 1" in text
    assert "Control" in text and "| control-racecheck | 1 | 0 | 1 |" in text
    assert "verdict: zero reports in ltx_kernels' kernels" in text


def test_reports_the_log_did_not_print_make_the_run_not_clean(tmp_path):
    """A print limit hides reports: the sanitizer's total then exceeds what was attributed."""
    log = HEADER.format(tool="initcheck") + LIBRARY_INITCHECK_REPORT + DONE + "========= ERROR SUMMARY: 5 errors\n"
    rc, text = summary(tmp_path, {"initcheck": log})
    assert rc == 1 and "NOT CLEAN" in text


def test_a_log_without_the_sanitizers_summary_is_not_clean(tmp_path):
    rc, text = summary(tmp_path, {"synccheck": HEADER.format(tool="synccheck") + DONE})
    assert rc == 1 and "no summary (crashed or timed out)" in text


def test_zero_reports_everywhere_is_clean(tmp_path):
    log = HEADER.format(tool="memcheck") + DONE + "========= ERROR SUMMARY: 0 errors\n"
    rc, text = summary(tmp_path, {"memcheck": log})
    assert rc == 0 and "verdict: zero reports, every case ran" in text
