"""`ltx-dev render` from tiny result JSON written here (no result is typed into a table by hand):
the README headline per GPU picks our default-mode row and the fastest baseline of the same
function, the end-to-end table has one row per model from generate_video's JSON (an older
LTX-Video-only run included until a newer one replaces it), docs/performance.md gets each family's
tables and each model's end-to-end tables, and rows timed with tuning knobs forced stay out of all of
them."""

from __future__ import annotations

import json

from ltx_dev.bench import end_to_end as e2e
from ltx_dev.bench import harness, render
from ltx_dev.bench.rows import COPY_IMPL, is_sweep, tuned_name
from ltx_dev.cli import main

H100 = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "commit": "0123456789abcdef",
        "date": "2026-11-25T16:41:23+00:00"}
SHAPE = [2, 2688, 2048]


def row(impl, us, frac, op="rmsnorm", shape=SHAPE, **extra):
    return {"op": op, "shape": list(shape), "dtype": "bfloat16", "impl": impl, "us": us, "us_flushed": us + 4,
            "tbps": 1.0, "frac_copy": frac, "bytes": 1, **extra}


def write(directory, family, rows, env=H100, copy=3.0, timing=harness.TIMING):
    path = directory / f"{family}-{harness.device_slug(env['device'])}.json"
    path.write_text(json.dumps({"env": env, "copy_tbps": copy, "timing": timing, "rows": rows}))
    return path


def files(tmp_path):
    readme, perf = tmp_path / "README.md", tmp_path / "performance.md"
    readme.write_text("# title\n\n<!-- headline-H100-80GB-HBM3:begin -->\nold\n<!-- headline-H100-80GB-HBM3:end -->\n"
                      "\n<!-- headline-H200:begin -->\nH200 as it was\n<!-- headline-H200:end -->\n"
                      "<!-- end-to-end:begin -->\nold\n<!-- end-to-end:end -->\ntail text\n")
    perf.write_text("intro\n<!-- rmsnorm-H100-80GB-HBM3-results:begin -->\nold\n"
                    "<!-- rmsnorm-H100-80GB-HBM3-results:end -->\nafter\n")
    results = tmp_path / "results"
    results.mkdir()
    return results, readme, perf


def block(text, name):
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0]


def rmsnorm_rows():
    return [row("ltx_kernels (torch rounding)", 16.7, 0.88), row("ltx_kernels (diffusers rounding)", 16.8, 0.87),
            row("F.rms_norm", 19.9, 0.74), row("Liger", 17.2, 0.85),
            row("torch.compile(diffusers)", 16.9, 0.87),  # the diffusers rounding's baseline, not ours' here
            row(COPY_IMPL, 16.0, 0.9),  # a ceiling, not a baseline
            row(tuned_name("ltx_kernels (torch rounding)", {"rmsnorm.threads_per_row": 64}), 12.0, 1.2)]


def test_the_headline_row_is_ours_in_default_mode_against_the_fastest_baseline_of_the_same_function(tmp_path):
    results, readme, perf = files(tmp_path)
    write(results, "rmsnorm", rmsnorm_rows())
    render.render(results, readme, perf)
    head = block(readme.read_text(), "headline-H100-80GB-HBM3")
    assert "| rmsnorm | `rmsnorm` [2, 2688, 2048] | 16.7 | Liger: 17.2 | 1.03x | 88% |" in head
    assert head.startswith("**H100 80GB HBM3** (copy 3.00 TB/s).") and "run of 2026-11-25" in head
    assert "outputs in fresh memory" in head
    assert "12.0" not in head and "x.clone()" not in head


def test_a_family_without_its_headline_shape_has_no_headline_row_and_other_devices_keep_their_block(tmp_path):
    results, readme, perf = files(tmp_path)
    write(results, "rmsnorm", rmsnorm_rows())
    write(results, "vae", [row("ltx_kernels (diffusers rounding)", 5.0, 0.9, op="pixel_norm", shape=[1, 8, 2, 2, 2]),
                           row("torch.compile(diffusers)", 6.0, 0.8, op="pixel_norm", shape=[1, 8, 2, 2, 2])])
    render.render(results, readme, perf)
    text = readme.read_text()
    assert "| vae |" not in block(text, "headline-H100-80GB-HBM3")
    assert block(text, "headline-H200") == "H200 as it was" and text.endswith("tail text\n")


