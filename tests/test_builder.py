"""The non-Nix builder (ltx_build): variant names `kernels` accepts, the op
namespace kernel-builder would pick, the generated files, the flat
build/<variant>/ layout and its metadata, the dev flavour, incremental steps
(stopping at the first error, timed), toolchain errors that name the fix, the
command line (from any directory) and the ABI of the built .so. CPU only
(needs the CUDA toolkit, not a GPU). The rebuild key and compile on first use:
test_jit_cache.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path

import pytest

from ltx_build import BuildError, build, checks, config, layout, toolchain, variant
from ltx_build import compile as steps

from .conftest import CFG, ROOT

NAMESPACE_RE = r"_ltx_kernels_cuda_[0-9a-f]{7}(_dirty)?"


# --- variant names -----------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (("2.14.1+cu130", "13.0", True, "x86_64"), "torch214-cxx11-cu130-x86_64-linux"),
    (("2.11.0+cu130", "13.0", True, "x86_64"), "torch211-cxx11-cu130-x86_64-linux"),
    (("2.12.0", "12.6", False, "x86_64"), "torch212-cxx98-cu126-x86_64-linux"),
    (("2.13.0+cu132", "13.2", True, "aarch64"), "torch213-cxx11-cu132-aarch64-linux"),
    (("2.13.0", "13.0", True, "arm64"), "torch213-cxx11-cu130-aarch64-linux"),
    (("2.9.0", "12.8", True, "AMD64"), "torch29-cxx11-cu128-x86_64-linux"),
])
def test_variant_name(args, expected):
    assert variant.variant_name(*args) == expected


@pytest.mark.parametrize("name", [
    variant.variant_name("2.14.1+cu130", "13.0", True, "x86_64"),
    variant.variant_name("2.12.0", "12.6", False, "aarch64"),
])
def test_variant_names_round_trip_through_kernels_parser(name):
    from kernels.variants import parse_variant

    assert parse_variant(name).variant_str == name


def test_current_variant_is_the_one_kernels_resolves_for_this_python():
    from kernels.variants import VariantAccepted, parse_variant, resolve_variant

    current = variant.current_variant()
    parsed = parse_variant(current)
    assert parsed.variant_str == current
    chosen, trace = resolve_variant([parsed])
    assert chosen == parsed, trace
    assert isinstance(trace[0], VariantAccepted)


def test_a_variant_for_another_torch_is_rejected_by_kernels():
    """Guards the check above: resolve_variant really discriminates."""
    import torch
    from kernels.variants import parse_variant, resolve_variant

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    other = variant.variant_name(f"{major}.{minor + 1}.0", torch.version.cuda, True, "x86_64")
    chosen, _ = resolve_variant([parse_variant(other)])
    assert chosen is None


# --- op namespace ------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", "-c",
         "commit.gpgsign=false", *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def git_repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_unique_id_is_the_short_tree_id_of_head(git_repo):
    tree = _git(git_repo, "rev-parse", "HEAD^{tree}")
    assert variant.unique_id(git_repo) == tree[:7]
    assert re.fullmatch(r"[0-9a-f]{7}", tree[:7])


def test_unique_id_is_dirty_when_a_tracked_file_changes(git_repo):
    tree = _git(git_repo, "rev-parse", "HEAD^{tree}")
    (git_repo / "a.txt").write_text("two\n")
    assert variant.unique_id(git_repo) == f"{tree[:7]}_dirty"


def test_unique_id_is_dirty_when_a_change_is_staged(git_repo):
    tree = _git(git_repo, "rev-parse", "HEAD^{tree}")
    (git_repo / "b.txt").write_text("new\n")
    _git(git_repo, "add", "b.txt")
    assert variant.unique_id(git_repo) == f"{tree[:7]}_dirty"


def test_unique_id_ignores_untracked_files(git_repo):
    tree = _git(git_repo, "rev-parse", "HEAD^{tree}")
    (git_repo / "untracked.txt").write_text("x\n")
    assert variant.unique_id(git_repo) == tree[:7]


def test_unique_id_follows_a_new_commit(git_repo):
    old = variant.unique_id(git_repo)
    (git_repo / "a.txt").write_text("two\n")
    _git(git_repo, "commit", "-q", "-am", "second")
    new = variant.unique_id(git_repo)
    assert new != old and new == _git(git_repo, "rev-parse", "HEAD^{tree}")[:7]


def test_unique_id_outside_git_is_random_base32(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never find an enclosing repo
    plain = tmp_path / "plain"
    plain.mkdir()
    ids = {variant.unique_id(plain) for _ in range(3)}
    assert all(re.fullmatch(r"[a-z2-7]{7}", i) for i in ids), ids
    assert len(ids) > 1


def test_ops_namespace():
    assert variant.ops_namespace("ltx_kernels", "cuda", "abc1234") == "_ltx_kernels_cuda_abc1234"
    assert variant.ops_namespace("ltx_kernels", "cuda", "abc1234_dirty") == "_ltx_kernels_cuda_abc1234_dirty"


# --- generated files ---------------------------------------------------------

def test_generated_ops_py_prefixes_op_names_with_the_namespace(monkeypatch):
    name = "_ltx_kernels_cuda_abc1234"
    source = layout.ops_py(name)
    assert f"from . import {name}\n" in source
    assert f"ops = torch.ops.{name}\n" in source
    code = compile(source, "_ops.py", "exec")
    # Run it as `fakepkg._ops`, with the extension module stubbed in sys.modules.
    pkg = types.ModuleType("fakepkg")
    pkg.__path__ = []
    monkeypatch.setitem(sys.modules, "fakepkg", pkg)
    monkeypatch.setitem(sys.modules, f"fakepkg.{name}", types.ModuleType(f"fakepkg.{name}"))
    ns = {"__name__": "fakepkg._ops", "__package__": "fakepkg"}
    exec(code, ns)
    assert ns["add_op_namespace_prefix"]("x") == f"{name}::x"
    assert ns["add_op_namespace_prefix"]("rms_norm") == f"{name}::rms_norm"


def test_generated_registration_h_defines_the_kernel_builder_macros():
    h = layout.REGISTRATION_H
    for macro in ("TORCH_LIBRARY_EXPAND", "TORCH_LIBRARY_IMPL_EXPAND", "STABLE_TORCH_LIBRARY_EXPAND",
                  "STABLE_TORCH_LIBRARY_IMPL_EXPAND", "REGISTER_EXTENSION"):
        assert re.search(rf"^#define {macro}\(", h, re.M), macro
    assert "PyInit_" in h
    assert "pybind11" not in h and "torch/extension.h" not in h


def test_metadata_of_a_config():
    meta = layout.metadata(CFG, "_ltx_kernels_cuda_abc1234", ["9.0"])
    assert meta == {"name": "ltx-kernels", "id": "_ltx_kernels_cuda_abc1234", "version": 1, "license": CFG.license,
                    "python-depends": [], "kernel-depends": [], "backend": {"type": "cuda", "archs": ["9.0"]}}


# --- the built variant -------------------------------------------------------

BUILD_LOG: list[str] = []


@pytest.fixture(scope="module")
def built() -> build.BuildResult:
    """Bring build/<variant>/ up to date for this checkout (first of two builds)."""
    return build.build(ROOT, log=BUILD_LOG.append)


def test_build_writes_the_current_variant(built):
    assert built.variant == variant.current_variant()
    assert built.variant_dir == ROOT / "build" / built.variant
    assert re.fullmatch(NAMESPACE_RE, built.ops_name)


def test_second_build_compiles_nothing(built):
    again = build.build(ROOT)
    assert again.rebuilt == []
    assert again.ops_name == built.ops_name
    assert again.so_path == built.so_path


def test_build_prints_a_start_line_and_the_time_of_the_install(built):
    assert re.fullmatch(rf"ltx_build: building {built.variant} into build/{built.variant}: ops {built.ops_name}, "
                        r"nvcc V\d+\.\d+\.\d+ .*, \d+ steps, \d+ jobs", BUILD_LOG[0]), BUILD_LOG[0]
    assert re.fullmatch(rf"ltx_build: wrote build/{built.variant} \(.*\) \d+\.\d s", BUILD_LOG[-2]), BUILD_LOG[-2]


def test_check_prints_each_check_with_its_time(built, monkeypatch):
    # The real checks run after every build (scripts/test.sh); here only what they print.
    monkeypatch.setattr(checks, "abi_violations", lambda so: ([], []))
    monkeypatch.setattr(checks, "load_local", lambda where: built.ops_name)
    monkeypatch.setattr(checks, "load_hub", lambda where, repo_id, version: built.ops_name)
    lines: list[str] = []
    build.check(ROOT, built, log=lines.append)
    assert [line.split(" ")[1] for line in lines] == ["ABI", "kernels.get_local_kernel",
                                                      f"kernels.get_kernel('{CFG.repo_id}',"]
    assert all(re.search(r" \d+\.\d s$", line) for line in lines), lines


def test_built_variant_ships_no_compile_on_first_use_code(built):
    assert not [f for f in built.files if "jit" in f]
    assert not [f for f in built.files if "install_ops_module" in (built.variant_dir / f).read_text(errors="replace")]


def test_variant_dir_holds_exactly_the_flat_layout(built):
    files = sorted(p.relative_to(built.variant_dir).as_posix() for p in built.variant_dir.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    sos = [f for f in files if f.endswith(".abi3.so")]
    assert len(sos) == 1 and re.fullmatch(NAMESPACE_RE + r"\.abi3\.so", sos[0]), files
    package = [f.name for f in (ROOT / "torch-ext" / CFG.python_name).glob("*.py") if f.name != "_ops.py"]
    assert {"__init__.py", "layers.py", "rmsnorm.py"} <= set(package)
    assert files == sorted([*package, "_ops.py", "metadata.json", sos[0]])
    assert files == built.files


def test_so_metadata_id_and_ops_namespace_agree(built):
    meta = json.loads((built.variant_dir / "metadata.json").read_text())
    ops_src = (built.variant_dir / "_ops.py").read_text()
    m = re.search(r"^ops = torch\.ops\.(\w+)$", ops_src, re.M)
    assert m
    so_stem = built.so_path.name.removesuffix(".abi3.so")
    assert so_stem == meta["id"] == m.group(1) == built.ops_name
    assert re.fullmatch(NAMESPACE_RE, meta["id"])


def test_metadata_json_is_what_kernels_reads(built):
    import kernels._rust as kr

    path = built.variant_dir / "metadata.json"
    meta = kr.Metadata.read_from_file(path)
    assert str(meta.name) == "ltx-kernels"
    assert meta.version == 1
    assert meta.license == CFG.license and meta.license
    assert list(meta.python_depends) == []
    assert str(meta.backend.backend_type) == "cuda"
    assert list(meta.backend.archs) == ["9.0"]
    raw = json.loads(path.read_text())
    assert raw["backend"] == {"type": "cuda", "archs": ["9.0"]}
    assert raw["python-depends"] == []
    # The digest kernels checks, and the provenance of this checkout (tests/test_hub_metadata.py: against
    # kernel-builder's).
    assert checks.digest_mismatch(built.variant_dir) == [] and set(meta.digest.files) == set(built.files) - {
        "metadata.json"}
    state = variant.git_state(ROOT)
    assert (meta.provenance.kernel.commit, meta.provenance.kernel.dirty) == (state.commit, state.dirty)
    assert raw["provenance"]["builder"] == layout.BUILDER


def test_package_files_are_copied_unchanged(built):
    pkg = ROOT / "torch-ext" / CFG.python_name
    for src in pkg.glob("*.py"):
        if src.name != "_ops.py":  # generated per build
            assert (built.variant_dir / src.name).read_bytes() == src.read_bytes(), src.name


def test_generated_sources_in_torch_ext_match_the_build(built):
    assert (ROOT / "torch-ext" / "registration.h").read_text() == layout.REGISTRATION_H
    ops_here = (ROOT / "torch-ext" / CFG.python_name / "_ops.py").read_text()
    assert ops_here == (built.variant_dir / "_ops.py").read_text() == layout.ops_py(built.ops_name)


def test_build_removes_outputs_of_older_namespaces(built):
    obj_dir = ROOT / "_build" / built.variant
    old = "_ltx_kernels_cuda_0000000"
    if built.ops_name == old:
        pytest.skip("the current namespace is the fake old one")
    # A namespace that differs from the current one only by `_dirty`, which a
    # prefix match would mistake for the current one.
    twin = built.ops_name.removesuffix("_dirty") if built.ops_name.endswith("_dirty") else built.ops_name + "_dirty"
    stale = [obj_dir / f"{old}.abi3.so", obj_dir / f"{old}.abi3.so.sha256",
             obj_dir / f"torch-ext__torch_binding.cpp.{old}.o",
             obj_dir / f"torch-ext__torch_binding.cpp.{old}.o.sha256",
             obj_dir / f"torch-ext__torch_binding.cpp.{twin}.o", obj_dir / f"{twin}.abi3.so"]
    for p in stale:
        p.write_text("stale")
    try:
        again = build.build(ROOT)
        assert again.rebuilt == []
        assert [p.name for p in stale if p.exists()] == []
        assert again.so_path.name == f"{built.ops_name}.abi3.so"
        current = sorted(p.name for p in obj_dir.iterdir() if built.ops_name in p.name)
        assert f"{built.ops_name}.abi3.so" in current
    finally:
        for p in stale:
            p.unlink(missing_ok=True)


# --- gencode -----------------------------------------------------------------

@pytest.mark.parametrize("caps, flags", [
    (["9.0"], ["-gencode=arch=compute_90,code=sm_90"]),
    (["9.0a"], ["-gencode=arch=compute_90a,code=sm_90a"]),
    (["9.0+PTX"], ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]),
    (["8.0", "9.0"], ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]),
])
def test_gencode_flags(caps, flags):
    assert build.gencode_flags(caps) == flags


# --- incremental steps -------------------------------------------------------

@pytest.fixture
def copy_step(tmp_path) -> steps.Step:
    src = tmp_path / "in.txt"
    src.write_text("v1\n")
    out = tmp_path / "out" / "copy.txt"
    return steps.Step("cp in.txt", out, ["cp", str(src), str(out)], [src])


def _problem(step: steps.Step, fingerprint: str = "fp") -> str | None:
    return step.problem(fingerprint, steps.Digests())


def test_step_is_stale_before_it_ran(copy_step):
    assert _problem(copy_step) == "not built yet"


def test_runner_skips_a_fresh_step(copy_step):
    runner = steps.Runner("fp", jobs=1, total=2, log=lambda m: None)
    runner.run_one(copy_step)
    assert runner.rebuilt == ["cp in.txt"]
    assert copy_step.output.read_text() == "v1\n"
    made = copy_step.output.stat().st_mtime_ns
    runner.run_one(copy_step)
    assert runner.rebuilt == ["cp in.txt"] and copy_step.output.stat().st_mtime_ns == made


def test_a_modified_output_makes_the_step_stale(copy_step):
    steps.Runner("fp", jobs=1, total=1, log=lambda m: None).run_one(copy_step)
    copy_step.output.write_text("v2\n")
    assert _problem(copy_step) == "copy.txt does not match its recorded SHA-256 (truncated or modified)"


def test_a_changed_input_makes_the_step_stale(copy_step):
    runner = steps.Runner("fp", jobs=1, total=2, log=lambda m: None)
    runner.run_one(copy_step)
    copy_step.inputs[0].write_text("v2\n")
    assert _problem(copy_step) == f"{copy_step.inputs[0]} changed"
    steps.Runner("fp", jobs=1, total=2, log=lambda m: None).run_one(copy_step)
    assert copy_step.output.read_text() == "v2\n"
    assert _problem(copy_step) is None


def test_a_changed_toolchain_or_command_makes_the_step_stale(copy_step):
    steps.Runner("fp", jobs=1, total=1, log=lambda m: None).run_one(copy_step)
    assert _problem(copy_step) is None
    assert _problem(copy_step, "another nvcc") == "toolchain changed (now another nvcc)"
    copy_step.command = [*copy_step.command[:1], "-p", *copy_step.command[1:]]
    assert _problem(copy_step) == "command changed (+-p)"


def test_a_missing_output_or_record_makes_the_step_stale(copy_step):
    steps.Runner("fp", jobs=1, total=1, log=lambda m: None).run_one(copy_step)
    copy_step.record.unlink()
    assert _problem(copy_step) == "no record copy.txt.sha256"
    copy_step.output.unlink()
    assert _problem(copy_step) == "not built yet"


def test_depfile_inputs_are_recorded_and_an_edit_of_one_makes_the_step_stale(tmp_path):
    (tmp_path / "sub dir").mkdir()
    header = tmp_path / "sub dir" / "h.h"
    header.write_text("1")
    (tmp_path / "a.d").write_text(f"out.o : a.c \\\n  sub\\ dir/../sub\\ dir/h.h\n")
    (tmp_path / "a.c").write_text("x")
    assert steps.read_depfile(tmp_path / "a.d", tmp_path) == [tmp_path / "a.c", header]
    step = steps.Step("cc a.c", tmp_path / "out.o", ["touch", "out.o"], [], tmp_path / "a.d", cwd=tmp_path)
    steps.Runner("fp", jobs=1, total=1, log=lambda m: None).run_one(step)
    assert f"# input {steps.file_sha256(header)} {header}" in step.record.read_text()
    header.write_text("2")
    assert _problem(step) == f"{header} changed"


def test_a_failing_step_raises_with_its_output_and_leaves_no_record(tmp_path):
    out = tmp_path / "never.o"
    step = steps.Step("fails", out, ["sh", "-c", "echo broken source >&2; exit 3"], [])
    with pytest.raises(BuildError, match=r"(?s)fails failed \(exit 3\).*broken source"):
        steps.Runner("fp", jobs=1, total=1).run_one(step)
    assert not step.record.exists()


def test_the_first_failure_stops_the_build_at_once_and_cancels_the_queue(tmp_path):
    running = steps.Step("slow", tmp_path / "slow", ["sh", "-c", f"sleep 30; touch {tmp_path / 'slow'}"])
    failing = steps.Step("nvcc bad.cu", tmp_path / "bad",
                         ["sh", "-c", "sleep 0.5; echo 'bad.cu(3): error' >&2; exit 1"])
    queued = [steps.Step(f"q{i}", tmp_path / f"q{i}", ["touch", str(tmp_path / f"q{i}")]) for i in range(3)]
    start = time.monotonic()
    with pytest.raises(BuildError) as e:
        steps.Runner("fp", jobs=2, total=5, log=lambda m: None).run([running, failing, *queued])
    assert time.monotonic() - start < 10  # not the 30 s of the step that was running
    assert "nvcc bad.cu failed (exit 1)" in str(e.value) and "bad.cu(3): error" in str(e.value)
    assert not [p.name for p in tmp_path.iterdir()]  # nothing queued ran, the slow step was stopped


def test_run_runs_every_step_and_prints_each_with_its_place_and_time(tmp_path):
    todo, lines = [], []
    for i in range(4):
        src = tmp_path / f"in{i}"
        src.write_text(str(i))
        todo.append(steps.Step(f"s{i}", tmp_path / f"out{i}", ["cp", str(src), str(tmp_path / f"out{i}")], [src]))
    runner = steps.Runner("fp", jobs=4, total=4, log=lines.append)
    runner.run(todo)
    assert sorted(runner.rebuilt) == ["s0", "s1", "s2", "s3"]
    assert [(tmp_path / f"out{i}").read_text() for i in range(4)] == ["0", "1", "2", "3"]
    assert [re.fullmatch(r"\[(\d)/4\] s\d \d+\.\d s", line).group(1) for line in lines] == ["1", "2", "3", "4"]
    again: list[str] = []
    steps.Runner("fp", jobs=4, total=4, log=again.append).run(todo)
    assert again == []  # up-to-date steps are quiet unless verbose


# --- toolchain ---------------------------------------------------------------

def _fake_toolkit(root: Path, release: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n"
                    "echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.131'\n")
    nvcc.chmod(0o755)
    (root / "include" / "cuda_runtime.h").write_text("")
    return root


def test_cuda_home_pointing_at_usr_local_names_the_right_directory():
    with pytest.raises(BuildError) as e:
        toolchain.find_cuda_home(env={"CUDA_HOME": "/usr/local", "PATH": os.environ["PATH"]})
    assert "CUDA_HOME" in str(e.value)
    assert "/usr/local/cuda" in str(e.value)


@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
def test_cuda_home_that_does_not_exist_is_an_error_naming_the_variable(var):
    with pytest.raises(BuildError, match=f"{var}=/nonexistent is not a CUDA toolkit"):
        toolchain.find_cuda_home(env={var: "/nonexistent", "PATH": os.environ["PATH"]})


def test_detect_refuses_an_nvcc_of_another_cuda_major(tmp_path):
    fake = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    with pytest.raises(BuildError) as e:
        toolchain.detect("13.0", env={"CUDA_HOME": str(fake), "PATH": os.environ["PATH"]})
    assert "12.4" in str(e.value) and "13.0" in str(e.value)
    assert "CUDA_HOME" in str(e.value)


def test_detect_accepts_an_nvcc_of_the_same_cuda_major(tmp_path):
    fake = _fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    tc = toolchain.detect("13.0", env={"CUDA_HOME": str(fake), "PATH": os.environ["PATH"]})
    assert tc.cuda_home == fake
    assert tc.nvcc == fake / "bin" / "nvcc"
    assert tc.nvcc_version == "13.0"
    assert tc.nvcc_build == "V13.0.131" and "nvcc V13.0.131 @" in tc.fingerprint  # the patch level is in the key


def test_detect_refuses_an_nvcc_whose_version_it_cannot_read(tmp_path):
    fake = _fake_toolkit(tmp_path / "cuda", "13.0")
    (fake / "bin" / "nvcc").write_text("#!/bin/sh\necho 'something else'\n")
    with pytest.raises(BuildError, match="cannot read the CUDA release"):
        toolchain.detect("13.0", env={"CUDA_HOME": str(fake), "PATH": os.environ["PATH"]})


def test_find_cuda_home_uses_the_nvcc_on_path(tmp_path):
    fake = _fake_toolkit(tmp_path / "cuda", "13.0")
    assert toolchain.find_cuda_home(env={"PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}"}) == fake


def test_find_cuda_home_sees_through_the_usr_local_bin_wrapper():
    # /usr/local/bin/nvcc here is a wrapper script, which makes torch guess
    # CUDA_HOME=/usr/local; the builder must still find the real toolkit.
    home = toolchain.find_cuda_home(env={"PATH": os.environ["PATH"]})
    assert home == Path("/usr/local/cuda")
    assert toolchain.is_toolkit(home)



def test_no_libstdcxx_override_when_the_compiler_links_the_shared_runtime():
    assert toolchain.shared_libstdcxx_args("g++") == []


def test_missing_shared_libstdcxx_link_is_replaced_by_the_runtime_library(tmp_path):
    # A compiler whose libstdc++.so development link is missing (it would link
    # libstdc++.a into the extension): the builder names libstdc++.so.6 itself.
    fake = tmp_path / "c++"
    fake.write_text('#!/bin/sh\necho libstdc++.so\n')
    fake.chmod(0o755)
    args = toolchain.shared_libstdcxx_args(str(fake))
    assert len(args) == 1 and args[0].endswith("libstdc++.so.6") and Path(args[0]).is_file()


def test_built_binding_needs_the_shared_libstdcxx(built):
    needed = subprocess.run(["readelf", "-d", str(built.so_path)], capture_output=True, text=True).stdout
    assert "[libstdc++.so.6]" in needed


# --- command line ------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ltx_build", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_help_describes_the_output_dir():
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "build/<variant>" in proc.stdout


def test_cli_variant_prints_variant_and_namespace():
    proc = _cli("variant")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == variant.current_variant()
    assert re.fullmatch(NAMESPACE_RE, lines[1])
    assert lines[1] == variant.ops_namespace(CFG.python_name, "cuda", variant.unique_id(ROOT))


def test_cli_reports_a_build_error_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ltx_build", "--root", str(tmp_path), "variant"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "ltx_build: error:" in proc.stderr and "build.toml not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def cli_calls(monkeypatch) -> list:
    """The build and check calls `main` makes, with their arguments; nothing is built."""
    calls: list = []
    monkeypatch.setattr(build, "build", lambda root, **kw: calls.append(("build", root, kw)) or types.SimpleNamespace(
        rebuilt=[], seconds=0.0))
    monkeypatch.setattr(build, "check", lambda root, result, **kw: calls.append(("check", kw)))
    return calls


@pytest.mark.parametrize("argv, allow_newer_glibc", [([], False), (["build"], False),
                                                     (["build", "-j", "16", "--allow-newer-glibc"], True)])
def test_cli_build_is_the_default_command_and_checks(cli_calls, argv, allow_newer_glibc):
    from ltx_build import __main__ as cli

    assert cli.main(argv) == 0
    assert [c[0] for c in cli_calls] == ["build", "check"]
    assert cli_calls[1] == ("check", {"allow_newer_glibc": allow_newer_glibc})


def test_cli_no_check_skips_the_checks(cli_calls):
    from ltx_build import __main__ as cli

    assert cli.main(["build", "--no-check"]) == 0
    assert [c[0] for c in cli_calls] == ["build"]


@pytest.mark.parametrize("argv", [["build", "--root", "{tmp}", "-j", "4", "--dev"],
                                  ["--root", "{tmp}", "build", "--dev", "-j", "4"]])
def test_cli_options_come_after_the_subcommand_or_before_it(cli_calls, tmp_path, argv):
    from ltx_build import __main__ as cli

    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 0
    assert cli_calls[0] == ("build", tmp_path.resolve(), {"jobs": 4, "verbose": False, "dev": True})


def test_cli_refuses_dev_for_the_whole_matrix(capsys):
    from ltx_build import __main__ as cli

    assert cli.main(["build", "--dev", "--all-variants"]) == 1
    assert "--dev builds the installed torch's variant only" in capsys.readouterr().err


def test_cli_variant_dev_prints_the_dev_namespace(capsys):
    from ltx_build import __main__ as cli

    assert cli.main(["variant", "--root", str(ROOT), "--dev"]) == 0
    release = variant.ops_namespace(CFG.python_name, "cuda", variant.unique_id(ROOT))
    assert capsys.readouterr().out.splitlines()[1] == release + "_dev"


# --- the repository root, from any directory ---------------------------------

def _kernel_tree(path: Path, name: str = "ltx-kernels") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "build.toml").write_text(f'[general]\nname = "{name}"\n')
    return path


def test_root_is_the_nearest_checkout_above_the_current_directory(tmp_path):
    outer = _kernel_tree(tmp_path / "checkout")
    _kernel_tree(outer / "examples" / "other", name="other-kernel")  # another kernel's build.toml is passed over
    deep = outer / "examples" / "other" / "src"
    deep.mkdir()
    assert config.find_root(deep, installed_from=tmp_path / "nowhere") == outer


def test_root_falls_back_to_the_checkout_the_tools_are_installed_from(tmp_path):
    assert config.find_root(tmp_path, installed_from=ROOT) == ROOT
    assert config.PACKAGE_CHECKOUT == ROOT  # ltx_build is imported from this checkout (editable install or tree)


def test_no_root_anywhere_is_an_error_that_says_what_to_do(tmp_path):
    with pytest.raises(BuildError, match=r"no ltx-kernels checkout here.*pass --root"):
        config.find_root(tmp_path, installed_from=tmp_path)


def test_cli_runs_from_a_subdirectory_of_the_checkout(monkeypatch, capsys):
    from ltx_build import __main__ as cli

    monkeypatch.chdir(ROOT / "kernel_src")
    assert cli.main(["variant"]) == 0
    expected = variant.ops_namespace(CFG.python_name, "cuda", variant.unique_id(ROOT))
    assert capsys.readouterr().out.splitlines()[1] == expected


def test_pyproject_installs_the_ltx_build_command_and_its_variant_matrix():
    project = tomllib.loads((ROOT / "tools" / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["ltx-build"] == "ltx_build.__main__:main"
    assert "variants.toml" in project["tool"]["setuptools"]["package-data"]["ltx_build"]
    assert "ltx_build*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    from importlib import metadata

    try:
        scripts = metadata.entry_points(group="console_scripts", name="ltx-build")
    except metadata.PackageNotFoundError:
        scripts = ()
    if not scripts:
        pytest.skip("ltx-kernels-tools is not installed here (pip install -e tools)")
    assert [s.value for s in scripts] == ["ltx_build.__main__:main"]


# --- the dev flavour ---------------------------------------------------------

@pytest.fixture(scope="module")
def plans() -> dict[str, build.Plan]:
    return {"release": build.make_plan(ROOT), "dev": build.make_plan(ROOT, dev=True)}


def test_dev_build_passes_its_define_to_every_compile_and_release_does_not(plans):
    listed = [s for k in CFG.kernels for s in k.src if s.endswith(".cu")]
    listed += [s for s in CFG.torch_src if s.endswith(".cpp")]
    assert len(plans["dev"].steps) == len(plans["release"].steps) == len(listed)
    assert all(build.DEV_DEFINE in s.command for s in plans["dev"].steps)
    assert not any(build.DEV_DEFINE in s.command for s in [*plans["release"].steps, plans["release"].link])


def test_dev_build_goes_to_build_dev_with_its_own_objects_never_to_build(plans):
    dev, release = plans["dev"], plans["release"]
    assert dev.variant_dir == ROOT / "_build" / "dev" / "build" / dev.variant
    assert dev.link.output.parent == ROOT / "_build" / "dev" / "_build" / dev.variant
    assert release.variant_dir == ROOT / "build" / release.variant
    assert release.link.output.parent == ROOT / "_build" / release.variant
    assert not {s.output.parent for s in release.steps} & {s.output.parent for s in dev.steps}


def test_dev_build_has_a_namespace_of_its_own_and_says_dev_in_its_metadata(plans):
    import kernels._rust as kr

    dev, release = plans["dev"], plans["release"]
    assert dev.ops_name == release.ops_name + "_dev"
    assert f"-DTORCH_EXTENSION_NAME={dev.ops_name}" in dev.steps[-1].command
    meta = layout.metadata(CFG, dev.ops_name, ["9.0"], dev=True)
    assert meta["dev"] is True and "dev" not in layout.metadata(CFG, release.ops_name, ["9.0"])
    assert str(kr.Metadata.from_bytes(json.dumps(meta).encode()).id) == dev.ops_name  # kernels still parses it


# --- ABI of the built .so ----------------------------------------------------

def test_built_so_passes_the_abi_check(built):
    assert checks.abi_violations(built.so_path) == ([], [])


def test_built_so_does_not_need_glibc_2_32_libc_single_threaded(built):
    nm = subprocess.run(["nm", "-D", str(built.so_path)], check=True, capture_output=True, text=True).stdout
    undefined = [line for line in nm.splitlines() if re.search(r"\bU\s+__libc_single_threaded\b", line)]
    assert undefined == []
    assert re.search(r"\bU\s+\w", nm), "nm -D printed no undefined symbols at all: is this the right file?"
