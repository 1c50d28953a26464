"""The rebuild key and compile on first use (ltx_build/jit.py), on a tiny
source tree laid out as the repository is (kernel_src/<family>/, a relative
include of ../common/, a binding including torch's headers): cache location and
environment variables, what rebuilds what, checksum failures, the file lock
between processes, the no-compile switch, and a real compile-and-load through
kernels of the release and dev flavours side by side.

Most tests drive the builder with stand-in compilers and a stand-in torch, so
they take milliseconds; `test_tiny_tree_compiles_on_first_use_...` runs nvcc
and the host compiler for real (~20 s). Compiling the whole package takes
minutes on two cores: LTX_KERNELS_SLOW_TESTS=1 runs that one too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ltx_build import build, checks, jit, toolchain, variant

ROOT = Path(__file__).resolve().parent.parent

slow = pytest.mark.skipif(os.environ.get("LTX_KERNELS_SLOW_TESTS") != "1",
                          reason="compiles the whole package (minutes); set LTX_KERNELS_SLOW_TESTS=1")

TINY_BUILD_TOML = """\
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
src = ["kernel_src/common/common.cuh", "kernel_src/noop/noop.cu"]
"""

TINY_BINDING = """\
#include <torch/library.h>
#include "registration.h"
int64_t add_one(int64_t x) { return x + 1; }
TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("add_one(int x) -> int", &add_one);
#ifdef LTX_KERNELS_DEV
  ops.def("probe() -> int", []() -> int64_t { return 7; });
#endif
}
REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""


