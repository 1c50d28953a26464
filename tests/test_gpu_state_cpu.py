"""The end-to-end benchmark's record of the GPU's clock, power and slowdowns (ltx_dev.bench.gpu_state), on
the CPU: nvidia-smi's output parsed, and a stand-in nvidia-smi sampled for real."""

import os
import stat
import textwrap

import pytest

from ltx_dev.bench import gpu_state


def test_samples_summarise_into_clock_power_temperature_and_each_slowdowns_share():
    lines = ["1980, 700.12, 60, 0x0000000000000004", "1755, 699.50, 62, 0x0000000000000004",
             "1980, 450.00, 58, 0x0000000000000000", "1830, 690.00, 61, 0x0000000000000024", ""]
    s = gpu_state.summarise(lines, with_reasons=True)
    assert s["samples"] == 4 and s["sm_clock_mhz_min"] == 1755 and s["temperature_c_max"] == 62
    assert s["sm_clock_mhz_mean"] == round((1980 + 1755 + 1980 + 1830) / 4, 1)
    assert s["power_w_mean"] == round((700.12 + 699.5 + 450 + 690) / 4, 1)
    assert s["slowdown_share"] == {"power_cap": 0.75, "hw_slowdown": 0.0, "sw_thermal": 0.25, "hw_thermal": 0.0,
                                   "power_brake": 0.0}
    assert gpu_state.note(s) == ("; SM 1886 MHz (min 1755), 635 W, 62 °C max, power cap 75% of samples, "
                                 "sw thermal 25% of samples")


def test_unreadable_fields_and_no_samples_give_no_figures():
    s = gpu_state.summarise(["1980, [N/A], [N/A]"], with_reasons=False)
    assert s["power_w_mean"] is None and s["temperature_c_max"] is None and "slowdown_share" not in s
    assert gpu_state.note(s) == "; SM 1980 MHz (min 1980)"
    assert gpu_state.summarise(["[N/A], 1, 2", "garbage"], with_reasons=False) is None
    assert gpu_state.note(None) == ""


def test_the_device_is_named_as_cuda_visible_devices_names_it(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_state.device_id(0) == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-abc")
    assert gpu_state.device_id(0) == "3" and gpu_state.device_id(1) == "GPU-abc"


@pytest.fixture
def fresh_probe():
    """The fields nvidia-smi answers are asked once per process: again for each test."""
    gpu_state._fields.cache_clear()
    yield
    gpu_state._fields.cache_clear()


def test_without_nvidia_smi_the_sampler_records_nothing(tmp_path, monkeypatch, fresh_probe):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    with gpu_state.GpuSampler("0") as sampler:
        pass
    assert sampler.summary is None


def test_the_sampler_reads_an_nvidia_smi_that_loops_until_stopped(tmp_path, monkeypatch, fresh_probe):
    # A stand-in that answers the one-off probe once and, with -lms, prints a sample every 10 ms until killed;
    # it knows only the older reasons field, so the sampler must fall back to it.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(textwrap.dedent("""\
        #!/usr/bin/env bash
        case "$*" in *clocks_event_reasons*) echo "unknown field" >&2; exit 2;; esac
        case "$*" in *-lms*) while true; do echo "1500, 600.0, 70, 0x0000000000000004"; sleep 0.01; done;; esac
        echo "1500, 600.0, 70, 0x0000000000000004"
        """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gpu_state.GpuSampler("GPU-test", period_ms=10) as sampler:
        import time

        time.sleep(0.3)
    s = sampler.summary
    assert s is not None and s["samples"] >= 2 and s["sm_clock_mhz_mean"] == 1500
    assert s["slowdown_share"]["power_cap"] == 1.0
