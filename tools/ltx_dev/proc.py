"""Running the steps of a GPU-machine session: commands whose output goes to the
console and to a log, with a time limit, and a start line and elapsed time per
step."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from .paths import ROOT

TIMED_OUT = 124  # the exit status of a command stopped at its time limit, as timeout(1) gives it


def stamp() -> str:
    return time.strftime("%H:%M:%S")


class Steps:
    """Named steps, each announced with a start line and closed with its elapsed time and exit
    status; `summary()` lists them all (build times included)."""

    def __init__(self, out=None):
        self.out = out  # None: sys.stdout at the time of printing
        self.done: list[tuple[str, float, int]] = []

    def run(self, name: str, fn) -> int:
        print(f"== [{stamp()}] {name}", file=self.out or sys.stdout, flush=True)
        start = time.monotonic()
        rc = fn()
        elapsed = time.monotonic() - start
        self.done.append((name, elapsed, rc))
        print(f"== [{stamp()}] {name}: exit {rc} after {elapsed:.1f} s", file=self.out or sys.stdout, flush=True)
        return rc

    def summary(self) -> str:
        width = max((len(n) for n, _, _ in self.done), default=0)
        return "\n".join(f"  {name:{width}s}  {elapsed:8.1f} s  exit {rc}" for name, elapsed, rc in self.done)


def run_logged(cmd: Sequence[str], log: Path | None = None, *, timeout: float | None = None, cwd: Path = ROOT,
               env: dict | None = None, drop: str | None = None, echo: bool = True) -> int:
    """Run `cmd`, its output (stdout and stderr) to the console (unless `echo` is off) and to `log`;
    stopped (the whole process group) after `timeout` seconds, which returns TIMED_OUT. Lines containing
    `drop` (case-insensitive) are left out of both. Python children run unbuffered, so their lines come
    as they are printed."""
    if echo:
        print("$ " + shlex.join(str(c) for c in cmd), flush=True)
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    sink = open(log, "w") if log else None
    try:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                start_new_session=True)
        stopped = threading.Event()

        def stop():
            stopped.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, stop) if timeout else None
        if timer:
            timer.start()
        for line in proc.stdout:
            if drop and drop.lower() in line.lower():
                continue
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if sink:
                sink.write(line)
        rc = proc.wait()
        if timer:
            timer.cancel()
        if stopped.is_set():
            message = f"stopped after its limit of {timeout:.0f} s: {shlex.join(str(c) for c in cmd)}\n"
            sys.stdout.write(message)
            if sink:
                sink.write(message)
            return TIMED_OUT
        return rc
    finally:
        if sink:
            sink.close()


def python(*args: str) -> list[str]:
    """A command line running this interpreter."""
    return [sys.executable, *args]


def install_wheels(directory: Path) -> int:
    """pip install --no-deps every wheel in `directory` (the offline GPU machine's carried wheels); 0 when
    there are none."""
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        print(f"no wheels in {directory}: nothing to install", flush=True)
        return 0
    return run_logged(python("-m", "pip", "install", "-q", "--no-deps", *map(str, wheels)), drop="warning")


def gpu_query(fields: str = "name") -> list[str]:
    """nvidia-smi's line per GPU for `fields` (e.g. "name,memory.total"); empty without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists (empty without nvidia-smi)."""
    return gpu_query("name")
