"""compute-sanitizer over every op (issue 7, item 1), and the summary of its logs.

  ltx-dev sanitize [TOOL ...] [--quick] [--parallel] [--ops a,b] [--out DIR]
      Runs the driver below under compute-sanitizer's memcheck, racecheck, initcheck and
      synccheck (or the TOOLs given), initcheck and racecheck also over the control; logs
      and summary.md in OUT/sanitize; exit 0 only when clean. --parallel runs the tools at
      once, spread round-robin over the visible GPUs.
  ltx-dev sanitize-driver run [--quick] [--ops a,b] [--no-check]
      What runs under the sanitizer: for every op of ltx_dev/registry.py, every dtype x
      {small, medium} x {vectorised, fallback} path, one LTX-sized problem (bf16,
      vectorised), and a few random problems (odd sizes and layouts); results are checked
      against the float64 reference except at LTX size. Every case is bracketed by
      "[ltx-sanitize] begin/end" lines so that reports can be attributed to it. Tensors
      are views of buffers left uninitialised around them, so that initcheck sees any
      read outside a view. --quick: small problems, bf16 only.
  ltx-dev sanitize-driver control
      The same GEMM shapes as linear_gelu's cases in plain PyTorch (F.linear, and
      torch._addmm_activation, which linear_gelu calls), no ltx_kernels code at all: a
      control for reports inside cuBLAS and in PyTorch kernels reading its output.
  ltx-dev sanitize-summary LOG... [--markdown FILE]
      Report counts per tool (the sanitizer's own summary line), per op and per origin: a
      report whose kernel is one of ours (namespace ltx::) or a library kernel (cuBLAS,
      PyTorch). Logs named control-<tool>.log are the control. Exit status 1 unless every
      tool ran every case and no report names one of our kernels.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from . import kernel as kernel_loading
from . import proc

MARK = "[ltx-sanitize]"
RANDOM_PER_OP = 4
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
CONTROLLED = ("initcheck", "racecheck")  # the tools that report inside cuBLAS or on reads of its output


def tool_name(text: str) -> str:
    if text not in TOOLS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(TOOLS)}")
    return text


def add_parsers(sub) -> None:
    s = sub.add_parser("sanitize", help="every op under compute-sanitizer, then a summary of the reports",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("tools", nargs="*", type=tool_name, metavar="TOOL",
                   help=f"the sanitizer tools ({', '.join(TOOLS)}; default all)")
    s.add_argument("--quick", action="store_true", help="small problems in bf16 only")
    s.add_argument("--parallel", action="store_true", help="run the tools at once, round-robin over the visible GPUs")
    s.add_argument("--ops", default="", help="comma-separated registry names (default: all)")
    s.add_argument("--out", type=Path, default=Path("gpu-out"), help="logs and summary.md go to OUT/sanitize")
    s.add_argument("--timeout", type=float, default=300, metavar="S", help="seconds per tool (default 300)")
    s.add_argument("--sanitizer", type=Path, metavar="PATH",
                   help="compute-sanitizer (default: on PATH, in $CUDA_HOME/bin or /usr/local/cuda)")
    s.add_argument("--dev-build", action="store_true", help="the development build instead of the release build")
    s.set_defaults(run=sanitize)
    d = sub.add_parser("sanitize-driver", help="drive every op (what `sanitize` runs under compute-sanitizer)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("what", choices=("run", "control"),
                   help="run: every op of the registry; control: linear_gelu's GEMMs in plain PyTorch")
    d.add_argument("--tool", default="none", help="the sanitizer tool, for the log only")
    d.add_argument("--quick", action="store_true", help="small problems in bf16 only")
    d.add_argument("--ops", default="", help="comma-separated registry names (default: all)")
    d.add_argument("--no-check", action="store_true", help="do not compare with the float64 reference")
    d.add_argument("--dev-build", action="store_true", help="the development build instead of the release build")
    d.set_defaults(run=lambda args: (run if args.what == "run" else control)(args))
    m = sub.add_parser("sanitize-summary", help="report counts from compute-sanitizer logs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("logs", nargs="+", metavar="LOG")
    m.add_argument("--markdown", help="also write the summary to this file")
    m.set_defaults(run=summarize)


# --- sanitize: the tools over the driver --------------------------------------------------------------

def find_sanitizer(given: Path | None) -> Path:
    candidates = [given, shutil.which("compute-sanitizer")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "compute-sanitizer")
    candidates += ["/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer"]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return Path(c)
    raise SystemExit("compute-sanitizer not found: pass --sanitizer PATH")


def jobs(tools: list[str]) -> list[tuple[str, str]]:
    """(tool, "run" or "control") for every log to write: the control under the tools that need one."""
    return [(tool, what) for tool in tools for what in (("run", "control") if tool in CONTROLLED else ("run",))]


def log_name(tool: str, what: str) -> str:
    return f"control-{tool}.log" if what == "control" else f"{tool}.log"


def visible_gpus() -> list[str]:
    """The GPU indices a job may be pinned to: CUDA_VISIBLE_DEVICES' entries, else nvidia-smi's count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v for v in visible.split(",") if v]
    return [str(i) for i in range(max(1, len(proc.gpu_names())))]


