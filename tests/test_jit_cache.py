"""Compile on first use (torch-ext/ltx_kernels/_jit.py): cache location and
environment variables, the build key, reuse, checksum failures, the file lock
between processes, and a real compile-and-load of a tiny source tree.

Most tests drive the cache with a stand-in compiler so they take milliseconds;
`test_tiny_source_tree_compiles_on_first_import_and_is_reused` runs nvcc and
the host compiler for real (~15 s). Compiling the whole package takes minutes
on two cores: LTX_KERNELS_SLOW_TESTS=1 runs that one too."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ltx_build import build as builder
from ltx_build import commands

ROOT = Path(__file__).resolve().parent.parent
jit = commands.load_jit_module(ROOT)

slow = pytest.mark.skipif(os.environ.get("LTX_KERNELS_SLOW_TESTS") != "1",
                          reason="compiles the whole package (minutes); set LTX_KERNELS_SLOW_TESTS=1")


def fake_plan(tmp_path: Path, manifest: list[str]) -> "jit.BuildPlan":
    link = jit.Step("link", tmp_path / "out" / "lib.so.tmp", ["true"], [])
    return jit.BuildPlan(tmp_path, tmp_path / "out", [], link, ["9.0"], manifest)


class FakeCompiler:
    """Writes a library whose bytes depend on the plan, counting calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, plan, log):
        self.calls += 1
        plan.link.output.parent.mkdir(parents=True, exist_ok=True)
        plan.link.output.write_bytes(b"ELF" + plan.key.encode() * 100)
        return plan.link.output


# --------------------------------------------------------------------------- environment


def test_cache_dir_prefers_ltx_variable_then_its_alias_then_torch_extensions_dir(tmp_path):
    both = {"LTX_KERNELS_CACHE_DIR": "/a", "RUNWARE_LTX_TORCH_COMPILE_DIR": "/b", "TORCH_EXTENSIONS_DIR": "/c"}
    assert jit.cache_root(both, "13.0") == Path("/a")
    assert jit.cache_root({k: v for k, v in both.items() if k != "LTX_KERNELS_CACHE_DIR"}, "13.0") == Path("/b")
    assert jit.cache_root({"TORCH_EXTENSIONS_DIR": "/c"}, "13.0") == Path("/c")


def test_default_cache_dir_is_torch_extensions_per_python_and_cuda(tmp_path):
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    assert jit.cache_root({"HOME": str(tmp_path)}, "13.0") == tmp_path / ".cache/torch_extensions" / f"{python}_cu130"
    assert jit.cache_root({"HOME": str(tmp_path), "XDG_CACHE_HOME": "/x"}, "12.8") == \
        Path("/x/torch_extensions") / f"{python}_cu128"


@pytest.mark.parametrize("env, off", [
    ({}, False),
    ({"LTX_KERNELS_NO_COMPILE": "1"}, True),
    ({"RUNWARE_LTX_NO_COMPILE_KERNELS": "1"}, True),
    ({"LTX_KERNELS_NO_COMPILE": "0"}, False),
    ({"LTX_KERNELS_NO_COMPILE": "false"}, False),
    ({"LTX_KERNELS_NO_COMPILE": "yes"}, True),
])
def test_no_compile_variable_and_its_alias(env, off):
    assert jit.compile_disabled(env) is off


def test_source_root_is_found_only_for_torch_ext_layout(tmp_path):
    (tmp_path / "build.toml").write_text("")
    (tmp_path / "torch-ext" / "pkg").mkdir(parents=True)
    (tmp_path / "build" / "torch214-cxx11-cu130-x86_64-linux").mkdir(parents=True)
    assert jit.find_source_root(tmp_path / "torch-ext" / "pkg") == tmp_path.resolve()
    assert jit.find_source_root(tmp_path / "build" / "torch214-cxx11-cu130-x86_64-linux") is None


# --------------------------------------------------------------------------- cache entry