def test_headline_captions_give_the_copy_range_the_dates_and_the_older_timing_method(tmp_path):
    results, readme, perf = files(tmp_path)
    h200 = dict(H100, device="NVIDIA H200", date="2026-11-24T10:00:00+00:00")
    old = {"us": "CUDA-graph replay of calls rotating over inputs spanning 4x L2, median per call"}
    write(results, "rmsnorm", rmsnorm_rows(), env=h200, copy=4.22, timing=old)
    write(results, "rope", [row("ltx_kernels", 23.0, 0.9, op="apply_rotary_emb"),
                            row("torch.compile(diffusers)", 31.3, 0.66, op="apply_rotary_emb")],
          env=dict(h200, date="2026-11-25T10:00:00+00:00"), copy=4.25, timing=old)
    render.render(results, readme, perf)
    head = block(readme.read_text(), "headline-H200")
    assert head.startswith("**H200** (copy 4.22-4.25 TB/s).")
    assert "runs of 2026-11-24 and 2026-11-25" in head and "older timing method" in head
    assert "| rope | `apply_rotary_emb` [2, 2688, 2048] | 23.0 | torch.compile(diffusers): 31.3 | 1.36x | 90% |" in head


def test_the_performance_doc_gets_the_family_tables_without_sweep_rows(tmp_path):
    results, readme, perf = files(tmp_path)
    write(results, "rmsnorm", rmsnorm_rows())
    messages = render.render(results, readme, perf)
    text = perf.read_text()
    body = block(text, "rmsnorm-H100-80GB-HBM3-results")
    assert text.startswith("intro\n") and text.endswith("after\n")
    assert body.startswith("H100 80GB HBM3, torch 2.11.0+cu130, commit `0123456`, 2026-11-25, bf16, copy 3.00 TB/s.")
    assert "| [2, 2688, 2048] | 16.7 (88%) | 16.8 (87%) | 19.9 (74%) |" in body
    assert "| 20.7 | 23.9 |" in body  # ours and F.rms_norm flushed
    assert "threads_per_row" not in body
    assert any("1 block(s) rendered (rmsnorm-H100-80GB-HBM3-results)" in m for m in messages)


def test_a_familys_backward_results_get_their_own_block(tmp_path):
    """bench_<family> saves its backward rows apart (<family>-backward-<device>.json); render fills
    <family>-backward-<device>-results from them."""
    results, readme, perf = files(tmp_path)
    perf.write_text("<!-- layernorm-backward-H100-80GB-HBM3-results:begin -->\nold\n"
                    "<!-- layernorm-backward-H100-80GB-HBM3-results:end -->\n")
    write(results, "layernorm-backward", [row("ltx_kernels", 213.9, 0.67, op="adaln_layernorm backward"),
                                          row("torch.compile(model code)", 231.1, 0.62, op="adaln_layernorm backward")])
    render.render(results, readme, perf)
    body = block(perf.read_text(), "layernorm-backward-H100-80GB-HBM3-results")
    assert "**adaln_layernorm backward**" in body and "| [2, 2688, 2048] | 213.9 (67%) | 231.1 (62%) |" in body


def test_per_op_tables_show_speedups_over_eager_and_a_missing_block_is_reported(tmp_path):
    results, readme, perf = files(tmp_path)
    write(results, "fused_norm", [row("ltx_kernels (exact)", 10.0, 0.9, op="gated_residual", speedup_vs_eager=3.0),
                                  row("eager", 30.0, 0.3, op="gated_residual", speedup_vs_eager=1.0)])
    messages = render.render(results, readme, perf)
    assert any(m.endswith("performance.md has no <!-- fused_norm-H100-80GB-HBM3-results:begin/end --> block; skipped")
               for m in messages)
    body = render.family_block("fused_norm", json.loads((results / "fused_norm-H100-80GB-HBM3.json").read_text()))
    assert "`×`: speedup over eager" in body and "**gated_residual**" in body
    assert "| [2, 2688, 2048] | 10.0 (90%, 3.0×) | 30.0 (30%) |" in body


def legacy_ltx_run():
    """An issue-5 generate_video-<device>.json: LTX-Video only, its own schema."""
    profile = {"floor_ms": 33.0, "other_ms": 31.9}
    return {"env": dict(H100, device="NVIDIA H200"),
            "shape": {"num_frames": 49, "height": 512, "width": 768, "latent": [7, 16, 24], "seq": 2688,
                      "transformer_batch": 2, "text_tokens": 128,
                      "weights": "random (LTXVideoTransformer3DModel(), 2B)"},
            "options": {"steps": 50, "warmup_iterations": 2, "kernel_mode": "exact", "gelu_epilogue": True,
                        "compile_scope": "blocks"},
            "rows": [{"config": "stock eager", "ms_per_step": 68.7, "it_per_s": 14.56, "speedup": 1.0,
                      "rel_l2_vs_stock": 0.0, "profile": profile},
                     {"config": "ltx_kernels eager", "ms_per_step": 48.2, "it_per_s": 20.75, "speedup": 1.425,
                      "rel_l2_vs_stock": 2.5e-3, "profile": dict(profile, other_ms=4.3)},
                     {"config": "stock + torch.compile", "ms_per_step": 46.2, "it_per_s": 21.63, "speedup": 1.49,
                      "rel_l2_vs_stock": 7.5e-3, "profile": dict(profile, other_ms=6.8)},
                     {"config": "ltx_kernels + torch.compile", "ms_per_step": 43.2, "it_per_s": 23.15,
                      "speedup": 1.59, "rel_l2_vs_stock": 2.5e-3,
                      "profile": {"gemm_ms": 26.0, "attention_ms": 10.7, "floor_ms": 36.7, "other_ms": 4.2}}]}