def make_tiny_tree(root: Path) -> Path:
    """One CUDA kernel including ../common/common.cuh, and a binding that
    registers a CPU op (and a probe op in dev builds)."""
    files = {
        "build.toml": TINY_BUILD_TOML,
        "kernel_src/common/common.cuh": "#pragma once\n#define VALUE 1\n",
        "kernel_src/noop/noop.cu": '#include "../common/common.cuh"\n__global__ void noop(int* x) { *x = VALUE; }\n',
        "torch-ext/binding.cpp": TINY_BINDING,
        "torch-ext/tiny/__init__.py": "from ._ops import add_op_namespace_prefix, ops\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# --------------------------------------------------------------------------- stand-in compilers

FAKE_COMPILER = '''\
"""Stand-in for nvcc and c++: --version; compile -c SRC -o OUT -MF DEP, writing
the depfile a compiler would (quoted and <> includes found on -I); link -o OUT."""
import hashlib, os, re, sys, time
from pathlib import Path

args = sys.argv[1:]
if args == ["--version"]:
    sys.exit(print(VERSION))
if args[0].startswith("-print-file-name="):
    sys.exit(print(__file__))  # a shared libstdc++ "exists": no override
with open(Path(__file__).with_name("calls.log"), "a") as f:
    f.write(" ".join(args) + "\\n")
time.sleep(float(os.environ.get("FAKE_COMPILER_SECONDS", "0")))
out = Path(args[args.index("-o") + 1])
if "-c" in args:
    dirs = [Path(a[2:]) for a in args if a.startswith("-I")]
    seen, todo = [], [Path(args[args.index("-c") + 1]).resolve()]
    while todo:
        current = todo.pop()
        seen.append(current)
        for kind, name in re.findall(r'#include\\s*([<"])([^>"]+)', current.read_text()):
            found = [(d / name).resolve() for d in ([current.parent] if kind == '"' else []) + dirs
                     if (d / name).is_file()]
            if found and found[0] not in seen + todo:
                todo.append(found[0])
    Path(args[args.index("-MF") + 1]).write_text(f"{out}: " + " \\\\\\n  ".join(map(str, seen)) + "\\n")
    out.write_text(hashlib.sha256(" ".join(args).encode() + b"".join(p.read_bytes() for p in seen)).hexdigest())
else:
    out.write_bytes(b"ELF" + b"".join(Path(a).read_bytes() for a in args if a.endswith(".o")) * 10)
'''


@dataclass
class Fakes:
    """A tiny tree with stand-in compilers and torch, and a cache dir."""

    root: Path
    cache: Path
    torch: variant.Torch
    tc: toolchain.Toolchain

    @property
    def calls(self) -> list[str]:
        log = self.tc.nvcc.with_name("calls.log")
        return log.read_text().splitlines() if log.is_file() else []

    def compiled(self) -> list[str]:
        """What each compiler call made (the output file names), then forget the calls."""
        made = [Path(c.split(" -o ")[1].split()[0]).name for c in self.calls]
        self.tc.nvcc.with_name("calls.log").unlink(missing_ok=True)
        return made

    def build(self, log: list[str] | None = None, env: dict[str, str] | None = None, **kw) -> build.Plan:
        env = {"LTX_KERNELS_CACHE_DIR": str(self.cache), **(env or {})}
        kw = {"torch": self.torch, "tc": self.tc, **kw}
        with jit.cached_build(self.root, env=env, log=(log if log is not None else []).append, **kw) as plan:
            return plan


def write_fake_compiler(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nVERSION = {version!r}\n{FAKE_COMPILER}")
    path.chmod(0o755)
    return path


@pytest.fixture
def fakes(tmp_path) -> Fakes:
    torch_dir = tmp_path / "torch"
    (torch_dir / "include" / "torch").mkdir(parents=True)
    (torch_dir / "include" / "torch" / "library.h").write_text("#pragma once\n// torch 2.14.1\n")
    bin_dir = tmp_path / "cuda" / "bin"
    nvcc = write_fake_compiler(bin_dir / "nvcc", "Cuda compilation tools, release 13.0, V13.0.88")
    cxx = write_fake_compiler(bin_dir / "c++", "c++ (fake) 12.2.0")
    tc = toolchain.Toolchain(tmp_path / "cuda", nvcc, "13.0", str(cxx), "c++ (fake) 12.2.0", "V13.0.88")
    torch = variant.Torch("2.14.1+cu130", "13.0", True, torch_dir, "abc123")
    return Fakes(make_tiny_tree(tmp_path / "tree"), tmp_path / "cache", torch, tc)


# --------------------------------------------------------------------------- environment


def test_cache_dir_prefers_ltx_variable_then_its_alias_then_torch_extensions_dir():
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


# --------------------------------------------------------------------------- the cache


def test_first_use_builds_a_loadable_variant_into_the_cache_then_reuses_it_silently(fakes):
    messages: list[str] = []
    plan = fakes.build(messages)
    variant_dir = fakes.cache / "tiny" / "build" / fakes.torch.variant
    assert plan.variant_dir == variant_dir and plan.out_dir == fakes.cache / "tiny"
    assert sorted(p.name for p in variant_dir.iterdir()) == [
        "__init__.py", "_ops.py", "_tiny_cuda_jit.abi3.so", "metadata.json"]
    assert sorted(fakes.compiled()) == ["_tiny_cuda_jit.abi3.so", "kernel_src__noop__noop.cu.o",
                                        "torch-ext__binding.cpp._tiny_cuda_jit.o"]
    assert "compiling tiny on first use (nvcc kernel_src/noop/noop.cu: not built yet)" in messages[0]
    assert any(m.startswith("[3/3] link _tiny_cuda_jit.abi3.so ") for m in messages)
    again: list[str] = []
    fakes.build(again)
    assert fakes.compiled() == [] and again == []


def test_every_install_writes_a_digest_that_kernels_accepts(fakes):
    plan = fakes.build()
    assert checks.digest_mismatch(plan.variant_dir) == []
    (fakes.root / "torch-ext" / "tiny" / "__init__.py").write_text("# changed: installed, nothing compiles\n")
    fakes.compiled()
    fakes.build()
    assert fakes.compiled() == [] and "changed" in (plan.variant_dir / "__init__.py").read_text()
    assert checks.digest_mismatch(plan.variant_dir) == []


def test_dev_flavour_has_its_own_directory_and_namespace_in_the_cache(fakes):
    fakes.build()
    fakes.compiled()
    plan = fakes.build(dev=True)
    assert plan.variant_dir == fakes.cache / "tiny" / "_build" / "dev" / "build" / fakes.torch.variant
    assert plan.ops_name == "_tiny_cuda_jit_dev"
    compiles = [c for c in fakes.calls if " -c " in c]
    assert len(compiles) == 2 and all(build.DEV_DEFINE in c.split() for c in compiles)
    assert (fakes.cache / "tiny" / "build" / fakes.torch.variant / "_tiny_cuda_jit.abi3.so").is_file()


@pytest.mark.parametrize("edit, rebuilt, reason", [
    # a header reached through a relative include from kernel_src/noop/
    (lambda f: f.root / "kernel_src/common/common.cuh", ["kernel_src__noop__noop.cu.o"], "common/common.cuh changed"),
    (lambda f: f.torch.dir / "include/torch/library.h", ["torch-ext__binding.cpp._tiny_cuda_jit.o"],
     "torch/library.h changed"),
    (lambda f: f.root / "torch-ext/binding.cpp", ["torch-ext__binding.cpp._tiny_cuda_jit.o"], "binding.cpp changed"),
])
def test_an_edited_file_recompiles_the_objects_that_include_it_then_relinks(fakes, edit, rebuilt, reason):
    fakes.build()
    fakes.compiled()
    with open(edit(fakes), "a") as f:
        f.write("// edited\n")
    messages: list[str] = []
    fakes.build(messages)
    assert fakes.compiled() == [*rebuilt, "_tiny_cuda_jit.abi3.so"]
    assert reason in messages[0]


@pytest.mark.parametrize("change, reason", [
    (lambda f: {"torch": replace(f.torch, version="2.14.2+cu130")}, "toolchain changed (now torch 2.14.2+cu130"),
    (lambda f: {"torch": replace(f.torch, git_version="def456")}, "(now torch 2.14.1+cu130 (git def456"),
    (lambda f: {"tc": replace(f.tc, nvcc_build="V13.0.89")}, "toolchain changed (now nvcc V13.0.89"),
    (lambda f: {"tc": replace(f.tc, cxx_version="c++ (fake) 12.3.0")}, "toolchain changed (now c++ c++ (fake) 12.3.0"),
])
def test_a_new_torch_or_compiler_version_rebuilds_every_step(fakes, change, reason):
    fakes.build()
    fakes.compiled()
    messages: list[str] = []
    fakes.build(messages, **change(fakes))
    assert len(fakes.compiled()) == 3
    assert reason in messages[0]


def test_a_new_flag_recompiles_and_names_it(fakes):
    fakes.build()
    fakes.compiled()
    messages: list[str] = []
    fakes.build(messages, env={"CXXFLAGS": "-DEXTRA=1"})
    assert fakes.compiled() == ["torch-ext__binding.cpp._tiny_cuda_jit.o", "_tiny_cuda_jit.abi3.so"]
    assert "command changed (+-DEXTRA=1)" in messages[0]


@pytest.mark.parametrize("damage", [
    lambda data: data[:100],  # truncated
    lambda data: data[:10] + bytes([data[10] ^ 0xFF]) + data[11:],  # modified, same size
])
def test_a_damaged_library_is_relinked_and_its_installed_copy_replaced(fakes, damage):
    plan = fakes.build()
    fakes.compiled()
    linked, installed = plan.link.output, plan.variant_dir / plan.link.output.name
    good = linked.read_bytes()
    linked.write_bytes(damage(good))
    installed.write_bytes(damage(good))
    messages: list[str] = []
    fakes.build(messages)
    assert fakes.compiled() == ["_tiny_cuda_jit.abi3.so"]
    assert "does not match its recorded SHA-256 (truncated or modified)" in messages[0]
    assert linked.read_bytes() == installed.read_bytes() == good


def test_a_missing_record_means_rebuild(fakes):
    plan = fakes.build()
    fakes.compiled()
    plan.steps[0].record.unlink()
    fakes.build()
    assert fakes.compiled() == ["kernel_src__noop__noop.cu.o"]  # the same object again: nothing to relink


def test_records_check_with_sha256sum(fakes):
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum")
    plan = fakes.build()
    for step in [*plan.steps, plan.link]:
        proc = subprocess.run(["sha256sum", "-c", step.record.name], cwd=step.record.parent, capture_output=True,
                              text=True)
        assert proc.returncode == 0 and proc.stdout == f"{step.output.name}: OK\n", proc.stdout + proc.stderr


@pytest.mark.parametrize("switch", ["LTX_KERNELS_NO_COMPILE", "RUNWARE_LTX_NO_COMPILE_KERNELS"])
def test_no_compile_uses_a_fresh_cache_and_refuses_a_stale_one(fakes, switch):
    with pytest.raises(jit.KernelNotCompiledError) as e:
        fakes.build(env={switch: "1"})
    assert "not built yet" in str(e.value) and "LTX_KERNELS_NO_COMPILE is set" in str(e.value)
    assert "RUNWARE" not in str(e.value) and "ltx-build jit" in str(e.value)
    fakes.build()
    fakes.compiled()
    fakes.build(env={switch: "1"})
    (fakes.root / "kernel_src/noop/noop.cu").write_text("__global__ void noop(int* x) { *x = 2; }\n")
    with pytest.raises(jit.KernelNotCompiledError, match="kernel_src/noop/noop.cu changed"):
        fakes.build(env={switch: "1"})
    assert fakes.compiled() == []


CONCURRENT_BUILDER = """
import sys, time
from pathlib import Path
from ltx_build import jit, toolchain, variant
root, cache, torch_dir, nvcc, cxx, start = sys.argv[1:]
tc = toolchain.Toolchain(Path(nvcc).parent.parent, Path(nvcc), "13.0", cxx, "c++ (fake) 12.2.0", "V13.0.88")
torch = variant.Torch("2.14.1+cu130", "13.0", True, Path(torch_dir), "abc123")
while time.time() < float(start):
    time.sleep(0.01)
with jit.cached_build(Path(root), env={"LTX_KERNELS_CACHE_DIR": cache}, torch=torch, tc=tc,
                      log=lambda m: None) as plan:
    print(len(plan.link.output.read_bytes()), plan.problem())
"""


def test_two_processes_building_at_once_compile_once_and_both_get_the_whole_library(fakes):
    start = time.time() + 1.0
    env = {**os.environ, "FAKE_COMPILER_SECONDS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_BUILDER, str(fakes.root), str(fakes.cache),
                               str(fakes.torch.dir), str(fakes.tc.nvcc), fakes.tc.cxx, str(start)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len(fakes.compiled()) == 3  # not 6
    assert outputs[0][0] == outputs[1][0] and outputs[0][0].split()[1] == "None", outputs


# --------------------------------------------------------------------------- the same build as `ltx-build build`


def test_jit_plan_is_the_release_plan_in_another_directory_and_namespace(tmp_path):
    release = build.make_plan(ROOT)
    cached = build.make_plan(ROOT, base=tmp_path, uid=jit.UID)

    def normalised(plan: build.Plan) -> list[list[str]]:
        swap = {str(plan.link.output.parent): "<objects>", plan.ops_name: "<ns>"}
        out = []
        for step in [*plan.steps, plan.link]:
            words = []
            for word in step.command:
                for old, new in swap.items():
                    word = word.replace(old, new)
                words.append(word)
            out.append(words)
        return out

    assert normalised(cached) == normalised(release)
    assert cached.fingerprint == release.fingerprint
    assert cached.ops_name == "_ltx_kernels_cuda_jit" and cached.variant_dir == tmp_path / "build" / release.variant


# --------------------------------------------------------------------------- real compilers


LOAD_TINY = """
import sys
from pathlib import Path
from ltx_build import jit
tiny = jit.load_kernel(Path(sys.argv[1]))
print(tiny.__name__, tiny.ops.add_one(41), hasattr(tiny.ops, "probe"))
if len(sys.argv) > 2:  # the dev flavour beside it, in the same process
    dev = jit.load_kernel(Path(sys.argv[1]), dev=True)
    print(dev.__name__, dev.ops.add_one(1), dev.ops.probe())
"""


def load_tiny(root: Path, cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD_TINY, str(root), *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "LTX_KERNELS_CACHE_DIR": str(cache), **env})


def test_tiny_tree_compiles_on_first_use_loads_through_kernels_beside_its_dev_flavour_and_is_reused(tmp_path):
    try:
        toolchain.detect(variant.Torch.installed().cuda)
    except Exception as e:  # noqa: BLE001 - any missing piece of the toolchain
        pytest.skip(f"no CUDA toolkit or torch here: {e}")
    root, cache = make_tiny_tree(tmp_path / "tree"), tmp_path / "cache"
    first = load_tiny(root, cache, "dev")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["_tiny_cuda_jit 42 False", "_tiny_cuda_jit_dev 2 7"]
    assert first.stderr.count("compiling tiny on first use") == 2
    records = cache / "tiny" / "_build" / variant.current_variant()
    assert f"{root}/kernel_src/common/common.cuh" in (records / "kernel_src__noop__noop.cu.o.sha256").read_text()
    assert "/torch/include/torch/library.h" in (records / "torch-ext__binding.cpp._tiny_cuda_jit.o.sha256").read_text()

    second = load_tiny(root, cache, LTX_KERNELS_NO_COMPILE="1")
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[1] == "42" and "compiling" not in second.stderr
    with open(root / "kernel_src/common/common.cuh", "a") as f:
        f.write("#define UNUSED 2\n")
    refused = load_tiny(root, cache, LTX_KERNELS_NO_COMPILE="1")
    assert refused.returncode != 0 and "KernelNotCompiledError" in refused.stderr
    assert "kernel_src/common/common.cuh changed" in refused.stderr


@slow
def test_whole_package_compiles_on_first_use_and_loads(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(ROOT / "build.toml", root / "build.toml")
    shutil.copytree(ROOT / "kernel_src", root / "kernel_src")
    shutil.copytree(ROOT / "torch-ext", root / "torch-ext", ignore=shutil.ignore_patterns(
        "__pycache__", "registration.h", "_ops.py"))  # as in a fresh clone
    code = ("import sys; from pathlib import Path; from ltx_build import jit; "
            "import importlib; m = jit.load_kernel(Path(sys.argv[1])); "
            "info = importlib.import_module(m.__name__ + '.info').kernel_info(); print(m.__name__, len(info.ops))")
    proc = subprocess.run([sys.executable, "-c", code, str(root)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "LTX_KERNELS_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, ops = proc.stdout.split()
    assert name == "_ltx_kernels_cuda_jit" and int(ops) >= 20
