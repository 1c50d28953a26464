"""metadata.json and the build/<variant>/ layout against kernel-builder's: the
digest that `kernels` checks (through its own verify_variant), the provenance
kernels reads, and a field-by-field comparison with what the pinned
kernel-builder (huggingface/kernels 8ac69fc542a4306eade0759ef7c45b4f2ae57df0)
writes. No compiling: variants are assembled from this checkout's package
and a stand-in shared object (tests/bundle_support.py)."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ltx_build import config, layout, variant

from .bundle_support import NIX_PROVENANCE, assemble, checkout_copy

KERNEL_BUILDER = Path(__file__).parent / "data" / "kernel_builder"  # verbatim templates, see its README.md
OPS = "_ltx_kernels_cuda_abcdef0"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A committed copy of this checkout's package."""
    root = checkout_copy(tmp_path)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "kernel")
    return root


@pytest.fixture
def kernels_verify(monkeypatch):
    """kernels.verify.verify_variant with only its signature step passed: these
    bundles are unsigned, and what follows that step is kernels' digest check."""
    import kernels.verify as kv

    monkeypatch.setattr(kv, "Bundle", SimpleNamespace(from_json=lambda data: None))
    monkeypatch.setattr(kv, "Verifier", SimpleNamespace(
        production=lambda: SimpleNamespace(verify_artifact=lambda *args, **kwargs: None)))

    def verify(variant_dir: Path):
        (variant_dir / "metadata.json.sigstore").write_text("{}")  # never hashed (digest.rs lines 100-102)
        return kv.verify_variant(variant_dir, policies=[])

    return verify


# --------------------------------------------------------------------------- digest


def test_an_assembled_variant_passes_the_digest_check_of_kernels(repo, kernels_verify):
    from kernels.verify import VerificationResult

    variant_dir = assemble(repo, git=variant.git_state(repo))
    (variant_dir / "__pycache__").mkdir()
    (variant_dir / "__pycache__" / "rmsnorm.cpython-311.pyc").write_bytes(b"written when it is imported")
    assert kernels_verify(variant_dir) == VerificationResult.Success()


@pytest.mark.parametrize("target", ["rmsnorm.py", f"{OPS}.abi3.so"])
def test_one_changed_byte_fails_the_digest_check_of_kernels(repo, tmp_path, kernels_verify, target):
    from kernels._rust import DigestViolation
    from kernels.verify import VerificationResult

    copy = tmp_path / "copy"
    shutil.copytree(assemble(repo), copy)
    data = bytearray((copy / target).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / target).write_bytes(bytes(data))
    result = kernels_verify(copy)
    assert isinstance(result, VerificationResult.DigestVerificationFailure)
    [violation] = result.violations
    assert isinstance(violation, DigestViolation.HashMismatch) and violation.path == target


def test_an_added_file_fails_the_digest_check_of_kernels(repo, kernels_verify):
    from kernels._rust import DigestViolation

    variant_dir = assemble(repo)
    (variant_dir / "extra.py").write_text("")
    [violation] = kernels_verify(variant_dir).violations
    assert isinstance(violation, DigestViolation.UnknownFile) and violation.path == "extra.py"


def test_reinstalling_after_a_change_rewrites_the_digest(repo, kernels_verify):
    from kernels.verify import VerificationResult

    assemble(repo)
    (repo / "torch-ext" / "ltx_kernels" / "rope.py").write_text("# changed\n")
    assert kernels_verify(assemble(repo)) == VerificationResult.Success()


# --------------------------------------------------------------------------- provenance


def test_provenance_records_the_kernel_commit_and_dirty_flag_and_no_kernel_builder(repo):
    from kernels._rust import Metadata

    head = git(repo, "rev-parse", "HEAD")
    clean = Metadata.read_from_file(assemble(repo, git=variant.git_state(repo)) / "metadata.json").provenance
    assert (clean.kernel.commit, clean.kernel.dirty, clean.dirty) == (head, False, False)
    assert clean.kernel_builder.version == layout.NO_KERNEL_BUILDER and clean.kernel_builder.git is None

    (repo / "build.toml").write_text((repo / "build.toml").read_text() + "\n")  # a tracked file changes
    dirty = Metadata.read_from_file(assemble(repo, git=variant.git_state(repo)) / "metadata.json").provenance
    assert (dirty.kernel.commit, dirty.kernel.dirty, dirty.dirty) == (head, True, True)  # kernels warns on load