def model_run(model, variant, times, ours_status="ok", layers=None, date="2026-11-27T10:00:00+00:00"):
    """A generate_video-<model>-<device>.json: `times` {config key: (ms, other ms)}; ours refused
    with `ours_status` where it is not "ok"."""
    spec = e2e.MODELS[model]
    step, full = spec.step, spec.variant(variant).units
    rows = []
    for key, (name, kernels, compiled) in e2e.CONFIGS.items():
        r = {"key": key, "config": name, "kernels": kernels, "compile": compiled}
        if kernels and ours_status != "ok":
            r.update(status=ours_status, reason="UnsupportedModelError")
        elif key in times:
            ms, other = times[key]
            r.update(ms_per_step=ms, speedup=times["stock-eager"][0] / ms, rel_l2_vs_stock=1e-3, measured={},
                     profile={"gemm_ms": 10.0, "attention_ms": 20.0, "other_ms": other, "floor_ms": 30.0,
                              "kernels_ms": 30.0 + other})
        else:
            continue  # not run
        rows.append(r)
    scaled = layers is not None
    return {"env": dict(H100, device="NVIDIA H200", diffusers="0.42.1", date=date),
            "model": {"key": model, "title": spec.title, "class": spec.cls, "pipeline": spec.pipeline,
                      "variant": variant, "weights": "random", "note": "", "notes": list(spec.notes)},
            "shape": {"frames": step.frames, "height": step.height, "width": step.width, "videos": 1,
                      "passes": e2e.passes(spec, 1), "tokens": e2e.tokens(spec, step),
                      "audio_tokens": e2e.audio_tokens(spec, step), "text_tokens": step.text_tokens,
                      "dtype": "bfloat16"},
            "depth": {"scaled": scaled, "layers": layers or full, "full_layers": full, "unit": spec.unit,
                      "method": e2e.DEPTH_METHOD if scaled else None},
            "attention": {"requested": "auto", "chosen": "cudnn", "why": "fastest within tolerance", "tolerance": 0.02,
                          "measured_on": "stock eager, 4 layers",
                          "backends": [{"backend": "native", "ms_per_step": 50.0, "rel_l2_vs_native": 0.0,
                                        "status": "ok"},
                                       {"backend": "flash", "status": "refused: ValueError: attn_mask"}]},
            "ours": {"status": ours_status, "entry": "optimize", "kernel_mode": "exact",
                     "reason": None if ours_status == "ok" else "UnsupportedModelError: no Wan yet"},
            "options": {"steps": 5, "warmup_iterations": 2, "guidance_scale": spec.guidance_scale,
                        "compile_scope": "blocks", "profiled": "own process, after the timing"},
            "rows": rows, "targets": e2e.targets(rows), "timing": "wall", "split": e2e.SPLIT_VERSION}


def train_run(model, variant, times, checkpointing="off", layers=4):
    """A generate_video-<model>-train[-ckpt]-<device>.json: `times` {config key: (ms, peak GiB)}."""
    data = model_run(model, variant, {k: (ms, 1.0) for k, (ms, _) in times.items()}, layers=layers)
    for r in data["rows"]:
        r.update(peak_memory_gib=times[r["key"]][1], grad_rel_l2_vs_fp32=3e-3 if r["kernels"] else 2e-3, loss=1.0)
    data["shape"]["train_batch"] = 2
    data["train"] = {"lora_rank": 64, "lora_targets": ["to_q", "to_k"], "grad_checkpointing": checkpointing}
    data["targets"] = {"ours_compile_faster_than_stock_compile": {"met": True}}
    return data


def write_run(results, name, data, device="H200"):
    """``data`` as ``<name>-<device>.json``, measured on that device ("H200" or "H100-80GB-HBM3")."""
    data["env"]["device"] = {"H200": "NVIDIA H200", "H100-80GB-HBM3": H100["device"]}[device]
    (results / f"{name}-{device}.json").write_text(json.dumps(data))


# a run's times, {config key: (ms per step, "other" ms)}
TIMES = {"stock-eager": (100.0, 40.0), "ours-eager": (70.0, 8.0), "stock-compile": (80.0, 12.0),
         "ours-compile": (64.0, 2.0)}


