"""What the experiments share: building a .cu file of this folder into a shared library (nvcc,
sm_90, ptxas's register report kept) and writing the results as JSON to $OUT."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

from benchmarks.common import environment

HERE = Path(__file__).resolve().parent


def build(name: str) -> tuple[ctypes.CDLL, Path]:
    """`<name>.cu` built into /tmp/<name>.so and loaded; returns it and ptxas's log (registers, spills)."""
    so, log_path = Path(f"/tmp/{name}.so"), Path(f"/tmp/{name}_ptxas.log")
    with open(log_path, "w") as log:
        subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v",
                        str(HERE / f"{name}.cu"), "-o", str(so)], check=True, stderr=log)
    return ctypes.CDLL(str(so)), log_path


def save(name: str, ceiling: float, rows: list, ptxas_log: Path | None = None, tail: int = 0) -> Path:
    """Rows to $OUT (or /tmp)/<name>-<device>.json with the run's environment (device, torch, commit, date);
    with a ptxas log, its last `tail` characters printed. Returns the JSON's path."""
    env = environment()
    out = Path(os.environ.get("OUT", "/tmp")) / f"{name}-{env['device'].replace(' ', '-')}.json"
    out.write_text(json.dumps(dict(env=env, copy_tbps=ceiling, rows=rows), indent=1) + "\n")
    if ptxas_log is not None:
        print(ptxas_log.read_text()[-tail:])
    return out
