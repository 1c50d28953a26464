"""What a Nix build at the pinned kernel-builder (flake.lock; docs/nix.md) does to this tree, checked
offline, one test per step that could fail it:

- the source it builds is a file set (nix-builder/lib/source-set.nix): build.toml, the [torch] and
  [kernel.*] sources, and the .py/.pyi files under torch-ext/ and tests/. Every header a source
  includes must be in it;
- `kernel-builder create-pyproject` (without --force) writes its files into that source and stops if
  one already exists (kernel-builder/src/pyproject/{torch/mod.rs,common.rs});
- kernel-layout-check and torch-ops-check (nix-builder/pkgs/*) check the Python package;
- `nix run .#ci-test` runs `pytest tests -m kernels_ci` on that source in a Python holding only torch,
  kernels and pytest (nix-builder/lib/build.nix, mkCiTests). It is emulated here: the source set is
  copied out and run with the dev tools made unimportable.

And README's variant list is the CUDA part of the pinned kernel-builder's build-variants.json."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

from . import conftest
from .conftest import BUILD_TOML, REPO_ID, ROOT, uses_kernels_ci_marker

PYTHON_NAME = BUILD_TOML["general"]["name"].replace("-", "_")
PINNED_VARIANTS = ROOT / "tools" / "ltx_build" / "pinned-build-variants.json"
BACKENDS = ("cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu")  # kernels-data Backend::all()
# What create-pyproject writes for a torch kernel at the pinned rev, and the _ops.py that CMake then
# configures into the package (templates/torch/preamble.cmake).
GENERATED = {
    "pyproject.toml", "setup.py", "CMakeLists.txt", "torch-ext/registration.h",
    *(f"cmake/{name}" for name in ("utils.cmake", "kernel.cmake", "build-variants.cmake", "add_build_metadata.py",
                                   "hipify.py", "compile-metal.cmake", "metallib_to_header.py",
                                   "get_gpu_lang.cmake", "get_gpu_lang.py", "_ops.py.in")),
    *(f"metadata-{backend}.json" for backend in BACKENDS),
    f"torch-ext/{PYTHON_NAME}/_ops.py",
}
TORCH_LIBRARY_DECORATORS = {"custom_op", "triton_op", "register_kernel", "register_fake", "register_vmap",
                            "register_torch_dispatch"}


def tracked_files(root: Path = ROOT) -> set[str]:
    """What a flake of this git checkout holds: the tracked files."""
    res = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"not a git checkout: {res.stderr.decode().strip()}")
    tracked = {p for p in res.stdout.decode().split("\0") if p}
    if any(not (root / p).exists() for p in tracked):
        # a copy whose git index is not its tree (the GPU machine's): what the flake holds is unknown
        pytest.skip("git's index lists files this tree does not have: commit (or restore) them first")
    return tracked


def nix_source_set(root: Path = ROOT) -> list[str]:
    """source-set.nix's file set over the tracked files of `root`."""
    toml = tomllib.loads((root / "build.toml").read_text())
    torch_cfg = toml.get("torch", {})
    exts = tuple("." + e for e in torch_cfg.get("pyext", ["py", "pyi"]))
    files = {"build.toml", *torch_cfg.get("src", [])}
    for kernel in toml.get("kernel", {}).values():
        files.update(kernel["src"])
    files.update(p for p in tracked_files(root) if p.startswith(("torch-ext/", "tests/")) and p.endswith(exts))
    return sorted(files)


def copy_source_set(dest: Path) -> Path:
    for rel in nix_source_set():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


# --- the source set and create-pyproject ------------------------------------------------------------

def test_every_quoted_include_of_the_sources_is_in_the_source_set():
    # ltx_build compiles in the checkout, where an unlisted header is found; Nix has only the set.
    source = set(nix_source_set())
    missing = []
    for rel in sorted(source):
        if not rel.endswith((".cu", ".cuh", ".h", ".cpp", ".hpp")):
            continue
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', (ROOT / rel).read_text(), re.M):
            target = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
            if target not in source and target not in GENERATED:
                missing.append(f"{rel}: {inc}")
    assert missing == [], "add these to a src list of build.toml"