def test_an_older_ltx_video_run_still_renders_its_row_and_its_block(tmp_path):
    results, readme, perf = files(tmp_path)
    write_run(results, "generate_video", legacy_ltx_run())
    render.render(results, readme, perf)
    e2e_block = block(readme.read_text(), "end-to-end")
    assert e2e_block.startswith("**End to end** (H200): one denoising step of each model's own pipeline loop")
    assert ("| LTX-Video 0.9 2B (`LTXVideoTransformer3DModel`) | B=2, 49 frames 768x512 (2688 tokens), 128 text "
            "tokens | full | 46.2 | 43.2 | 1.07x | 26.0 / 10.7 / 4.2 | 6.8 → 4.2 |") in e2e_block
    full = render.family_block("generate_video", legacy_ltx_run())
    assert "| ltx_kernels eager | 48.2 | 20.75 | 1.43x | 33.0 | 4.3 | 2.5e-03 |" in full


def test_the_readme_end_to_end_table_is_the_device_with_the_most_models(tmp_path):
    """Another device's shorter run goes to docs/performance.md only."""
    results, readme, perf = files(tmp_path)
    for model, variant in (("ltx", "2b"), ("mochi", "10b")):
        write_run(results, f"generate_video-{model}", model_run(model, variant, TIMES, layers=4))
    write_run(results, "generate_video-mochi", model_run("mochi", "10b", TIMES, layers=4), "H100-80GB-HBM3")
    render.render(results, readme, perf)
    e2e_block = block(readme.read_text(), "end-to-end")
    assert e2e_block.startswith("**End to end** (H200)") and "H100" not in e2e_block
    assert len([line for line in e2e_block.splitlines() if line.startswith("| ")]) == 1 + 2


def test_between_devices_with_as_many_models_the_readme_shows_the_one_with_fewer_rows_on_the_old_split(tmp_path):
    results, readme, perf = files(tmp_path)
    for model, variant in (("ltx", "2b"), ("mochi", "10b")):
        write_run(results, f"generate_video-{model}", model_run(model, variant, TIMES, layers=4))
        h100 = model_run(model, variant, TIMES, layers=4)
        del h100["split"]  # written before the key: the first split
        write_run(results, f"generate_video-{model}", h100, "H100-80GB-HBM3")
    render.render(results, readme, perf)
    e2e_block = block(readme.read_text(), "end-to-end")
    assert e2e_block.startswith("**End to end** (H200)") and "‡" not in e2e_block


def test_a_fast_kernel_mode_run_has_its_own_block_and_no_readme_row(tmp_path):
    results, readme, perf = files(tmp_path)
    write_run(results, "generate_video-ltx", model_run("ltx", "2b", TIMES))
    fast = model_run("mochi", "10b", TIMES, layers=4)
    fast["ours"]["kernel_mode"] = "fast"
    write_run(results, "generate_video-mochi-fast", fast)
    render.render(results, readme, perf)
    assert "Mochi" not in block(readme.read_text(), "end-to-end")
    assert "ours = `optimize`, fast mode" in render.blocks(results)[1]["generate_video-H200-results"]


def test_a_run_split_before_inductors_kernels_counted_as_other_is_marked(tmp_path):
    results, readme, perf = files(tmp_path)
    old, new = model_run("mochi", "10b", TIMES, layers=4), model_run("ltx", "2b", TIMES)
    del old["split"]  # written before the key: the first split
    write_run(results, "generate_video-mochi", old)
    write_run(results, "generate_video-ltx", new)
    render.render(results, readme, perf)
    e2e_block = block(readme.read_text(), "end-to-end")
    rows = {line.split(" | ")[0]: line for line in e2e_block.splitlines() if line.startswith("| L") or
            line.startswith("| M")}
    assert rows["| Mochi 1 10b (`MochiTransformer3DModel`)"].endswith("| 12.0 → 2.0 ‡ |")
    assert rows["| LTX-Video 0.9 2b (`LTXVideoTransformer3DModel`)"].endswith("| 12.0 → 2.0 |")
    assert e2e_block.endswith("stock compile's \"other\" reads low.")


def test_a_run_timed_in_the_process_that_profiled_its_earlier_configurations_is_marked_once(tmp_path):
    results, readme, perf = files(tmp_path)
    readme.write_text(readme.read_text() + "<!-- training:begin -->\nold\n<!-- training:end -->\n"
                      "<!-- profiled-note:begin -->\nold\n<!-- profiled-note:end -->\n")
    before, after = model_run("mochi", "10b", TIMES, layers=4), model_run("ltx", "2b", TIMES)
    del before["options"]["profiled"]  # written before the profile pass
    write_run(results, "generate_video-mochi", before)
    write_run(results, "generate_video-ltx", after)
    train = train_run("ltx", "2b", {k: (ms, 1.0) for k, (ms, _) in TIMES.items()}, layers=None)
    write_run(results, "generate_video-ltx-train", train)  # profiled apart, like `after`
    render.render(results, readme, perf)
    text = readme.read_text()
    rows = {line.split(" | ")[0]: line for line in block(text, "end-to-end").splitlines() if line.startswith("| ")}
    assert "| 1.25x † |" in rows["| Mochi 1 10b (`MochiTransformer3DModel`)"]
    assert "| 1.25x |" in rows["| LTX-Video 0.9 2b (`LTXVideoTransformer3DModel`)"]
    assert "†" not in block(text, "training")
    assert block(text, "profiled-note") == render.PROFILED_NOTE  # one note, under every table
    # a run that profiled nothing (--no-profile) was not slowed by a profiler
    for r in before["rows"]:
        r.pop("profile", None)
    write_run(results, "generate_video-mochi", before)
    render.render(results, readme, perf)
    assert "†" not in readme.read_text() and block(readme.read_text(), "profiled-note") == ""


