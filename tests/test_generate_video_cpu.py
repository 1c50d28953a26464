"""The end-to-end benchmark (benchmarks/generate_video.py, its table and arithmetic in
ltx_dev.bench.end_to_end) without a GPU: each model's step shape as issue 35 states it, the command
line, the per-layer scaling, the targets, the result's schema and chart, and tiny models run end to
end on the CPU (one step's loop per model, a refusal of ours reported while stock is measured)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ltx_dev.bench import end_to_end as e2e

gv = pytest.importorskip("benchmarks.generate_video")


# --- the table --------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, tokens, text, batch, layers, audio", [
    ("ltx", 2688, 128, 2, 28, None),
    ("ltx2", 6144, 1024, 2, 48, 126),
    ("wan", 32760, 512, 2, 30, None),
    ("mochi", 23850, 256, 2, 48, None),
    ("flux", 4096, 512, 1, 19, None),
])
def test_each_model_steps_at_issue_35s_shape(model, tokens, text, batch, layers, audio):
    spec = e2e.MODELS[model]
    variant = spec.variant(None)
    assert e2e.shape_problems(spec, spec.step) == []
    assert e2e.tokens(spec, spec.step) == tokens  # frames and size through the VAE and the patches
    assert e2e.audio_tokens(spec, spec.step) == audio
    assert spec.step.text_tokens == text
    assert sum(e2e.passes(spec, spec.step.videos)) == batch  # sequences the transformer sees per step
    assert variant.units == layers


def test_flux_counts_a_unit_as_one_double_and_two_single_blocks_so_full_depth_is_19_plus_38():
    assert e2e.depth_kwargs(e2e.MODELS["flux"], 19) == {"num_layers": 19, "num_single_layers": 38}
    assert e2e.depth_kwargs(e2e.MODELS["flux"], 2) == {"num_layers": 2, "num_single_layers": 4}


def test_wan_offers_the_14b_and_image_to_video_configurations():
    wan = e2e.MODELS["wan"]
    assert wan.variant("14b").units == 40 and wan.variant("14b").kwargs == {}  # the class defaults
    i2v = wan.variant("14b-i2v").kwargs
    assert i2v["in_channels"] == 16 + 4 + 16 and i2v["added_kv_proj_dim"] == 40 * 128
    assert wan.variant("1.3b-i2v").kwargs["added_kv_proj_dim"] == 12 * 128


def test_shapes_the_vae_cannot_take_are_named():
    wan = e2e.MODELS["wan"]
    bad = e2e.Step(frames=80, height=481, width=832, text_tokens=512)
    problems = e2e.shape_problems(wan, bad)
    assert any("4k+1" in p for p in problems) and any("height" in p for p in problems)
    assert e2e.shape_problems(e2e.MODELS["flux"], e2e.Step(frames=5, height=64, width=64, text_tokens=8))


# --- the command line --------------------------------------------------------------------------------

def test_the_defaults_are_ltx_video_at_full_depth_in_all_four_configurations():
    args = gv.parse_args([])
    assert (args.model, args.config, args.layers, args.attention_backend) == ("ltx", "2b", 28, "auto")
    assert args.configs == list(e2e.CONFIGS) and args.guidance_scale == 3.0
    assert (args.step.frames, args.step.height, args.step.width) == (49, 512, 768)


def test_model_config_layers_and_shape_overrides_are_parsed():
    args = gv.parse_args(["--model", "wan", "--config", "14b", "--layers", "4", "--num-frames", "41",
                          "--configs", "ours-compile,stock-compile", "--attention-backend", "cudnn"])
    assert (args.model, args.config, args.layers, args.variant.units) == ("wan", "14b", 4, 40)
    assert args.step.frames == 41 and args.step.width == 832
    assert args.configs == ["stock-eager", "stock-compile", "ours-compile"]  # stock eager always, in run order
    assert args.guidance_scale == 5.0  # WanPipeline's


def test_fp8_adds_its_configurations_after_the_four():
    args = gv.parse_args(["--fp8", "--configs", "stock-compile,ours-compile"])
    assert args.configs == ["stock-eager", "stock-compile", "ours-compile", *e2e.FP8_CONFIGS]
    assert args.fp8_fast_accum and not gv.parse_args(["--fp8", "--no-fp8-fast-accum"]).fp8_fast_accum


def test_train_mode_options_are_parsed():
    args = gv.parse_args(["--model", "wan", "--train", "--grad-checkpointing", "on", "--lora-rank", "16"])
    assert (args.train, args.grad_checkpointing, args.lora_rank) == (True, "on", 16)
    plain = gv.parse_args([])
    assert (plain.train, plain.grad_checkpointing, plain.lora_rank) == (False, "off", 64)


@pytest.mark.parametrize("argv, message", [
    (["--model", "mochi", "--config", "14b"], "--config for mochi"),
    (["--model", "mochi", "--layers", "1"], "--layers"),
    (["--model", "mochi", "--layers", "49"], "--layers"),
    (["--model", "wan", "--num-frames", "80"], "4k+1"),
    (["--configs", "stock-eager,ours-fast"], "unknown ours-fast"),
    (["--steps", "1"], "--steps >= 2"),
    (["--grad-checkpointing", "on"], "go with --train"),
    (["--train", "--lora-rank", "0"], "--lora-rank >= 1"),
    (["--fp8", "--train"], "--fp8: inference on --model ltx or ltx2 or wan or mochi or flux only"),
    (["--model", "wan", "--fp8", "--device", "cpu"], "--fp8: the FP8 GEMMs and their quality check run on a CUDA GPU"),
    (["--compile-mode", "reduce-overhead"], "--compile-mode reduce-overhead needs --compile-scope model"),
    (["--cuda-graph", "--train"], "--cuda-graph: inference on one GPU"),
    (["--train", "--configs", "ours-fp8-compile"], "inference only, not --train"),
    (["--model", "wan", "--parallel", "ulysses"], "launched as `torchrun --nproc-per-node N"),  # no torchrun here
])
def test_bad_arguments_are_refused_saying_why(argv, message, capsys):
    with pytest.raises(SystemExit):
        gv.parse_args(argv)
    assert message in capsys.readouterr().err


def test_parallel_refuses_a_sequence_that_does_not_split_evenly(monkeypatch, capsys):
    """diffusers' sharder asserts equal shards: LTX-2's 121 frames carry 126 audio tokens (2 ranks, not 4)."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit):
        gv.parse_args(["--model", "ltx2", "--parallel", "ulysses", "--device", "cuda"])
    assert "126 audio tokens do not divide by 4" in capsys.readouterr().err
    assert gv.parse_args(["--model", "ltx2", "--parallel", "ulysses", "--device", "cuda",
                          "--num-frames", "161"]).parallel == "ulysses"  # 168 audio tokens
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert gv.parse_args(["--model", "ltx2", "--parallel", "ulysses", "--device", "cuda"]).parallel == "ulysses"