def test_first_use_compiles_into_the_documented_layout_then_reuses(tmp_path):
    entry, compiler = jit.CacheEntry(tmp_path / "cache" / jit.KERNEL), FakeCompiler()
    plan = fake_plan(tmp_path, ["source a.cu 1"])
    loaded = []
    path = jit.ensure_library(entry, plan, build=compiler, load=loaded.append, log=lambda m: None)
    assert path == tmp_path / "cache" / "ltx_kernels" / "ltx_kernels.so"
    record = (tmp_path / "cache" / "ltx_kernels" / "ltx_kernels.sha256").read_text()
    assert f"# key: {plan.key}" in record
    assert f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ltx_kernels.so" in record
    jit.ensure_library(entry, plan, build=compiler, load=loaded.append, log=lambda m: None)
    assert compiler.calls == 1 and loaded == [path, path]


def test_a_changed_source_flag_or_toolchain_line_rebuilds_and_says_what_changed(tmp_path):
    entry, compiler, messages = jit.CacheEntry(tmp_path / jit.KERNEL), FakeCompiler(), []
    base = ["toolchain nvcc 13.0", "command nvcc -O3 a.cu", "source kernel_src/a.cu 111"]
    jit.ensure_library(entry, fake_plan(tmp_path, base), build=compiler, log=messages.append)
    for i, changed in enumerate([["toolchain nvcc 13.1", *base[1:]],
                                 [base[0], "command nvcc -O2 a.cu", base[2]],
                                 [*base[:2], "source kernel_src/a.cu 222"]]):
        jit.ensure_library(entry, fake_plan(tmp_path, changed), build=compiler, log=messages.append)
        assert compiler.calls == i + 2
    last_reason = [m for m in messages if "compiling" in m][-1]
    assert "sources, flags or toolchain changed:" in last_reason and "kernel_src/a.cu" in last_reason


def test_truncated_library_is_detected_by_its_checksum_and_rebuilt(tmp_path):
    entry, compiler, messages = jit.CacheEntry(tmp_path / jit.KERNEL), FakeCompiler(), []
    plan = fake_plan(tmp_path, ["source a.cu 1"])
    library = jit.ensure_library(entry, plan, build=compiler, log=messages.append)
    good = library.read_bytes()
    library.write_bytes(good[:100])
    assert "does not match its recorded SHA-256" in entry.problem(plan.key)
    jit.ensure_library(entry, plan, build=compiler, log=messages.append)
    assert compiler.calls == 2 and library.read_bytes() == good


def test_modified_library_of_the_same_size_is_rebuilt(tmp_path):
    entry, compiler = jit.CacheEntry(tmp_path / jit.KERNEL), FakeCompiler()
    plan = fake_plan(tmp_path, ["source a.cu 1"])
    library = jit.ensure_library(entry, plan, build=compiler, log=lambda m: None)
    data = bytearray(library.read_bytes())
    data[10] ^= 0xFF
    library.write_bytes(bytes(data))
    jit.ensure_library(entry, plan, build=compiler, log=lambda m: None)
    assert compiler.calls == 2


def test_missing_record_means_rebuild(tmp_path):
    entry, compiler = jit.CacheEntry(tmp_path / jit.KERNEL), FakeCompiler()
    plan = fake_plan(tmp_path, ["source a.cu 1"])
    jit.ensure_library(entry, plan, build=compiler, log=lambda m: None)
    entry.record.unlink()
    jit.ensure_library(entry, plan, build=compiler, log=lambda m: None)
    assert compiler.calls == 2