def test_the_eager_target_gives_the_back_to_back_steps_beside_the_synchronised_verdict():
    times = {"stock-eager": (100.0, 40.0), "ours-eager": (90.0, 8.0), "stock-compile": (80.0, 12.0),
             "ours-compile": (64.0, 2.0)}
    data = model_run("flux", "dev", times, layers=4)
    by = {r["key"]: r for r in data["rows"]}
    by["ours-eager"]["ms_per_step_back_to_back"], by["stock-compile"]["ms_per_step_back_to_back"] = 70.0, 78.0
    assert ("ours eager faster than stock compile: not met (90.0 vs 80.0 ms; back to back, as a pipeline runs its "
            "steps: 70.0 vs 78.0)") in render.target_text(data)


def test_the_end_to_end_table_has_one_row_per_model_in_model_order(tmp_path):
    results, readme, perf = files(tmp_path)
    perf.write_text(perf.read_text() + "<!-- generate_video-H200-results:begin -->\nold\n"
                    "<!-- generate_video-H200-results:end -->\n")
    write_run(results, "generate_video", legacy_ltx_run())  # superseded by the LTX-Video run per model
    write_run(results, "generate_video-mochi", model_run("mochi", "10b", TIMES, layers=4))
    write_run(results, "generate_video-ltx", model_run("ltx", "2b", TIMES))
    # a --train run (a LoRA step) is no denoising step: not in the table
    write_run(results, "generate_video-flux-train", train_run("flux", "dev", {k: (ms, 9.0) for k, (ms, _) in
                                                                          TIMES.items()}))
    write_run(results, "generate_video-wan", model_run("wan", "1.3b", {k: TIMES[k] for k in ("stock-eager",
                                                                                             "stock-compile")},
                                                        ours_status=e2e.OURS_NOT_SUPPORTED, layers=4))
    render.render(results, readme, perf)
    rows = [line for line in block(readme.read_text(), "end-to-end").splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| LTX-Video 0.9 2b (`LTXVideoTransformer3DModel`)",
                                               "| Wan 2.1 1.3b (`WanTransformer3DModel`)",
                                               "| Mochi 1 10b (`MochiTransformer3DModel`)"]
    assert rows[0].endswith("| full (28) | 80.0 | 64.0 | 1.25x | 10.0 / 20.0 / 2.0 | 12.0 → 2.0 |")
    assert "B=2, 81 frames 832x480 (32760 tokens), 512 text tokens | scaled from 4 of 30 | 80.0 | " \
           "ours: not supported yet |" in rows[1]
    assert "B=2, 85 frames 848x480 (23850 tokens), 256 text tokens | scaled from 4 of 48 |" in rows[2]
    details = block(perf.read_text(), "generate_video-H200-results")
    assert details.index("**LTX-Video 0.9 2b") < details.index("**Wan 2.1 1.3b") < details.index("**Mochi 1 10b")
    assert "46.2" not in details  # the older LTX-Video run is left out
    assert "| ours eager | not supported yet | – |" in details
    assert "flash refused" in details and "tolerance 0.02" in details
    assert ("Targets (issue 35): ours eager faster than stock compile: met (70.0 vs 80.0 ms); ours + compile ≥ 1.1x "
            "stock compile: met (1.25x; with no other GPU time at all, at most 1.18x); ours + compile's other ≤ 25% "
            "of stock compile's: met (17%).") in details
    assert e2e.DEPTH_METHOD in details


def test_a_model_without_results_is_absent_and_audio_tokens_are_shown(tmp_path):
    results, readme, perf = files(tmp_path)
    times = {"stock-eager": (942.0, 400.0), "stock-compile": (660.0, 90.0), "ours-compile": (560.0, 20.0)}
    write_run(results, "generate_video-ltx2", model_run("ltx2", "2.0", times, layers=4))
    render.render(results, readme, perf)
    e2e_block = block(readme.read_text(), "end-to-end")
    assert "6144 tokens + 126 audio tokens), 1024 text tokens" in e2e_block
    assert "Wan" not in e2e_block and "Mochi" not in e2e_block and "LTX-Video 0.9" not in e2e_block
    details = render.family_block("generate_video-ltx2", model_run("ltx2", "2.0", times, layers=4))
    assert "| ours eager | not measured | – |" not in details  # a configuration not run is not a row
    assert "ours eager faster than stock compile: not measured" in details


