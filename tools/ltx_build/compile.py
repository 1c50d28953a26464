"""Incremental, parallel compile and link.

Each output has a record beside it, ``<output>.sha256``: the toolchain
fingerprint, the command, the SHA-256 of every file the step read and the
output's own SHA-256 (the last line in ``sha256sum`` format, so
``sha256sum -c`` checks the output by hand). A step reruns unless every line
still holds. What a compile reads is what the compiler itself reports with
``-MD -MF <depfile>``: the source and every header it includes, relative
includes, torch's, CUDA's and the system's alike."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import BuildError


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Digests:
    """SHA-256 of input files, each read once per build (thousands of torch
    headers are shared by every binding). Never used for outputs, which change."""

    def __init__(self):
        self._known: dict[Path, str | None] = {}

    def __call__(self, path: Path) -> str | None:
        if path not in self._known:
            self._known[path] = file_sha256(path) if path.is_file() else None
        return self._known[path]


def read_depfile(path: Path, cwd: Path) -> list[Path]:
    """The prerequisites of a make rule as nvcc and g++ write it with -MD -MF."""
    text = path.read_text().replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    names = re.findall(r"(?:\\ |\S)+", prerequisites)
    return [(cwd / name.replace("\\ ", " ")).resolve() for name in names]


@dataclass
class Step:
    label: str
    output: Path
    command: list[str]
    inputs: list[Path] = field(default_factory=list)  # read besides what the depfile lists
    depfile: Path | None = None
    cwd: Path = Path("/")  # relative depfile paths are relative to it

    @property
    def record(self) -> Path:
        return self.output.with_name(self.output.name + ".sha256")

    def _header(self, fingerprint: str) -> list[str]:
        return [*(f"# toolchain {line}" for line in fingerprint.splitlines()), f"# command {shlex.join(self.command)}"]

    def problem(self, fingerprint: str, digests: Digests) -> str | None:
        """Why the step must run; None when its output is up to date."""
        if not self.output.is_file():
            return "not built yet"
        try:
            lines = self.record.read_text().splitlines()
        except OSError:
            return f"no record {self.record.name}"
        recorded = [line for line in lines if line.startswith(("# toolchain ", "# command "))]
        header = self._header(fingerprint)
        if recorded != header:
            return _header_change(recorded, header)
        for line in lines:
            if line.startswith("# input "):
                digest, name = line.removeprefix("# input ").split(" ", 1)
                if digests(Path(name)) != digest:
                    return f"{name} {'changed' if Path(name).exists() else 'was removed'}"
        last = lines[-1].split("  ", 1) if lines else []
        if last[1:] != [self.output.name] or file_sha256(self.output) != last[0]:
            return f"{self.output.name} does not match its recorded SHA-256 (truncated or modified)"
        return None

    def write_record(self, fingerprint: str, digests: Digests) -> None:
        inputs = list(self.inputs)
        if self.depfile is not None and self.depfile.is_file():
            inputs += read_depfile(self.depfile, self.cwd)
        lines = [f"# ltx_build: {self.output.name} is rebuilt when a line below no longer holds",
                 *self._header(fingerprint),
                 *(f"# input {digests(p)} {p}" for p in sorted(set(inputs))),
                 f"{file_sha256(self.output)}  {self.output.name}"]
        self.record.write_text("\n".join(lines) + "\n")


def _header_change(recorded: list[str], header: list[str]) -> str:
    """The toolchain line or the flags that differ, briefly."""
    changed = next((line for line in header if line not in recorded), None)
    if changed is None or changed.startswith("# toolchain "):
        return f"toolchain changed (now {changed[12:] if changed else 'fewer lines'})"
    old = next((shlex.split(line[10:]) for line in recorded if line.startswith("# command ")), [])
    new = shlex.split(changed[10:])
    diff = [*(f"+{a}" for a in new if a not in old), *(f"-{a}" for a in old if a not in new)]
    return f"command changed ({' '.join(diff)[:200] or 'order'})"


class Runner:
    """Runs steps in parallel, a line with its time for each one run; the first
    failure cancels what is queued, stops what is running and is raised with
    its compiler output."""

    def __init__(self, fingerprint: str, jobs: int, total: int, *, verbose: bool = False,
                 log: Callable[[str], None] = print):
        self.fingerprint, self.jobs, self.total, self.verbose, self.log = fingerprint, jobs, total, verbose, log
        self.digests = Digests()
        self.done = 0
        self.rebuilt: list[str] = []
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._cancelled = threading.Event()

    def _progress(self, step: Step, note: str) -> None:
        with self._lock:
            self.done += 1
            if note != "up to date" or self.verbose:
                self.log(f"[{self.done}/{self.total}] {step.label} {note}")

    def run_one(self, step: Step) -> None:
        if self._cancelled.is_set():
            return
        why = step.problem(self.fingerprint, self.digests)
        if why is None:
            self._progress(step, "up to date")
            return
        step.output.parent.mkdir(parents=True, exist_ok=True)
        step.record.unlink(missing_ok=True)  # a step cut off halfway must not look done
        if self.verbose:
            self.log(f"  ({why})\n  $ {shlex.join(step.command)}")
        start = time.monotonic()
        with self._lock:  # so a cancel either sees this process or stops it from starting
            if self._cancelled.is_set():
                return
            # Own process group: nvcc's children (cicc, ptxas) stop with it on cancel.
            proc = subprocess.Popen(step.command, cwd=step.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            self._running.add(proc)
        output, _ = proc.communicate()
        with self._lock:
            self._running.discard(proc)
        if self._cancelled.is_set():
            return
        if proc.returncode != 0:
            self._cancel()  # here, not in run(): this thread would otherwise take the next queued step first
            raise BuildError(f"{step.label} failed (exit {proc.returncode}):\n$ {shlex.join(step.command)}\n{output}")
        step.write_record(self.fingerprint, self.digests)
        with self._lock:
            self.rebuilt.append(step.label)
        self._progress(step, f"{time.monotonic() - start:.1f} s")

    def _cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            for proc in self._running:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def run(self, steps: list[Step]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            futures = [pool.submit(self.run_one, s) for s in steps]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
                for f in futures:
                    if f.done() and f.exception() is not None:
                        raise f.exception()
            except BaseException:  # a failed step, or Ctrl-C (the compilers are in their own sessions)
                self._cancel()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
