"""What the GPU ran at while a benchmark's steps were timed: SM clock, power, temperature and the reasons
the driver gave for holding the clock down. ``nvidia-smi -lms`` samples in a process of its own, so the
timed loop's host thread shares nothing with it. The end-to-end benchmark records it per configuration:
the same attention kernel has taken up to 26% longer in the configurations after stock eager in one run
(docs/performance.md, "That floor moves"), and these figures tell a power cap from a warming GPU."""

from __future__ import annotations

import functools
import os
import statistics
import subprocess

from .. import proc

# NVML's clock event reasons (nvmlClocksEventReason*) that slow a busy GPU.
SLOWDOWNS = {0x4: "power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "power_brake"}
BASE_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")
# The reasons field as newer and older drivers name it.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


@functools.lru_cache(maxsize=None)
def _fields() -> tuple[str, ...]:
    """The fields this nvidia-smi answers (the reasons under the newer or the older name), asked once per
    process; () without nvidia-smi."""
    for fields in (BASE_FIELDS + (f,) for f in REASON_FIELDS):
        if proc.gpu_query(",".join(fields)):
            return fields
    return BASE_FIELDS if proc.gpu_query(",".join(BASE_FIELDS)) else ()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def summarise(lines: list[str], with_reasons: bool) -> dict | None:
    """Mean and minimum SM clock (MHz), mean power (W), highest temperature (°C) and, per slowdown
    reason, the share of samples it was active in, from ``nvidia-smi --format=csv,noheader,nounits``
    lines of BASE_FIELDS (+ a reasons bitmask). None without a sample."""
    rows = [[cell.strip() for cell in line.split(",")] for line in lines if line.strip()]
    rows = [r for r in rows if len(r) == len(BASE_FIELDS) + with_reasons and _number(r[0]) is not None]
    if not rows:
        return None
    clocks = [_number(r[0]) for r in rows]
    power = [p for p in (_number(r[1]) for r in rows) if p is not None]
    temperature = [t for t in (_number(r[2]) for r in rows) if t is not None]
    out = {"samples": len(rows), "sm_clock_mhz_mean": round(statistics.mean(clocks), 1),
           "sm_clock_mhz_min": min(clocks), "power_w_mean": round(statistics.mean(power), 1) if power else None,
           "temperature_c_max": max(temperature) if temperature else None}
    if with_reasons:
        masks = [int(r[3], 16) for r in rows if r[3].lower().startswith("0x")]
        out["slowdown_share"] = {name: round(sum(bool(m & bit) for m in masks) / len(masks), 3)
                                 for bit, name in SLOWDOWNS.items()} if masks else None
    return out


class GpuSampler:
    """``with GpuSampler(device) as s: ...`` then ``s.summary`` (None where nvidia-smi is missing or
    refuses the query, or ``device`` is None: no GPU). ``device``: what ``nvidia-smi -i`` takes (an index
    or a GPU UUID)."""

    def __init__(self, device: str | None, period_ms: int = 100):
        self.device, self.period_ms = device, period_ms
        self.summary: dict | None = None
        self._process = None
        self._fields: tuple[str, ...] = ()

    def __enter__(self) -> "GpuSampler":
        self._fields = _fields() if self.device is not None else ()
        if self._fields:
            self._process = subprocess.Popen(
                ["nvidia-smi", "-i", self.device, f"--query-gpu={','.join(self._fields)}",
                 "--format=csv,noheader,nounits", "-lms", str(self.period_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            out, _ = self._process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, _ = self._process.communicate()
        self.summary = summarise(out.splitlines(), len(self._fields) > len(BASE_FIELDS))


def device_id(index: int = 0) -> str:
    """The ``nvidia-smi -i`` name of torch's CUDA device ``index``: its entry in CUDA_VISIBLE_DEVICES (an index
    or a UUID, both of which nvidia-smi takes) where that is set, else the index itself."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


def note(summary: dict | None) -> str:
    """``; SM 1830 MHz (min 1755), 652 W, 61 °C max, power cap 80% of samples`` or ""."""
    if not summary:
        return ""
    text = f"; SM {summary['sm_clock_mhz_mean']:.0f} MHz (min {summary['sm_clock_mhz_min']:.0f})"
    if summary["power_w_mean"] is not None:
        text += f", {summary['power_w_mean']:.0f} W"
    if summary["temperature_c_max"] is not None:
        text += f", {summary['temperature_c_max']:.0f} °C max"
    active = {k: v for k, v in (summary.get("slowdown_share") or {}).items() if v}
    return text + "".join(f", {k.replace('_', ' ')} {v:.0%} of samples" for k, v in active.items())