def render_with_a_compile_variant(tmp_path, name: str, options: dict) -> tuple[list[str], str]:
    """A default LTX-Video run and one 5 ms faster with other compile ``options`` (file ``name``), rendered:
    (the README's LTX rows, the docs block)."""
    results, readme, perf = files(tmp_path)
    perf.write_text(perf.read_text() + "<!-- generate_video-H200-results:begin -->\nold\n"
                    "<!-- generate_video-H200-results:end -->\n")
    times = {"stock-eager": (100.0, 40.0), "stock-compile": (80.0, 12.0), "ours-compile": (64.0, 2.0)}
    write_run(results, "generate_video-ltx", model_run("ltx", "2b", times))
    variant = model_run("ltx", "2b", {k: (ms - 5.0, other) for k, (ms, other) in times.items()})
    variant["options"].update(options)
    write_run(results, name, variant)
    render.render(results, readme, perf)
    rows = [line for line in block(readme.read_text(), "end-to-end").splitlines() if line.startswith("| LTX")]
    return rows, block(perf.read_text(), "generate_video-H200-results")


def test_a_cuda_graph_run_has_its_block_with_its_mode_and_no_readme_row(tmp_path):
    rows, details = render_with_a_compile_variant(tmp_path, "generate_video-ltx-reduce-overhead",
                                                  dict(compile_scope="model", compile_mode="reduce-overhead"))
    assert len(rows) == 1 and "| 80.0 | 64.0 |" in rows[0]  # the regional run's row only
    assert "torch.compile model scope, mode reduce-overhead." in details and "| ours + compile | 59.0 |" in details
    assert "torch.compile blocks scope." in details and "| ours + compile | 64.0 |" in details


def test_a_cpp_wrapper_run_has_its_block_and_no_readme_row(tmp_path):
    rows, details = render_with_a_compile_variant(tmp_path, "generate_video-ltx-cpp-wrapper", dict(cpp_wrapper=True))
    assert len(rows) == 1 and "| 80.0 | 64.0 |" in rows[0]
    assert "torch.compile blocks scope, inductor C++ wrapper." in details and "| ours + compile | 59.0 |" in details


def test_a_run_without_guard_evaluation_has_its_block_and_no_readme_row(tmp_path):
    rows, details = render_with_a_compile_variant(tmp_path, "generate_video-ltx-skip-guards",
                                                  dict(skip_guard_eval=True))
    assert len(rows) == 1 and "| 80.0 | 64.0 |" in rows[0]
    assert "guard evaluation skipped" in details and "| ours + compile | 59.0 |" in details


def fp8_run(times, errors):
    """A generate_video-ltx-fp8-<device>.json: `times` {config key: ms}, every FP8 configuration among them
    (profile "other" 3 ms), `errors` {quality label: relative L2 to fp32}."""
    data = model_run("ltx", "2b", {k: (ms, 3.0) for k, ms in times.items() if k in e2e.CONFIGS})
    for key, (name, kernels, compiled) in e2e.FP8_CONFIGS.items():
        data["rows"].append({"key": key, "config": name, "kernels": kernels, "compile": compiled,
                             "ms_per_step": times[key], "speedup": times["stock-eager"] / times[key],
                             "profile": {"gemm_ms": 5.0, "attention_ms": 20.0, "other_ms": 3.0}})
    data["fp8"] = {"layers": 28, "rel_l2_to_fp32": errors, "bar": 3.0, "met": True, "fast_accum": True,
                   "per_linear": [{"linear": "attn1.to_q", "blocks": 28, "bf16_rel_l2_mean": 1.66e-3,
                                   "fp8_rel_l2_mean": 3.67e-2, "fp8_rel_l2_max": 3.7e-2}],
                   "targets": e2e.fp8_targets(data["rows"], "ltx")}
    return data


def test_an_fp8_run_has_its_own_tables_and_stays_out_of_the_bf16_one(tmp_path):
    results, readme, perf = files(tmp_path)
    readme.write_text(readme.read_text() + "<!-- fp8:begin -->\nold\n<!-- fp8:end -->\n")
    perf.write_text(perf.read_text() + "<!-- generate_video-fp8-H200-results:begin -->\nold\n"
                    "<!-- generate_video-fp8-H200-results:end -->\n")
    times = {"stock-eager": 75.0, "stock-compile": 47.6, "ours-compile": 44.3, "ours-fp8-eager": 49.8,
             "ours-fp8-compile": 34.5, "torchao-fp8-compile": 40.3}
    errors = {"stock bf16": 0.0144, "ours bf16": 0.0145, "ours fp8": 0.0184, "torchao fp8": "ImportError: x"}
    write_run(results, "generate_video-ltx-fp8", fp8_run(times, errors))
    render.render(results, readme, perf)
    assert "| LTX-Video 0.9 2b (`LTXVideoTransformer3DModel`) | full (28) | 47.6 | 44.3 | 34.5 | 40.3 | 1.28x | " \
           "0.0144 → 0.0184 |" in block(readme.read_text(), "fp8")
    assert "LTX-Video" not in block(readme.read_text(), "end-to-end")  # no bf16 row from an FP8 run
    details = block(perf.read_text(), "generate_video-fp8-H200-results")
    assert "| ours fp8 + compile | 34.5 | 2.17x | 5.0 / 20.0 / 3.0 | 0.0184 (1.28x) |" in details
    assert "| torchao fp8 + compile | 40.3 | 1.86x | 5.0 / 20.0 / 3.0 | – |" in details  # its error: a failure
    assert "| `attn1.to_q` | 1.66e-03 | 3.67e-02 | 3.70e-02 |" in details
    assert "- speedup over ours bf16 compile: NOT met" in details and "- ltx step ms: NOT met" in details
    assert "- faster than torchao fp8 compile: met" in details


