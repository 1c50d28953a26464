"""Incremental, parallel compile and link.

Each step is skipped when a SHA-256 over its command line, the toolchain and
the content of every file it reads (the source and the local headers it
includes, recursively) matches the stamp written beside its output."""

from __future__ import annotations

import hashlib
import re
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import BuildError

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def local_headers(source: Path, include_dirs: list[Path]) -> list[Path]:
    """Every quoted #include reachable from `source` that exists on disk."""
    found: list[Path] = []
    todo = [source]
    while todo:
        current = todo.pop()
        try:
            text = current.read_text(errors="replace")
        except OSError:
            continue
        for name in INCLUDE_RE.findall(text):
            for base in [current.parent, *include_dirs]:
                candidate = (base / name).resolve()
                if candidate.is_file():
                    if candidate not in found:
                        found.append(candidate)
                        todo.append(candidate)
                    break
    return sorted(found)


@dataclass
class Step:
    label: str
    output: Path
    command: list[str]
    inputs: list[Path] = field(default_factory=list)

    @property
    def stamp(self) -> Path:
        return self.output.with_name(self.output.name + ".sha256")

    def key(self, fingerprint: str) -> str:
        h = hashlib.sha256()
        h.update(fingerprint.encode())
        h.update("\0".join(self.command).encode())
        for p in self.inputs:
            h.update(str(p).encode())
            h.update(p.read_bytes())
        return h.hexdigest()

    def fresh(self, fingerprint: str) -> bool:
        return self.output.is_file() and self.stamp.is_file() and self.stamp.read_text() == self.key(fingerprint)


class Runner:
    """Runs steps with a progress line each; remembers what it rebuilt."""

    def __init__(self, fingerprint: str, jobs: int, total: int, verbose: bool = False):
        self.fingerprint, self.jobs, self.total, self.verbose = fingerprint, jobs, total, verbose
        self.done = 0
        self.rebuilt: list[str] = []
        self._lock = threading.Lock()

    def _progress(self, verb: str, step: Step) -> None:
        with self._lock:
            self.done += 1
            print(f"[{self.done}/{self.total}] {verb} {step.label}", flush=True)

    def run_one(self, step: Step) -> None:
        if step.fresh(self.fingerprint):
            self._progress("up to date:", step)
            return
        step.output.parent.mkdir(parents=True, exist_ok=True)
        if self.verbose:
            print("  $ " + " ".join(step.command), flush=True)
        proc = subprocess.run(step.command, capture_output=True, text=True)
        if proc.returncode != 0:
            step.stamp.unlink(missing_ok=True)
            raise BuildError(f"{step.label} failed (exit {proc.returncode}):\n$ {' '.join(step.command)}\n"
                             f"{proc.stdout}{proc.stderr}")
        step.stamp.write_text(step.key(self.fingerprint))
        with self._lock:
            self.rebuilt.append(step.label)
        self._progress("built", step)

    def run_parallel(self, steps: list[Step]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
            for f in [pool.submit(self.run_one, s) for s in steps]:
                f.result()
