"""build.toml: kernels' own parser accepts it, ltx_build's schema check finds
nothing wrong with it and fires on each broken copy, every listed source
exists and every CUDA source is listed, and the values this project relies
on (name, version, sm_90, the torch binding sources) are what they should be.
CPU only.

Validity for the Nix build: `kernels._rust.Build` (the kernels 0.17.2 wheel)
is kernel-builder's own edition-5 parser (kernels-data), and every key the
file uses is one that kernels-data/src/config/v5.rs declares at the pinned
kernel-builder revision (flake.lock), which denies unknown fields."""

from __future__ import annotations

import copy
import shutil
import tomllib
from pathlib import Path

import pytest

from ltx_build import BuildError, config

from .conftest import ROOT

RAW = tomllib.loads((ROOT / "build.toml").read_text())
KERNELS = RAW.get("kernel", {})


def _first_kernel(data: dict) -> dict:
    return next(iter(data["kernel"].values()))


def test_build_toml_is_accepted_by_kernels_rust_parser():
    # the check that build.toml parses as kernel-builder parses it (kernels-data, edition 5)
    import kernels._rust as kr

    build = kr.Build.open(ROOT)
    assert [str(b) for b in build.general.backends] == ["cuda"]


# kernels-data/src/config/v5.rs at the pinned kernel-builder revision (8ac69fc): the keys each
# table accepts (serde deny_unknown_fields, kebab-case), for a torch kernel with CUDA kernels.
PINNED_V5_KEYS = {
    "": {"general", "torch", "torch-noarch", "tvm-ffi", "kernel"},
    "general": {"name", "version", "edition", "license", "upstream", "source", "backends", "cuda", "hub",
                "kernel-depends", "neuron", "python-depends", "tpu", "xpu"},
    "general.cuda": {"minver", "maxver", "kernel-depends", "python-depends"},
    "general.hub": {"repo-id", "branch"},
    "torch": {"include", "minver", "maxver", "pyext", "src", "stable-abi", "cxx-flags"},
    "kernel.*": {"backend", "cuda-capabilities", "cuda-flags", "cuda-minver", "cxx-flags", "depends", "include",
                 "src"},  # the `cuda` variant of the Kernel enum
}
PINNED_V5_BACKENDS = {"cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu"}
PINNED_DEPENDENCIES = {"torch", "cutlass_2_10", "cutlass_3_5", "cutlass_3_6", "cutlass_3_8", "cutlass_3_9",
                       "cutlass_4_0", "cutlass_4_4", "cutlass_4_5", "sycl_tla", "metal-cpp"}  # config/deps.rs