def test_another_compile_setup_scope_qkv_split_fp8_attention_cuda_graph_or_kernel_mode_writes_its_own_result_file():
    default = gv.parse_args(["--model", "ltx", "--device", "cpu"])
    assert gv.setup_suffix(default) == "" and not default.cpp_wrapper
    assert gv.setup_suffix(gv.parse_args(["--model", "ltx", "--device", "cpu", "--cpp-wrapper"])) == "-cpp-wrapper"
    graphs = gv.parse_args(["--model", "ltx", "--device", "cpu", "--compile-scope", "model", "--compile-mode",
                            "reduce-overhead", "--cpp-wrapper"])
    assert gv.setup_suffix(graphs) == "-reduce-overhead-cpp-wrapper"
    whole = gv.parse_args(["--model", "ltx", "--device", "cpu", "--train", "--compile-scope", "model"])
    assert gv.setup_suffix(whole) == "-model-scope"  # not the blocks-scope run's file
    skipping = gv.parse_args(["--model", "ltx", "--device", "cpu", "--skip-guard-eval"])
    assert gv.setup_suffix(skipping) == "-skip-guards" and not default.skip_guard_eval
    three = gv.parse_args(["--model", "ltx", "--fp8", "--no-fp8-fuse-qkv"])
    assert gv.setup_suffix(three) == "-no-fuse-qkv" and gv.parse_args(["--model", "ltx", "--fp8"]).fp8_fuse_qkv
    with pytest.raises(SystemExit):
        gv.parse_args(["--model", "wan", "--fp8", "--no-fp8-fuse-qkv"])
    assert gv.setup_suffix(gv.parse_args(["--model", "wan", "--fp8", "--fp8-attention"])) == "-fp8-attention"
    with pytest.raises(SystemExit):
        gv.parse_args(["--model", "ltx", "--fp8", "--fp8-attention"])
    assert gv.setup_suffix(gv.parse_args(["--model", "ltx", "--fp8", "--cuda-graph"])) == "-cuda-graph"
    assert gv.setup_suffix(gv.parse_args(["--model", "wan", "--device", "cpu", "--kernel-mode", "fast"])) == "-fast"


# --- arithmetic ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, category", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("fmha_cutlassF_bf16_aligned_32x128_gmem_sm80(PyTorchMemEffAttention::AttentionKernel<...>)", "attention"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    ("nvjet_sm90_tst_192x208_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("triton_tem_fused_mm_3", "gemm"),
    # Inductor's q/k norm + RoPE kernels name the SDPA they feed: elementwise work, not attention
    ("triton_poi_fused__fused_rms_norm__scaled_dot_product_cudnn_attention__to_copy_add_mul_permute_view_11",
     "other"),
    ("triton_red_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_clone_expand_permute_unsqueeze_view_13",
     "other"),
    ("triton_per_fused_add_mean_mul_pow_rsqrt_2", "other"),
    ("void ltx::(anonymous namespace)::qk_rmsnorm_rope_vectorized<__nv_bfloat16>", "other"),
])
def test_kernels_are_split_into_gemm_attention_and_other_by_name(name, category):
    assert gv.kernel_category(name) == category