def test_rows_timed_with_knobs_forced_are_recognised_by_their_name():
    name = tuned_name("ltx_kernels (exact)", {"fused_norm.prefetch": 0})
    assert name == "ltx_kernels (exact) [fused_norm.prefetch=0]" and is_sweep(name)
    assert is_sweep(tuned_name("ltx_kernels", {"pixel_norm.pos_words": 4, "pixel_norm.channel_words": 8}))
    assert not is_sweep("ltx_kernels (exact)") and not is_sweep("ltx_kernels inplace_add (y bfloat16)")
    assert not is_sweep(COPY_IMPL)



def test_the_render_command_takes_other_files(tmp_path, capsys):
    results, readme, perf = files(tmp_path)
    write(results, "rmsnorm", rmsnorm_rows())
    assert main(["render", "--results", str(results), "--readme", str(readme), "--performance", str(perf)]) == 0
    assert "16.7 | Liger: 17.2" in readme.read_text()
    assert "README.md: 1 block(s) rendered (headline-H100-80GB-HBM3)" in capsys.readouterr().out


def test_the_training_table_has_one_row_per_default_run_checkpointing_off_first_with_its_depth(tmp_path):
    results, readme, perf = files(tmp_path)
    readme.write_text(readme.read_text() + "<!-- training:begin -->\nold\n<!-- training:end -->\n")
    perf.write_text(perf.read_text() + "<!-- generate_video-train-H200-results:begin -->\n"
                    "<!-- generate_video-train-H200-results:end -->\n")
    times = {"stock-eager": (200.0, 16.0), "ours-eager": (190.0, 15.5), "stock-compile": (120.0, 14.0),
             "ours-compile": (100.0, 13.5)}
    write_run(results, "generate_video-wan-train-ckpt", train_run("wan", "1.3b", times, "on"))
    write_run(results, "generate_video-wan-train", train_run("wan", "1.3b", times))
    write_run(results, "generate_video-ltx-train", train_run("ltx", "2b", times, layers=None))  # full depth
    whole = train_run("ltx", "2b", times, "on", layers=None)
    whole["options"]["compile_scope"] = "model"
    write_run(results, "generate_video-ltx-train-ckpt-model-scope", whole)
    render.render(results, readme, perf)
    rows = [line for line in block(readme.read_text(), "training").splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[:3] for r in rows] == [["| LTX-Video 0.9 2b (`LTXVideoTransformer3DModel`)", "H200", "off"],
                                                 ["| Wan 2.1 1.3b (`WanTransformer3DModel`)", "H200", "off"],
                                                 ["| Wan 2.1 1.3b (`WanTransformer3DModel`)", "H200", "on"]]
    assert rows[0].endswith("| 28 layers | 120.0 | 100.0 | 1.20x | 14.00 → 13.50 | 2.00e-03 → 3.00e-03 |")
    assert "| 4 → 30 layers |" in rows[1] and "| 4 → 30 layers |" in rows[2]  # measured at 4, scaled
    assert "end-to-end" not in block(readme.read_text(), "training")
    details = block(perf.read_text(), "generate_video-train-H200-results")
    assert details.count("LoRA rank 64") == 4 and "| ours + compile | 100.0 | 2.00x | 13.50 |" in details
    # the whole-model compile has its own block, not a README row
    assert details.count("torch.compile model scope") == 1 and details.count("torch.compile blocks scope") == 3


def test_a_training_row_timed_also_in_turns_gives_that_speedup_beside_the_means(tmp_path):
    results, readme, perf = files(tmp_path)
    readme.write_text(readme.read_text() + "<!-- training:begin -->\nold\n<!-- training:end -->\n")
    times = {"stock-eager": (300.0, 5.0), "stock-compile": (180.0, 4.8), "ours-compile": (210.0, 4.7)}
    run = train_run("ltx", "2b", times, "on", layers=None)
    run["interleaved"] = {"layers": 28, "steps_per_round": 10, "stock_compile_ms_median": 198.0,
                          "ours_compile_ms_median": 188.4, "speedup": 1.0511, "rounds": []}
    write_run(results, "generate_video-ltx-train-ckpt", run)
    render.render(results, readme, perf)
    row = [line for line in block(readme.read_text(), "training").splitlines() if line.startswith("| LTX")][0]
    assert "| 180.0 | 210.0 | 0.86x; in turns 1.05x |" in row


