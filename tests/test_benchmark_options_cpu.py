"""The benchmarks' --only filter and --rounds summary (ltx_dev/bench/harness.py), and how the
rendered tables name the timing method a result JSON records: no GPU needed."""

from __future__ import annotations

import pytest

from ltx_dev.bench import harness
from ltx_dev.bench import render


@pytest.fixture
def only(monkeypatch):
    def set_only(*names):
        monkeypatch.setattr(harness.SETTINGS, "only_ops", set(names))
    return set_only


def test_without_only_every_op_is_measured(only):
    only()
    assert harness.selected("qk_rmsnorm_rope per head")
    assert harness.selected("gated_residual")


def test_only_matches_exact_names_and_underscored_spaces_but_not_prefixes(only):
    only("qk_rmsnorm_rope", "qk_rmsnorm_rope_per_head")
    assert harness.selected("qk_rmsnorm_rope")
    assert harness.selected("qk_rmsnorm_rope per head")
    assert not harness.selected("apply_rotary_emb")
    only("qk_rmsnorm_rope")
    assert not harness.selected("qk_rmsnorm_rope per head")
    only("rmsnorm")
    assert not harness.selected("rmsnorm_residual")


def test_rounds_report_the_lower_median_so_one_slow_round_never_sets_the_figure():
    assert harness.median_of_rounds([(10.0, 20.0)]) == (10.0, 20.0)
    assert harness.median_of_rounds([(12.0, 21.0), (10.0, 30.0), (11.0, 20.0)]) == (11.0, 21.0)
    assert harness.median_of_rounds([(10.0, 20.0), (15.0, 25.0)]) == (10.0, 20.0)
    assert harness.median_of_rounds([(9.9, 1.0), (10.0, 2.0), (10.1, 3.0), (99.0, 4.0)]) == (10.0, 2.0)


def test_tables_name_the_timing_method_their_json_records():
    fresh = render.steady_state({"timing": harness.TIMING})
    assert "outputs in fresh memory" in fresh
    old_timing = dict(harness.TIMING, us="CUDA-graph replay of calls rotating over inputs spanning 4x L2, median "
                                        "per call")
    assert "reused buffer" in render.steady_state({"timing": old_timing})
    assert "reused buffer" in render.steady_state({})