def test_per_layer_scaling_adds_the_per_block_difference_to_the_one_layer_model():
    # 1 layer: 12 ms (2 of per-step work + 10 per block); 4 layers: 42 ms; so 48 layers: 2 + 48 * 10.
    assert e2e.scale_to_depth(42.0, 12.0, 4, 48) == pytest.approx(482.0)
    assert e2e.scale_to_depth(42.0, 12.0, 48, 48) == 42.0  # full depth is not scaled
    with pytest.raises(ValueError):
        e2e.scale_to_depth(42.0, 12.0, 1, 48)
    scaled = e2e.scale_profile({"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0},
                               {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0}, 2, 10)
    assert scaled == {"gemm_ms": 28.0, "attention_ms": 19.0, "other_ms": 10.0, "floor_ms": 47.0, "kernels_ms": 57.0}
    launches = e2e.scale_profile({"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0, "launches": 70},
                                 {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0, "launches": 30}, 2, 10)
    assert launches["launches"] == 390  # 30 + 9 blocks of 40


def test_collective_time_counts_overlapping_collectives_once_and_exposes_what_no_kernel_overlaps():
    # µs: compute 0-10 ms and 20-30 ms; collectives 5-25 ms (two overlapping launches) and 40-42 ms
    kernels = [(0, 10_000, False), (20_000, 30_000, False), (5_000, 18_000, True), (12_000, 25_000, True),
               (40_000, 42_000, True)]
    split = e2e.collective_split(kernels)
    assert split == {"collective_ms": 22.0, "exposed_collective_ms": 12.0}  # 20 + 2; 10-20 and 40-42 exposed
    assert e2e.collective_split([(0, 10_000, False)]) == {}  # one GPU: no collective, no keys
    hidden = e2e.collective_split([(0, 10_000, False), (2_000, 8_000, True)])
    assert hidden == {"collective_ms": 6.0, "exposed_collective_ms": 0.0}


def test_timeline_split_gives_the_kernels_span_and_the_idle_time_inside_it():
    # µs: 0-10 ms and 4-12 ms overlap (one busy stretch), idle 12-20, busy 20-30
    kernels = [(0, 10_000, False), (4_000, 12_000, True), (20_000, 30_000, False)]
    assert e2e.timeline_split(kernels) == {"gpu_span_ms": 30.0, "gpu_gaps_ms": 8.0}
    assert e2e.timeline_split([]) == {}
    scaled = e2e.scale_profile({"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0, "gpu_span_ms": 12.0,
                                "gpu_gaps_ms": 3.0},
                               {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0, "gpu_span_ms": 4.0,
                                "gpu_gaps_ms": 1.0}, 2, 10)
    assert (scaled["gpu_span_ms"], scaled["gpu_gaps_ms"]) == (76.0, 19.0)  # 4 + 9 x 8, 1 + 9 x 2


def test_collective_times_scale_to_full_depth_like_the_categories():
    measured = {"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0,
                "collective_ms": 9.0, "exposed_collective_ms": 5.0}
    baseline = {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0,
                "collective_ms": 3.0, "exposed_collective_ms": 2.0}
    scaled = e2e.scale_profile(measured, baseline, 2, 10)
    assert (scaled["collective_ms"], scaled["exposed_collective_ms"]) == (57.0, 29.0)  # 3 + 9 x 6, 2 + 9 x 3
    assert "collective_ms" not in e2e.scale_profile({**measured, "collective_ms": 1.0}, {"gemm_ms": 1.0,
                                                    "attention_ms": 1.0, "other_ms": 1.0}, 2, 10)


def test_launches_per_layer_by_kernel_come_from_the_counts_at_n_layers_and_at_one():
    measured = {"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0, "launches": 13,
                "launch_counts": {"gemm": 8, "norm": 4, "scheduler": 1}}
    baseline = {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0, "launches": 4,
                "launch_counts": {"gemm": 2, "norm": 1, "scheduler": 1}}
    scaled = e2e.scale_profile(measured, baseline, 4, 48)
    assert scaled["launches_per_unit"] == {"gemm": 2.0, "norm": 1.0}  # per-step work (scheduler) left out
    assert list(scaled["launches_per_unit"]) == ["gemm", "norm"]  # most first
    assert "launches_per_unit" not in e2e.scale_profile(measured, None, 48, 48)  # full depth: no baseline


def test_device_time_per_layer_by_kernel_comes_from_the_times_at_n_layers_and_at_one():
    measured = {"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0,
                "kernel_ms": {"gemm": 8.0, "norm": 2.5, "scheduler": 0.1}}
    baseline = {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0,
                "kernel_ms": {"gemm": 2.0, "norm": 1.0, "scheduler": 0.1}}
    assert e2e.scale_profile(measured, baseline, 4, 48)["ms_per_unit"] == {"gemm": 2.0, "norm": 0.5}


def row(key, ms, other):
    name, kernels, compiled = e2e.CONFIGS[key]
    return {"key": key, "config": name, "kernels": kernels, "compile": compiled, "ms_per_step": ms,
            "profile": {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": other}}


def test_targets_are_judged_against_stock_compile():
    rows = [row("stock-eager", 67.0, 32.0), row("ours-eager", 40.9, 3.9), row("stock-compile", 43.9, 6.8),
            row("ours-compile", 39.0, 1.5)]
    t = e2e.targets(rows)
    assert t["ours_eager_faster_than_stock_compile"]["met"] is True
    assert t["ours_compile_speedup_over_stock_compile"]["value"] == pytest.approx(43.9 / 39.0, abs=1e-3)
    assert t["ours_compile_speedup_over_stock_compile"]["met"] is True
    other = t["ours_other_within_fraction_of_stock_compile_other"]
    assert other["value"] == pytest.approx(1.5 / 6.8, abs=1e-3) and other["met"] is True
    assert other["ours_eager_value"] == pytest.approx(3.9 / 6.8, abs=1e-3)
    assert "back_to_back_ms" not in t["ours_eager_faster_than_stock_compile"]  # not timed so here
    rows[1]["ms_per_step_back_to_back"], rows[2]["ms_per_step_back_to_back"] = 38.0, 42.0
    assert e2e.targets(rows)["ours_eager_faster_than_stock_compile"]["back_to_back_ms"] == [38.0, 42.0]
    slower = e2e.targets([rows[0], rows[2], row("ours-compile", 42.0, 3.0)])
    assert slower["ours_compile_speedup_over_stock_compile"]["met"] is False
    assert slower["ours_other_within_fraction_of_stock_compile_other"]["met"] is False
    assert slower["ours_eager_faster_than_stock_compile"]["met"] is None  # not measured


def test_result_files_are_named_by_model_and_by_a_configuration_other_than_the_default():
    assert e2e.result_name("wan", "1.3b") == "generate_video-wan"
    assert e2e.result_name("wan", "14b-i2v") == "generate_video-wan-14b-i2v"


# --- runs on the CPU ---------------------------------------------------------------------------------

def run(tmp_path, *argv, capsys=None):
    gv.main(["--device", "cpu", "--config", "tiny", "--steps", "2", "--warmup-iterations", "1",
             "--attention-backend", "native", "--out", str(tmp_path), *argv])
    [path] = tmp_path.glob("generate_video-*.json")
    return json.loads(path.read_text()), path


@pytest.fixture
def cpu(monkeypatch):
    """main() sets the module's DEVICE from --device: put it back afterwards."""
    monkeypatch.setattr(gv, "DEVICE", gv.DEVICE)


def test_ltx_runs_end_to_end_on_the_cpu_and_scales_a_two_layer_model_to_three(tmp_path, cpu):
    data, path = run(tmp_path, "--model", "ltx", "--configs", "stock-eager", "--layers", "2")
    assert path.name == "generate_video-ltx-tiny-cpu.json"
    assert e2e.schema_problems(data) == []
    assert data["depth"] == {"scaled": True, "layers": 2, "full_layers": 3, "unit": "LTXVideoTransformerBlock",
                             "baseline_layers": 1, "method": e2e.DEPTH_METHOD}
    [stock] = data["rows"]
    n, one = stock["measured"]["ms_per_step"], stock["baseline"]["ms_per_step"]
    assert stock["ms_per_step"] == pytest.approx(e2e.scale_to_depth(n, one, 2, 3), abs=1e-3)
    n, one = stock["measured"]["ms_per_step_back_to_back"], stock["baseline"]["ms_per_step_back_to_back"]
    assert n > 0 and stock["ms_per_step_back_to_back"] == pytest.approx(e2e.scale_to_depth(n, one, 2, 3), abs=1e-3)
    assert stock["rel_l2_vs_stock"] == 0.0 and stock["speedup"] == 1.0
    assert data["shape"]["tokens"] == 8 and data["shape"]["passes"] == [2]
    assert [b["backend"] for b in data["attention"]["backends"]] == list(e2e.ATTENTION_BACKENDS)
    assert data["attention"]["chosen"] == "native"
    assert (tmp_path / "generate_video-ltx-tiny-cpu.svg").is_file() or (
        tmp_path / "generate_video-ltx-tiny-cpu.png").is_file()


def test_a_model_ours_does_not_support_is_reported_and_still_measured_stock(tmp_path, cpu, monkeypatch, capsys):
    from ltx_kernels_diffusers import models

    # Wan taken out of the registry: the report of a model optimize refuses, whichever models it supports
    monkeypatch.setattr(models, "MODELS", tuple(m for m in models.MODELS if m is not models.wan))
    monkeypatch.setattr(gv, "load_kernel", lambda args: object())  # the refusal comes before the kernel is used
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # no tqdm: a line per step on stderr instead
    data, _ = run(tmp_path, "--model", "wan", "--configs", "stock-eager,ours-eager")
    stock, ours = data["rows"]
    assert stock["ms_per_step"] > 0 and "status" not in stock
    assert ours["status"] == e2e.OURS_NOT_SUPPORTED and "ms_per_step" not in ours
    assert data["ours"]["status"] == e2e.OURS_NOT_SUPPORTED and "WanTransformer3DModel" in data["ours"]["reason"]
    assert e2e.schema_problems(data) == []
    out = capsys.readouterr()
    assert "stock eager, 3 layers: step 2/2" in out.err
    assert "| ours eager | not supported yet |" in out.out
    assert data["shape"]["passes"] == [1, 1]  # WanPipeline: a pass per prompt


def test_ours_runs_on_ltx_video_and_is_compared_with_stock(tmp_path, cpu, monkeypatch, kernel):
    """The ours path (optimize, then the attention backend, then the loop) with the fused ops computed
    as the eager model computes them (the integration tests' reference kernel)."""
    from .integration_support import ReferenceKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: ReferenceKernel(kernel))
    data, _ = run(tmp_path, "--model", "ltx", "--configs", "stock-eager,ours-eager", "--no-gelu-epilogue")
    stock, ours = data["rows"]
    assert data["ours"]["status"] == "ok" and data["ours"]["entry"] in ("optimize", "optimize_ltx")
    assert ours["ms_per_step"] > 0 and ours["speedup"] == pytest.approx(stock["ms_per_step"] / ours["ms_per_step"],
                                                                         abs=1e-3)
    assert ours["rel_l2_vs_stock"] < 2e-2  # the same model (0.006 on this tiny one)
    assert data["targets"]["ours_eager_faster_than_stock_compile"]["met"] is None  # stock compile did not run
    assert e2e.schema_problems(data) == []


def test_ours_runs_on_wan_and_equals_stock_with_the_reference_ops(tmp_path, cpu, monkeypatch):
    """optimize on Wan in the benchmark's loop (a pass per prompt, UniPC): with the ops computed as the
    eager model computes them, ours gives stock's latents bit for bit."""
    from .integration_support import ReferenceKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: ReferenceKernel())
    data, _ = run(tmp_path, "--model", "wan", "--configs", "stock-eager,ours-eager", "--no-profile")
    stock, ours = data["rows"]
    assert data["ours"]["status"] == "ok" and data["ours"]["entry"] == "optimize"
    assert ours["ms_per_step"] > 0 and ours["rel_l2_vs_stock"] == 0.0
    assert e2e.schema_problems(data) == []


def test_ours_runs_on_flux_and_is_compared_with_stock(tmp_path, cpu, monkeypatch):
    """Flux through optimize with the reference kernel (the Flux forwards are the integration's), at the
    tiny config's full depth (no per-layer scaling, whose difference of two CPU timings can go negative)."""
    from .integration_support import ReferenceKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: ReferenceKernel())
    data, _ = run(tmp_path, "--model", "flux", "--configs", "stock-eager,ours-eager")
    stock, ours = data["rows"]
    assert data["ours"] == {"status": "ok", "entry": "optimize", "reason": None, "kernel_mode": "exact",
                            "gelu_epilogue": True}
    assert ours["ms_per_step"] > 0 and 0 < ours["rel_l2_vs_stock"] < 2e-2  # the GELU epilogue rounds once
    assert e2e.schema_problems(data) == []


def test_flux_without_the_gelu_epilogue_gives_stocks_latents(tmp_path, cpu, monkeypatch):
    """--no-gelu-epilogue reaches Flux's optimize: the up-projection, then the GELU, each rounded as
    eager rounds them, so with the reference ops ours equals stock bit for bit."""
    from .integration_support import ReferenceKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: ReferenceKernel())
    data, _ = run(tmp_path, "--model", "flux", "--configs", "stock-eager,ours-eager", "--no-gelu-epilogue")
    assert data["ours"]["status"] == "ok" and data["ours"]["gelu_epilogue"] is False
    assert data["rows"][1]["rel_l2_vs_stock"] == 0.0


