"""Render benchmark JSON into README.md and docs/performance.md.

    ltx-dev render [--results DIR] [--readme FILE] [--performance FILE]

From every `<family>-<device>.json` in the results directory (default
benchmarks/results) it rewrites, between their begin/end markers:

  README.md            <!-- headline-<device>:begin -->: one row per op family at a
                       representative DiT shape (HEADLINE): our µs, the fastest baseline of the
                       same function and its µs, the speedup over it, the fraction of the copy rate;
                       <!-- end-to-end:begin -->: per device, one row per model of the end-to-end
                       runs (generate_video-<model>[-<config>]-<device>.json, and an older
                       LTX-Video-only generate_video-<device>.json where no newer LTX-Video run is);
                       <!-- training:begin -->: per device, one row per LoRA training run
                       (generate_video-<model>-train[-ckpt]-<device>.json);
  docs/performance.md  <!-- <family>-<device>-results:begin -->: the family's full tables;
                       <!-- generate_video-<device>-results:begin -->: every end-to-end run's tables;
                       <!-- generate_video-train-<device>-results:begin -->: every training run's;
                       <!-- fp8:begin --> (README) and <!-- generate_video-fp8-<device>-results:begin -->:
                       the FP8 runs (generate_video --fp8, generate_video-<model>-fp8-<device>.json).

<device> is the device name as the file names spell it (H200, H100-80GB-HBM3). A block
the file lacks is reported and skipped. Rows timed with tuning knobs forced (sweeps)
stay out of every table.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import RESULTS, ROOT
from . import FAMILIES
from . import end_to_end as e2e
from .harness import device_slug
from .rows import COPY_IMPL, is_sweep
from .targets import MOCHI_PUBLISHED, comparisons

# Per family: the op, the representative DiT shape and our implementation in its default mode.
HEADLINE = {
    "rmsnorm": ("rmsnorm", [2, 2688, 2048], "ltx_kernels (torch rounding)"),
    "fused_norm": ("gated_residual_rmsnorm", [2, 2688, 2048], "ltx_kernels (exact)"),
    "layernorm": ("gated_residual_layernorm", [2, 32760, 1536], "ltx_kernels (exact)"),
    "activation": ("gelu_tanh", [2, 2688, 8192], "ltx_kernels"),
    "rope": ("apply_rotary_emb", [2, 2688, 2048], "ltx_kernels"),
    "qk_rmsnorm_rope": ("qk_rmsnorm_rope", [2, 2688, 2048], "ltx_kernels"),
    "rope_axes": ("rope_3d", [1, 32760, 12, 128], "ltx_kernels"),
    "vae": ("pixel_norm", [1, 256, 13, 64, 96], "ltx_kernels (diffusers rounding)"),
    "fp8": ("gated_residual_rmsnorm_fp8", [2, 2688, 2048], "ltx_kernels"),
}
RMSNORM_IMPLS = ["ltx_kernels (torch rounding)", "ltx_kernels (diffusers rounding)", "F.rms_norm",
                 "torch.compile(F.rms_norm)", "torch.compile(diffusers)", "Liger", "diffusers eager", COPY_IMPL]
SPEEDUP_OVER = {"activation": "the eager pair"}  # what `×` is measured against, where not "eager"
# In harness.TIMING["us"] since outputs are kept alive per call (05c699a); tests check the two agree.
FRESH_OUTPUTS_MARK = "outputs in memory of their own"


# --- captions ----------------------------------------------------------------------------------

def fresh_outputs(data: dict) -> bool:
    """Whether the run's `us` wrote every call's outputs into fresh memory. Runs before outputs were
    kept alive per call wrote into one reused buffer, which flatters ops with an output of their own."""
    return FRESH_OUTPUTS_MARK in data.get("timing", {}).get("us", "")


def steady_state(data: dict) -> str:
    """How the run's `us` was taken, as the captions say it."""
    if fresh_outputs(data):
        return "steady state, outputs in fresh memory"
    return "steady state, outputs into one reused buffer (older method)"


def device_name(env: dict) -> str:
    return env["device"].replace("NVIDIA ", "")


def short_commit(commit: str) -> str:
    """'abc1234', or 'abc1234+exp' for a run of that commit's tree with a named change (--commit SHA+NAME)."""
    sha, plus, change = commit.partition("+")
    return sha[:7] + plus + change


def run_label(env: dict) -> str:
    """'H200, torch 2.11.0+cu130, commit `abc1234`, 2026-11-24' (and the dev build where it was one)."""
    dev = ", development build" if env.get("build") == "dev" else ""
    return f"{device_name(env)}, torch {env['torch']}, commit `{short_commit(env['commit'])}`, {env['date'][:10]}{dev}"


def header(data: dict, extra: str = "") -> str:
    return (f"{run_label(data['env'])}, bf16, copy {data['copy_tbps']:.2f} TB/s. µs per call (% of copy), "
            f"{steady_state(data)}{extra}.")


