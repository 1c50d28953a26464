"""Render benchmark JSON into README.md and docs/performance.md.

    ltx-dev render [--results DIR] [--readme FILE] [--performance FILE]

From every `<family>-<device>.json` in the results directory (default
benchmarks/results) it rewrites, between their begin/end markers:

  README.md            <!-- headline-<device>:begin -->: one row per op family at a
                       representative DiT shape (HEADLINE): our µs, the fastest baseline of the
                       same function and its µs, the speedup over it, the fraction of the copy rate;
                       <!-- end-to-end:begin -->: the denoising-step table of every
                       generate_video-<device>.json;
  docs/performance.md  <!-- <family>-<device>-results:begin -->: the family's full tables.

<device> is the device name as the file names spell it (H200, H100-80GB-HBM3). A block
the file lacks is reported and skipped. Rows timed with tuning knobs forced (sweeps)
stay out of every table.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import RESULTS, ROOT
from . import FAMILIES
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


def run_label(env: dict) -> str:
    """'H200, torch 2.11.0+cu130, commit `abc1234`, 2026-11-24' (and the dev build where it was one)."""
    dev = ", development build" if env.get("build") == "dev" else ""
    return f"{device_name(env)}, torch {env['torch']}, commit `{env['commit'][:7]}`, {env['date'][:10]}{dev}"


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
    """Every configuration of a generate_video run, with the profiled step's split."""
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
    """docs/performance.md's block for one generate_video run: what ran, then every configuration."""
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


def family_block(family: str, data: dict) -> str:
    if family == "rmsnorm":
        return rmsnorm_table(data)
    if family == "attention":
        return attention_table(data)
    if family == "generate_video":
        return end_to_end_block(data)
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


def end_to_end_summary(data: dict, source: str) -> str:
    """README's end-to-end table for one generate_video run."""
    shape, env = data["shape"], data["env"]
    weights = ("LTX-Video 2B denoising step, random weights" if shape["weights"].startswith("random")
               else f"LTX-Video denoising step, weights from `{shape['weights']}`")
    lines = [f"**End to end** ({device_name(env)}): an {weights}, {shape['num_frames']} frames at "
             f"{shape['width']}x{shape['height']} ({shape['seq']} tokens), CFG batch {shape['transformer_batch']}, "
             f"bf16, mean of {data['options']['steps']} steps. From `{source}`, run of {env['date'][:10]}, commit "
             f"`{env['commit'][:7]}`. GEMM + attention is the GPU time no elementwise fusion can remove.", "",
             "| configuration | ms/step | speedup vs stock eager | GEMM + attention (ms) | other GPU time (ms) |",
             "|---|---|---|---|---|"]
    for r in data["rows"]:
        p = r.get("profile")
        lines.append(f"| {r['config']} | {r['ms_per_step']:.1f} | {r['speedup']:.2f}x | "
                     + (f"{p['floor_ms']:.1f} | {p['other_ms']:.1f} |" if p else "– | – |"))
    return "\n".join(lines)


# --- files ----------------------------------------------------------------------------------------

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


def blocks(results: Path) -> tuple[dict[str, str], dict[str, str]]:
    """({README block name: body}, {docs/performance.md block name: body}) from a results directory."""
    readme, performance = {}, {}
    runs = load_results(results)
    e2e = []
    for slug, families in sorted(runs.items()):
        head = headline(families, shown(results / f"*-{slug}.json"))
        if head:
            readme[f"headline-{slug}"] = head
        for family, data in families.items():
            performance[f"{family}-{slug}-results"] = family_block(family, data)
        if "generate_video" in families:
            e2e.append(end_to_end_summary(families["generate_video"], shown(results / f"generate_video-{slug}.json")))
    if e2e:
        readme["end-to-end"] = "\n\n".join(e2e)
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