def test_create_pyproject_finds_none_of_its_files_already_there():
    clashes = sorted(GENERATED & (tracked_files() | set(nix_source_set())))
    assert clashes == [], "kernel-builder create-pyproject refuses to overwrite these (move or untrack them)"


# --- kernel-layout-check ------------------------------------------------------------------------------

def test_package_layout_is_what_kernel_layout_check_accepts():
    package = f"torch-ext/{PYTHON_NAME}"
    source = nix_source_set()
    assert f"{package}/__init__.py" in source
    assert not any(p == f"{package}/{PYTHON_NAME}" or p.startswith(f"{package}/{PYTHON_NAME}/") for p in source)
    assert not (ROOT / package / PYTHON_NAME).exists()


# --- torch-ops-check ----------------------------------------------------------------------------------

def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def torch_ops_violations(source: str, filename: str = "<src>") -> list[str]:
    """torch-ops-check-hook.py's rule: a top-level function or class decorated with one of the
    torch.library decorators (called with arguments) must pass add_op_namespace_prefix(...) first."""
    found = []
    for node in ast.iter_child_nodes(ast.parse(source, filename=filename)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and dec.args and _called_name(dec) in TORCH_LIBRARY_DECORATORS:
                first = dec.args[0]
                if not (isinstance(first, ast.Call) and _called_name(first) == "add_op_namespace_prefix"):
                    found.append(f"{filename}:{node.lineno} {node.name}")
    return found


def test_no_torch_library_decorator_in_the_source_set_misses_the_namespace_prefix():
    # the hook checks every .py of the source, tests/ included
    violations = [v for rel in nix_source_set() if rel.endswith(".py")
                  for v in torch_ops_violations((ROOT / rel).read_text(), rel)]
    assert violations == []


@pytest.mark.parametrize("code, flagged", [
    ('@torch.library.register_fake("ns::op")\ndef f(x): ...', True),
    ('@register_kernel(f"{NS}::op", "cuda")\ndef f(x): ...', True),
    ('@torch.library.custom_op("ns::op", mutates_args=())\nclass C: ...', True),
    ('@torch.library.register_fake(add_op_namespace_prefix("op"))\ndef f(x): ...', False),
    ('@torch.library.register_fake(_ops.add_op_namespace_prefix("op"))\ndef f(x): ...', False),
    ('torch.library.register_fake("ns::op")(f)', False),  # a call, not a decorator: not checked upstream
    ('def outer():\n    @torch.library.register_fake("ns::op")\n    def f(x): ...', False),  # top level only
    ('@functools.cache\ndef f(x): ...', False),
])
def test_the_torch_ops_rule_flags_what_the_hook_flags(code, flagged):
    assert bool(torch_ops_violations(code)) == flagged


# --- ci-test ------------------------------------------------------------------------------------------

# Only these may be imported by the kernels_ci modules (and at conftest.py's top level): the Nix
# test Python has torch, kernels, pytest and the standard library.
CI_IMPORTS = {"torch", "kernels", "pytest", *sys.stdlib_module_names}
# Installed here but not in the Nix test Python.
DEV_ONLY = ("ltx_build", "ltx_dev", "ltx_kernels_diffusers", "diffusers", "transformers", "hypothesis",
            "tabulate", "liger_kernel")
NIX_PYTHON_PLUGIN = f'''
"""Loaded with `-p`: this Python then lacks what the Nix test Python lacks."""
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {DEV_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
'''


def _imports(tree: ast.AST, top_level_only: bool) -> set[str]:
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.partition(".")[0])
    return names


def ci_modules() -> list[Path]:
    return [p for p in sorted((ROOT / "tests").glob("test_*.py")) if uses_kernels_ci_marker(p)]