def test_ours_runs_on_ltx2_3_and_equals_stock_with_the_reference_ops(tmp_path, cpu, monkeypatch):
    """optimize on LTX-2 with LTX-2.3's options (gated attention, the text query's modulation) in the
    benchmark's loop (video and audio in one pass over [negative, positive]): with the ops computed as
    the eager model computes them, ours gives stock's latents bit for bit."""
    from .integration_support import ReferenceKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: ReferenceKernel())
    data, _ = run(tmp_path, "--model", "ltx2", "--config", "tiny-2.3", "--configs", "stock-eager,ours-eager",
                  "--no-profile")
    stock, ours = data["rows"]
    assert data["ours"]["status"] == "ok" and data["ours"]["entry"] == "optimize"
    assert ours["ms_per_step"] > 0 and ours["rel_l2_vs_stock"] == 0.0
    assert e2e.schema_problems(data) == []


def test_the_ltx2_3_variant_builds_at_full_size_with_gated_attention():
    """LTX2VideoTransformer3DModel takes the 2.3 options (on the meta device: no memory)."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    variant = e2e.MODELS["ltx2"].variant("2.3")
    with torch.device("meta"):
        model = LTX2VideoTransformer3DModel(**variant.kwargs, num_layers=1)
    block = model.transformer_blocks[0]
    assert variant.units == 48 and block.attn1.to_gate_logits is not None
    assert block.audio_attn2.to_gate_logits is not None and block.scale_shift_table.shape[0] == 9
    assert block.audio_scale_shift_table.shape[0] == 9


def tiny_mochi(layers):
    from diffusers import MochiTransformer3DModel

    return MochiTransformer3DModel(**e2e.MODELS["mochi"].variant("tiny").kwargs, num_layers=layers)


def test_cutting_a_model_to_fewer_layers_keeps_mochis_last_block():
    model = tiny_mochi(4)
    first, last = model.transformer_blocks[0], model.transformer_blocks[-1]
    gv.truncate(model, e2e.MODELS["mochi"], 2)
    assert list(model.transformer_blocks) == [first, last] and model.config.num_layers == 2
    assert last.context_pre_only and not first.context_pre_only


def test_weights_load_from_a_local_checkout_and_are_cut_to_the_layers_asked(tmp_path, cpu):
    tiny_mochi(3).save_pretrained(tmp_path / "checkout" / "transformer")
    out = tmp_path / "out"
    data, _ = run(out, "--model", "mochi", "--weights", str(tmp_path / "checkout"), "--layers", "2",
                  "--configs", "stock-eager", "--no-profile")
    assert data["model"]["weights"] == str(tmp_path / "checkout")
    assert data["depth"]["scaled"] and data["rows"][0]["baseline"]["layers"] == 1
    tiny_mochi(4).save_pretrained(tmp_path / "deeper")  # the checkout's depth, not the table's, is full depth
    data, _ = run(tmp_path / "out4", "--model", "mochi", "--weights", str(tmp_path / "deeper"),
                  "--configs", "stock-eager", "--no-profile")
    assert data["depth"]["full_layers"] == 4 and not data["depth"]["scaled"]


@pytest.mark.parametrize("model", ["ltx2", "mochi", "flux"])
def test_every_other_models_loop_runs_a_tiny_step_on_the_cpu(model, tmp_path, cpu):
    data, _ = run(tmp_path, "--model", model, "--configs", "stock-eager", "--no-profile")
    assert e2e.schema_problems(data) == []
    assert data["rows"][0]["ms_per_step"] > 0
    assert data["model"]["class"] == e2e.MODELS[model].cls


def test_the_chart_is_redrawn_from_a_result_file(tmp_path, cpu, capsys):
    data, path = run(tmp_path, "--model", "ltx", "--configs", "stock-eager")
    out = tmp_path / "redrawn"
    out.mkdir()
    gv.main(["--chart-from", str(path), "--out", str(out)])
    [chart] = out.iterdir()
    assert chart.stem == path.stem and chart.suffix in (".svg", ".png")
    assert "**LTX-Video 0.9 tiny" in capsys.readouterr().out


def test_the_chart_of_a_training_run_is_redrawn_with_its_training_table(tmp_path, cpu, capsys):
    data, path = run(tmp_path, "--model", "ltx", "--train", "--configs", "stock-eager", "--no-profile")
    out = tmp_path / "redrawn"
    out.mkdir()
    capsys.readouterr()
    gv.main(["--chart-from", str(path), "--out", str(out)])
    [chart] = out.iterdir()
    assert chart.stem == path.stem
    assert "| configuration | ms / step | vs stock eager | peak memory (GiB)" in capsys.readouterr().out


def test_resplit_recounts_inductors_kernels_named_after_the_sdpa_they_feed_as_other(tmp_path, cpu, capsys):
    data, path = run(tmp_path, "--model", "ltx", "--configs", "stock-eager")
    qk = "triton_poi_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_view_1"
    attention = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7"
    row = data["rows"][0]
    row["measured"]["profile"] = {"gemm_ms": 5.0, "attention_ms": 4.0, "other_ms": 1.0, "floor_ms": 9.0,
                                  "kernels_ms": 10.0, "kernel_ms": {"nvjet_sm90_tst": 5.0, attention: 3.0, qk: 1.0,
                                                                    "ltx_kernels_rmsnorm": 1.0}}
    row["profile"] = dict(row["measured"]["profile"])
    path.write_text(json.dumps(data))
    path.with_suffix(".svg").unlink(missing_ok=True)
    path.with_suffix(".png").unlink(missing_ok=True)
    gv.main(["--resplit", str(path)])
    rewritten = json.loads(path.read_text())
    profile = rewritten["rows"][0]["profile"]
    assert (profile["gemm_ms"], profile["attention_ms"], profile["other_ms"], profile["floor_ms"]) == (5.0, 3.0, 2.0,
                                                                                                      8.0)
    assert rewritten["rows"][0]["measured"]["profile"]["attention_ms"] == 3.0
    assert "Inductor" in rewritten["profile"] and rewritten["split"] == e2e.SPLIT_VERSION
    assert e2e.schema_problems(rewritten) == []
    assert path.with_suffix(".svg").exists() or path.with_suffix(".png").exists()
    assert "rewrote" in capsys.readouterr().out


def test_resplit_refuses_a_training_result(tmp_path, cpu):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"train": {}, "rows": []}))
    with pytest.raises(SystemExit, match="training, parallel or FP8 result"):
        gv.main(["--resplit", str(path)])


# --- --train -------------------------------------------------------------------------------------------

def test_a_lora_step_on_wan_runs_ours_with_stock_gradients_on_the_cpu(tmp_path, cpu, monkeypatch):
    """--train on the tiny Wan, checkpointed: both prompts' passes as one batch of 2, rank-8 adapters
    on every attention projection, ours with a kernel that can differentiate only rmsnorm (the
    other ops run as stock code under autograd): its LoRA grads are stock's, so its relative L2 to
    the fp32 step is stock bf16's."""
    from .integration_support import TrainingKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: TrainingKernel({"rmsnorm"}))
    data, path = run(tmp_path, "--model", "wan", "--train", "--grad-checkpointing", "on", "--lora-rank", "8",
                     "--configs", "stock-eager,ours-eager")
    assert path.name == "generate_video-wan-tiny-train-ckpt-cpu.json"
    assert (tmp_path / "generate_video-wan-tiny-train-ckpt-cpu.svg").is_file() or (
        tmp_path / "generate_video-wan-tiny-train-ckpt-cpu.png").is_file()
    assert data["shape"]["train_batch"] == 2 and data["train"]["grad_checkpointing"] == "on"
    assert data["attention"]["chosen"] == "native" and data["attention"]["backends"] == []  # requested: no probe
    blocks, projections = 3, 2 * 4  # self- and cross-attention: to_q, to_k, to_v, to_out.0
    hidden = 2 * 8  # the tiny config: 2 heads of 8
    assert data["train"]["lora_parameters"] == blocks * projections * 2 * 8 * hidden
    stock, ours = data["rows"]
    assert data["ours"]["status"] == "ok" and stock["ms_per_step"] > 0 and ours["ms_per_step"] > 0
    assert data["ours"]["prefer_cudnn_attention"] is False  # stock's attention: the grads compare our ops
    assert 0 < stock["grad_rel_l2_vs_fp32"] < 0.1  # bf16 against fp32: close, not equal
    assert ours["grad_rel_l2_vs_fp32"] == pytest.approx(stock["grad_rel_l2_vs_fp32"], rel=1e-6)
    assert ours["loss"] == pytest.approx(stock["loss"], rel=1e-6)
    assert data["targets"]["ours_eager_grad_agreement"]["met"] is True
    assert data["targets"]["ours_compile_faster_than_stock_compile"]["met"] is None  # not run
    assert set(stock["profile"]) >= {"gemm_ms", "attention_ms", "other_ms"}