def listing(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --- docs/performance.md: per family ---------------------------------------------------------------

def rmsnorm_table(data: dict) -> str:
    """Shapes down, the RMSNorm implementations across (a fixed order), and the flushed timings of
    ours and F.rms_norm."""
    by_shape: dict[str, dict[str, dict]] = {}
    for r in data["rows"]:
        by_shape.setdefault(str(r["shape"]), {})[r["impl"]] = r
    impls = [i for i in RMSNORM_IMPLS if any(i in d for d in by_shape.values())]
    lines = [header(data, "; `flushed`: do_bench, L2 flushed"), "",
             "| shape | " + " | ".join(impls) + " | ours flushed | F.rms_norm flushed |",
             "|---" * (len(impls) + 3) + "|"]
    for shape, d in by_shape.items():
        cells = [f"{d[i]['us']:.1f} ({d[i]['frac_copy']:.0%})" if i in d else "–" for i in impls]
        for impl in (RMSNORM_IMPLS[0], "F.rms_norm"):
            cells.append(f"{d[impl]['us_flushed']:.1f}" if impl in d else "–")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_op_tables(rows: list[dict], title, cell) -> list[str]:
    """Markdown lines of one table per op of `rows`: shapes down, implementations across (sweep rows
    left out); `title(op)` heads each table, `cell(impl, row)` fills each cell ("–" where none)."""
    by_op: dict[str, dict[str, dict[str, dict]]] = {}
    for r in rows:
        if not is_sweep(r["impl"]):
            by_op.setdefault(r["op"], {}).setdefault(str(r["shape"]), {})[r["impl"]] = r
    out = []
    for op, shapes in by_op.items():
        impls = list(dict.fromkeys(i for d in shapes.values() for i in d))
        out += ["", title(op), "", "| shape | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
        for shape, d in shapes.items():
            out.append(f"| {shape} | " + " | ".join(cell(i, d[i]) if i in d else "–" for i in impls) + " |")
    return out


def ops_tables(data: dict, family: str) -> str:
    """One table per op: shapes down, implementations across; cells µs (% of copy, × over eager)."""
    def cell(impl: str, r: dict) -> str:
        x = f", {r['speedup_vs_eager']:.1f}×" if "speedup_vs_eager" in r and not impl.startswith("eager") else ""
        return f"{r['us']:.1f} ({r['frac_copy']:.0%}{x})"

    speedups = any("speedup_vs_eager" in r for r in data["rows"])
    extra = f"; `×`: speedup over {SPEEDUP_OVER.get(family, 'eager')}" if speedups else ""
    out = [header(data, extra)] + per_op_tables(data["rows"], lambda op: f"**{op}**", cell)
    return "\n".join(out) + published_harness_tables(data)


def published_harness_tables(data: dict) -> str:
    """The rows timed as Mochi's published kernel table was (`us_published_harness`), if any, a table
    per op. For reference beside that table's ratios, not a target: timed on the host, these rows
    measure host dispatch as much as the kernel and move by up to 30% between runs."""
    rows = [r for r in data["rows"] if "us_published_harness" in r]
    if not rows:
        return ""

    def cell(impl: str, r: dict) -> str:
        x = "" if impl.startswith("eager") else f" ({r['speedup_vs_eager_published_harness']:.1f}×)"
        return f"{r['us_published_harness']:.1f}{x}"

    out = ["", "", "Mochi's published sizes, timed as the published table was (the same inputs every call, 100 calls "
           "back to back, host timer; median of 5 loops): µs per call (speedup over eager; the published "
           "kernel's: " + " / ".join(f"{x}x" for x in MOCHI_PUBLISHED.values()) + "). Host-bound at these sizes "
           "(~11 µs of host time per call, as `F.rms_norm`): these move by up to 30% between runs, and targets are "
           "not judged on them."]
    out += per_op_tables(rows, lambda op: f"**{op}**, timed as published", cell)
    return "\n".join(out)


def attention_table(data: dict) -> str:
    """SDPA backends: one row per call, TFLOP/s per backend (or `–` where it refuses the call)."""
    backends = list(dict.fromkeys(r["impl"] for r in data["rows"]))
    by_op: dict[str, dict[str, dict]] = {}
    for r in data["rows"]:
        by_op.setdefault(r["op"], {})[r["impl"]] = r
    lines = [f"{run_label(data['env'])}; bf16. Cells: TFLOP/s (µs, triton do_bench median, L2 flushed); `–`: the "
             "backend refuses the call.", "",
             "| call | q, k shapes | " + " | ".join(backends) + " |", "|---" * (len(backends) + 2) + "|"]
    for op, d in by_op.items():
        shape = next(iter(d.values()))["shape"]
        cells = [f"{d[b]['tflops']:.0f} ({d[b]['us']:.0f} µs)" if "tflops" in d.get(b, {}) else "–"
                 for b in backends]
        lines.append(f"| {op} | {shape[0]}, {shape[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def end_to_end_table(rows: list) -> str:
    """Every configuration of an issue-5 generate_video run (LTX-Video only), with the profiled step's split."""
    lines = ["| configuration | ms/step | it/s | speedup vs stock eager | GEMM + attention floor (ms) | "
             "other GPU time (ms) | rel. diff of latents vs stock |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("profile")
        floor = f"{p['floor_ms']:.1f}" if p else "–"
        other = f"{p['other_ms']:.1f}" if p else "–"
        lines.append(f"| {r['config']} | {r['ms_per_step']:.1f} | {r['it_per_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{floor} | {other} | {r['rel_l2_vs_stock']:.1e} |")
    return "\n".join(lines)


def end_to_end_block(data: dict) -> str:
    """docs/performance.md's block for an issue-5 generate_video run (LTX-Video only, before one file
    per model): what ran, then every configuration."""
    shape, options = data["shape"], data["options"]
    latent = "x".join(str(n) for n in shape["latent"])
    caption = (f"{run_label(data['env'])}; LTX-Video transformer, {shape['weights']}, bf16; {shape['num_frames']} "
               f"frames at {shape['width']}x{shape['height']} (latent {latent}, seq {shape['seq']}), transformer "
               f"batch {shape['transformer_batch']} (classifier-free guidance), {shape['text_tokens']} text tokens; "
               f"{options['steps']} timed steps after {options['warmup_iterations']} warm-up steps; optimize_ltx "
               f"{options['kernel_mode']} mode, GELU epilogue {'on' if options['gelu_epilogue'] else 'off'}; "
               f"torch.compile fullgraph, {options['compile_scope']} scope. Floor = GPU time in GEMMs + attention "
               "in one profiled step.")
    return f"{caption}\n\n{end_to_end_table(data['rows'])}"


# --- end to end, one file per model (issue 35) ------------------------------------------------------

E2E_FAMILY = "generate_video"
# The configuration names of an issue-5 run, by the keys of a run per model.
LEGACY_CONFIGS = {"stock eager": "stock-eager", "ltx_kernels eager": "ours-eager",
                  "stock + torch.compile": "stock-compile", "ltx_kernels + torch.compile": "ours-compile"}


def is_end_to_end(family: str) -> bool:
    return family == E2E_FAMILY or family.startswith(E2E_FAMILY + "-")


def is_legacy(data: dict) -> bool:
    """An issue-5 generate_video run: LTX-Video only, before one file per model."""
    return "model" not in data


def model_label(data: dict) -> str:
    if is_legacy(data):
        return "LTX-Video 0.9 2B (`LTXVideoTransformer3DModel`)"
    m = data["model"]
    weights = "" if m["weights"] == "random" else f", weights `{m['weights']}`"
    return f"{m['title']} {m['variant']} (`{m['class']}`{weights})"


def step_label(data: dict) -> str:
    """'B=2, 81 frames 832x480 (32760 tokens), 512 text tokens', as issue 35's table states a step."""
    s = data["shape"]
    if is_legacy(data):
        return (f"B={s['transformer_batch']}, {s['num_frames']} frames {s['width']}x{s['height']} ({s['seq']} tokens), "
                f"{s['text_tokens']} text tokens")
    frames = f"{s['frames']} frames " if s["frames"] is not None else ""
    audio = f" + {s['audio_tokens']} audio tokens" if s.get("audio_tokens") else ""
    image = f", {s['image_tokens']} image tokens" if s.get("image_tokens") else ""
    return (f"B={sum(s['passes'])}, {frames}{s['width']}x{s['height']} ({s['tokens']} tokens{audio}), "
            f"{s['text_tokens']} text tokens{image}")


def depth_label(data: dict) -> str:
    if is_legacy(data):
        return "full"
    d = data["depth"]
    return f"scaled from {d['layers']} of {d['full_layers']}" if d["scaled"] else f"full ({d['full_layers']})"


def rows_by_key(data: dict) -> dict:
    if is_legacy(data):
        return {LEGACY_CONFIGS[r["config"]]: r for r in data["rows"] if r["config"] in LEGACY_CONFIGS}
    return {r["key"]: r for r in data["rows"]}


def split(profile: dict | None, missing: str = "–") -> str:
    return (f"{profile['gemm_ms']:.1f} / {profile['attention_ms']:.1f} / {profile['other_ms']:.1f}" if profile
            else missing)


OLD_SPLIT_MARK = " ‡"


def old_split(data: dict) -> bool:
    """A run split before ``e2e.SPLIT_VERSION`` that could not be re-split (no per-kernel times)."""
    return not is_legacy(data) and data.get("split", 1) < e2e.SPLIT_VERSION


PROFILED_MARK = " †"
PROFILED_NOTE = (f"{PROFILED_MARK.strip()} Timed in the process that had profiled the configurations before it "
                 "(runs before `4e848ac`): the profiler stays attached and every later launch costs the host more, "
                 "so host-bound configurations read slow ([more](docs/performance.md#profiled-steps)).")


def timed_after_profiling(data: dict) -> bool:
    """A run timed in the process that profiled its earlier configurations (before generate_video's
    profile pass): its later host-bound configurations read slow."""
    return (not is_legacy(data) and not data["options"].get("profiled", "").startswith("own process")
            and any("profile" in r for r in data["rows"]))


def profiled_mark(data: dict) -> str:
    return PROFILED_MARK if timed_after_profiling(data) else ""


def readme_row(data: dict) -> str:
    """One model's row: stock compile against ours + compile, and where ours' time goes."""
    by = rows_by_key(data)
    stock, ours = by.get("stock-compile"), by.get("ours-compile")
    head = f"| {model_label(data)} | {step_label(data)} | {depth_label(data)} | "
    stock_ms = f"{stock['ms_per_step']:.1f}" if stock and "ms_per_step" in stock else "–"
    if not ours or "ms_per_step" not in ours:
        status = ours.get("status", "not measured") if ours else "not measured"
        return head + f"{stock_ms} | ours: {status} | – | – | – |"
    target = data.get("targets", {}).get("ours_compile_speedup_over_stock_compile", {}).get("threshold")
    speedup = times(stock['ms_per_step'] / ours['ms_per_step'], target) if stock_ms != "–" else "–"
    sp, op = stock.get("profile") if stock else None, ours.get("profile")
    mark = OLD_SPLIT_MARK if old_split(data) else ""
    other = f"{sp['other_ms']:.1f} → {op['other_ms']:.1f}{mark}" if sp and op else "–"
    return head + f"{stock_ms} | {ours['ms_per_step']:.1f} | {speedup}{profiled_mark(data)} | {split(op)} | {other} |"


def model_order(item: tuple[str, dict]) -> tuple:
    family, data = item
    if is_legacy(data):
        return (0, 0, family)
    keys, model = list(e2e.MODELS), data["model"]
    if model["key"] not in keys:
        return (len(keys), True, family)
    return (keys.index(model["key"]), model["variant"] != e2e.MODELS[model["key"]].default, family)


def end_to_end_runs(families: dict[str, dict]) -> list[tuple[str, dict]]:
    """The end-to-end runs of one device in model order; an issue-5 LTX-Video run only where no run
    per model has LTX-Video's default configuration. Training runs (``--train``: a LoRA step, not a
    denoising step), FP8 runs (``--fp8``, :func:`fp8_runs`) and context-parallel runs (``--parallel``)
    are not among them."""
    runs = {f: d for f, d in families.items()
            if is_end_to_end(f) and not {"train", "fp8", "parallel"} & set(d)}
    if e2e.result_name("ltx", e2e.MODELS["ltx"].default) in runs:
        runs.pop(E2E_FAMILY, None)
    return sorted(runs.items(), key=model_order)


def runs_source(runs: list[tuple[str, dict]], source: str) -> str:
    """'From `<source>`, run(s) of <dates>, commit(s) <commits>.' of a summary's runs."""
    envs = [d["env"] for _, d in runs]
    dates, commits = sorted({e["date"][:10] for e in envs}), sorted({f"`{short_commit(e['commit'])}`" for e in envs})
    return (f"From `{source}`, run{'s' if len(dates) > 1 else ''} of {listing(dates)}, "
            f"commit{'s' if len(commits) > 1 else ''} {listing(commits)}.")


def end_to_end_summary(runs: list[tuple[str, dict]], source: str) -> str:
    """README's end-to-end table of one device: one row per model."""
    lines = [f"**End to end** ({device_name(runs[0][1]['env'])}): one denoising step of each model's own pipeline "
             "loop (scheduler and guidance as its diffusers pipeline runs them), transformer only, random weights, "
             "bf16; ms per step, mean of the timed steps. Rows \"scaled\" were measured at N layers and at 1 layer "
             "and scaled per layer to full depth. GEMM + attention is the GPU time no elementwise fusion can remove. "
             + runs_source(runs, source), "",
             "| model | step | depth | stock compile (ms) | ours + compile (ms) | speedup | "
             "ours + compile: GEMM / attention / other (ms) | other (ms): stock compile → ours |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [readme_row(d) for _, d in runs]
    if any(old_split(d) for _, d in runs):
        lines += ["", f"{OLD_SPLIT_MARK.strip()} Split before 2026-11-28, when Inductor's kernels that write the "
                  "attention's inputs (q/k norm + RoPE) counted as attention: stock compile's \"other\" reads low."]
    return "\n".join(lines)


def fusion_ceiling(data: dict) -> float | None:
    """Stock compile's step time over that time less its "other" GPU time: the most any elementwise
    fusion can give while GEMM and attention stay as they are (None without a profile)."""
    row = rows_by_key(data).get("stock-compile") or {}
    other = (row.get("profile") or {}).get("other_ms")
    return row["ms_per_step"] / (row["ms_per_step"] - other) if other else None


def target_text(data: dict) -> str:
    t = e2e.targets(data["rows"])  # from the rows, so a run measured before a change to the rules shows them too
    ceiling = fusion_ceiling(data)

    def verdict(entry: dict) -> str:
        return {True: "met", False: "not met", None: "not measured"}[entry["met"]]

    eager, speed, other = (t["ours_eager_faster_than_stock_compile"], t["ours_compile_speedup_over_stock_compile"],
                           t["ours_other_within_fraction_of_stock_compile_other"])
    back = eager.get("back_to_back_ms")
    back_note = f"; back to back, as a pipeline runs its steps: {back[0]:.1f} vs {back[1]:.1f}" if back else ""
    parts = [f"ours eager faster than stock compile: {verdict(eager)}"
             + (f" ({eager['ours_eager_ms']:.1f} vs {eager['stock_compile_ms']:.1f} ms{back_note})"
                if eager["met"] is not None else ""),
             f"ours + compile ≥ {speed['threshold']}x stock compile: {verdict(speed)}"
             + (f" ({times(speed['value'], speed['threshold'])}"
                + (f"; with no other GPU time at all, at most {ceiling:.2f}x" if ceiling else "") + ")"
                if speed["value"] is not None else ""),
             f"ours + compile's other ≤ {other['threshold']:.0%} of stock compile's: {verdict(other)}"
             + (f" ({other['value']:.0%})" if other["value"] is not None else "")]
    return "Targets (issue 35): " + "; ".join(parts) + "."


def configuration_table(columns: list[str], rows: list[dict], cells, blank: str = "–") -> list[str]:
    """A markdown table of end-to-end configurations: the header of ``columns``, then a line a row,
    ``cells(row)`` where it was measured, else its name, its status and ``blank`` in the other
    columns (an empty ``blank`` leaves them one space wide)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        if "ms_per_step" in r:
            lines.append("| " + " | ".join(cells(r)) + " |")
        else:
            lines.append(f"| {r['config']} | {r.get('status', 'not measured')} |"
                         + (f" {blank} |" if blank else " |") * (len(columns) - 2))
    return lines


def times(ratio: float, target: float | None = None) -> str:
    """A speedup to two decimals, or three where two would round a miss of ``target`` up to it
    (1.095 against 1.1 reads 1.095x, not 1.10x)."""
    text = f"{ratio:.2f}"
    if target is not None and ratio < target <= float(text):
        text = f"{ratio:.3f}"
    return text + "x"


def verdict(met) -> str:
    """A target's `met` (True, False or None where it was not measured) as the tables say it."""
    return "n/a" if met is None else ("met" if met else "NOT met")


def train_table(data: dict) -> str:
    """A training run's configurations (generate_video --train) and its targets."""
    def cells(r: dict) -> list[str]:
        memory = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "n/a"
        return [r["config"], f"{r['ms_per_step']:.1f}", f"{r['speedup']:.2f}x", memory,
                f"{r['grad_rel_l2_vs_fp32']:.3e}", split(r.get("profile"), "")]

    lines = configuration_table(["configuration", "ms / step", "vs stock eager", "peak memory (GiB)",
                                 "LoRA grads rel. L2 to fp32", "GEMM / attention / other (ms)"],
                                data["rows"], cells, blank="")
    for name, t in data["targets"].items():
        lines.append(f"- {name.replace('_', ' ')}: {verdict(t['met'])}")
    turns = data.get("interleaved")
    if turns and "rounds" in turns:
        lines.append(f"- in turns in one process ({len(turns['rounds'])} rounds of {turns['steps_per_round']} steps, "
                     f"{turns['layers']} layers, medians): stock compile {turns['stock_compile_ms_median']:.1f}, "
                     f"ours + compile {turns['ours_compile_ms_median']:.1f} ms ({turns['speedup']:.2f}x; by round "
                     + ", ".join(f"{r['speedup']:.2f}x" for r in turns["rounds"]) + ")")
    return "\n".join(lines)


def train_block(data: dict) -> str:
    """docs/performance.md's block for one training run."""
    t, d, o = data["train"], data["depth"], data["options"]
    depth = (f"{d['layers']} of {d['full_layers']} layers and 1, scaled to full depth" if d["scaled"]
             else f"full depth, {d['full_layers']} layers")
    caption = (f"**{model_label(data)}**, LoRA rank {t['lora_rank']} on {', '.join(t['lora_targets'])}, gradient "
               f"checkpointing {t['grad_checkpointing']}. {run_label(data['env'])}; {step_label(data)}, batch "
               f"{data['shape']['train_batch']}; {depth}; {o['steps']} timed steps after {o['warmup_iterations']} "
               f"warm-up steps; attention {data['attention']['chosen']}; torch.compile {o['compile_scope']} scope"
               f"{compile_note(o)}.")
    return caption + "\n\n" + train_table(data)


def train_order(item: tuple[str, dict]) -> tuple:
    """LoRA training runs by model, checkpointing off first, then by device."""
    return (*model_order(item)[:2], item[1]["train"]["grad_checkpointing"] == "on", device_name(item[1]["env"]))


def train_runs(families: dict[str, dict]) -> list[tuple[str, dict]]:
    """The LoRA training runs of one device, in train_order."""
    return sorted(((f, d) for f, d in families.items() if is_end_to_end(f) and "train" in d), key=train_order)


def train_summary(runs: list[tuple[str, dict]], source: str) -> str:
    """README's training table: one row per run, every device's."""
    lines = ["**LoRA training step**: forward + backward, rank-64 adapters on the attention projections, base "
             "frozen, bf16, random weights; ms per step (mean) and peak memory at full depth, measured there or "
             "scaled per layer from fewer layers (depth). Where the two were also timed in turns in one process "
             "(`--interleave`, for host-bound steps), the speedup of those medians follows. "
             + runs_source(runs, source),
             "", "| model | GPU | checkpointing | depth | stock compile (ms) | ours + compile (ms) | speedup | "
             "peak GiB: stock compile → ours + compile | LoRA grads rel. L2 to fp32: stock → ours |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, data in runs:
        by = rows_by_key(data)
        sc, oc = by.get("stock-compile", {}), by.get("ours-compile", {})
        if "ms_per_step" not in sc or "ms_per_step" not in oc:
            continue
        d = data["depth"]
        depth = f"{d['layers']} → {d['full_layers']} layers" if d["scaled"] else f"{d['full_layers']} layers"
        speedup = sc["ms_per_step"] / oc["ms_per_step"]
        turns = data.get("interleaved") or {}
        in_turns = f"; in turns {times(turns['speedup'])}" if "speedup" in turns else ""
        lines.append(f"| {model_label(data)} | {device_name(data['env'])} | {data['train']['grad_checkpointing']} | "
                     f"{depth} | {sc['ms_per_step']:.1f} | {oc['ms_per_step']:.1f} | "
                     f"{times(speedup)}{profiled_mark(data)}{in_turns} | "
                     f"{sc['peak_memory_gib']:.2f} → {oc['peak_memory_gib']:.2f} | "
                     f"{sc['grad_rel_l2_vs_fp32']:.2e} → {oc['grad_rel_l2_vs_fp32']:.2e} |")
    return "\n".join(lines)


def model_block(data: dict) -> str:
    """docs/performance.md's block for one model's run: what ran, every configuration, the attention
    backends measured, and the targets."""
    m, d, a, o, opt = data["model"], data["depth"], data["attention"], data["ours"], data["options"]
    depth = (f"{d['layers']} of {d['full_layers']} layers ({d['unit']}) measured with a 1-layer baseline and "
             f"scaled: {d['method']}" if d["scaled"] else f"full depth, {d['full_layers']} layers")
    graphed = ", each transformer call one CUDA graph (`cuda_graph=True`)" if o.get("cuda_graph") else ""
    ours = (f"ours = `{o['entry']}`, {o['kernel_mode']} mode{graphed}" if o["status"] == "ok"
            else f"ours: {o['status']}" + (f" ({o['reason'].splitlines()[0][:160]})" if o.get("reason") else ""))
    caption = (f"**{model_label(data)}**, {m['pipeline']}'s loop. {run_label(data['env'])}, diffusers "
               f"{data['env']['diffusers']}; {m['weights']} weights, bf16; {step_label(data)}; {depth}; "
               f"{opt['steps']} timed steps after {opt['warmup_iterations']} warm-up steps; attention backend "
               f"{a['chosen']} ({a['why']}); {ours}; torch.compile {opt['compile_scope']} scope"
               f"{compile_note(opt)}.")

    def cells(r: dict) -> list[str]:
        p = r.get("profile")
        graph = " (graph breaks)" if r.get("fullgraph") is False else ""
        return [f"{r['config']}{graph}", f"{r['ms_per_step']:.1f}", f"{r['speedup']:.2f}x",
                *([f"{p[k]:.1f}" for k in ("gemm_ms", "attention_ms", "other_ms")] if p else ["–"] * 3),
                f"{r['rel_l2_vs_stock']:.1e}"]

    lines = [caption, "", *configuration_table(
        ["configuration", "ms/step", "speedup vs stock eager", "GEMM (ms)", "attention (ms)", "other (ms)",
         "rel. L2 of latents vs stock"], data["rows"], cells)]
    backends = []
    for b in a["backends"]:
        if "ms_per_step" in b and b.get("rel_l2_vs_native") is not None:
            backends.append(f"{b['backend']} {b['ms_per_step']:.1f} ms (rel. L2 {b['rel_l2_vs_native']:.1e}"
                            + ("" if b["status"] == "ok" else ", outside tolerance") + ")")
        else:
            backends.append(f"{b['backend']} refused")
    if backends:
        lines += ["", f"Attention backends ({a['measured_on']}, tolerance {a['tolerance']} rel. L2 against native): "
                  + ", ".join(backends) + "."]
    lines += ["", target_text(data)]
    timeline = timeline_text(data["rows"])
    if timeline:
        lines += ["", timeline]
    if "parallel" in data:
        lines += ["", parallel_text(data["parallel"], data["rows"])]
    lines += [f"Note: {n}." for n in [m.get("note"), *m.get("notes", []), below_zero_note(data["rows"])] if n]
    return "\n".join(lines)


def below_zero_note(rows: list[dict]) -> str:
    """Which rows' profile figures scaled below zero (e2e.below_zero), or ""."""
    parts = [f"{r['config']} ({', '.join(names)})" for r in rows if (names := e2e.below_zero(r.get("profile") or {}))]
    return ("profile figures that scaled below zero, noise rather than time (the N-layer step measured less than "
            "the 1-layer one; measure more layers): " + "; ".join(parts)) if parts else ""


def timeline_text(rows: list[dict]) -> str:
    """Where the profiled step's kernels ran against its timed wall time: per configuration, the span from the
    first kernel's start to the last one's end and the idle time inside it; "" for runs that predate it."""
    parts = [f"{r['config']} {r['ms_per_step']:.1f} ms{back_to_back(r)}: {kernel_timeline(p)}"
             for r in rows if (p := r.get("profile")) and "gpu_span_ms" in p]
    if not parts:
        return ""
    return ("Device timeline of the profiled step (ms; a step's time less the span is the host's before the first "
            "launch and after the last; back to back: the steps with one synchronisation at the end, as a pipeline "
            "runs them): " + "; ".join(parts) + ".")


def kernel_timeline(profile: dict) -> str:
    """``kernels K over S (G idle)``: a profiled step's kernel time, its span and the idle time inside (ms)."""
    return (f"kernels {profile['kernels_ms']:.1f} over {profile['gpu_span_ms']:.1f} "
            f"({profile['gpu_gaps_ms']:.1f} idle)")


def back_to_back(row: dict) -> str:
    """`` (B back to back)`` where the row timed its steps back to back too."""
    b2b = row.get("ms_per_step_back_to_back")
    return f" ({b2b:.1f} back to back)" if b2b else ""


def parallel_text(p: dict, rows: list[dict] = ()) -> str:
    """A --parallel run's scaling (each configuration on one GPU against the same with context
    parallelism), issue 38's targets, and where its rows' profiles timed collectives."""
    scaling = "; ".join(f"{key}: {e['one_gpu_ms']:.1f} → {e['parallel_ms']:.1f} ms ({e['speedup']:.2f}x, "
                        f"efficiency {e['efficiency']:.0%})" for key, e in p["scaling"].items())
    targets = "; ".join(f"{name.replace('_', ' ')}: {verdict(t['met'])}"
                        for name, t in p["targets"].items())
    text = (f"Context parallelism ({p['mode']}, {p['world']} GPUs), one GPU → {p['world']}: {scaling}. "
            f"Targets (issue 38): {targets or 'none measured'}.")
    exchanges = [f"{r['config']}: {q['collective_ms']:.1f} ms, {q['exposed_collective_ms']:.1f} of them exposed"
                 for r in rows if (q := r.get("profile")) and "collective_ms" in q]
    if exchanges:
        text += (" Rank 0's profiled step, NCCL kernels (the exchange and the wait for peers) and the part of them "
                 "no other kernel overlaps: " + "; ".join(exchanges) + ".")
    return text


def family_block(family: str, data: dict) -> str:
    if family == "rmsnorm":
        return rmsnorm_table(data)
    if family == "attention":
        return attention_table(data)
    if is_end_to_end(family):
        return end_to_end_block(data) if is_legacy(data) else model_block(data)
    return ops_tables(data, family)


# --- README.md: headline and end to end ------------------------------------------------------------

def headline_row(family: str, data: dict) -> str | None:
    """The family's row of the headline table, or None where the run lacks the headline op, shape
    or implementation."""
    op, shape, impl = HEADLINE[family]
    for row_op, row_shape, ours, theirs in comparisons(data):
        mine = next((r for r in ours if r["impl"] == impl), None)
        if row_op != op or row_shape != str(shape) or mine is None:
            continue
        best = min(theirs, key=lambda r: r["us"], default=None)
        baseline = f"{best['impl']}: {best['us']:.1f}" if best else "–"
        speedup = f"{best['us'] / mine['us']:.2f}x" if best else "–"
        return (f"| {family} | `{op}` {shape} | {mine['us']:.1f} | {baseline} | {speedup} | "
                f"{mine['frac_copy']:.0%} |")
    return None


def headline(runs: dict[str, dict], source: str) -> str:
    """The headline block of one device from its runs by family."""
    families = [f for f in FAMILIES if f in runs and headline_row(f, runs[f])]
    if not families:
        return ""
    datas = [runs[f] for f in families]
    copies = sorted({f"{d['copy_tbps']:.2f}" for d in datas})
    copy = copies[0] if len(copies) == 1 else f"{copies[0]}-{copies[-1]}"
    dates = sorted({d["env"]["date"][:10] for d in datas})
    older = [f for f in families if not fresh_outputs(runs[f])]
    if not older:
        method = "outputs in fresh memory"
    elif len(older) == len(families):
        method = ("all with the older timing method (every call's output into one reused buffer, which reads "
                  "out-of-place rows of 8-70 MB 5-30% high)")
    else:
        method = f"outputs in fresh memory except {listing(older)} (older method: one reused output buffer)"
    dev = [f for f in families if runs[f]["env"].get("build") == "dev"]
    dev_note = f"; {listing(dev)} timed on a development build" if dev else ""
    lines = [f"**{device_name(datas[0]['env'])}** (copy {copy} TB/s). From `{source}`, "
             f"run{'s' if len(dates) > 1 else ''} of {listing(dates)}, {method}{dev_note}.", "",
             "| family | op, shape | ours | best baseline | speedup | % of copy |", "|---|---|---|---|---|---|"]
    lines += [headline_row(f, runs[f]) for f in families]
    return "\n".join(lines)


# --- files ----------------------------------------------------------------------------------------

# --- FP8 (issue 37): generate_video --fp8 -------------------------------------------------------------

FP8_QUALITY_LABEL = {"stock-eager": "stock bf16", "stock-compile": "stock bf16", "ours-eager": "ours bf16",
                     "ours-compile": "ours bf16", "ours-fp8-eager": "ours fp8", "ours-fp8-compile": "ours fp8",
                     "torchao-fp8-compile": "torchao fp8"}


def fp8_runs(families: dict[str, dict]) -> list[tuple[str, dict]]:
    """The FP8 end-to-end runs of one device, by model."""
    return sorted(((f, d) for f, d in families.items() if is_end_to_end(f) and "fp8" in d), key=model_order)


def fp8_block(data: dict) -> str:
    """docs/performance.md's block for one FP8 run: the configurations with each one's first-step error
    against fp32, the error of each block linear's GEMM, and issue 37's targets."""
    q = data["fp8"]
    errors = q["rel_l2_to_fp32"]
    stock = errors.get("stock bf16")

    def quality(r: dict) -> str:
        err = errors.get(FP8_QUALITY_LABEL.get(r["key"], ""))
        if not isinstance(err, (int, float)):
            return "–"
        return f"{err:.4f} ({err / stock:.2f}x)" if isinstance(stock, (int, float)) else f"{err:.4f}"

    def cells(r: dict) -> list[str]:
        return [r["config"], f"{r['ms_per_step']:.1f}", f"{r['speedup']:.2f}x", split(r.get("profile"), ""),
                quality(r)]

    qkv_note = ", three q/k/v GEMMs (--no-fp8-fuse-qkv)" if data["ours"].get("fp8_fuse_qkv") is False else ""
    if data["ours"].get("fp8_attention"):
        qkv_note += ", self-attention on cuDNN's FP8 SDPA (`fp8_attention=True`)"
    if data["ours"].get("cuda_graph"):
        qkv_note += ", each transformer call of ours one CUDA graph (`cuda_graph=True`)"
    caption = (f"**{model_label(data)}**, FP8 (`optimize(..., fp8=True)`"
               f"{', fast accumulation' if q.get('fast_accum') else ''}). {run_label(data['env'])}; "
               f"{step_label(data)}; {depth_label(data)} depth; attention {data['attention']['chosen']}"
               f"{compile_note(data['options'])}{qkv_note}. The error "
               f"column is the first denoising step's transformer output against an fp32 run of the same model at "
               f"{q['layers']} layers, and its ratio to stock bf16's (bar: {q['bar']:g}x).")
    lines = configuration_table(["configuration", "ms / step", "vs stock eager", "GEMM / attention / other (ms)",
                                 "rel. L2 to fp32 (x stock bf16)"], data["rows"], cells, blank="")
    lines += ["", "| block linear | GEMM rel. L2 to float64, bf16 | fp8 (mean over blocks) | fp8 (max) |",
              "|---|---|---|---|"]
    lines += [f"| `{r['linear']}` | {r['bf16_rel_l2_mean']:.2e} | {r['fp8_rel_l2_mean']:.2e} | "
              f"{r['fp8_rel_l2_max']:.2e} |" for r in q["per_linear"]]
    lines.append("")
    for name, t in q.get("targets", {}).items():
        lines.append(f"- {name.replace('_', ' ')}: {verdict(t['met'])}" + (
            f"; back to back ({t['back_to_back']:.1f} ms): {verdict(t['met_back_to_back'])}"
            if t.get("back_to_back") else ""))
    lines.append(f"- quality within {q['bar']:g}x stock bf16: {verdict(q['met'])}")
    timeline = timeline_text(data["rows"])
    if timeline:
        lines += ["", timeline]
    return caption + "\n\n" + "\n".join(lines)


def fp8_summary(runs: list[tuple[str, dict]], source: str) -> str:
    """README's FP8 table of one device: one row per run."""
    lines = [f"**FP8** ({device_name(runs[0][1]['env'])}): one denoising step, ms (mean); the error is the first "
             "step's output against an fp32 run of the same random-weight model. " + runs_source(runs, source), "",
             "| model | depth | stock compile | ours + compile (bf16) | ours fp8 + compile | torchao fp8 + compile | "
             "fp8 vs bf16 | rel. L2 to fp32: stock bf16 → ours fp8 |", "|---|---|---|---|---|---|---|---|"]
    for _, data in runs:
        by = rows_by_key(data)
        ms = [by.get(k, {}).get("ms_per_step") for k in ("stock-compile", "ours-compile", "ours-fp8-compile",
                                                          "torchao-fp8-compile")]
        speedup = times(ms[1] / ms[2]) if ms[1] and ms[2] else "–"
        e = data["fp8"]["rel_l2_to_fp32"]
        err = (f"{e['stock bf16']:.4f} → {e['ours fp8']:.4f}" if isinstance(e.get("ours fp8"), (int, float))
               else "–")
        cells = " | ".join(f"{m:.1f}" if m else "–" for m in ms)
        attention = (" + FP8 attention" if data["ours"].get("fp8_attention") else "") + (
            " + CUDA graph" if data["ours"].get("cuda_graph") else "")
        lines.append(f"| {model_label(data)}{attention} | {depth_label(data)} | {cells} | "
                     f"{speedup}{profiled_mark(data)} | {err} |")
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str | None:
    """`text` with the block between <!-- name:begin --> and <!-- name:end --> set to `body`, or None
    where `text` has no such block."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        return None
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + "\n" + text[stop:]


def load_results(results: Path) -> dict[str, dict[str, dict]]:
    """{device slug: {family: data}} of every <family>-<device>.json in `results`."""
    runs: dict[str, dict[str, dict]] = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        slug = device_slug(data["env"]["device"])
        if path.stem.endswith("-" + slug):
            runs.setdefault(slug, {})[path.stem[: -len(slug) - 1]] = data
    return runs


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def compile_note(options: dict) -> str:
    """How a run's compile differed from the default: ", mode <mode>", ", inductor C++ wrapper", ", guard
    evaluation skipped", or ""."""
    mode = options.get("compile_mode", "default")
    wrapper = ", inductor C++ wrapper" if options.get("cpp_wrapper") else ""
    guards = ", guard evaluation skipped (set_stance skip_guard_eval_unsafe)" if options.get("skip_guard_eval") else ""
    return ("" if mode == "default" else f", mode {mode}") + wrapper + guards


def default_setup(data: dict, cuda_graph: bool = False) -> bool:
    """Whether an end-to-end run compiled and ran as the README's tables do: torch.compile's default mode,
    inductor's Python wrapper, every guard evaluated, one FP8 q/k/v GEMM, no CUDA graph unless ``cuda_graph``
    (``--compile-mode``, ``--compile-scope model``, ``--cpp-wrapper``, ``--skip-guard-eval``,
    ``--no-fp8-fuse-qkv``, ``--kernel-mode fast`` runs have only their own blocks; ``--cuda-graph`` runs also a
    row in the README's FP8 table)."""
    options, ours = data["options"], data.get("ours", {})
    return (options.get("compile_mode", "default") == "default" and options.get("compile_scope", "blocks") == "blocks"
            and not options.get("cpp_wrapper") and not options.get("skip_guard_eval") and ours.get("fp8_fuse_qkv", True)
            and ours.get("kernel_mode", "exact") == "exact" and (cuda_graph or not ours.get("cuda_graph")))


def blocks(results: Path) -> tuple[dict[str, str], dict[str, str]]:
    """({README block name: body}, {docs/performance.md block name: body}) from a results directory."""
    readme, performance = {}, {}
    runs = load_results(results)
    summaries, trainings, fp8s = [], [], []
    for slug, families in sorted(runs.items()):
        head = headline(families, shown(results / f"*-{slug}.json"))
        if head:
            readme[f"headline-{slug}"] = head
        for family, data in families.items():
            # op families (forward and backward rows) and the attention sweep; other results (fp8_floor)
            # have no rendered block
            if not is_end_to_end(family) and (family.removesuffix("-backward") in FAMILIES or family == "attention"):
                performance[f"{family}-{slug}-results"] = family_block(family, data)
        runs_e2e = end_to_end_runs(families)
        if runs_e2e:
            performance[f"{E2E_FAMILY}-{slug}-results"] = "\n\n".join(family_block(f, d) for f, d in runs_e2e)
            # runs with another compile setup have only their docs/performance.md blocks
            regional = [(f, d) for f, d in runs_e2e if default_setup(d)]
            summary = end_to_end_summary(regional, shown(results / f"{E2E_FAMILY}*-{slug}.json"))
            summaries.append(((len(regional), -sum(old_split(d) for _, d in regional)), summary))
        runs_train = train_runs(families)
        if runs_train:
            performance[f"{E2E_FAMILY}-train-{slug}-results"] = "\n\n".join(train_block(d) for _, d in runs_train)
            trainings += [(f, d) for f, d in runs_train if default_setup(d)]
        runs_cp = sorted(((f, d) for f, d in families.items() if is_end_to_end(f) and "parallel" in d),
                         key=model_order)
        if runs_cp:
            performance[f"{E2E_FAMILY}-cp-{slug}-results"] = "\n\n".join(model_block(d) for _, d in runs_cp)
        runs_fp8 = fp8_runs(families)
        if runs_fp8:
            performance[f"{E2E_FAMILY}-fp8-{slug}-results"] = "\n\n".join(fp8_block(d) for _, d in runs_fp8)
            fp8s.append(fp8_summary([(f, d) for f, d in runs_fp8 if default_setup(d, cuda_graph=True)],
                                    shown(results / f"{E2E_FAMILY}-*-fp8-{slug}.json")))
    # README: the device with the most models measured, then the fewest on the old split (every device's
    # runs are in docs/performance.md)
    if summaries:
        readme["end-to-end"] = max(summaries, key=lambda summary: summary[0])[1]
    if trainings:
        readme["training"] = train_summary(sorted(trainings, key=train_order),
                                           shown(results / f"{E2E_FAMILY}-*-train*.json"))
    if fp8s:
        readme["fp8"] = "\n\n".join(fp8s)
    # one footnote for the mark in any of the tables above
    marked = any(PROFILED_MARK.strip() in readme.get(name, "") for name in ("end-to-end", "training", "fp8"))
    readme["profiled-note"] = PROFILED_NOTE if marked else ""
    return readme, performance


def render(results: Path = RESULTS, readme: Path = ROOT / "README.md",
           performance: Path = ROOT / "docs" / "performance.md") -> list[str]:
    """Rewrite the blocks of `readme` and `performance` from `results`; returns what was done."""
    messages = []
    for path, bodies in zip((readme, performance), blocks(results)):
        text = path.read_text()
        changed = []
        for name, body in bodies.items():
            new = replace_block(text, name, body)
            if new is None:
                messages.append(f"{shown(path)} has no <!-- {name}:begin/end --> block; skipped")
                continue
            text = new
            changed.append(name)
        path.write_text(text)
        messages.append(f"{shown(path)}: {len(changed)} block(s) rendered" + (f" ({', '.join(changed)})" if changed
                                                                                else ""))
    return messages
