"""ltx_dev/bench/targets.py: which benchmark rows miss the issues' targets (no GPU needed)."""

from __future__ import annotations

from ltx_dev.bench import targets


def row(impl, us, frac_copy, op="op", shape=(2, 8)):
    return {"op": op, "shape": list(shape), "impl": impl, "us": us, "frac_copy": frac_copy}


def test_a_row_under_85_percent_of_copy_is_reported_and_one_at_it_is_not():
    data = {"rows": [row("ltx_kernels", 10.0, 0.849, shape=(1,)), row("eager", 30.0, 0.3, shape=(1,)),
                     row("ltx_kernels", 10.0, 0.85, shape=(2,)), row("eager", 30.0, 0.3, shape=(2,))]}
    found = targets.misses(data)
    assert [(m.shape, m.under_copy_target, m.ahead_baselines) for m in found] == [("[1]", True, [])]


def test_the_fastest_mode_counts_and_a_faster_baseline_is_named_with_the_margin():
    data = {"rows": [row("ltx_kernels (exact)", 10.4, 0.90), row("ltx_kernels (fast)", 10.2, 0.92),
                     row("torch.compile", 10.1, 0.93), row("eager", 40.0, 0.2)]}
    (m,) = targets.misses(data)
    assert m.ours["impl"] == "ltx_kernels (fast)" and not m.under_copy_target
    assert m.ahead_baselines == [("torch.compile", 10.1)]
    assert "behind torch.compile 10.10 µs by 1.0%" in m.line()


def test_sweep_rows_and_the_same_bytes_copy_are_not_implementations_to_beat():
    data = {"rows": [row("ltx_kernels", 10.0, 0.9), row("ltx_kernels [fused_norm.prefetch=1]", 5.0, 1.8),
                     row(targets.COPY_IMPL, 9.0, 1.0), row("eager", 30.0, 0.3)]}
    assert targets.misses(data) == []


def test_each_rounding_variant_meets_only_its_own_baselines():
    data = {"rows": [row("ltx_kernels (diffusers rounding)", 10.0, 0.9),
                     row("ltx_kernels (original rounding)", 12.0, 0.86),
                     row("torch.compile(diffusers)", 11.0, 0.85), row("torch.compile(original)", 12.5, 0.8)]}
    assert targets.misses(data) == []  # the original form is slower than compile(diffusers), not its own
    data["rows"].append(row("original eager (PixelNorm)", 11.9, 0.87))
    (m,) = targets.misses(data)
    assert m.ours["impl"] == "ltx_kernels (original rounding)"
    assert m.ahead_baselines == [("original eager (PixelNorm)", 11.9)]


def test_the_untagged_variant_meets_the_untagged_baselines():
    data = {"rows": [row("ltx_kernels (torch rounding)", 10.0, 0.9), row("ltx_kernels (diffusers rounding)", 9.0, 1.0),
                     row("Liger", 9.5, 0.95), row("torch.compile(diffusers)", 9.6, 0.94)]}
    (m,) = targets.misses(data)
    assert m.ours["impl"] == "ltx_kernels (torch rounding)" and m.ahead_baselines == [("Liger", 9.5)]


def test_gemm_rows_are_judged_on_speed_alone():
    data = {"rows": [{"op": "linear_gelu", "shape": [8, 8, 8], "impl": "ltx_kernels linear_gelu", "us": 10.0,
                      "frac_copy": 0.1, "tflops": 600.0},
                     {"op": "linear_gelu", "shape": [8, 8, 8], "impl": "eager F.linear + F.gelu", "us": 11.0,
                      "frac_copy": 0.1, "tflops": 550.0}]}
    assert targets.misses(data) == []


def test_a_speedup_over_eager_short_of_the_issue_target_is_reported():
    shape = (1, 2048, 3072)  # Mochi's published 9.6x

    def rows(ours_us):
        return {"rows": [row("ltx_kernels (exact)", ours_us, 0.9, op="residual_tanh_gated_rmsnorm", shape=shape),
                         row("eager (genmo)", 96.0, 0.1, op="residual_tanh_gated_rmsnorm", shape=shape)]}
    (m,) = targets.misses(rows(10.5))
    assert not m.under_copy_target and not m.ahead_baselines
    assert m.short_of_speedup == (96.0 / 10.5, 9.6) and "9.14x eager (< 9.6x)" in m.line()
    assert targets.misses(rows(10.0)) == []  # exactly 9.6x


def test_shapes_without_a_speedup_target_are_not_held_to_one():
    data = {"rows": [row("ltx_kernels", 10.0, 0.9, op="residual_tanh_gated_rmsnorm", shape=(2, 2048, 3072)),
                     row("eager (genmo)", 20.0, 0.45, op="residual_tanh_gated_rmsnorm", shape=(2, 2048, 3072))]}
    assert targets.misses(data) == []


def test_rows_whose_shape_lists_several_operands_are_checked_too():
    shape = [[2, 512, 7, 32, 48], [512, 1, 1, 1]]  # inplace_add's x and y
    data = {"rows": [row("ltx_kernels", 10.0, 0.8, op="inplace_add", shape=shape),
                     row("eager", 9.0, 0.9, op="inplace_add", shape=shape)]}
    (m,) = targets.misses(data)
    assert m.under_copy_target and m.ahead_baselines == [("eager", 9.0)]


def test_a_backward_is_held_to_80_percent_of_copy_from_64_mb_and_to_no_share_below():
    def bwd(frac_copy, nbytes, shape):
        return {**row("ltx_kernels", 10.0, frac_copy, op="rmsnorm backward", shape=shape), "bytes": nbytes}

    data = {"rows": [bwd(0.79, 64e6, (1,)), bwd(0.80, 64e6, (2,)), bwd(0.30, 63e6, (3,)),
                     *(row("eager", 40.0, 0.2, op="rmsnorm backward", shape=(n,)) for n in (1, 2, 3))]}
    found = targets.misses(data)
    assert [(m.shape, m.under_copy_target) for m in found] == [("[1]", True)]
    assert "79.0% of copy (< 80%)" in found[0].line()