def test_under_train_the_attention_backends_are_timed_on_the_lora_step_and_compared_by_its_grads(
        tmp_path, cpu, monkeypatch):
    """An inference probe picked LTX-Video's memory-efficient backend for training, whose backward made
    the step 4x slower in attention than cuDNN's: under --train each backend runs the stock LoRA step
    (forward and backward), and its grads are what is compared with native's."""
    steps, grads = [], []
    real_step, real_grads = gv.TrainStep.step, gv.TrainStep.grads
    monkeypatch.setattr(gv.TrainStep, "step", lambda self, i=0: (steps.append(i), real_step(self, i))[1])
    monkeypatch.setattr(gv.TrainStep, "grads", lambda self: grads.append(1) or real_grads(self))
    monkeypatch.setattr(gv, "PROBE_STEPS", 2)
    data, _ = run(tmp_path, "--model", "wan", "--train", "--lora-rank", "8", "--configs", "stock-eager",
                  "--attention-backend", "auto", "--no-profile")
    attention = data["attention"]
    timed = [b for b in attention["backends"] if "ms_per_step" in b]
    assert {b["backend"] for b in timed} >= {"native", "flash"}  # the CPU's SDPA runs both on the tiny Wan
    assert attention["measured_on"] == "stock eager LoRA step, 3 layers"  # the tiny Wan at full depth
    assert len(steps) >= len(timed) * (1 + 2)  # a warm-up and PROBE_STEPS LoRA steps per timed backend
    assert len(grads) >= len(timed)
    assert all(b["rel_l2_vs_native"] <= attention["tolerance"] for b in timed if b["status"] == "ok")
    assert attention["chosen"] in {b["backend"] for b in timed}