PINNED_CUDA_ARCHS = {"7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "11.0", "12.0"}


def used_keys(data: dict) -> dict[str, set[str]]:
    """The keys build.toml uses, per table of PINNED_V5_KEYS."""
    used = {"": set(data), "general": set(data["general"]), "torch": set(data.get("torch", {})),
            "kernel.*": {key for k in data.get("kernel", {}).values() for key in k}}
    for sub in ("cuda", "hub"):
        if isinstance(data["general"].get(sub), dict):
            used[f"general.{sub}"] = set(data["general"][sub])
    return used


def test_every_key_is_declared_by_the_pinned_kernel_builder():
    for table, keys in used_keys(RAW).items():
        assert keys <= PINNED_V5_KEYS[table], (table, keys - PINNED_V5_KEYS[table])
    assert set(RAW["general"]["backends"]) <= PINNED_V5_BACKENDS
    for name, k in KERNELS.items():
        assert k["backend"] in PINNED_V5_BACKENDS and set(k["depends"]) <= PINNED_DEPENDENCIES, name
        # kernel-builder intersects these with its supported archs; one it lacks would be dropped
        assert set(k["cuda-capabilities"]) <= PINNED_CUDA_ARCHS, name


def test_the_key_check_reports_a_key_the_pinned_schema_lacks():
    data = copy.deepcopy(RAW)
    _first_kernel(data)["cuda-flagz"] = ["-O3"]
    data["general"]["hub"]["org"] = "x"
    bad = {t: keys - PINNED_V5_KEYS[t] for t, keys in used_keys(data).items() if keys - PINNED_V5_KEYS[t]}
    assert bad == {"kernel.*": {"cuda-flagz"}, "general.hub": {"org"}}


def test_build_toml_has_no_schema_errors():
    assert config.schema_errors(RAW) == []


def test_config_load_reads_the_real_file():
    cfg = config.load(ROOT)
    assert cfg.name == "ltx-kernels"
    assert cfg.python_name == "ltx_kernels"
    assert cfg.capabilities == ["9.0"]
    assert [k.name for k in cfg.kernels] == list(KERNELS)


# (id, mutation of a deep copy of the parsed file, substring of the one error expected)
def _set_general(key, value):
    def mutate(d):
        d["general"][key] = value
    return mutate


def _del_general(key):
    def mutate(d):
        del d["general"][key]
    return mutate


def _set_kernel(key, value):
    def mutate(d):
        _first_kernel(d)[key] = value
    return mutate


def _del_kernel(key):
    def mutate(d):
        del _first_kernel(d)[key]
    return mutate


BROKEN = [
    ("name-with-underscore", _set_general("name", "ltx_kernels"), "dashes, not underscores"),
    ("edition-4", _set_general("edition", 4), "edition must be 5, got 4"),
    ("missing-license", _del_general("license"), "license is required"),
    ("missing-version", _del_general("version"), "version must be an integer"),
    ("unknown-backend", _set_general("backends", ["cuda", "tpu2"]), "unknown backend 'tpu2'"),
    ("unknown-general-key", _set_general("universal", True), "[general] has unknown key 'universal'"),
    ("unknown-kernel-key", _set_kernel("cuda-flagz", ["-O3"]), "has unknown key 'cuda-flagz'"),
    ("kernel-backend-not-in-backends", _set_kernel("backend", "rocm"),
     "backend 'rocm' is not one of [general] backends"),
    ("missing-depends", _del_kernel("depends"), "depends is required"),
    ("empty-src", _set_kernel("src", []), "src must not be empty"),
    ("malformed-capability", _set_kernel("cuda-capabilities", ["sm90"]), "cuda-capabilities has malformed 'sm90'"),
]


@pytest.mark.parametrize("mutate, expected", [pytest.param(m, e, id=i) for i, m, e in BROKEN])
def test_schema_check_reports_exactly_the_broken_rule(mutate, expected):
    data = copy.deepcopy(RAW)
    mutate(data)
    errors = config.schema_errors(data)
    assert len(errors) == 1 and expected in errors[0], errors


def test_schema_check_reports_every_broken_rule_at_once():
    data = copy.deepcopy(RAW)
    for _, mutate, _ in BROKEN:
        mutate(data)
    errors = "\n".join(config.schema_errors(data))
    for i, _, expected in BROKEN:
        assert expected in errors, i


def test_schema_check_rejects_a_file_without_general():
    assert config.schema_errors({"torch": {}}) == ["[general] section is missing"]


def test_config_load_refuses_a_broken_file_naming_the_rule(tmp_path):
    text = (ROOT / "build.toml").read_text().replace('name = "ltx-kernels"', 'name = "ltx_kernels"', 1)
    (tmp_path / "build.toml").write_text(text)
    with pytest.raises(BuildError, match="dashes, not underscores"):
        config.load(tmp_path)


# The same breakages as text edits: kernels' own parser rejects them too, so
# ltx_build is not stricter than kernel-builder there. (A malformed capability
# like "sm90" is the exception: kernel-builder silently drops unknown archs,
# huggingface/kernels#720; ltx_build refuses it.)
TEXT_BROKEN = [
    ("name-with-underscore", 'name = "ltx-kernels"', 'name = "ltx_kernels"', "Invalid kernel name"),
    ("edition-4", "edition = 5", "edition = 4", "edition 4"),
    ("missing-license", 'license = "Apache-2.0"\n', "", "license"),
    ("missing-version", "version = 1\n", "", "version"),
    ("unknown-backend", 'backends = ["cuda"]', 'backends = ["cuda", "tpu2"]', "tpu2"),
    ("unknown-general-key", "edition = 5\n", "edition = 5\nuniversal = true\n", "universal"),
    ("missing-depends", 'depends = ["torch"]\n', "", "depends"),
]


@pytest.mark.parametrize("old, new, message", [pytest.param(o, n, m, id=i) for i, o, n, m in TEXT_BROKEN])
def test_kernels_rust_parser_rejects_the_same_breakage(tmp_path, old, new, message):
    import kernels._rust as kr

    text = (ROOT / "build.toml").read_text()
    assert old in text, f"build.toml no longer contains {old!r}: update this test"
    (tmp_path / "build.toml").write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match=message):
        kr.Build.open(tmp_path)
    assert config.schema_errors(tomllib.loads(text.replace(old, new, 1))) != []