def sanitize(args) -> int:
    san = find_sanitizer(args.sanitizer)
    out = args.out.resolve() / "sanitize"
    out.mkdir(parents=True, exist_ok=True)
    print(f"compute-sanitizer: {san}", flush=True)
    version = subprocess.run([str(san), "--version"], capture_output=True, text=True).stdout
    (out / "version.txt").write_text(version)
    print(version, end="", flush=True)
    # One cudaMalloc per tensor: an access past a tensor's end leaves its allocation (memcheck sees it),
    # and memory around a view is never initialised (initcheck sees reads of it). Without this the
    # caching allocator hides both.
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    driver_options = [*(["--quick"] if args.quick else []), *(["--ops", args.ops] if args.ops else []),
                      *(["--dev-build"] if args.dev_build else [])]
    todo = jobs(args.tools or list(TOOLS))
    gpus = visible_gpus()

    def one(index: int, tool: str, what: str) -> None:
        job_env = dict(env, CUDA_VISIBLE_DEVICES=gpus[index % len(gpus)]) if args.parallel else env
        options = driver_options if what == "run" else []
        start = time.monotonic()
        rc = proc.run_logged([str(san), "--tool", tool, "--print-limit", "100000",
                              *proc.python("-m", "ltx_dev", "sanitize-driver", what, "--tool", tool, *options)],
                             out / log_name(tool, what), timeout=args.timeout, env=job_env, echo=False)
        pinned = f" on GPU {job_env['CUDA_VISIBLE_DEVICES']}" if args.parallel else ""
        print(f"{tool}{' control' if what == 'control' else ''}: exit {rc} after {time.monotonic() - start:.0f} s"
              f"{pinned} (log: {out / log_name(tool, what)})", flush=True)

    if args.parallel:
        threads = [threading.Thread(target=one, args=(i, *job)) for i, job in enumerate(todo)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i, job in enumerate(todo):
            one(i, *job)
    return summarize(argparse.Namespace(logs=[str(out / log_name(*job)) for job in todo],
                                        markdown=str(out / "summary.md")))


# --- the driver ----------------------------------------------------------------------------------------

def cases(ops, quick: bool):
    """(label, spec, problem, dtype, check) for every case to run."""
    from .registry import BF16, RandomPick

    for spec in ops:
        dtypes = (BF16,) if quick else spec.dtypes
        for dtype in dtypes:
            for size in ("small",) if quick else ("small", "medium"):
                for path in ("vector", "fallback"):
                    problem = spec.canonical(size, path)
                    if problem is not None:
                        yield f"{size} {path} {str(dtype)[6:]}", spec, problem, dtype, True
        if not quick:
            ltx = spec.canonical("ltx", "vector")
            if ltx is not None:
                yield "ltx vector bfloat16", spec, ltx, BF16, False
            for seed in range(RANDOM_PER_OP):
                pick = RandomPick(seed)
                problem = spec.random_problem(pick)
                dtype = pick.choice(spec.dtypes)
                yield f"random {seed} {str(dtype)[6:]}", spec, problem, dtype, True


def banner(tool: str) -> None:
    import torch

    print(f"{MARK} device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"date {datetime.date.today().isoformat()}, tool {tool}", flush=True)


def run(args) -> int:
    import torch

    from .registry import OPS, Source, assert_matches

    kernel = kernel_loading.load(dev=args.dev_build)
    ops = [s for s in OPS if not args.ops or s.name in args.ops.split(",")]
    banner(args.tool)
    start, failed, n = time.time(), 0, 0
    for label, spec, problem, dtype, check in cases(ops, args.quick):
        n += 1
        print(f"{MARK} begin {spec.name} {label}", flush=True)
        try:
            call_args, _ = spec.build(problem, dtype, Source(n, "cuda"), sentinel=False)
            expected = spec.reference(call_args) if check and not args.no_check else None
            outputs = spec.call(kernel, call_args)
            torch.cuda.synchronize()
            if expected is not None:
                assert_matches(outputs, expected, spec.tolerance[dtype], what=spec.name)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on with the next case
            failed += 1
            print(f"{MARK} FAILED {spec.name} {label}: {type(e).__name__}: {str(e)[:500]}", flush=True)
        print(f"{MARK} end {spec.name}", flush=True)
    print(f"{MARK} done: {n} cases, {failed} failed, {time.time() - start:.1f} s", flush=True)
    return 1 if failed else 0


def control(args) -> int:
    import torch
    import torch.nn.functional as F

    from .registry import linear_gelu_canonical

    banner(args.tool)
    start, n = time.time(), 0
    for size in ("small", "medium", "ltx"):
        p = linear_gelu_canonical(size, "vector")
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            gen = torch.Generator(device="cuda").manual_seed(n)
            x = torch.randn(*p["shape"], device="cuda", dtype=dtype, generator=gen)
            w = torch.randn(p["n"], p["shape"][-1], device="cuda", dtype=dtype, generator=gen)
            b = torch.randn(p["n"], device="cuda", dtype=dtype, generator=gen)
            for name, fn in (("F.linear", lambda: F.linear(x, w)),
                             ("_addmm_activation", lambda: torch._addmm_activation(
                                 b, x.reshape(-1, x.shape[-1]), w.t(), use_gelu=True))):
                n += 1
                print(f"{MARK} begin control:{name} {size} {str(dtype)[6:]}", flush=True)
                y = fn()
                if size != "ltx":  # read the output back where the op cases do (they do not check at LTX size)
                    float(y.double().sum())
                torch.cuda.synchronize()
                print(f"{MARK} end control:{name}", flush=True)
    print(f"{MARK} done: {n} cases, 0 failed, {time.time() - start:.1f} s", flush=True)
    return 0


# --- summarize ---------------------------------------------------------------------------------------

# First lines of the sanitizers' reports (memcheck, racecheck, initcheck, synccheck);
# backtraces and details are indented further.
REPORT = re.compile(r"^========= (Invalid |Uninitialized |Program hit |Error: |Warning: |ERROR: |WARNING: |"
                    r"Race reported|Barrier error|Misaligned |Out-of-range |Address |Malloc|Leaked |Unused |"
                    r"Illegal |Divergent |Potential )")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
# The line naming the kernel a report is in ("=========     at <kernel>+0x..").
REPORT_KERNEL = re.compile(r"^=========\s+at (.*?)(\+0x[0-9a-f]+)?$")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
DONE = re.compile(re.escape(MARK) + r" done: (\d+) cases, (\d+) failed, ([\d.]+) s")
DEVICE = re.compile(re.escape(MARK) + r" device: (.*), date ([\d-]+)")


def parse_log(text: str) -> dict:
    """Counts of one tool's log: `total` from the sanitizer's summary (None when it
    printed none: it crashed or timed out), `per_op` from the report headers
    between the driver's begin/end lines ("(outside ops)" for the rest), `ours` /
    `library`: reports whose kernel is in namespace ltx:: / any other kernel
    (racecheck names the kernel in its header line, the other tools on the next)."""
    per_op: dict = {}
    current = "(outside ops)"
    failures = []
    origin = {"ours": 0, "library": 0, "unknown": 0}
    library_kernels: dict = {}
    pending = False  # a report header whose kernel line is still to come
    for line in text.splitlines():
        if line.startswith(MARK + " begin "):
            current = line.split()[2]
        elif line.startswith(MARK + " end "):
            current = "(outside ops)"
        elif line.startswith(MARK + " FAILED "):
            failures.append(line[len(MARK) + 1:])
        elif REPORT.match(line):
            if pending:
                origin["unknown"] += 1
            per_op[current] = per_op.get(current, 0) + 1
            pending = True
            race = re.search(r" at (\S+?)\+0x", line)
            if race:
                _count_origin(race.group(1), origin, library_kernels)
                pending = False
        elif pending and REPORT_KERNEL.match(line):
            _count_origin(REPORT_KERNEL.match(line).group(1), origin, library_kernels)
            pending = False
    if pending:
        origin["unknown"] += 1
    totals = [int(m.group(1)) for m in ERROR_SUMMARY.finditer(text)]
    totals += [int(m.group(1)) for m in RACE_SUMMARY.finditer(text)]
    done = DONE.search(text)
    device = DEVICE.search(text)
    return {"total": max(totals) if totals else None, "per_op": per_op, "failures": failures,
            "origin": origin, "library_kernels": library_kernels,
            "cases": int(done.group(1)) if done else None, "failed": int(done.group(2)) if done else None,
            "seconds": float(done.group(3)) if done else None,
            "device": device.group(1) if device else None, "date": device.group(2) if device else None}


def _count_origin(kernel: str, origin: dict, library_kernels: dict) -> None:
    if "ltx::" in kernel:
        origin["ours"] += 1
        return
    origin["library"] += 1
    short = re.sub(r"<.*", "", kernel.removeprefix("void ")).strip()
    library_kernels[short] = library_kernels.get(short, 0) + 1


def _tool_table(results: dict) -> list:
    lines = ["| log | reports | in our kernels (ltx::) | in library kernels | cases run | failed cases | driver time |",
             "|---|---|---|---|---|---|---|"]
    for tool, r in results.items():
        reports = "no summary (crashed or timed out)" if r["total"] is None else str(r["total"])
        cases_run = "not finished" if r["cases"] is None else str(r["cases"])
        failed = "-" if r["failed"] is None else str(r["failed"])
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f} s"
        o = r["origin"]
        ours = str(o["ours"]) + (f" (+{o['unknown']} unattributed)" if o["unknown"] else "")
        lines.append(f"| {tool} | {reports} | {ours} | {o['library']} | {cases_run} | {failed} | {seconds} |")
    return lines


def summarize(args) -> int:
    logs = {Path(p).stem: parse_log(Path(p).read_text(errors="replace")) for p in args.logs}
    results = {k: v for k, v in logs.items() if not k.startswith("control-")}
    controls = {k: v for k, v in logs.items() if k.startswith("control-")}
    ok = True
    lines = []
    first = next((r for r in logs.values() if r["device"]), None)
    if first:
        lines += [f"{first['device']}, {first['date']}.", ""]
    lines += _tool_table(results)
    library = 0
    for r in results.values():
        o = r["origin"]
        attributed = o["ours"] + o["library"] + o["unknown"]
        ok &= (r["total"] is not None and r["cases"] is not None and r["failed"] == 0
               and o["ours"] == 0 and o["unknown"] == 0 and attributed == r["total"])
        library += o["library"]
    ops = sorted({op for r in results.values() for op in r["per_op"]})
    if ops:
        lines += ["", "Reports by op (report headers between the driver's begin/end lines):", "",
                  "| op | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
        for op in ops:
            lines.append(f"| {op} | " + " | ".join(str(r["per_op"].get(op, 0)) for r in results.values()) + " |")
    kernels: dict = {}
    for r in results.values():
        for k, n in r["library_kernels"].items():
            kernels[k] = kernels.get(k, 0) + n
    if kernels:
        lines += ["", "Library kernels named by reports:", ""]
        lines += [f"- {k}: {n}" for k, n in sorted(kernels.items(), key=lambda kv: -kv[1])]
    if controls:
        lines += ["", "Control (`ltx-dev sanitize-driver control`: the same GEMMs in plain PyTorch, no ltx_kernels code):",
                  ""] + _tool_table(controls)
    for tool, r in results.items():
        for failure in r["failures"]:
            lines.append(f"- {tool}: {failure}")
    if not ok:
        verdict = "NOT CLEAN"
    elif library:
        verdict = (f"zero reports in ltx_kernels' kernels, every case ran; {library} reports in library kernels "
                   "(listed above; compare the control)")
    else:
        verdict = "zero reports, every case ran"
    lines += ["", "verdict: " + verdict]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0 if ok else 1