def train_row(key, ms, memory, rel):
    name = e2e.CONFIGS[key][0]
    return {"key": key, "config": name, "ms_per_step": ms, "peak_memory_gib": memory, "grad_rel_l2_vs_fp32": rel}


def test_train_targets_compare_ours_compile_with_stock_compile_and_grads_with_the_stock_counterpart():
    targets = gv.train_targets([
        train_row("stock-eager", 100.0, 30.0, 1e-2), train_row("ours-eager", 80.0, 25.0, 1.05e-2),
        train_row("stock-compile", 70.0, 20.0, 1e-2), train_row("ours-compile", 60.0, 21.0, 1.2e-2)])
    assert targets["ours_compile_faster_than_stock_compile"]["met"] is True
    assert targets["ours_compile_peak_memory_within_stock_compile"]["met"] is False  # 21 > 20 GiB
    assert targets["ours_eager_grad_agreement"]["met"] is True  # 1.05x stock eager's
    compiled = targets["ours_compile_grad_agreement"]
    assert compiled["met"] is False and compiled["ratio"] == 1.2


# --- the chart and the schema ------------------------------------------------------------------------

def test_the_svg_chart_stacks_gemm_attention_and_other_per_configuration(tmp_path):
    data = {"model": {"title": "Wan 2.1", "variant": "1.3b"}, "env": {"device": "H200"},
            "shape": {"tokens": 32760, "passes": [1, 1]},
            "depth": {"scaled": True, "layers": 4, "full_layers": 30},
            "rows": [row("stock-eager", 1260.0, 337.0), row("ours-eager", 900.0, 30.0),
                     {"key": "ours-compile", "config": "ours + compile", "status": "not supported yet"}]}
    svg = e2e.write_svg(data, tmp_path / "chart.svg").read_text()
    assert svg.count("<rect ") == 2 * 3 + 3  # two measured configurations x three categories, and the legend
    assert "stock eager" in svg and "ours eager" in svg and "ours + compile" not in svg
    assert "1260.0 ms/step" in svg and "scaled from 4 of 30 layers" in svg
    heights = [float(h) for h in re.findall(r'<rect x="[^"]*" y="[^"]*" width="80" height="([^"]+)"', svg)]
    assert max(heights) == pytest.approx((360 - 40 - 60) * 337.0 / 339.0, abs=0.1)  # other of stock eager, to scale


