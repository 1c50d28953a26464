"""`ltx-dev gpu-session`: one GPU-machine session. Installs the carried wheels
(.wheels/) and these tools, builds the development variant and runs the op
tests against it (GPU and CPU; the builder tests need a git checkout and a
glibc <= 2.36 host, so they run in CI), builds the release variant and runs
the benchmarks against it, then lists the rows that miss the issues' targets.
Every step prints a start line and its elapsed time; the summary at the end
lists them (the builds' times included). Logs and JSON go to --out.

On the device machine (whose $OUT comes back), after `ltx-dev wheels` here (carry .wheels/):

    python3 -m pip install -q --no-deps .wheels/*.whl
    export PYTHONPATH=$PWD/tools:$PWD/integrations/diffusers
    python3 -m ltx_dev gpu-session --out "$OUT" --commit <sha> --no-install [--require-gpu H200] [--pack] ...

(PYTHONPATH, not `pip install -e`: on the GPU machine `ltx_build` then came up as an empty
namespace package, most likely from a directory the move to tools/ left in its copy of the tree,
which the path finder prefers to setuptools' editable finder; PYTHONPATH's regular package wins.)
"""

from __future__ import annotations

import argparse
import shlex
import tarfile
import tempfile
import time
from pathlib import Path

from . import proc
from .paths import BENCHMARKS, ROOT

DEFAULT_TESTS = ("tests/test_*_gpu.py", "tests/test_*_cpu.py", "tests/test_reference.py", "tests/test_rope_tables.py")


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-session", help="build, test and benchmark on a GPU machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu-out"), help="directory for logs and JSON (default gpu-out)")
    p.add_argument("--require-gpu", metavar="NAME",
                   help="do nothing (exit 0) unless the GPU's name contains NAME (e.g. H200): a machine of the "
                        "wrong kind then costs seconds, not a session")
    p.add_argument("--commit", metavar="SHA", help="the commit the benchmarks record (the machine's copy of the "
                                                   "tree has no git history)")
    p.add_argument("--tests", nargs="*", metavar="PATH",
                   help="test files or node ids for pytest (default: the GPU and CPU op tests); with no value, "
                        "no tests")
    p.add_argument("--release-tests", action="store_true",
                   help="run the tests against the release build too, after the development build's run (the "
                        "dev-only tests skip there): what ships is tested as built")
    p.add_argument("--pytest-args", default="", metavar="ARGS",
                   help="more pytest arguments, one string (with '=' where it starts with a dash: --pytest-args=-x)")
    p.add_argument("--benches", nargs="*", metavar="NAME",
                   help="benchmarks to run, by family (rmsnorm), file name or path (default: every "
                        "benchmarks/bench_*.py); with no value, none")
    p.add_argument("--bench-args", default="", metavar="ARGS",
                   help="arguments for every benchmark, one string (with '=' where it starts with a dash: "
                        "--bench-args='--quick --rounds 3')")
    p.add_argument("--bench-timeout", type=float, default=900, metavar="S",
                   help="stop a benchmark after S seconds (default 900)")
    p.add_argument("--stop-after", type=float, metavar="S",
                   help="start no benchmark once the session has run S seconds")
    p.add_argument("--pack", action="store_true",
                   help="everything into one OUT/results.tar, rewritten after the tests and after each benchmark "
                        "(the device tool returns few files, and a call cut off at its limit still returns what "
                        "was packed)")
    p.add_argument("--jobs", type=int, default=16, metavar="N", help="compile jobs per build (default 16)")
    p.add_argument("--wheels", type=Path, default=ROOT / ".wheels", metavar="DIR",
                   help="wheels to install first with pip --no-deps (default .wheels; see `ltx-dev wheels`)")
    p.add_argument("--no-install", action="store_true", help="install neither the wheels nor these tools")
    p.set_defaults(run=run)


def bench_files(names: list[str] | None) -> list[Path]:
    """The benchmark scripts `names` stand for (family, file name or path); every bench_*.py for None."""
    if names is None:
        return sorted(BENCHMARKS.glob("bench_*.py"))
    files = []
    for name in names:
        stem = Path(name).stem
        path = BENCHMARKS / (stem if stem.startswith("bench_") or stem == "generate_video" else f"bench_{stem}")
        path = path.with_suffix(".py")
        if not path.is_file():
            raise SystemExit(f"--benches {name}: no {path.relative_to(ROOT)}")
        files.append(path)
    return files


