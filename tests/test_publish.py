"""Hub publishing, offline: the card rendered from CARD.md, the upload plan
(`upload --dry-run`), the refusal of bundles not built by Nix and its
override, the calls an upload makes (against HfApi's real
signatures, with no network), and the kernels.lock round trip: `kernels
lock` against a stand-in Hub serving what the upload would publish, then
`get_locked_kernel` loading this checkout's build from the kernels cache."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from ltx_build import BuildError, card, upload, variant

from .bundle_support import VARIANT, assemble, checkout_copy, write_variant
from .conftest import CFG, ROOT

REPO = CFG.repo_id


def make_root(tmp_path: Path, variants: dict[str, dict] | None = None, real_variant: bool = False,
              nix: bool = True) -> Path:
    """A checkout copy whose build/ holds the given variants (metadata, a
    stand-in .so; with `nix`, as kernel-builder's Nix build writes them)."""
    root = checkout_copy(tmp_path)
    for name, meta in (variants or {}).items():
        write_variant(root, name, meta, nix=nix)
    if real_variant:
        built = ROOT / "build" / variant.current_variant()
        shutil.copytree(built, root / "build" / built.name, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def meta(ops_id: str = "_ltx_kernels_cuda_abcdef0", version: int = 1) -> dict:
    return {"name": "ltx-kernels", "id": ops_id, "version": version, "license": "Apache-2.0",
            "python-depends": [], "backend": {"type": "cuda", "archs": ["9.0"]}}


# --------------------------------------------------------------------------- card


def test_card_follows_the_kernels_card_convention():
    text = card.render(ROOT)
    front = text.split("---")[1]
    assert "library_name: kernels" in front and f"license: {CFG.license.lower()}" in front
    assert f'get_kernel("{REPO}", version={CFG.version}, trust_remote_code=True)' in text
    assert f"kernels benchmark {REPO}" in text  # benchmarks/benchmark.py exists


def test_card_lists_the_packages_functions_and_layers():
    text = card.render(ROOT)
    api = card.package_api(ROOT / "torch-ext" / CFG.python_name)
    assert {"rmsnorm", "adaln_rmsnorm", "qk_rmsnorm_rope", "rope_3d", "pixel_norm"} <= set(api.functions)
    assert "add_op_namespace_prefix" not in api.functions and "vae" not in api.functions
    assert {"RMSNorm", "TorchRMSNorm", "PixelNorm", "LTXVideoTransformerBlock"} <= set(api.layers)
    assert "PackageOps" not in api.layers  # a helper class, not an nn.Module
    for name in api.functions:
        assert f"- `{name}`: " in text
    for name in api.layers:
        assert f"- `{name}`" in text


def test_package_api_follows_imports_and_inheritance(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''\
        from . import layers
        from ._ops import ops
        from .math import scale, Helper
        __all__ = ["scale", "Helper", "layers", "ops"]
        '''))
    (pkg / "math.py").write_text('def scale(x):\n    """Scale x.\n\n    More."""\n\nclass Helper:\n    pass\n')
    (pkg / "norms.py").write_text("from torch import nn\nclass Norm(nn.Module):\n    pass\n")
    (pkg / "layers.py").write_text(textwrap.dedent('''\
        from torch import nn
        from .norms import Norm
        class A(nn.Module):
            pass
        class B(A):
            pass
        class NotALayer:
            pass
        '''))
    api = card.package_api(pkg)
    assert api.functions == ["scale"] and api.summaries == {"scale": "Scale x."}
    assert api.layers == ["A", "B", "Norm"]


def test_template_renders_with_kernel_builders_variables_only():
    """kernel-builder's renderer passes no version, summaries or variants."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True)
    text = env.from_string((ROOT / "CARD.md").read_text()).render(
        repo_id=REPO, functions=["rmsnorm"], layers=["RMSNorm"], has_benchmark=True, upstream=None,
        license="apache-2.0")
    assert f'get_kernel("{REPO}", version=1, trust_remote_code=True)' in text
    assert "- `rmsnorm`\n" in text


# --------------------------------------------------------------------------- upload plan


def test_plan_puts_the_card_on_main_and_every_variant_file_and_benchmark_on_the_version_branch(tmp_path):
    root = make_root(tmp_path, {"torch214-cxx11-cu130-x86_64-linux": meta(),
                                "torch211-cxx11-cu130-x86_64-linux": meta()})
    plan = upload.make_plan(root, abi_check=False)
    assert plan.branch == f"v{CFG.version}" and plan.problems == []
    assert [(f.local, f.path_in_repo) for f in plan.on("main")] == [(root / "build" / "CARD.md", "README.md")]
    on_branch = {f.path_in_repo for f in plan.on(plan.branch)}
    for name in plan.variants:
        assert {f"build/{name}/metadata.json", f"build/{name}/__init__.py",
                f"build/{name}/_ltx_kernels_cuda_abcdef0.abi3.so"} <= on_branch
    assert "benchmarks/benchmark.py" in on_branch and "benchmarks/bench_rmsnorm.py" not in on_branch
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in on_branch)
    assert (root / "build" / "CARD.md").read_text().startswith("---\nlibrary_name: kernels")


def test_plan_refuses_dirty_builds_and_version_mismatches(tmp_path):
    root = make_root(tmp_path, {"torch214-cxx11-cu130-x86_64-linux": meta("_ltx_kernels_cuda_abcdef0_dirty"),
                                "torch211-cxx11-cu130-x86_64-linux": meta(version=2)})
    problems = upload.make_plan(root, abi_check=False).problems
    assert any("uncommitted changes" in p and "--allow-dirty" in p for p in problems)
    assert any("version 2" in p for p in problems)
    assert not any("uncommitted" in p for p in upload.make_plan(root, abi_check=False, allow_dirty=True).problems)
    # A Nix build from a dirty tree says so in its provenance only.
    dirty_nix = json.loads((root / "build" / "torch211-cxx11-cu130-x86_64-linux" / "metadata.json").read_text())
    dirty_nix["provenance"]["kernel"]["dirty"] = True
    (root / "build" / "torch211-cxx11-cu130-x86_64-linux" / "metadata.json").write_text(json.dumps(dirty_nix))
    assert any(p == "torch211-cxx11-cu130-x86_64-linux: built from uncommitted changes (provenance of the kernel); "
               "commit and rebuild, or pass --allow-dirty" for p in upload.make_plan(root, abi_check=False).problems)
    with pytest.raises(BuildError, match="not uploading"):
        upload.upload(upload.make_plan(root, abi_check=False), api=None)


def test_plan_names_a_shared_object_the_abi_check_cannot_read(tmp_path):
    root = make_root(tmp_path, {VARIANT: meta()})
    so = root / "build" / VARIANT / f"{meta()['id']}.abi3.so"
    so.write_bytes(b"not an object file")
    problems = upload.make_plan(root, allow_non_nix=True).problems
    assert any(p.startswith(f"{VARIANT}/{so.name}: the ABI check cannot read it") for p in problems), problems


def test_plan_without_a_build_says_to_build(tmp_path):
    with pytest.raises(BuildError, match="ltx_build build"):
        upload.make_plan(make_root(tmp_path))


def test_stale_files_keep_other_variants_on_an_existing_branch_and_clear_a_new_one(tmp_path):
    root = make_root(tmp_path, {"torch214-cxx11-cu130-x86_64-linux": meta()})
    plan = upload.make_plan(root, abi_check=False)
    existing = ["README.md", "build/torch214-cxx11-cu130-x86_64-linux/_ltx_kernels_cuda_0000000.abi3.so",
                "build/torch214-cxx11-cu130-x86_64-linux/metadata.json",
                "build/torch29-cxx11-cu128-x86_64-linux/metadata.json", "benchmarks/benchmark_old.py"]
    assert upload.stale_files(plan, existing, new_branch=False) == [
        "benchmarks/benchmark_old.py", "build/torch214-cxx11-cu130-x86_64-linux/_ltx_kernels_cuda_0000000.abi3.so"]
    assert "build/torch29-cxx11-cu128-x86_64-linux/metadata.json" in upload.stale_files(plan, existing, True)


def dry_run(root: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing may be reached
    return subprocess.run([sys.executable, "-m", "ltx_build", "--root", str(root), "upload", "--dry-run", *flags],
                          cwd=ROOT, capture_output=True, text=True, env=env)


def test_dry_run_prints_each_file_and_its_destination_and_sends_nothing(tmp_path):
    root = make_root(tmp_path, {VARIANT: meta()})
    proc = dry_run(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"repository {REPO} (type kernel)" in out
    assert "branch main: 1 file(s)\n  build/CARD.md -> README.md" in out
    for f in sorted((root / "build" / VARIANT).iterdir()):
        if f.is_file():
            assert f"  build/{VARIANT}/{f.name} -> build/{VARIANT}/{f.name}\n" in out
    assert "  benchmarks/benchmark.py -> benchmarks/benchmark.py" in out
    assert "built by Nix: every variant" in out
    assert "dry run: nothing was sent" in out


# --------------------------------------------------------------------------- publishing policy


def test_dry_run_of_an_ltx_build_bundle_shows_the_refusal_and_fails(tmp_path):
    root = checkout_copy(tmp_path)
    assemble(root)
    proc = dry_run(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "not built by Nix: 1 of 1 variant(s), refused (override: --allow-non-nix-build)" in out
    assert f"not built by kernel-builder's Nix build: {VARIANT} (built by ltx_build)" in out
    for why in ("manylinux_2_28", "docs/source/builder/local-dev.md", "should not be published on the Kernel Hub",
                "rebuilt bit for bit", ".github/workflows/release.yml", "docs/release.md", '"Releasing"'):
        assert why in out, why
    assert "dry run: nothing was sent" in out and "WARNING" not in proc.stderr


def test_dry_run_with_the_override_warns_loudly_and_passes(tmp_path):
    root = checkout_copy(tmp_path)
    assemble(root)
    proc = dry_run(root, "--allow-non-nix-build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not built by Nix: 1 of 1 variant(s), allowed by --allow-non-nix-build" in proc.stdout
    assert "problems" not in proc.stdout
    warning = proc.stderr.splitlines()
    assert warning[0] == ("WARNING: --allow-non-nix-build: uploading variant(s) NOT built by kernel-builder's Nix "
                          f"build: {VARIANT} (built by ltx_build).")
    assert all(line.startswith("WARNING: ") for line in warning) and "manylinux_2_28" in proc.stderr
    assert ".github/workflows/release.yml" in proc.stderr


def test_plan_refuses_every_bundle_that_does_not_read_as_a_nix_build_and_names_why(tmp_path):
    root = make_root(tmp_path, {"torch211-cxx11-cu130-x86_64-linux": meta()}, nix=False)  # no provenance
    write_variant(root, "torch212-cxx11-cu130-x86_64-linux",  # kernel-builder's local build: no digest
                  {**meta(), "provenance": {"kernel-builder": {"version": "0.17.0-dev0"}}}, nix=False)
    write_variant(root, "torch213-cxx11-cu130-x86_64-linux", meta())  # the Nix build's
    assemble(root)
    plan = upload.make_plan(root, abi_check=False)
    assert plan.not_nix == ["torch211-cxx11-cu130-x86_64-linux (metadata.json has no provenance)",
                            "torch212-cxx11-cu130-x86_64-linux (kernel-builder 0.17.0-dev0 without the Nix build's "
                            "digest)",
                            f"{VARIANT} (built by ltx_build)"]
    [refusal] = plan.problems
    assert refusal.startswith("not built by kernel-builder's Nix build: torch211-") and "torch213" not in refusal
    with pytest.raises(BuildError, match="(?s)not uploading.*--allow-non-nix-build"):
        upload.upload(plan, api=None)


def test_override_uploads_a_non_nix_bundle_and_keeps_the_warning(tmp_path):
    root = checkout_copy(tmp_path)
    assemble(root)
    plan = upload.make_plan(root, abi_check=False, allow_non_nix=True)
    assert plan.problems == [] and plan.not_nix == [f"{VARIANT} (built by ltx_build)"]
    assert plan.warnings and "NOT built by kernel-builder's Nix build" in plan.warnings[0]
    api = RecordingHfApi()
    upload.upload(plan, api, log=lambda m: None)
    assert [c[0] for c in api.calls].count("create_commit") == 2
    assert upload.make_plan(root, abi_check=False).warnings == []  # refused plans warn about nothing


def test_files_changed_after_the_build_block_the_upload_even_with_the_override(tmp_path):
    root = make_root(tmp_path, {VARIANT: meta()})
    (root / "build" / VARIANT / "__init__.py").write_text("# edited after the build\n")
    [problem] = upload.make_plan(root, abi_check=False, allow_non_nix=True).problems
    assert problem.startswith(f"{VARIANT}: files differ from metadata.json's digest") and "__init__.py" in problem


class RecordingHfApi:
    """Records calls after checking each binds to huggingface_hub.HfApi's signature."""

    def __init__(self, branches=("main",), files=()):
        from huggingface_hub import HfApi

        self._real, self.calls, self.branches, self.files = HfApi, [], list(branches), list(files)

    def _record(self, name, *args, **kwargs):
        inspect.signature(getattr(self._real, name)).bind(self, *args, **kwargs)
        self.calls.append((name, args, kwargs))

    def create_repo(self, *args, **kwargs):
        self._record("create_repo", *args, **kwargs)

    def list_repo_refs(self, *args, **kwargs):
        self._record("list_repo_refs", *args, **kwargs)
        return SimpleNamespace(branches=[SimpleNamespace(name=b) for b in self.branches])

    def create_branch(self, *args, **kwargs):
        self._record("create_branch", *args, **kwargs)

    def list_repo_files(self, *args, **kwargs):
        self._record("list_repo_files", *args, **kwargs)
        return self.files

    def create_commit(self, *args, **kwargs):
        self._record("create_commit", *args, **kwargs)
        return SimpleNamespace(commit_url=f"https://hub/commit/{len(self.calls)}")


def test_upload_creates_a_kernel_repo_and_the_version_branch_and_commits_card_then_build(tmp_path):
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    root = make_root(tmp_path, {"torch214-cxx11-cu130-x86_64-linux": meta()})
    plan = upload.make_plan(root, abi_check=False)
    api = RecordingHfApi(files=["build/old-variant/metadata.json"])
    urls = upload.upload(plan, api, log=lambda m: None)
    names = [c[0] for c in api.calls]
    assert names == ["create_repo", "list_repo_refs", "create_branch", "list_repo_files", "create_commit",
                     "create_commit"]
    assert api.calls[0][2]["repo_type"] == "kernel" and api.calls[0][2]["exist_ok"] is True
    assert api.calls[2][2]["branch"] == "v1"
    (_, main_args, main_kwargs), (_, v1_args, v1_kwargs) = api.calls[4], api.calls[5]
    assert main_kwargs["revision"] == "main" and v1_kwargs["revision"] == "v1"
    assert [op.path_in_repo for op in main_args[1]] == ["README.md"]
    adds = [op for op in v1_args[1] if isinstance(op, CommitOperationAdd)]
    deletes = [op.path_in_repo for op in v1_args[1] if isinstance(op, CommitOperationDelete)]
    assert {op.path_in_repo for op in adds} == {f.path_in_repo for f in plan.on("v1")}
    assert deletes == ["build/old-variant/metadata.json"]  # a new branch drops what it inherited
    assert len(urls) == 2


# --------------------------------------------------------------------------- kernels.lock


def test_consumer_example_lock_names_this_kernel_at_version_1():
    from kernels._rust import KernelLocks

    locks = KernelLocks.from_json((ROOT / "examples/consumer/kernels.lock").read_text())
    [(dependency, lock)] = locks.items()
    assert dependency.repo_id == REPO and dependency.version.version == CFG.version
    assert len(lock.commit) == 40
    assert f'"{REPO}" = {CFG.version}' in (ROOT / "examples/consumer/pyproject.toml").read_text()


COMMIT = "1234567890abcdef1234567890abcdef12345678"


class PublishedHub:
    """What `kernels lock` asks the Hub, answered from the files an upload would put on branch v1."""

    def __init__(self, plan, trusted: bool):
        self.files = {f.path_in_repo: f.local for f in plan.on(plan.branch)}
        self.trusted = trusted

    def get_organization_overview(self, org):
        return SimpleNamespace(trustedKernelPublisher=self.trusted)

    def list_repo_refs(self, repo_id, repo_type=None, **kwargs):
        from huggingface_hub.hf_api import GitRefInfo

        return SimpleNamespace(branches=[GitRefInfo(name="v1", ref="refs/heads/v1", target_commit=COMMIT)])

    def list_repo_tree(self, repo_id, path_in_repo, repo_type=None, revision=None, **kwargs):
        from huggingface_hub.hf_api import RepoFolder

        assert revision == COMMIT
        folders = {p.split("/")[1] for p in self.files if p.startswith("build/")}
        return [RepoFolder(path=f"build/{v}", oid="0" * 40) for v in sorted(folders)]

    def hf_hub_download(self, repo_id, filename, repo_type=None, revision=None, **kwargs):
        assert revision == COMMIT
        return str(self.files[filename])


def lock_against(monkeypatch, hub, project: Path) -> None:
    import kernels.cli.lock as lock_cli
    import kernels.hf_hub

    monkeypatch.setattr(kernels.hf_hub, "_get_hf_api", lambda *a, **k: hub)
    monkeypatch.setattr(lock_cli, "_get_hf_api", lambda *a, **k: hub)
    lock_cli.lock_kernels(SimpleNamespace(project_dir=project))


def test_kernels_lock_refuses_a_publisher_the_hub_does_not_trust(tmp_path, monkeypatch):
    """kernels 0.17.2's `kernels lock` has no trust_remote_code switch."""
    root = make_root(tmp_path, real_variant=True)
    project = tmp_path / "consumer"
    shutil.copytree(ROOT / "examples/consumer", project)
    hub = PublishedHub(upload.make_plan(root, abi_check=False, allow_dirty=True), trusted=False)
    with pytest.raises(ValueError, match="not from a trusted publisher"):
        lock_against(monkeypatch, hub, project)


def test_lock_round_trip_pins_the_published_commit_and_loads_it_offline(tmp_path, monkeypatch):
    root = make_root(tmp_path, real_variant=True)
    plan = upload.make_plan(root, abi_check=False, allow_dirty=True)
    project = tmp_path / "consumer"
    shutil.copytree(ROOT / "examples/consumer", project)
    (project / "kernels.lock").unlink()
    lock_against(monkeypatch, PublishedHub(plan, trusted=True), project)
    lock = json.loads((project / "kernels.lock").read_text())
    assert lock == [{"dependency": {"repo-id": REPO, "version": CFG.version}, "lock": {"commit": COMMIT}}]

    # The kernels cache as a download of that commit leaves it (only the build variants, as kernels fetches).
    cache = tmp_path / "kernels-cache"
    snapshot = cache / f"kernels--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    for f in plan.on(plan.branch):
        if f.path_in_repo.startswith("build/"):
            (snapshot / f.path_in_repo).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f.local, snapshot / f.path_in_repo)
    proc = subprocess.run([sys.executable, str(project / "consumer.py")], capture_output=True, text=True,
                          env={**os.environ, "KERNELS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ops_id = json.loads((root / "build" / variant.current_variant() / "metadata.json").read_text())["id"]
    assert f"loaded {ops_id} pinned by kernels.lock" in proc.stdout