def test_the_schema_names_what_a_result_lacks():
    problems = e2e.schema_problems({"env": {"device": "H200"}, "depth": {"scaled": True, "method": None},
                                    "rows": [{"key": "stock-eager"}]})
    assert "env.torch: missing" in problems and "model: missing" in problems
    assert "depth: scaled without a method" in problems
    assert "rows[0].config: missing" in problems and "rows[0]: neither measured nor a status" in problems


def test_skip_guard_eval_times_the_steps_under_that_stance_and_only_them(monkeypatch):
    """--skip-guard-eval: the timed steps (synchronised and back to back) run under
    set_stance(skip_guard_eval_unsafe=True); the warm-up, which compiles, does not."""
    from torch._dynamo import eval_frame

    monkeypatch.setattr(gv, "DEVICE", "cpu")
    stances = []

    class Loop:
        def step(self, i):
            stances.append(eval_frame._stance.skip_guard_eval_unsafe)

    args = gv.parse_args(["--model", "ltx", "--device", "cpu", "--skip-guard-eval", "--steps", "2",
                          "--warmup-iterations", "1"])
    out, _ = gv.time_run(Loop(), Loop, args, "test", 0.0, also_back_to_back=True)
    assert stances == [False, True, True, True, True] and "ms_per_step_back_to_back" in out
    assert not eval_frame._stance.skip_guard_eval_unsafe


