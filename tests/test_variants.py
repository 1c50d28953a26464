"""`build --all-variants` (ltx_build/variants.py): the matrix, the toolkit
assembled from pip wheels, which environment builds each variant, and the
report. A stand-in runner replaces pip and the compiler, so these take
milliseconds; LTX_KERNELS_VARIANT_TESTS=1 builds the real matrix (downloads
torch wheels, tens of minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ltx_build import BuildError, variants
from ltx_build.toolchain import is_toolkit

from .conftest import ROOT


def test_shipped_matrix_has_torch_211_and_214_on_cuda_13_and_a_cuda_12_variant():
    from kernels.variants import parse_variant

    specs = variants.load_matrix()
    expects = {s.expect for s in specs}
    assert {"torch214-cxx11-cu130-x86_64-linux", "torch211-cxx11-cu130-x86_64-linux"} <= expects
    assert any("-cu12" in e for e in expects)
    for s in specs:
        parse_variant(s.expect)  # a name kernels can choose
        assert s.expect.startswith(f"torch{''.join(s.torch.split('.')[:2])}-")
    cu12 = next(s for s in specs if "-cu12" in s.expect)
    assert cu12.cuda_toolkit != "host" and any("nvcc" in r for r in cu12.cuda_toolkit)


def test_matrix_errors_name_the_entry(tmp_path):
    bad = tmp_path / "v.toml"
    bad.write_text('[[variant]]\nlabel = "a"\ntorch = "2.14.1"\n\n[[variant]]\nlabel = "b"\ntorch = "2.11.0"\n'
                   'expect = "x"\ncuda-toolkit = 3\ncolour = "red"\n')
    with pytest.raises(BuildError) as e:
        variants.load_matrix(bad)
    assert "#1: 'expect' (a string) is required" in str(e.value)
    assert "#2: unknown key 'colour'" in str(e.value) and "#2: cuda-toolkit must be" in str(e.value)


def test_builder_requirements_are_the_pins_of_pyproject():
    reqs = variants.builder_requirements(ROOT)
    text = (ROOT / variants.TOOLS_PYPROJECT).read_text()
    assert [r.split("==")[0] for r in reqs] == ["kernels", "kernel-abi-check"]
    assert all(f'"{r}"' in text and "==" in r for r in reqs)


class FakeRunner:
    """Records commands; pip --target lays out the given wheel files; builds write a variant."""

    def __init__(self, root: Path, wheel_files=(), wrote: str = "torch211-cxx11-cu130-x86_64-linux"):
        self.root, self.wheel_files, self.wrote, self.commands = root, wheel_files, wrote, []

    def __call__(self, cmd, env, log):
        self.commands.append((cmd, env))
        if "--target" in cmd:
            target = Path(cmd[cmd.index("--target") + 1])
            for rel in self.wheel_files:
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                (target / rel).write_text("")
        elif "ltx_build" in cmd:
            so = self.root / "build" / self.wrote / "_ltx_kernels_cuda_abcdef0.abi3.so"
            so.parent.mkdir(parents=True, exist_ok=True)
            so.write_bytes(b"x" * 3 * 2**20)
            with open(log, "a") as f:
                f.write(f"ltx_build: wrote build/{self.wrote} (__init__.py, ...)\n")


PTXAS_ONLY = ["nvidia/cuda_nvcc/bin/ptxas", "nvidia/cuda_nvcc/nvvm/lib64/libnvvm.so",
              "nvidia/cuda_runtime/include/cuda_runtime.h", "nvidia/cuda_runtime/lib/libcudart.so.12"]


def cu12_spec(**kw):
    return variants.VariantSpec("torch29-cu128", "2.9.1", "torch29-cxx11-cu128-x86_64-linux",
                                ("nvidia-cuda-nvcc-cu12==12.8.93",), **kw)


def test_wheels_without_nvcc_stop_before_torch_is_installed_and_say_why(tmp_path, created):
    runner = FakeRunner(tmp_path, PTXAS_ONLY)
    result = variants.build_variant(cu12_spec(), tmp_path, run=runner, host=("2.14.1", "13.0"))
    assert not result.ok
    assert "has no bin/nvcc" in result.error and "bin/ holds: ptxas" in result.error
    assert "--cuda-home torch29-cu128=<dir>" in result.error
    assert not any("torch==2.9.1" in " ".join(c) for c, _ in runner.commands) and created == []


def test_wheels_with_nvcc_merge_into_a_toolkit_that_becomes_cuda_home(tmp_path, created):
    runner = FakeRunner(tmp_path, [*PTXAS_ONLY, "nvidia/cuda_nvcc/bin/nvcc", "nvidia/cuda_cccl/include/cuda/std/x"],
                        wrote="torch29-cxx11-cu128-x86_64-linux")
    result = variants.build_variant(cu12_spec(), tmp_path, run=runner, host=("2.14.1", "13.0"))
    home = tmp_path / "_build/toolkits/torch29-cu128/cuda"
    assert result.ok, result.error
    assert is_toolkit(home) and (home / "lib64/libcudart.so").resolve().name == "libcudart.so.12"
    assert (home / "include/cuda/std/x").is_file()
    build_cmd, build_env = runner.commands[-1]
    assert build_env["CUDA_HOME"] == str(home) and build_env["PATH"].startswith(str(home / "bin"))
    assert any("torch==2.9.1" in cmd for cmd, _ in runner.commands)


@pytest.fixture
def created(monkeypatch):
    """Environments the builder creates (recorded, not created: ensurepip takes seconds)."""
    made = []
    monkeypatch.setattr(variants.venv, "EnvBuilder", lambda **kw: type("E", (), {
        "create": lambda self, d: made.append(Path(d))})())
    return made


def test_the_running_torch_is_built_with_this_python_others_in_their_own_venv(tmp_path, created):
    spec = variants.VariantSpec("torch211-cu130", "2.11.0", "torch211-cxx11-cu130-x86_64-linux", "host")
    (tmp_path / "tools").mkdir()
    (tmp_path / variants.TOOLS_PYPROJECT).write_text((ROOT / variants.TOOLS_PYPROJECT).read_text())
    runner = FakeRunner(tmp_path)
    here = variants.build_variant(spec, tmp_path, run=runner, host=("2.11.0", "13.0"))
    assert here.ok and here.environment == "host python" and created == []
    assert runner.commands[-1][0][0] == sys.executable
    runner = FakeRunner(tmp_path)
    other = variants.build_variant(spec, tmp_path, run=runner, host=("2.14.1", "13.0"))
    assert other.ok and created == [tmp_path / "_build/venvs/torch211-cu130"]
    pip_cmd = runner.commands[0][0]
    assert "torch==2.11.0" in pip_cmd and any(r.startswith("kernels==") for r in pip_cmd)
    assert runner.commands[-1][0][0] == str(tmp_path / "_build/venvs/torch211-cu130/bin/python")
    assert other.so_bytes == 3 * 2**20 and other.variant == spec.expect


def test_a_build_that_writes_another_variant_fails(tmp_path):
    spec = variants.VariantSpec("torch211-cu130", "2.11.0", "torch211-cxx11-cu130-x86_64-linux", "host")
    result = variants.build_variant(spec, tmp_path, run=FakeRunner(tmp_path, wrote="torch214-cxx11-cu130-x86_64-linux"),
                                    host=("2.11.0", "13.0"))
    assert not result.ok and "expected build/torch211" in result.error


def test_report_shows_time_size_and_failure_per_variant():
    ok = variants.VariantResult("a", "torch214-cxx11-cu130-x86_64-linux", ok=True,
                                variant="torch214-cxx11-cu130-x86_64-linux", environment="host python",
                                cuda_home="host", setup_seconds=1, build_seconds=250, so_bytes=19 * 2**20)
    bad = variants.VariantResult("b", "torch29-cxx11-cu128-x86_64-linux", error="no bin/nvcc\nmore")
    table = variants.report([ok, bad])
    assert "| torch214-cxx11-cu130-x86_64-linux | host python | host | 1 s | 250 s | 19.0 MiB | built" in table
    assert "| torch29-cxx11-cu128-x86_64-linux |" in table and "failed: no bin/nvcc |" in table


def test_cli_rejects_unknown_labels_without_building():
    proc = subprocess.run([sys.executable, "-m", "ltx_build", "build", "--all-variants", "--variant-label", "nope"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "no variant labelled nope" in proc.stderr


@pytest.mark.skipif(os.environ.get("LTX_KERNELS_VARIANT_TESTS") != "1",
                    reason="downloads torch wheels and builds every variant (tens of minutes); "
                           "set LTX_KERNELS_VARIANT_TESTS=1")
def test_all_variants_build_pass_the_abi_check_and_load():
    proc = subprocess.run([sys.executable, "-m", "ltx_build", "build", "--all-variants"], cwd=ROOT,
                          capture_output=True, text=True)
    print(proc.stdout[-5000:])
    for spec in variants.load_matrix():
        if spec.cuda_toolkit == "host":
            assert f"{spec.label}: built {spec.expect}" in proc.stdout