def test_paths(tests: list[str] | None) -> list[str]:
    if tests is not None:
        return tests
    return [str(p.relative_to(ROOT)) for pattern in DEFAULT_TESTS for p in sorted(ROOT.glob(pattern))]


def module_of(script: Path) -> str:
    """benchmarks/bench_rmsnorm.py -> benchmarks.bench_rmsnorm (run with -m from the repository root, so
    ltx_dev imports whether or not it is installed)."""
    return ".".join(script.relative_to(ROOT).with_suffix("").parts)


class Packer:
    """With --pack: the session writes into a scratch directory, packed into OUT/results.tar after
    each step; otherwise it writes into OUT and pack() does nothing."""

    def __init__(self, out: Path, pack: bool):
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        self.tar = out / "results.tar" if pack else None
        self.dir = Path(tempfile.mkdtemp(prefix="ltx-session-")) if pack else out

    def pack(self) -> None:
        if self.tar is None:
            return
        with tarfile.open(self.tar, "w") as tar:
            for path in sorted(self.dir.iterdir()):
                tar.add(path, arcname=path.name)


def install_tools() -> int:
    """These tools and the diffusers integration into the interpreter (editable)."""
    rc = proc.run_logged(proc.python("-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                                     "-e", "tools", "-e", "integrations/diffusers"), drop="warning")
    if rc:
        print("could not install the tools (pip install -e tools -e integrations/diffusers)", flush=True)
    return rc


def run(args) -> int:
    started = time.monotonic()
    gpus = proc.gpu_names()
    if args.require_gpu and not any(args.require_gpu in g for g in gpus):
        print(f"--require-gpu {args.require_gpu}: this machine has {', '.join(gpus) or 'no GPU'}; nothing run")
        return 0
    benches = bench_files(args.benches)
    packer = Packer(args.out, args.pack)
    out = packer.dir
    steps = proc.Steps()
    if not args.no_install:
        steps.run("install the carried wheels", lambda: proc.install_wheels(args.wheels))
        steps.run("install ltx_dev, ltx_build (editable)", install_tools)
    device = proc.gpu_query("name,memory.total,driver_version")
    (out / "device.txt").write_text("".join(line + "\n" for line in device))
    print("GPU: " + ("; ".join(device) or "none found by nvidia-smi"), flush=True)
    build = ["-m", "ltx_build", "build", "-j", str(args.jobs), "--allow-newer-glibc"]
    tests = test_paths(args.tests)
    tests_rc = 0
    if tests:  # the development build only serves the tests
        dev_rc = steps.run("dev build", lambda: proc.run_logged(proc.python(*build, "--dev"), out / "build-dev.log"))
        if dev_rc:
            print("the dev build failed: no tests (see build-dev.log)", flush=True)
            tests_rc = dev_rc
        else:
            tests_rc = steps.run("tests (dev build)", lambda: proc.run_logged(
                proc.python("-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, "--dev-build",
                            *shlex.split(args.pytest_args)), out / "tests.log"))
    packer.pack()
    release_rc = steps.run("release build", lambda: proc.run_logged(proc.python(*build), out / "build.log"))
    if release_rc:
        print("the release build failed: no benchmarks (see build.log)", flush=True)
        benches = []
    elif tests and args.release_tests:
        tests_rc = steps.run("tests (release build)", lambda: proc.run_logged(
            proc.python("-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *shlex.split(args.pytest_args)),
            out / "tests-release.log")) or tests_rc
        packer.pack()
    commit = ["--commit", args.commit] if args.commit else []
    for script in benches:
        if args.stop_after is not None and time.monotonic() - started >= args.stop_after:
            print(f"--stop-after {args.stop_after:.0f}: {time.monotonic() - started:.0f} s gone, not starting "
                  f"{script.name} or the benchmarks after it", flush=True)
            break
        steps.run(script.stem, lambda script=script: proc.run_logged(
            proc.python("-m", module_of(script), "--out", str(out), *commit, *shlex.split(args.bench_args)),
            out / f"{script.stem}.log", timeout=args.bench_timeout))
        packer.pack()
    results = sorted(out.glob("*.json"))
    if results:
        steps.run("targets", lambda: proc.run_logged(proc.python("-m", "ltx_dev", "targets", *map(str, results)),
                                                     out / "targets.log"))
    summary = steps.summary()
    (out / "steps.txt").write_text(summary + "\n")
    packer.pack()
    print(f"steps:\n{summary}\ntests exit code: {tests_rc}", flush=True)
    return tests_rc or release_rc
