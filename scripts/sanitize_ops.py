"""Drive every op of the package for compute-sanitizer (scripts/sanitize.sh), and
summarise the sanitizer's logs.

  python3 scripts/sanitize_ops.py run [--quick] [--ops a,b] [--no-check]
      Runs, for every op of tests/op_registry.py: every dtype x {small, medium} x
      {vectorised, fallback} path, one LTX-sized problem (bf16, vectorised), and a
      few random problems (odd sizes and layouts); results are checked against the
      float64 reference except at LTX size. Every case is bracketed by
      "[ltx-sanitize] begin/end" lines so that reports can be attributed to it.
      Tensors are views of buffers left uninitialised around them, so that
      initcheck sees any read outside a view. --quick: small problems, bf16 only.
  python3 scripts/sanitize_ops.py control
      The same GEMM shapes as linear_gelu's cases in plain PyTorch (F.linear, and
      torch._addmm_activation, which linear_gelu calls), no ltx_kernels code at all:
      a control for reports inside cuBLAS and in PyTorch kernels reading its output.
  python3 scripts/sanitize_ops.py summarize LOG... [--markdown FILE]
      Report counts per tool (the sanitizer's own summary line), per op and per
      origin: a report whose kernel is one of ours (namespace ltx::) or a library
      kernel (cuBLAS, PyTorch). Logs named control-<tool>.log are the control.
      Exit status 1 unless every tool ran every case and no report names one of
      our kernels.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # ltx_build, and the registry in tests/
MARK = "[ltx-sanitize]"
RANDOM_PER_OP = 4


# --- run -------------------------------------------------------------------------------------------

def load_kernel():
    """The built variant through kernels.get_kernel, as tests/conftest.py loads it."""
    from ltx_build import config as build_config

    cfg = build_config.load(ROOT)
    os.environ["LOCAL_KERNELS"] = f"{cfg.repo_id}={ROOT}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import kernels

    return kernels.get_kernel(cfg.repo_id, version=cfg.version, trust_remote_code=True)


def cases(ops, quick: bool):
    """(label, spec, problem, dtype, check) for every case to run."""
    from tests.op_registry import BF16, RandomPick

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


def run(args) -> int:
    import torch

    from tests.op_registry import OPS, Source, assert_matches

    kernel = load_kernel()
    ops = [s for s in OPS if not args.ops or s.name in args.ops.split(",")]
    print(f"{MARK} device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"date {datetime.date.today().isoformat()}, tool {args.tool}", flush=True)
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

    from tests.op_registry import linear_gelu_canonical

    print(f"{MARK} device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"date {datetime.date.today().isoformat()}, tool {args.tool}", flush=True)
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
        lines += ["", "Control (`sanitize_ops.py control`: the same GEMMs in plain PyTorch, no ltx_kernels code):",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run every op (under compute-sanitizer)")
    r.add_argument("--tool", default="none", help="the sanitizer tool, for the log only")
    r.add_argument("--quick", action="store_true", help="small problems in bf16 only")
    r.add_argument("--ops", default="", help="comma-separated registry names (default: all)")
    r.add_argument("--no-check", action="store_true", help="do not compare with the float64 reference")
    c = sub.add_parser("control", help="the linear_gelu GEMMs in plain PyTorch (under compute-sanitizer)")
    c.add_argument("--tool", default="none", help="the sanitizer tool, for the log only")
    s = sub.add_parser("summarize", help="report counts from sanitizer logs")
    s.add_argument("logs", nargs="+")
    s.add_argument("--markdown", help="also write the summary to this file")
    args = parser.parse_args()
    return {"run": run, "control": control, "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