def test_record_checks_with_sha256sum(tmp_path):
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum")
    entry = jit.CacheEntry(tmp_path / jit.KERNEL)
    jit.ensure_library(entry, fake_plan(tmp_path, ["x"]), build=FakeCompiler(), log=lambda m: None)
    proc = subprocess.run(["sha256sum", "-c", entry.record.name], cwd=entry.directory, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_compile_loads_a_valid_cache_and_refuses_to_build_otherwise(tmp_path):
    entry, compiler = jit.CacheEntry(tmp_path / jit.KERNEL), FakeCompiler()
    plan = fake_plan(tmp_path, ["source a.cu 1"])
    with pytest.raises(jit.KernelNotCompiledError, match="no cached library.*compilation on first use is off.*LTX_KERNELS_NO_COMPILE"):
        jit.ensure_library(entry, plan, no_compile=True, build=compiler)
    jit.ensure_library(entry, plan, build=compiler, log=lambda m: None)
    loaded = []
    jit.ensure_library(entry, plan, no_compile=True, build=compiler, load=loaded.append)
    assert loaded == [entry.library]
    with pytest.raises(ImportError, match="sources, flags or toolchain changed"):
        jit.ensure_library(entry, fake_plan(tmp_path, ["source a.cu 2"]), no_compile=True, build=compiler)
    assert compiler.calls == 1


CONCURRENT_BUILDER = """
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("jit_under_test", sys.argv[1])
jit = importlib.util.module_from_spec(spec); sys.modules[spec.name] = jit; spec.loader.exec_module(jit)
tmp, cache, start = Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])

def slow_compiler(plan, log):
    with open(tmp / "compiles.txt", "a") as f:
        f.write("compile\\n")
    time.sleep(1.5)  # long enough that the other process arrives meanwhile
    plan.link.output.parent.mkdir(parents=True, exist_ok=True)
    plan.link.output.write_bytes(b"ELF" + plan.key.encode() * 1000)
    return plan.link.output

link = jit.Step("link", tmp / "out" / "lib.so.tmp", ["true"], [])
plan = jit.BuildPlan(tmp, tmp / "out", [], link, ["9.0"], ["source a.cu 1"])
while time.time() < start:
    time.sleep(0.01)
entry = jit.CacheEntry(cache / jit.KERNEL)
seen = []
jit.ensure_library(entry, plan, build=slow_compiler, load=lambda p: seen.append(p.read_bytes()), log=lambda m: None)
print(len(seen[0]), entry.problem(plan.key))
"""


def test_two_processes_compiling_at_once_compile_once_and_load_the_same_library(tmp_path):
    script = tmp_path / "builder.py"
    script.write_text(CONCURRENT_BUILDER)
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, str(script), str(ROOT / "torch-ext/ltx_kernels/_jit.py"),
                               str(tmp_path), str(tmp_path / "cache"), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert (tmp_path / "compiles.txt").read_text().count("compile") == 1
    assert [o[0].split() for o in outputs] == [["64003", "None"]] * 2  # both loaded the complete library


# --------------------------------------------------------------------------- the build plan


def fake_toolchain() -> "jit.Toolchain":
    return jit.Toolchain(Path("/opt/cuda"), Path("/opt/cuda/bin/nvcc"), "c++", ("nvcc release 13.0",))


def test_plan_compiles_every_source_of_build_toml_with_the_builders_arch_flags(tmp_path):
    from ltx_build import config

    cfg = config.load(ROOT)
    plan = jit.make_plan(ROOT, tmp_path, fake_toolchain(), env={})
    compiled = {s.label.split(" ", 1)[1] for s in plan.compile_steps}
    listed = {s for k in cfg.kernels for s in k.src if s.endswith(".cu")} | \
             {s for s in cfg.torch_src if s.endswith(".cpp")}
    assert compiled == listed
    for step in plan.compile_steps:
        if step.label.startswith("nvcc"):
            assert all(flag in step.argv for flag in builder.gencode_flags(list(cfg.capabilities)))
        else:
            assert f"-DTORCH_EXTENSION_NAME={jit.OPS_NAMESPACE}" in step.argv
    assert plan.capabilities == list(cfg.capabilities)


def copy_sources(dst: Path) -> Path:
    dst.mkdir(parents=True)
    shutil.copy(ROOT / "build.toml", dst / "build.toml")
    shutil.copytree(ROOT / "kernel_src", dst / "kernel_src")
    shutil.copytree(ROOT / "torch-ext", dst / "torch-ext", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_key_covers_sources_flags_and_toolchain(tmp_path):
    root = copy_sources(tmp_path / "src")
    key = jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={}).key
    assert jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={}).key == key
    assert jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={"CXXFLAGS": "-g"}).key != key
    other_nvcc = jit.Toolchain(Path("/opt/cuda"), Path("/opt/cuda/bin/nvcc"), "c++", ("nvcc release 13.1",))
    assert jit.make_plan(root, tmp_path / "b", other_nvcc, env={}).key != key
    with open(root / "kernel_src" / "common.cuh", "a") as f:
        f.write("// a header nobody lists still counts\n")
    assert jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={}).key != key