def test_a_parallel_run_says_how_much_collective_time_each_profiled_row_left_exposed():
    parallel = {"mode": "ulysses", "world": 4, "targets": {},
                "scaling": {"stock-compile": {"one_gpu_ms": 900.0, "parallel_ms": 500.0, "speedup": 1.8,
                                              "efficiency": 0.45}}}
    rows = [{"config": "stock compile", "profile": {"gemm_ms": 1.0}},
            {"config": "stock compile, ulysses x4", "profile": {"collective_ms": 95.7, "exposed_collective_ms": 90.1}}]
    text = render.parallel_text(parallel, rows)
    assert "stock compile, ulysses x4: 95.7 ms, 90.1 of them exposed" in text
    assert "stock compile:" not in text  # the one-GPU row ran no collective
    assert "NCCL" not in render.parallel_text(parallel, rows[:1])


def test_the_device_timeline_is_said_for_the_rows_whose_profile_has_it():
    rows = [{"config": "stock compile", "ms_per_step": 46.3, "profile": {"kernels_ms": 42.2}},
            {"config": "ours fp8 + compile", "ms_per_step": 31.4,
             "profile": {"kernels_ms": 27.2, "gpu_span_ms": 29.0, "gpu_gaps_ms": 1.8}}]
    text = render.timeline_text(rows)
    assert "ours fp8 + compile 31.4 ms: kernels 27.2 over 29.0 (1.8 idle)" in text and "stock compile" not in text
    assert render.timeline_text(rows[:1]) == ""  # an older run: no line
    rows[1]["ms_per_step_back_to_back"] = 28.6
    assert "ours fp8 + compile 31.4 ms (28.6 back to back): kernels 27.2" in render.timeline_text(rows)


def test_profile_figures_scaled_below_zero_are_named_as_noise():
    # collective time at 2 layers below the 1-layer step's: scaled to 48 layers it goes negative
    measured = {"gemm_ms": 4.0, "attention_ms": 3.0, "other_ms": 2.0, "collective_ms": 10.0}
    baseline = {"gemm_ms": 1.0, "attention_ms": 1.0, "other_ms": 1.0, "collective_ms": 30.0}
    scaled = e2e.scale_profile(measured, baseline, 2, 48)
    assert scaled["collective_ms"] == 30.0 - 47 * 20.0 and e2e.below_zero(scaled) == ["collective_ms"]
    assert e2e.below_zero(e2e.scale_profile(measured, {**baseline, "collective_ms": 3.0}, 2, 48)) == []
    rows = [{"config": "stock compile, ulysses x2", "profile": scaled}, {"config": "stock compile", "profile": {}}]
    note = render.below_zero_note(rows)
    assert "stock compile, ulysses x2 (collective_ms)" in note and "stock compile (" not in note
    assert render.below_zero_note(rows[1:]) == ""


def test_the_ltx_fp8_step_target_is_judged_synchronised_and_back_to_back_apart():
    rows = [{"key": "ours-fp8-compile", "ms_per_step": 31.4, "ms_per_step_back_to_back": 28.6}]
    target = e2e.fp8_targets(rows, "ltx")["ltx_step_ms"]
    assert target["met"] is False and target["met_back_to_back"] is True and target["back_to_back"] == 28.6
    rows[0]["ms_per_step_back_to_back"] = 30.5
    assert e2e.fp8_targets(rows, "ltx")["ltx_step_ms"]["met_back_to_back"] is False
    del rows[0]["ms_per_step_back_to_back"]  # an older run
    assert e2e.fp8_targets(rows, "ltx")["ltx_step_ms"]["met_back_to_back"] is None


def test_a_run_of_a_commit_with_a_named_change_keeps_the_change_in_its_label():
    env = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "date": "2026-11-27T21:00:00+00:00"}
    assert "commit `18b2fe7+exp`" in render.run_label({**env, "commit": "18b2fe7c0ffee+exp"})
    assert "commit `18b2fe7`," in render.run_label({**env, "commit": "18b2fe7c0ffee"})


def test_a_speedup_just_short_of_its_target_never_rounds_up_to_it():
    assert render.times(48.36 / 44.163, 1.1) == "1.095x"  # H100 LTX-Video, 0712093: not met
    assert render.times(48.36 / 44.163) == "1.10x"
    assert render.times(1.1, 1.1) == "1.10x"
    assert render.times(1.0694, 1.1) == "1.07x"