def test_provenance_outside_git_has_no_kernel_commit_and_keeps_the_marker(tmp_path):
    from kernels._rust import Metadata

    root = checkout_copy(tmp_path)
    assert variant.git_state(root) is None
    path = assemble(root, git=None) / "metadata.json"
    assert Metadata.read_from_file(path).provenance.kernel is None
    assert json.loads(path.read_text())["provenance"] == {"kernel-builder": {"version": "none"},
                                                          "builder": "ltx_build"}


# --------------------------------------------------------------------------- against kernel-builder


def upstream_digest(variant_dir: Path) -> dict:
    """`kernel-builder hash` (kernel-builder/src/hash.rs lines 17-41): sha256 of
    every file under the variant, base64 (standard alphabet, padded), keyed by
    its /-separated relative path; skipped: the top-level metadata.json and
    metadata.json.sigstore, __pycache__ and *.pyc (kernels-data/src/digest.rs
    lines 84-135)."""
    files = {}
    for p in sorted(variant_dir.rglob("*")):
        rel = p.relative_to(variant_dir)
        if not p.is_file() or rel.as_posix() in ("metadata.json", "metadata.json.sigstore") \
                or "__pycache__" in rel.parts or p.suffix == ".pyc":
            continue
        files[rel.as_posix()] = base64.b64encode(hashlib.sha256(p.read_bytes()).digest()).decode()
    return {"algorithm": "sha256", "files": files}


def upstream_metadata(cfg: config.BuildConfig, ops_name: str, archs: list[str], variant_dir: Path,
                      git_state: variant.GitState, tmp_path: Path) -> dict:
    """metadata.json as the pinned kernel-builder's Nix build leaves it, step by step."""
    # 1. create-pyproject writes metadata-cuda.json: Metadata::for_backend (kernels-data/src/metadata.rs
    #    lines 119-140; fields and the ones skipped when unset: lines 89-109). The torch framework
    #    precomputes no archs (kernels-data/src/config/mod.rs lines 93-102), kernel-depends is always
    #    written; provenance: the version baked into kernel-builder (kernel-builder/src/pyproject/common.rs
    #    lines 21-51) and the kernel commit of --kernel-sha/--kernel-dirty (kernel-builder/src/pyproject/
    #    mod.rs lines 60-74, nix-builder/lib/extension/provenance-flags.nix lines 8-10).
    for_backend = {"name": cfg.name, "id": ops_name, "version": cfg.version, "license": cfg.license,
                   "python-depends": list(cfg.python_depends), "kernel-depends": [],
                   "backend": {"type": "cuda"},
                   "provenance": {**NIX_PROVENANCE, "kernel": {"commit": git_state.commit,
                                                               "dirty": git_state.dirty}}}
    source = tmp_path / "metadata-cuda.json"
    source.write_text(json.dumps(for_backend, indent=2))
    # 2. The install target runs add_build_metadata.py with the compiled archs joined by ";"
    #    (kernel-builder/src/pyproject/templates/torch/build-variants.cmake lines 185-202).
    written = tmp_path / "metadata.json"
    subprocess.run([sys.executable, str(KERNEL_BUILDER / "add_build_metadata.py"), str(source), str(written),
                    "--archs", ";".join(archs)], check=True)
    # 3. The hash-kernel-hook (nix-builder/pkgs/hash-kernel-hook/hash-kernel-hook.sh lines 5-12) runs
    #    `kernel-builder hash`, which re-serialises the Metadata struct: digest before provenance.
    data = json.loads(written.read_text())
    provenance = data.pop("provenance")
    return {**data, "digest": upstream_digest(variant_dir), "provenance": provenance}