def test_editing_one_kernel_invalidates_only_its_object(tmp_path):
    root = copy_sources(tmp_path / "src")
    before = {s.label: s.key() for s in jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={}).compile_steps}
    with open(root / "kernel_src" / "rope.cu", "a") as f:
        f.write("// edited\n")
    after = {s.label: s.key() for s in jit.make_plan(root, tmp_path / "b", fake_toolchain(), env={}).compile_steps}
    assert [label for label in before if before[label] != after[label]] == ["nvcc kernel_src/rope.cu"]


# --------------------------------------------------------------------------- import hook


IMPORT_HOOK = '''"""Tiny package: the import fallback ltx_kernels' __init__.py uses."""
try:
    from . import _ops
except ImportError as _error:
    from ._jit import install_ops_module

    install_ops_module(__name__, cause=_error)
from ._ops import ops
'''


def make_tiny_tree(root: Path) -> Path:
    """A source tree with one CUDA kernel and a binding that registers a CPU op."""
    (root / "kernel_src").mkdir(parents=True)
    (root / "torch-ext" / "tiny").mkdir(parents=True)
    (root / "build.toml").write_text(textwrap.dedent("""\
        [general]
        name = "tiny"
        version = 1
        edition = 5
        license = "Apache-2.0"
        backends = ["cuda"]

        [torch]
        src = ["torch-ext/binding.cpp"]

        [kernel.noop]
        backend = "cuda"
        depends = ["torch"]
        cuda-capabilities = ["9.0"]
        src = ["kernel_src/noop.cu"]
        """))
    (root / "kernel_src" / "noop.cu").write_text("__global__ void noop(int* x) { *x = 1; }\n")
    (root / "torch-ext" / "binding.cpp").write_text(textwrap.dedent("""\
        #include <torch/library.h>
        #include "registration.h"
        int64_t add_one(int64_t x) { return x + 1; }
        TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) { ops.def("add_one(int x) -> int", &add_one); }
        REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
        """))
    shutil.copy(ROOT / "torch-ext/ltx_kernels/_jit.py", root / "torch-ext/tiny/_jit.py")
    (root / "torch-ext/tiny/__init__.py").write_text(IMPORT_HOOK)
    return root


def import_tiny(root: Path, cache: Path, **env: str) -> subprocess.CompletedProcess:
    code = "import time; t = time.time(); import tiny; print(tiny.ops.add_one(41), round(time.time() - t, 2))"
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "torch-ext"), "LTX_KERNELS_CACHE_DIR": str(cache),
                               **env})


def test_tiny_source_tree_compiles_on_first_import_and_is_reused(tmp_path):
    try:
        jit.find_toolchain()
    except ImportError as e:
        pytest.skip(f"no CUDA toolkit here: {e}")
    root, cache = make_tiny_tree(tmp_path / "tree"), tmp_path / "cache"
    first = import_tiny(root, cache)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split()[0] == "42" and "compiling the CUDA kernels" in first.stderr
    assert (cache / "ltx_kernels" / "ltx_kernels.so").is_file()
    second = import_tiny(root, cache, LTX_KERNELS_NO_COMPILE="1")
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[0] == "42" and "compiling" not in second.stderr
    (root / "kernel_src" / "noop.cu").write_text("__global__ void noop(int* x) { *x = 2; }\n")
    refused = import_tiny(root, cache, LTX_KERNELS_NO_COMPILE="1")
    assert refused.returncode != 0 and "KernelNotCompiledError" in refused.stderr


def test_package_init_falls_back_to_compile_on_first_use():
    """The lines of IMPORT_HOOK are in ltx_kernels/__init__.py, before any
    submodule that imports _ops."""
    init = (ROOT / "torch-ext/ltx_kernels/__init__.py").read_text()
    assert "install_ops_module(__name__, cause=" in init
    assert init.index("install_ops_module(__name__") < init.index("from . import layers")


@slow
def test_whole_package_compiles_from_the_source_tree_and_loads(tmp_path):
    root = copy_sources(tmp_path / "src")
    (root / "torch-ext" / "registration.h").unlink(missing_ok=True)  # as in a fresh clone
    (root / "torch-ext" / "ltx_kernels" / "_ops.py").unlink(missing_ok=True)
    code = ("import ltx_kernels, ltx_kernels.info as i; info = i.kernel_info(); "
            "print(info.variant); print(len(info.ops))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "torch-ext"),
                               "LTX_KERNELS_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "source tree (compiled on first use)"
    assert int(proc.stdout.splitlines()[1]) >= 20
