"""ltx_dev.tuning on a fake kernel object (no build needed): override sets the knobs a dev build
knows and always restores them, refuses release builds with DevBuildRequired, and with_tuning
forces a knob around each call only."""

from __future__ import annotations

import types

import pytest

from ltx_dev import tuning

KNOBS = ("dependent_launch", "fused_norm.prefetch", "fused_norm.threads_per_row", "qk_rmsnorm_rope.samples")


class FakeOps:
    """A dev build's two tuning ops, recording every set_tuning call and the live overrides."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.values: dict[str, int] = {}

    def tuning_knobs(self):
        return list(KNOBS)

    def set_tuning(self, knob, value):
        self.calls.append((knob, value))
        if value == -1:
            self.values.pop(knob, None)
        else:
            self.values[knob] = value


def dev_kernel():
    return types.SimpleNamespace(__name__="_ltx_kernels_cuda_dev", ops=FakeOps())


def test_override_sets_dotted_knobs_from_a_dict_and_plain_ones_by_keyword_then_clears_them():
    k = dev_kernel()
    with tuning.override(k, {"fused_norm.prefetch": 0}, dependent_launch=0):
        assert k.ops.values == {"fused_norm.prefetch": 0, "dependent_launch": 0}
    assert k.ops.values == {}
    assert ("fused_norm.prefetch", -1) in k.ops.calls and ("dependent_launch", -1) in k.ops.calls


def test_override_clears_its_knobs_when_the_block_raises():
    k = dev_kernel()
    with pytest.raises(KeyError):
        with tuning.override(k, {"qk_rmsnorm_rope.samples": 1}):
            raise KeyError("boom")
    assert k.ops.values == {}


def test_a_nested_override_of_the_same_knob_restores_the_outer_value():
    k = dev_kernel()
    with tuning.override(k, {"fused_norm.threads_per_row": 128}):
        with tuning.override(k, {"fused_norm.threads_per_row": 64}):
            assert k.ops.values["fused_norm.threads_per_row"] == 64
        assert k.ops.values["fused_norm.threads_per_row"] == 128
    assert k.ops.values == {}


def test_an_unknown_knob_or_a_negative_value_is_refused_before_anything_is_set():
    k = dev_kernel()
    with pytest.raises(ValueError, match="unknown tuning knob 'fused_norm.prefetched'.*fused_norm.prefetch"):
        with tuning.override(k, {"dependent_launch": 0, "fused_norm.prefetched": 1}):
            pass
    with pytest.raises(ValueError, match="values are >= 0"):
        with tuning.override(k, {"dependent_launch": -1}):
            pass
    assert k.ops.calls == []


def test_a_release_build_raises_dev_build_required_which_tests_can_skip_on():
    release = types.SimpleNamespace(__name__="_ltx_kernels_cuda_abc", ops=types.SimpleNamespace(rmsnorm=None))
    with pytest.raises(tuning.DevBuildRequired, match="--dev"):
        with tuning.override(release, {"dependent_launch": 0}):
            pass
    with pytest.raises(tuning.DevBuildRequired):
        tuning.with_tuning(release, "dependent_launch", 0, lambda: None)
    assert issubclass(tuning.DevBuildRequired, RuntimeError)


def test_with_tuning_forces_the_knob_during_each_call_and_clears_it_after_even_on_error():
    k = dev_kernel()
    seen = []

    def fn(x):
        seen.append(dict(k.ops.values))
        if x == "fail":
            raise RuntimeError("op failed")
        return x * 2

    wrapped = tuning.with_tuning(k, "fused_norm.prefetch", 1, fn)
    assert k.ops.values == {}  # nothing is set until a call
    assert wrapped(3) == 6 and k.ops.values == {}
    with pytest.raises(RuntimeError):
        wrapped("fail")
    assert seen == [{"fused_norm.prefetch": 1}] * 2 and k.ops.values == {}


def test_with_tuning_checks_the_knob_when_wrapping():
    with pytest.raises(ValueError, match="unknown tuning knob"):
        tuning.with_tuning(dev_kernel(), "rmsnorm.tpr", 64, lambda: None)


def test_knob_settings_parse_from_the_command_line_form():
    assert tuning.parse_setting("qk_rmsnorm_rope.samples=1,2") == ("qk_rmsnorm_rope.samples", [1, 2])
    assert tuning.parse_setting("dependent_launch=0") == ("dependent_launch", [0])
    for bad in ("dependent_launch", "dependent_launch=", "=1", "fused_norm.prefetch=on"):
        with pytest.raises(ValueError, match="KNOB=V1"):
            tuning.parse_setting(bad)
