"""Timing and bookkeeping shared by the benchmarks (benchmarks/bench_<family>.py):
a measured copy ceiling, steady-state and cold-L2 median timing, the common
command line, loading the built kernel, and the JSON record. With --profile the
same benchmarks run each implementation a few times in NVTX ranges instead of
timing it, for ncu / nsys (`ltx-dev profile`)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import kernel as kernel_loading
from .. import tuning
from ..paths import RESULTS, ROOT
from .rows import is_ours, is_sweep, tuned_name


def median_us(fn, warmup_ms: float = 25, rep_ms: float = 200) -> float:
    """Median GPU time of `fn` in µs. triton's do_bench zeroes a 256 MB buffer
    before every timed call, so inputs come from HBM (cold L2), and the launch
    is queued behind that work, so host overhead is not in the figure."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def rotating_graph_us(fn, make_args, bytes_per_call: int, replays: int = 7) -> float:
    """Per-call GPU time in µs, steady state: calls rotate over enough argument
    sets that they span 4x the L2 (each call reads inputs that are not in
    L2), are captured back to back in one CUDA graph (no launch gaps from
    the host) and timed with CUDA events; median over `replays` replays.
    What each call returns stays alive until the graph is gone, so every call
    writes memory of its own: an output allocated per call and freed at once
    would get the block just freed, the same one every call, and part of its
    writes would stay in L2 (a 44 MB copy into one reused buffer measured 101%
    of the 1 GiB copy rate on the H100, 86% into fresh memory)."""
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    # Inputs, warm-up and capture on one side stream: autograd runs a backward on
    # its forward's stream, so a forward made on the default stream would put a
    # timed backward outside the capture (and invalidate it).
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sets = [make_args(i) for i in range(max(2, -(-4 * l2 // bytes_per_call)))]
        calls = max(len(sets), 24)
        calls -= calls % len(sets)
        for args in sets:  # warm up (and compile) outside the capture
            fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outputs = []
    with torch.cuda.graph(graph, stream=stream):
        for c in range(calls):
            outputs.append(fn(*sets[c % len(sets)]))
    # Untimed replays for >= 50 ms first: the GPU's clocks ramp up after idle
    # gaps (compiling a baseline leaves one), which made the first row measured
    # after such a gap up to 10% slow.
    warm_start = time.perf_counter()
    while True:
        graph.replay()
        torch.cuda.synchronize()
        if time.perf_counter() - warm_start > 0.05:
            break
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph, outputs
    return sorted(times)[len(times) // 2]


def published_harness_us(fn, args, calls: int = 100, warmup: int = 10) -> float:
    """Per-call wall time in µs as the table of Mochi's published fused-RMSNorm kernel (5.6x / 6.3x /
    9.6x over eager at 512 / 1024 / 2048 x 3072) was measured: `warmup` calls, then `calls` calls back
    to back on the same inputs (they stay in L2 where they fit) between two synchronizes, timed on the
    host, each call allocating its output (so host dispatch counts where it outlasts the GPU work)."""
    import torch

    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def copy_tbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in TB/s, counting bytes read plus written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6) / 1e12


def git_commit() -> str:
    """HEAD of the checkout ("-dirty" with uncommitted changes), or "unknown" outside a git checkout
    (the GPU machine's copy of the tree: pass --commit there)."""
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(commit: str | None = None, dev_build: bool = False) -> dict:
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    env = {
        "device": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": commit or git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if dev_build:
        env["build"] = "dev"
    return env


def device_slug(device: str) -> str:
    """The device as result files name it: 'NVIDIA H100 80GB HBM3' -> 'H100-80GB-HBM3'."""
    return device.replace("NVIDIA ", "").replace(" ", "-")


def write_json(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    out_dir = out_dir or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{device_slug(payload['env']['device'])}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


TIMING = {"us": "CUDA-graph replay of calls rotating over inputs spanning 4x L2, each call's outputs in memory of "
                "their own, median per call",
          "us_flushed": "triton do_bench median, L2 flushed before each call",
          "us_published_harness": "Mochi's published sizes only: the method of that table (same inputs every call, "
                                  "100 calls back to back timed on the host; median of 5 such loops, taken in turn with the "
                                  "other implementations)",
          "us_rounds": "with --rounds N: `us` of each round (every implementation of a shape timed once per "
                       "round, in turn); `us` and `us_flushed` are then the lower median over the rounds"}


# --- the common command line ---------------------------------------------------------------------

@dataclass
class Settings:
    """What the common command line selects; measure() reads it."""

    only_ops: set = field(default_factory=set)         # --only: the other ops are skipped
    shapes: list = field(default_factory=list)          # --shape: the other shapes are skipped
    impls: list = field(default_factory=list)           # --impl: implementations whose names contain one of these
    rounds: int = 1                                     # --rounds
    sweeps: list = field(default_factory=list)          # --sweep-tuning: (knob, [values]) rows per value
    tuning: dict = field(default_factory=dict)          # --tuning: knobs forced on every ltx_kernels row
    profile: bool = False                               # --profile: run in NVTX ranges, no timing
    calls: int = 3                                      # --calls (profile)
    flush: bool = False                                 # --flush (profile)
    kernel: object = None                               # the loaded kernel (for the tuning knobs)


SETTINGS = Settings()


def median_of_rounds(times: list[tuple[float, float]]) -> tuple[float, float]:
    """(steady-state µs, flushed µs) of an implementation over interleaved rounds: the median of
    each (the lower middle value for an even count, so a slow outlier round never sets the figure)."""
    def lower_median(values):
        ordered = sorted(values)
        return ordered[(len(ordered) - 1) // 2]
    return lower_median(t[0] for t in times), lower_median(t[1] for t in times)


def selected(op: str) -> bool:
    """Whether --only (if given) names `op`, by its name or with spaces as underscores."""
    only = SETTINGS.only_ops
    return not only or op in only or op.replace(" ", "_") in only


def parse_shape(text: str) -> tuple:
    """'2,2688,2048' -> (2, 2688, 2048); 'a;b' (several operands' shapes, as inplace_add's rows) ->
    (a, b)."""
    try:
        parts = [tuple(int(d) for d in part.split(",")) for part in text.split(";")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a shape is comma-separated integers, operands ';'-separated "
                                         "(e.g. 2,2688,2048 or 2,512,7,32,48;512,1,1,1)") from None
    return parts[0] if len(parts) == 1 else tuple(parts)


def _as_key(shape) -> tuple:
    return tuple(tuple(s) for s in shape) if isinstance(shape[0], (tuple, list)) else tuple(shape)


def shape_selected(shape) -> bool:
    """Whether --shape (if given) names `shape`."""
    return not SETTINGS.shapes or _as_key(shape) in {_as_key(s) for s in SETTINGS.shapes}


def shapes(defaults: list, quick: list | None = None, args=None) -> list:
    """The shapes a benchmark whose shapes are plain tensor shapes runs: --shape's (any shape)
    when given, else `quick` under --quick, else `defaults`."""
    if SETTINGS.shapes:
        return [s for s in SETTINGS.shapes if not isinstance(s[0], tuple)]
    return quick if args is not None and args.quick and quick is not None else defaults


def impl_selected(name: str) -> bool:
    return not SETTINGS.impls or any(part in name for part in SETTINGS.impls)


def parser(doc: str, quick_help: str, sweep_help: str | None = None, kernel: bool = True) -> argparse.ArgumentParser:
    """The command line every benchmark shares; `kernel=False` (attention) leaves out what concerns
    the package's kernels."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--commit", default=None, metavar="SHA",
                    help="the commit to record (default: git's HEAD; give it where the tree is no git checkout)")
    if not kernel:
        return ap
    if sweep_help:
        ap.add_argument("--sweep", action="store_true", help=sweep_help + " (tuning knobs: needs --dev-build)")
    ap.add_argument("--dev-build", action="store_true",
                    help="time the development build (_build/dev, `python3 -m ltx_build build --dev`), which has "
                         "the tuning knobs, instead of the release build (build/)")
    ap.add_argument("--sweep-tuning", action="append", default=[], metavar="KNOB=V1,V2",
                    help="also time every ltx_kernels implementation with the tuning knob KNOB forced to each value "
                         "(rows named '<impl> [KNOB=V]'; e.g. qk_rmsnorm_rope.samples=1,2); repeatable; needs "
                         "--dev-build")
    ap.add_argument("--tuning", action="append", default=[], metavar="KNOB=V",
                    help="force a tuning knob on every ltx_kernels implementation for the whole run; repeatable; "
                         "needs --dev-build")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="time every implementation of a shape N times, round-robin, and report the lower median "
                         "(separates small gaps between implementations from drift during the run)")
    ap.add_argument("--only", default="", metavar="OP[,OP]",
                    help="measure only these ops (e.g. gated_residual); spaces in an op's name may be written as "
                         "underscores (qk_rmsnorm_rope_per_head), so the list survives unquoted shell expansion")
    ap.add_argument("--shape", action="append", default=[], type=parse_shape, metavar="DIMS",
                    help="only this shape (e.g. 2,2688,2048; several operands: 2,512,7,32,48;512,1,1,1); "
                         "benchmarks of plain tensor shapes also take shapes outside their list; repeatable")
    ap.add_argument("--impl", action="append", default=[], metavar="TEXT",
                    help="only the implementations whose name contains TEXT (e.g. 'ltx_kernels', 'compile'); "
                         "repeatable")
    profile = ap.add_argument_group("profiling (ltx-dev profile)")
    profile.add_argument("--profile", action="store_true",
                         help="no timing and no JSON: run each selected implementation --calls times, each call in "
                              "an NVTX range named after the implementation (for ncu --nvtx / nsys)")
    profile.add_argument("--calls", type=int, default=3, metavar="N", help="calls per implementation (default 3)")
    profile.add_argument("--flush", action="store_true",
                         help="zero 256 MB before each call, as do_bench does for `us_flushed`")
    return ap


def configure(args, ap: argparse.ArgumentParser) -> None:
    """Check the parsed common options and set SETTINGS from them."""
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    knob_options = [option for option, given in (("--sweep", getattr(args, "sweep", False)),
                                                 ("--sweep-tuning", args.sweep_tuning), ("--tuning", args.tuning))
                    if given]
    if knob_options and not args.dev_build:
        verb = "sets" if len(knob_options) == 1 else "set"
        ap.error(f"{', '.join(knob_options)} {verb} tuning knobs, which only a development build has: build one "
                 "with `python3 -m ltx_build build --dev` and add --dev-build")
    try:
        sweeps = [tuning.parse_setting(s) for s in args.sweep_tuning]
        forced = [tuning.parse_setting(s) for s in args.tuning]
    except ValueError as e:
        ap.error(str(e))
    if any(len(values) != 1 for _, values in forced):
        ap.error("--tuning takes one value: KNOB=V")
    SETTINGS.__init__(only_ops={o for o in args.only.split(",") if o}, shapes=list(args.shape), impls=list(args.impl),
                      rounds=args.rounds, sweeps=sweeps, tuning={k: v[0] for k, v in forced}, profile=args.profile,
                      calls=args.calls, flush=args.flush)


def start(doc: str, quick_help: str, sweep_help: str | None = None, kernel: bool = True):
    """Parse the common command line, load the kernel (unless `kernel=False`) and measure the copy
    ceiling. Returns (args, kernel, env, copy TB/s); with --profile, env and the ceiling are None."""
    ap = parser(doc, quick_help, sweep_help, kernel)
    args = ap.parse_args()
    if not kernel:
        env = environment(args.commit)
        print(f"{env['device']}  torch {env['torch']}", flush=True)
        return args, None, env, None
    configure(args, ap)
    SETTINGS.kernel = kernel_loading.load(dev=args.dev_build)
    if SETTINGS.profile:
        return args, SETTINGS.kernel, None, None
    env = environment(args.commit, args.dev_build)
    ceiling = copy_tbps()
    print(f"{env['device']}  torch {env['torch']}  copy {ceiling:.2f} TB/s"
          + ("  (development build)" if args.dev_build else ""), flush=True)
    return args, SETTINGS.kernel, env, ceiling


def tuned(name: str, settings: dict, fn):
    """(row name, fn with the knobs forced around each call) for a dev build's sweep row."""
    for knob, value in settings.items():
        fn = tuning.with_tuning(SETTINGS.kernel, knob, value, fn)
    return tuned_name(name, settings), fn


def _implementations(impls: dict) -> dict:
    """`impls` with --tuning applied to ours and a row added per --sweep-tuning value, less the
    names --impl leaves out."""
    out = {}
    for name, fn in impls.items():
        if is_ours(name) and SETTINGS.tuning:
            for knob, value in SETTINGS.tuning.items():
                fn = tuning.with_tuning(SETTINGS.kernel, knob, value, fn)
        out[name] = fn
    for name, fn in list(out.items()):
        if is_ours(name) and not is_sweep(name):
            for knob, values in SETTINGS.sweeps:
                for value in values:
                    row, tuned_fn = tuned(name, {knob: value}, fn)
                    out[row] = tuned_fn
    return {name: fn for name, fn in out.items() if impl_selected(name)}


def profile_calls(op: str, shape, impls: dict, args0: tuple) -> None:
    """Each implementation's calls in NVTX ranges named after it (compiled and warmed up outside)."""
    import torch

    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if SETTINGS.flush else None
    for name, fn in impls.items():
        fn(*args0)
        torch.cuda.synchronize()
        print(f"  profile {op} {shape_label(shape)}: {SETTINGS.calls} calls of {name!r}", flush=True)
        for _ in range(SETTINGS.calls):
            if flush is not None:
                flush.zero_()
            torch.cuda.nvtx.range_push(name)
            fn(*args0)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


def shape_label(shape) -> str:
    nested = isinstance(shape[0], (tuple, list))
    return " <- ".join(str(list(s)) for s in shape) if nested else str(list(shape))


def measure(rows: list, ceiling: float, op: str, shape, impls: dict, make_args, nbytes: int,
            skip=lambda name: False) -> list[dict]:
    """Time every implementation on the same inputs (steady state and flushed; with --rounds N, N
    times each in turn, keeping the lower median), append one row per implementation to `rows` and
    return the new rows. `shape` is a shape, or a tuple of shapes (printed as `a <- b`). An
    implementation that raises is reported and left out. With --profile: run them for a profiler
    instead and return no rows."""
    if not selected(op) or not shape_selected(shape):
        return []
    impls = {name: fn for name, fn in _implementations(impls).items() if not skip(name)}
    if not impls:
        return []
    args0 = make_args(0)
    if SETTINGS.profile:
        profile_calls(op, shape, impls, args0)
        return []
    added = []
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
    for round_index in range(SETTINGS.rounds):
        for name in list(times):
            fn = impls[name]
            try:
                if round_index == 0:
                    fn(*args0)  # compile / warm up outside the timing
                times[name].append((rotating_graph_us(fn, make_args, nbytes), median_us(lambda: fn(*args0))))
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"  {op} {name} failed at {shape}: {e!r}", flush=True)
                del times[name]
    for name, rounds in times.items():
        us, us_flushed = median_of_rounds(rounds)
        tbps = nbytes / (us * 1e-6) / 1e12
        nested = isinstance(shape[0], (tuple, list))
        row = {"op": op, "shape": [list(s) for s in shape] if nested else list(shape), "dtype": "bfloat16",
               "impl": name, "us": round(us, 2), "us_flushed": round(us_flushed, 2), "tbps": round(tbps, 3),
               "frac_copy": round(tbps / ceiling, 3), "bytes": nbytes}
        if len(rounds) > 1:
            row["us_rounds"] = [round(t[0], 2) for t in rounds]
        rows.append(row)
        added.append(row)
        spread = f"  rounds {min(t[0] for t in rounds):.2f}-{max(t[0] for t in rounds):.2f}" if len(rounds) > 1 \
            else ""
        print(f"  {op:28s} {shape_label(shape):30s} {name:36s} {us:8.2f} us {tbps:6.2f} TB/s {tbps / ceiling:6.1%}"
              f"  | flushed {us_flushed:8.2f} us{spread}", flush=True)
    return added


def save(name: str, env: dict, ceiling: float, rows: list, out_dir: Path | None) -> None:
    """Write the run's JSON (nothing under --profile): forward rows to `<name>-<device>.json`,
    backward rows ("<op> backward") to `<name>-backward-<device>.json`, each only when the run has
    some, so a run of one kind leaves the other's results as they were."""
    if SETTINGS.profile:
        return
    backward = [r for r in rows if " backward" in r["op"]]  # also "<op> backward (rows only)"
    forward = [r for r in rows if " backward" not in r["op"]]
    for suffix, part in (("", forward), ("-backward", backward)):
        if part or (suffix == "" and not rows):
            path = write_json(name + suffix, {"env": env, "copy_tbps": round(ceiling, 3), "timing": TIMING,
                                              "rows": part}, out_dir)
            print(f"wrote {path}")
