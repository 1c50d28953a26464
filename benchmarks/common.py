"""Timing and bookkeeping shared by the benchmarks: a measured copy ceiling,
cold-L2 median timing, loading the built kernel, and the JSON record."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load_kernel():
    """The built variant, through kernels.get_kernel + LOCAL_KERNELS (as users load it)."""
    sys.path.insert(0, str(ROOT))
    from ltx_build import config

    cfg = config.load(ROOT)
    os.environ["LOCAL_KERNELS"] = f"{cfg.repo_id}={ROOT}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    return kernels.get_kernel(cfg.repo_id, version=cfg.version, trust_remote_code=True)


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
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = [make_args(i) for i in range(max(2, -(-4 * l2 // bytes_per_call)))]
    calls = max(len(sets), 24)
    calls -= calls % len(sets)
    for args in sets:  # warm up (and compile) outside the capture
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outputs = []
    with torch.cuda.graph(graph):
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
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def with_env(var: str, value, fn):
    """`fn` with the experiment knob `var` set while it runs (the kernels read
    their knobs per call, so one process can sweep them)."""
    def run(*args):
        os.environ[var] = str(value)
        try:
            return fn(*args)
        finally:
            del os.environ[var]
    return run


def copy_tbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in TB/s, counting bytes read plus written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6) / 1e12


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("LTX_COMMIT", "unknown")


def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": os.environ.get("LTX_COMMIT") or git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    out_dir = out_dir or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = payload["env"]["device"].replace("NVIDIA ", "").replace(" ", "-")
    path = out_dir / f"{name}-{dev}.json"
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


SWEEP_ENV: list = []  # (VAR, [values]) from --sweep-env: measure() adds a row per value
ONLY_OPS: set = set()  # from --only: measure() skips the other ops
ROUNDS = [1]  # from --rounds: measure() times every implementation this many times, interleaved


def median_of_rounds(times: list[tuple[float, float]]) -> tuple[float, float]:
    """(steady-state µs, flushed µs) of an implementation over interleaved rounds: the median of
    each (the lower middle value for an even count, so a slow outlier round never sets the figure)."""
    def lower_median(values):
        ordered = sorted(values)
        return ordered[(len(ordered) - 1) // 2]
    return lower_median(t[0] for t in times), lower_median(t[1] for t in times)


def selected(op: str) -> bool:
    """Whether --only (if given) names `op`, by its name or with spaces as underscores."""
    return not ONLY_OPS or op in ONLY_OPS or op.replace(" ", "_") in ONLY_OPS


def start(doc: str, quick_help: str, sweep_help: str | None = None):
    """Parse the common command line (--out, --quick[, --sweep]), load the kernel and measure the copy
    ceiling. Returns (args, kernel, env, copy TB/s)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    if sweep_help:
        ap.add_argument("--sweep", action="store_true", help=sweep_help)
    ap.add_argument("--sweep-env", action="append", default=[], metavar="VAR=V1,V2",
                    help="also time every ltx_kernels implementation with the experiment knob VAR set to each "
                         "value (rows named '<impl> [VAR=V]'; e.g. LTX_KERNELS_QK_SAMPLES=1); repeatable")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="time every implementation of a shape N times, round-robin, and report the lower median "
                         "(separates small gaps between implementations from drift during the run)")
    ap.add_argument("--only", default="", metavar="OP[,OP]",
                    help="measure only these ops (e.g. gated_residual); spaces in an op's name may be written as "
                         "underscores (qk_rmsnorm_rope_per_head), so the list survives unquoted shell expansion")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    ROUNDS[0] = args.rounds
    ONLY_OPS.update(o for o in args.only.split(",") if o)
    for spec in args.sweep_env:
        var, _, values = spec.partition("=")
        SWEEP_ENV.append((var, values.split(",")))
    kernel = load_kernel()
    env = environment()
    ceiling = copy_tbps()
    print(f"{env['device']}  torch {env['torch']}  copy {ceiling:.2f} TB/s", flush=True)
    return args, kernel, env, ceiling


def measure(rows: list, ceiling: float, op: str, shape, impls: dict, make_args, nbytes: int,
            skip=lambda name: False) -> list[dict]:
    """Time every implementation on the same inputs (steady state and flushed; with --rounds N, N
    times each in turn, keeping the lower median), append one row per implementation to `rows` and
    return the new rows. `shape` is a shape, or a tuple of shapes
    (printed as `a <- b`). An implementation that raises is reported and left out."""
    if not selected(op):
        return []
    args0 = make_args(0)
    added = []
    if SWEEP_ENV:
        impls = dict(impls)
        for name, fn in list(impls.items()):
            if name.startswith("ltx_kernels"):
                for var, values in SWEEP_ENV:
                    for value in values:
                        impls[f"{name} [{var}={value}]"] = with_env(var, value, fn)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in impls if not skip(name)}
    for round_index in range(ROUNDS[0]):
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
        label = " <- ".join(str(list(s)) for s in shape) if nested else str(list(shape))
        spread = f"  rounds {min(t[0] for t in rounds):.2f}-{max(t[0] for t in rounds):.2f}" if len(rounds) > 1 \
            else ""
        print(f"  {op:28s} {label:30s} {name:36s} {us:8.2f} us {tbps:6.2f} TB/s {tbps / ceiling:6.1%}"
              f"  | flushed {us_flushed:8.2f} us{spread}", flush=True)
    return added


def save(name: str, env: dict, ceiling: float, rows: list, out_dir: Path | None) -> None:
    path = write_json(name, {"env": env, "copy_tbps": round(ceiling, 3), "timing": TIMING, "rows": rows}, out_dir)
    print(f"wrote {path}")