def test_kernels_ci_modules_import_only_what_the_nix_test_python_has():
    assert ci_modules(), "no module is marked kernels_ci: ci-test would run nothing"
    for path in ci_modules():
        assert _imports(ast.parse(path.read_text()), top_level_only=False) <= CI_IMPORTS, path.name
    # conftest.py imports ltx_build inside a try (ModuleNotFoundError), the dev tools in fixtures
    conftest = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    assert _imports(conftest, top_level_only=True) <= CI_IMPORTS


def test_no_package_module_shadows_what_the_tests_import():
    # ci-test puts the variant directory itself on PYTHONPATH, so each module of the package is
    # also importable by its bare name: none may be called like a module the tests need.
    package = ROOT / "torch-ext" / PYTHON_NAME
    names = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    assert names & (CI_IMPORTS | {"numpy", "huggingface_hub", "packaging", "yaml"}) == set()


def _ci_test_functions() -> set[str]:
    return {n.name for p in ci_modules() for n in ast.parse(p.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_ci_test_in_a_bare_python_runs_exactly_the_kernels_ci_tests(tmp_path):
    """`pytest tests -m kernels_ci -p no:cacheprovider` on a copy of the Nix source set, in this Python
    with the dev tools made unimportable: no collection error, and the tests it runs are the kernels_ci
    tests. Without a GPU they skip; with one they run against this checkout's build/ (_build/dev/ under
    --dev-build), handed over through LOCAL_KERNELS as the Nix runner hands over its build."""
    src = copy_source_set(tmp_path / "source")
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "nix_test_python.py").write_text(NIX_PYTHON_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "LOCAL_KERNELS")}
    # no plugins of installed packages (hypothesis has one): the Nix test Python has none of them
    env |= {"PYTHONPATH": str(plugin_dir), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "HF_HUB_OFFLINE": "1",
            "LOCAL_KERNELS": f"{REPO_ID}={conftest.KERNEL_ROOT}"}

    probe = subprocess.run([sys.executable, "-c", "import nix_test_python, ltx_build"], env=env, cwd=src,
                           capture_output=True, text=True)
    assert "No module named 'ltx_build'" in probe.stderr, "the plugin does not hide the dev tools"

    report = tmp_path / "report.xml"
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "nix_test_python", str(src / "tests"),
                          "-m", "kernels_ci", "-p", "no:cacheprovider", "--strict-markers", "-q",
                          f"--junitxml={report}"], env=env, cwd=src, capture_output=True, text=True)
    # (exit 5, nothing collected: is a kernels_ci module new and not yet `git add`ed? Nix sees only git's files)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {}
    for case in cases:
        kids = [c.tag for c in case if c.tag in ("skipped", "failure", "error")]
        outcomes[case.get("name")] = kids[0] if kids else "passed"
    assert {name.partition("[")[0] for name in outcomes} == _ci_test_functions()
    expected = "passed" if torch.cuda.is_available() else "skipped"
    assert set(outcomes.values()) == {expected}, outcomes


# --- README ----------------------------------------------------------------------------------------

def test_readme_lists_the_cuda_variants_of_the_pinned_kernel_builder():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Variants\n", 1)[1].split("\n## ", 1)[0]
    listed = {m[1]: re.findall(r"`(torch[^`]+)`", m[2])
              for m in re.finditer(r"^- (\S+): (.*(?:\n  .*)*)", section, re.M)}
    pinned = {system: backends["cuda"] for system, backends in json.loads(PINNED_VARIANTS.read_text()).items()
              if "cuda" in backends}
    assert listed == pinned
    # and the prose names their torch and CUDA versions and the one capability built
    for variant in (v for names in pinned.values() for v in names):
        torch_v = re.search(r"torch(\d)(\d+)-", variant).group(1, 2)
        cuda_v = re.search(r"-cu(\d+)(\d)-", variant).group(1, 2)
        assert ".".join(torch_v) in section and ".".join(cuda_v) in section, variant
    capabilities = {c for k in BUILD_TOML["kernel"].values() for c in k["cuda-capabilities"]}
    assert capabilities == {"9.0"} and "capability 9.0 only" in section
