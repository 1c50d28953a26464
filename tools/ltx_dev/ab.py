"""`ltx-dev ab`: A/B two versions of the CUDA sources in one GPU-machine call. A
is this tree; B is a copy of it with the kernel sources of --b-src in place of
kernel_src/. Both are built at once (half the cores each), then the benchmark
runs against A and then B in the same session; JSON and logs go to OUT/A and
OUT/B.

    here:  rm -rf _ab && mkdir _ab && git archive <rev> kernel_src | tar -x -C _ab
    there (carry .wheels and _ab):
           python3 -m ltx_dev ab fused_norm --out "$OUT" --commit <A sha> --bench-args='--only gated_residual'
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import proc
from .paths import ROOT
from .session import bench_files, module_of

LEFT_OUT_OF_B = ("kernel_src", "build", "_build", "_ab", ".git", ".wheels", "gpu-out")


def add_parser(sub) -> None:
    p = sub.add_parser("ab", help="benchmark two versions of kernel_src/ in one session",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", help="the benchmark: family (fused_norm), file name or path")
    p.add_argument("--b-src", type=Path, default=ROOT / "_ab" / "kernel_src", metavar="DIR",
                   help="B's kernel sources (default _ab/kernel_src)")
    p.add_argument("--out", type=Path, default=Path("gpu-out"), help="OUT/A and OUT/B get the logs and JSON")
    p.add_argument("--bench-args", default="", metavar="ARGS",
                   help="arguments for the benchmark, one string (with '=': --bench-args='--only gated_residual')")
    p.add_argument("--commit", metavar="SHA", help="A's commit, recorded in its JSON (B records SHA+B)")
    p.add_argument("--dev-build", action="store_true",
                   help="build and benchmark the development variants (for --sweep-tuning in --bench-args)")
    p.add_argument("--wheels", type=Path, default=ROOT / ".wheels", metavar="DIR",
                   help="wheels to install first with pip --no-deps (default .wheels)")
    p.set_defaults(run=run)


def copy_b(b_src: Path) -> Path:
    """A scratch copy of this tree with b_src as its kernel_src/."""
    tree = Path(tempfile.mkdtemp(prefix="ltx-ab-"))
    shutil.copytree(ROOT, tree, dirs_exist_ok=True, ignore=lambda d, names: [
        n for n in names if Path(d) == ROOT and n in LEFT_OUT_OF_B])
    shutil.copytree(b_src, tree / "kernel_src")
    return tree


def run(args) -> int:
    if not args.b_src.is_dir():
        raise SystemExit(f"{args.b_src}: no such directory (see `ltx-dev ab --help`)")
    (script,) = bench_files([args.bench])
    out = args.out.resolve()
    proc.install_wheels(args.wheels)
    b_tree = copy_b(args.b_src)
    try:
        jobs = str(max(1, (os.cpu_count() or 2) // 2))
        build = proc.python("-m", "ltx_build", "build", "-j", jobs, "--allow-newer-glibc",
                            *(["--dev"] if args.dev_build else []))
        for side in "AB":
            (out / side).mkdir(parents=True, exist_ok=True)
        with open(out / "A" / "build.log", "w") as a_log:
            a_build = subprocess.Popen(build, cwd=ROOT, stdout=a_log, stderr=subprocess.STDOUT)
            b_rc = proc.run_logged(build, out / "B" / "build.log", cwd=b_tree)
            a_rc = a_build.wait()
        if a_rc or b_rc:
            print(f"build failed: A exit {a_rc}, B exit {b_rc} (see OUT/A/build.log, OUT/B/build.log)")
            return 1
        bench = [*shlex.split(args.bench_args), *(["--dev-build"] if args.dev_build else [])]
        rcs = []
        for side, tree in (("A", ROOT), ("B", b_tree)):
            commit = ["--commit", args.commit + ("+B" if side == "B" else "")] if args.commit else []
            rcs.append(proc.run_logged(proc.python("-m", module_of(script), "--out", str(out / side), *commit, *bench),
                                       out / side / "bench.log", cwd=tree))
        return max(rcs)
    finally:
        shutil.rmtree(b_tree, ignore_errors=True)