def test_interleave_times_stock_and_ours_compile_in_turns_swapping_the_order_each_round(tmp_path, cpu, monkeypatch,
                                                                                       capsys):
    """--interleave: after the table, stock compile and ours + compile live side by side and take turns,
    --steps steps each per round, the order swapped every round; medians and each round's ratio land in
    the JSON and the printed table (compilation itself is left out here: the CPU run times the turns)."""
    from .integration_support import TrainingKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: TrainingKernel({"rmsnorm"}))
    monkeypatch.setattr(gv, "compile_model", lambda model, args, fullgraph: None)
    order = []
    real_step = gv.TrainStep.step
    monkeypatch.setattr(gv.TrainStep, "step", lambda self, i=0: (
        order.append(getattr(self.model, "benchmark_key", None)), real_step(self, i))[1])
    real_prepare = gv.prepare_train

    def prepare(key, *a, **k):
        model, params = real_prepare(key, *a, **k)
        model.benchmark_key = key
        return model, params

    monkeypatch.setattr(gv, "prepare_train", prepare)
    data, _ = run(tmp_path, "--model", "wan", "--train", "--lora-rank", "8", "--configs",
                  "stock-compile,ours-compile", "--interleave", "3", "--no-profile")
    turns = data["interleaved"]
    assert [r["order"] for r in turns["rounds"]] == [["stock-compile", "ours-compile"],
                                                     ["ours-compile", "stock-compile"],
                                                     ["stock-compile", "ours-compile"]]
    timed = order[-3 * 2 * 2:]  # 3 rounds of 2 configurations x --steps 2, after each one's warm-up step
    assert timed == ["stock-compile"] * 2 + ["ours-compile"] * 4 + ["stock-compile"] * 4 + ["ours-compile"] * 2
    assert turns["speedup"] == pytest.approx(turns["stock_compile_ms_median"] / turns["ours_compile_ms_median"],
                                             rel=1e-3)
    assert turns["ours_faster"] == (turns["ours_compile_ms_median"] < turns["stock_compile_ms_median"])
    assert data["options"]["interleave"] == 3
    assert "in turns in one process (3 rounds of 2 steps" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--interleave", "3"], ["--train", "--interleave", "1"],
                                  ["--train", "--interleave", "2", "--configs", "ours-compile"]])
def test_interleave_is_refused_without_training_two_rounds_or_the_pair(argv):
    with pytest.raises(SystemExit):
        gv.parse_args(["--model", "wan", *argv])


def test_a_failed_interleave_keeps_the_measured_table(tmp_path, cpu, monkeypatch):
    from .integration_support import TrainingKernel

    monkeypatch.setattr(gv, "load_kernel", lambda args: TrainingKernel({"rmsnorm"}))
    monkeypatch.setattr(gv, "compile_model", lambda model, args, fullgraph: None)

    def out_of_memory(*args):
        raise gv.torch.cuda.OutOfMemoryError("both")

    monkeypatch.setattr(gv, "interleaved", out_of_memory)
    data, _ = run(tmp_path, "--model", "wan", "--train", "--lora-rank", "8", "--configs",
                  "stock-compile,ours-compile", "--interleave", "2", "--no-profile")
    assert data["interleaved"] == {"status": "failed", "reason": "OutOfMemoryError: both"}
    assert all(row["ms_per_step"] > 0 for row in data["rows"])


@pytest.mark.parametrize("train", [False, True])
def test_the_profiled_steps_run_in_a_process_of_their_own_after_the_timing(tmp_path, cpu, monkeypatch, capsys, train):
    """A profiler leaves CUPTI attached and slows later launches, so on a GPU every configuration is timed
    first and then profiled in a child process; each row's profile is that child's, keyed by its label."""
    monkeypatch.setattr(gv, "profile_here", lambda args: False)  # as on a GPU
    spawned = []
    real_run = gv.subprocess.run

    def spy(cmd, **kw):
        if "--profile-into" in cmd:  # by then every configuration was timed
            spawned.append((cmd, capsys.readouterr().out))
        return real_run(cmd, **kw)

    monkeypatch.setattr(gv.subprocess, "run", spy)
    data, _ = run(tmp_path, "--model", "ltx", "--configs", "stock-eager", *(["--train"] if train else []))
    [(command, printed_before)] = spawned
    assert "ms/step" in printed_before and "GPU split" not in printed_before
    assert command[command.index("--attention-backend", command.index("--out")) + 1] == "native"  # the one chosen
    assert data["options"]["profiled"] == "own process, after the timing"
    assert "not in the profile pass" not in capsys.readouterr().out  # every label found in the child's profiles
    [stock] = data["rows"]
    assert stock["measured"]["profile"]["launches"] > 0 and set(stock["profile"]) >= {"gemm_ms", "other_ms"}


def test_a_failed_profile_pass_leaves_the_timed_rows_without_a_split_and_says_so(tmp_path, cpu, monkeypatch):
    monkeypatch.setattr(gv, "profile_here", lambda args: False)
    real_run = gv.subprocess.run  # git's calls still run
    monkeypatch.setattr(gv.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1)
                        if "--profile-into" in cmd else real_run(cmd, **kw))
    data, _ = run(tmp_path, "--model", "ltx", "--configs", "stock-eager")
    assert data["options"]["profiled"] == "no (the profile pass failed: exit 1)"
    assert data["rows"][0]["ms_per_step"] > 0 and "profile" not in data["rows"][0]