@pytest.fixture
def repo_copy(tmp_path) -> Path:
    """build.toml, kernel_src/ and torch-ext/ of this checkout, in a tmp dir."""
    shutil.copy2(ROOT / "build.toml", tmp_path / "build.toml")
    for d in ("kernel_src", "torch-ext"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_every_listed_source_exists_and_every_cu_is_listed():
    assert config.source_errors(config.load(ROOT)) == []


def test_source_check_passes_on_a_copy_of_the_repo(repo_copy):
    assert config.source_errors(config.load(repo_copy)) == []


def test_source_check_reports_a_missing_listed_source(repo_copy):
    cfg = config.load(repo_copy)
    listed = next(s for s in cfg.kernels[0].src if s.endswith(".cu"))
    (repo_copy / listed).unlink()
    assert config.source_errors(cfg) == [f"listed source '{listed}' does not exist"]


def test_source_check_reports_a_missing_torch_binding_source(repo_copy):
    (repo_copy / "torch-ext" / "torch_binding.h").unlink()
    errors = config.source_errors(config.load(repo_copy))
    assert errors == ["listed source 'torch-ext/torch_binding.h' does not exist"]


@pytest.mark.parametrize("rel", ["kernel_src/unlisted.cu", "kernel_src/sub/deeper.cu"])
def test_source_check_reports_an_unlisted_cu(repo_copy, rel):
    (repo_copy / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo_copy / rel).write_text("__global__ void k() {}\n")
    errors = config.source_errors(config.load(repo_copy))
    assert errors == [f"'{rel}' is not listed in any [kernel.*] src of build.toml"]


def test_build_refuses_a_repo_with_source_errors(repo_copy):
    from ltx_build.build import build

    (repo_copy / "kernel_src" / "unlisted.cu").write_text("")
    with pytest.raises(BuildError, match="unlisted.cu"):
        build(repo_copy)


def test_there_is_at_least_one_kernel_section():
    assert KERNELS, "build.toml has no [kernel.*] section"


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_section_targets_sm90_cuda_with_torch(name):
    k = KERNELS[name]
    assert k["cuda-capabilities"] == ["9.0"]
    assert k["backend"] == "cuda"
    assert k["depends"] == ["torch"]


def test_general_section():
    g = RAW["general"]
    assert g["name"] == "ltx-kernels"
    assert g["version"] == 1
    assert g["edition"] == 5
    assert isinstance(g.get("license"), str) and g["license"]
    assert g["backends"] == ["cuda"]
    assert isinstance(g.get("hub", {}).get("repo-id"), str) and g["hub"]["repo-id"]


def test_torch_section_lists_the_binding_sources():
    src = RAW["torch"]["src"]
    assert "torch-ext/torch_binding.cpp" in src
    assert "torch-ext/torch_binding.h" in src
