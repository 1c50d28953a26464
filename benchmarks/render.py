"""Render benchmark JSON into README tables and PNG plots.

    python3 benchmarks/render.py [RESULT.json ...]   (default: every benchmarks/results/*.json)

Needs matplotlib (python3 -m pip install matplotlib) besides requirements-dev.txt.

For `<name>-<device>.json` it rewrites the block between
<!-- <name>-<device>-results:begin --> and <!-- <name>-<device>-results:end -->
in README.md (one block per op family and GPU) and writes
docs/<name>-<device>.png. RMSNorm has its own table layout; the
other files (fused_norm, vae) get one table per op: shapes down, every
implementation across, µs (fraction of the copy rate) and the speedup over
the eager chain where the benchmark recorded one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPY_IMPL = "x.clone() (a copy of the same bytes)"  # reference row, not a baseline
MAIN_IMPLS = ["ltx_kernels (torch rounding)", "ltx_kernels (diffusers rounding)", "F.rms_norm",
              "torch.compile(F.rms_norm)", "torch.compile(diffusers)", "Liger", "diffusers eager", COPY_IMPL]
SWEEP_MARKS = ("tpr=", "plan=", " [LTX_")  # experiment rows: in the JSON, not in the README tables


def is_sweep(impl: str) -> bool:
    return any(m in impl for m in SWEEP_MARKS)


# In common.TIMING["us"] since outputs are kept alive per call (05c699a); tests check the two agree.
FRESH_OUTPUTS_MARK = "outputs in memory of their own"


def steady_state(data: dict) -> str:
    """How the run's `us` was taken. Runs before outputs were kept alive per call wrote every call's
    output into one reused buffer, which flatters ops with an output of their own."""
    if FRESH_OUTPUTS_MARK in data.get("timing", {}).get("us", ""):
        return "steady state over inputs spanning 4x L2 and outputs in fresh memory, in a CUDA graph"
    return ("steady state over inputs spanning 4x L2 in a CUDA graph, each call's output written into the same "
            "reused buffer (older method: rows with an output of their own read high, part of their writes "
            "staying in L2; see docs/perf-notes.md)")


def table(data: dict) -> str:
    env = data["env"]
    by_shape: dict[str, dict[str, dict]] = {}
    for r in data["rows"]:
        by_shape.setdefault(str(r["shape"]), {})[r["impl"]] = r
    impls = [i for i in MAIN_IMPLS if any(i in d for d in by_shape.values())]
    lines = [f"{env['device']}, torch {env['torch']}, commit `{env['commit'][:7]}`, {env['date'][:10]}; "
             f"bf16 with a bf16 weight; copy rate measured in the same run: **{data['copy_tbps']:.2f} TB/s**. "
             f"Cells: µs per call (fraction of the copy rate), {steady_state(data)}; `flushed` is triton do_bench "
             "with L2 flushed before each call (the issue's method).", "",
             "| shape | " + " | ".join(impls) + " | ours flushed | F.rms_norm flushed |",
             "|---" * (len(impls) + 3) + "|"]
    for shape, d in by_shape.items():
        cells = []
        for i in impls:
            r = d.get(i)
            cells.append(f"{r['us']:.1f} ({r['frac_copy']:.0%})" if r else "–")
        ours, frms = d.get(MAIN_IMPLS[0]), d.get("F.rms_norm")
        cells.append(f"{ours['us_flushed']:.1f}" if ours else "–")
        cells.append(f"{frms['us_flushed']:.1f}" if frms else "–")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pyplot():
    """matplotlib's pyplot on the file-only backend (plots need matplotlib; not in requirements-dev.txt)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("render.py draws its plots with matplotlib: python3 -m pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(data: dict, path: Path) -> None:
    plt = _pyplot()

    shapes = list(dict.fromkeys(str(r["shape"]) for r in data["rows"]))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(MAIN_IMPLS)
    for k, impl in enumerate(MAIN_IMPLS):
        vals = [next((r["tbps"] for r in data["rows"] if str(r["shape"]) == s and r["impl"] == impl), 0)
                for s in shapes]
        ax.bar([i + k * width for i in range(len(shapes))], vals, width, label=impl)
    ax.axhline(data["copy_tbps"], color="black", linestyle="--", linewidth=1, label="measured copy rate")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes, rotation=20, fontsize=8)
    ax.set_ylabel("TB/s (x read + y written)")
    ax.set_title(f"RMSNorm bf16 on {data['env']['device']} (torch {data['env']['torch']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def header(data: dict) -> str:
    env = data["env"]
    return (f"{env['device']}, torch {env['torch']}, commit `{env['commit'][:7]}`, {env['date'][:10]}; bf16; copy "
            f"rate measured in the same run: **{data['copy_tbps']:.2f} TB/s**. Cells: µs per call (fraction of the "
            f"copy rate for the bytes the op must move), {steady_state(data)}")


def per_op_tables(rows: list[dict], title, cell) -> list[str]:
    """Markdown lines of one table per op of `rows`: shapes down, implementations across (sweep rows
    left out); `title(op)` heads each table, `cell(impl, row)` fills each cell ("–" where none)."""
    by_op: dict[str, dict[str, dict[str, dict]]] = {}
    for r in rows:
        by_op.setdefault(r["op"], {}).setdefault(str(r["shape"]), {})[r["impl"]] = r
    out = []
    for op, shapes in by_op.items():
        impls = list(dict.fromkeys(i for d in shapes.values() for i in d if not is_sweep(i)))
        out += [title(op), "", "| shape | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
        for shape, d in shapes.items():
            out.append(f"| {shape} | " + " | ".join(cell(i, d[i]) if i in d else "–" for i in impls) + " |")
        out.append("")
    return out


def ops_tables(data: dict) -> str:
    """One table per op: shapes down, implementations across."""
    def cell(impl: str, r: dict) -> str:
        x = f", {r['speedup_vs_eager']:.1f}×" if "speedup_vs_eager" in r and not impl.startswith("eager") else ""
        return f"{r['us']:.1f} ({r['frac_copy']:.0%}{x})"

    out = [header(data) + "; `×` is the speedup over the eager chain.", ""]
    out += per_op_tables(data["rows"], lambda op: f"**{op}**", cell)
    return "\n".join(out) + published_harness_table(data)


def published_harness_table(data: dict) -> str:
    """The rows timed as Mochi's published kernel table was (`us_published_harness`), if any, a table
    per op. For reference beside that table's ratios, not a target: timed on the host, these rows
    measure host dispatch as much as the kernel and move by up to 30% between runs."""
    from targets import MOCHI_PUBLISHED  # here: targets imports this module

    rows = [r for r in data["rows"] if "us_published_harness" in r]
    if not rows:
        return ""

    def cell(impl: str, r: dict) -> str:
        x = "" if impl.startswith("eager") else f" ({r['speedup_vs_eager_published_harness']:.1f}×)"
        return f"{r['us_published_harness']:.1f}{x}"

    out = ["", "Mochi's published sizes timed as that table was (" + data["timing"]["us_published_harness"]
           + "): µs per call (speedup over eager; the published kernel's: "
           + " / ".join(f"{x}x" for x in MOCHI_PUBLISHED.values()) + "). Host-bound at these sizes (a call "
           "of ours costs the host ~11 µs, as F.rms_norm does): these figures move by up to 30% between runs "
           "and are not what the targets are judged on.", ""]
    out += per_op_tables(rows, lambda op: f"**{op}**, timed as published", cell)
    return "\n".join(out)


def ops_plot(data: dict, path: Path, title: str) -> None:
    """Fraction of the copy rate per op at its first shape, one bar per implementation."""
    plt = _pyplot()

    firsts: dict[str, str] = {}
    for r in data["rows"]:
        firsts.setdefault(r["op"], str(r["shape"]))
    rows = [r for r in data["rows"] if str(r["shape"]) == firsts[r["op"]] and not is_sweep(r["impl"])]
    ops = list(firsts)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    per_op = {op: [r for r in rows if r["op"] == op] for op in ops}
    width = 0.8 / max(len(v) for v in per_op.values())
    for i, op in enumerate(ops):
        for k, r in enumerate(per_op[op]):
            colour = "tab:blue" if r["impl"].startswith("ltx_kernels") else (
                "tab:orange" if "compile" in r["impl"] else "tab:gray")
            ax.bar(i + k * width, r["frac_copy"], width, color=colour)
            ax.text(i + k * width, r["frac_copy"] + 0.01, r["impl"].replace("ltx_kernels", "ours"), rotation=90,
                    fontsize=6, ha="center", va="bottom")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))],
                  [f"{op}\n{firsts[op]}" for op in ops], fontsize=7)
    ax.set_ylabel("fraction of the measured copy rate")
    ax.set_ylim(0, 1.35)
    ax.set_title(f"{title} on {data['env']['device']} (torch {data['env']['torch']}); blue: ltx_kernels, "
                 "orange: torch.compile, grey: eager/other")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def attention_table(data: dict) -> str:
    """SDPA backends: one row per call, TFLOP/s per backend (or why it refused)."""
    env = data["env"]
    backends = list(dict.fromkeys(r["impl"] for r in data["rows"]))
    by_op: dict[str, dict[str, dict]] = {}
    for r in data["rows"]:
        by_op.setdefault(r["op"], {})[r["impl"]] = r
    lines = [f"{env['device']}, torch {env['torch']}, commit `{env['commit'][:7]}`, {env['date'][:10]}; bf16; "
             "cells: TFLOP/s (µs, triton do_bench median, L2 flushed); `–` the backend refuses the call.", "",
             "| call | q, k shapes | " + " | ".join(backends) + " |", "|---" * (len(backends) + 2) + "|"]
    for op, d in by_op.items():
        shape = next(iter(d.values()))["shape"]
        cells = [f"{d[b]['tflops']:.0f} ({d[b]['us']:.0f} µs)" if "tflops" in d.get(b, {}) else "–" for b in backends]
        lines.append(f"| {op} | {shape[0]}, {shape[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(src: Path) -> None:
    data = json.loads(src.read_text())
    dev = data["env"]["device"].replace("NVIDIA ", "").replace(" ", "-")  # may contain dashes
    name = src.stem[: -len(dev) - 1] if src.stem.endswith("-" + dev) else src.stem.rsplit("-", 1)[0]
    png = ROOT / "docs" / f"{name}-{dev}.png"
    png.parent.mkdir(exist_ok=True)
    if name == "rmsnorm":
        plot(data, png)
        body = table(data)
    elif name == "attention":
        body = attention_table(data)
        png = None
    elif name == "generate_video":  # the benchmark draws its own chart
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from generate_video import readme_block

        body = readme_block(data)
        png = None
    else:
        ops_plot(data, png, {"fused_norm": "Fused norm family", "vae": "VAE ops"}.get(name, name))
        body = ops_tables(data)
    readme = ROOT / "README.md"
    text = readme.read_text()
    begin, end = f"<!-- {name}-{dev}-results:begin -->", f"<!-- {name}-{dev}-results:end -->"
    if begin not in text:
        print(f"README.md has no {begin} block; skipped {src.name}")
        return
    start, stop = text.index(begin) + len(begin), text.index(end)
    block = "\n" + body + (f"\n\n![{name} bandwidth](docs/{png.name})\n" if png else "\n")
    readme.write_text(text[:start] + block + text[stop:])
    print("updated README.md" + (f" and {png.relative_to(ROOT)}" if png else ""))


def main() -> None:
    sources = [Path(a) for a in sys.argv[1:]] or sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    for src in sources:
        render(src)


if __name__ == "__main__":
    main()