def normalised_ops(source: str) -> str:
    """_ops.py without docstrings and return annotations."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.returns = None
            if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                node.body = node.body[1:]
    return ast.dump(tree)


def test_layout_and_metadata_match_what_the_pinned_kernel_builder_writes(repo, tmp_path):
    pkg = repo / "torch-ext" / "ltx_kernels"
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "stubs.pyi").write_text("")  # pyi is never installed (kernels-data/src/config/mod.rs lines 267-290)
    (pkg / "table.json").write_text("{}")  # nor other data without [torch] pyext
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more files")
    state = variant.git_state(repo)
    cfg = config.load(repo)
    variant_dir = assemble(repo, git=state, ops_name=OPS)

    # Layout: add_kernels_install_target (build-variants.cmake lines 145-221) installs the library
    # (Python3_add_library USE_SABI 3 WITH_SOABI: <ops>.abi3.so, torch-extension.cmake lines 7-15) and
    # every torch-ext/<pkg>/**/*.py into build/<variant>/ itself, _ops.py generated there beside them
    # (preamble.cmake lines 293-297), and metadata.json. No <pkg>/ compat folder since kernels PR #736
    # (kernel-layout-check-hook.sh lines 32-36 forbids it), and no bytecode (remove-bytecode-hook.sh).
    expected_files = sorted([*(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")), "_ops.py",
                             f"{OPS}.abi3.so", "metadata.json"])
    assert sorted(p.relative_to(variant_dir).as_posix() for p in variant_dir.rglob("*") if p.is_file()) \
        == expected_files
    assert {"__init__.py", "sub/__init__.py"} <= set(expected_files) and not (variant_dir / "ltx_kernels").exists()
    template = (KERNEL_BUILDER / "_ops.py.in").read_text().replace("@OPS_NAME@", OPS)
    assert normalised_ops((variant_dir / "_ops.py").read_text()) == normalised_ops(template)

    # metadata.json, field by field.
    ours = json.loads((variant_dir / "metadata.json").read_text())
    theirs = upstream_metadata(cfg, OPS, cfg.capabilities, variant_dir, state, tmp_path)
    assert list(ours) == list(theirs)  # the same fields in the same order
    for field in ("name", "id", "version", "license", "python-depends", "kernel-depends", "backend", "digest"):
        assert ours[field] == theirs[field], field
    assert ours["backend"] == {"type": "cuda", "archs": ["9.0"]}
    assert set(ours["digest"]["files"]) == set(expected_files) - {"metadata.json"}
    # Provenance: the same kernel commit and flag; deliberately no kernel-builder version (none built
    # it: `version` is required, commit and dirty optional together, metadata.rs lines 27-65) and a
    # marker key that kernels' parser ignores.
    assert ours["provenance"]["kernel"] == theirs["provenance"]["kernel"]
    assert ours["provenance"]["kernel-builder"] == {"version": "none"}
    assert set(theirs["provenance"]["kernel-builder"]) == {"version", "commit", "dirty"}
    assert {k: v for k, v in ours["provenance"].items() if k != "kernel-builder"} == \
        {"kernel": theirs["provenance"]["kernel"], "builder": "ltx_build"}


def test_build_toml_upstream_source_and_dependencies_reach_metadata_as_kernel_builder_writes_them(repo):
    from kernels._rust import Metadata

    text = (repo / "build.toml").read_text().replace('license = "Apache-2.0"\n', (
        'license = "Apache-2.0"\nupstream = "https://github.com/Lightricks/LTX-Video"\n'
        'source = "https://github.com/example/ltx-kernels"\npython-depends = ["einops"]\n'
        'kernel-depends = [{ repo-id = "kernels-community/activation", version = 1 }]\n'))
    (repo / "build.toml").write_text(text)
    path = assemble(repo) / "metadata.json"
    data = json.loads(path.read_text())
    # kernels-data/src/metadata.rs lines 92-104: upstream and source after license, then the depends.
    assert list(data)[:8] == ["name", "id", "version", "license", "upstream", "source", "python-depends",
                              "kernel-depends"]
    assert data["python-depends"] == ["einops"]
    assert data["kernel-depends"] == [{"repo-id": "kernels-community/activation", "version": 1}]
    meta = Metadata.read_from_file(path)
    assert meta.upstream == "https://github.com/Lightricks/LTX-Video" and list(meta.python_depends) == ["einops"]
