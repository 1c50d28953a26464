"""Upload build/ to the Hub the way kernel-builder's ``upload`` does.

The rendered card (build/CARD.md) goes to the ``main`` branch as README.md;
every file of every variant in build/ (``build/<variant>/...``) and
``benchmarks/benchmark*.py`` go to the version branch ``v<version>`` of a
repository of type ``kernel``. Files the branch already has under an
uploaded variant's directory (or, on a new branch, anywhere under build/ and
benchmarks/) that this upload does not contain are deleted, so a variant on
the Hub is exactly the local one; variants not uploaded now are left alone.

Before anything is sent, each variant is checked: metadata.json readable by
kernels and of the branch's version, files that match its digest, an op
namespace not built from a dirty tree, and a shared object that passes the ABI
check (manylinux_2_28, abi3). Variants not built by kernel-builder's Nix build
are refused unless ``allow_non_nix`` (``--allow-non-nix-build``): see
:func:`nix_build_problem` and :data:`NON_NIX_REFUSAL`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from . import BuildError, card, checks, config, layout

MAIN_BRANCH = "main"
REPO_TYPE = "kernel"
COMMIT_MESSAGE = "Uploaded with ltx_build"
RELEASE_WORKFLOW = ".github/workflows/release.yml"
ALLOW_FLAG = "--allow-non-nix-build"
NON_NIX_REFUSAL = f"""\
not built by kernel-builder's Nix build: {{variants}}.
    Builds made outside Nix (ltx-build, or kernel-builder's own local build) are for local use:
    kernel-builder's documentation (huggingface/kernels, docs/source/builder/local-dev.md) says
    they should not be published on the Kernel Hub, as they do not fulfil the kernel requirements.
    They are compiled with this host's compiler, glibc and CUDA toolkit, not the
    manylinux_2_28 toolchain pinned by flake.lock, so nothing guarantees they load on
    users' systems (the ABI check sees symbol versions only), and they cannot be
    rebuilt bit for bit from the commit.
    Publish through the release workflow instead: {RELEASE_WORKFLOW} builds every
    variant with Nix and uploads it (docs/release.md; README, "Releasing").
    A maintainer who accepts the consequences can pass {ALLOW_FLAG}."""
NON_NIX_WARNING = f"""\
WARNING: {ALLOW_FLAG}: uploading variant(s) NOT built by kernel-builder's Nix build: {{variants}}.
WARNING: they are not built with the manylinux_2_28 toolchain and not reproducible from the
WARNING: commit; users with another glibc or CUDA runtime may fail to load them. Replace
WARNING: them with the release workflow's build ({RELEASE_WORKFLOW}) as soon as you can."""


@dataclass(frozen=True)
class PlannedFile:
    local: Path
    path_in_repo: str
    branch: str


@dataclass
class UploadPlan:
    repo_id: str
    branch: str
    variants: list[str]
    files: list[PlannedFile] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what blocks the upload
    not_nix: list[str] = field(default_factory=list)  # "<variant> (<why>)" of variants not built by Nix
    allow_non_nix: bool = False

    @property
    def warnings(self) -> list[str]:
        """What an allowed upload of non-Nix builds prints before it sends anything."""
        return [NON_NIX_WARNING.format(variants="; ".join(self.not_nix))] if self.not_nix and self.allow_non_nix \
            else []

    def on(self, branch: str) -> list[PlannedFile]:
        return [f for f in self.files if f.branch == branch]

    def describe(self, root: Path) -> str:
        lines = [f"repository {self.repo_id} (type {REPO_TYPE}); {len(self.variants)} variant(s): "
                 f"{', '.join(self.variants)}"]
        for branch in (MAIN_BRANCH, self.branch):
            planned = self.on(branch)
            lines.append(f"branch {branch}: {len(planned)} file(s)")
            lines += [f"  {_shown(f.local, root)} -> {f.path_in_repo}" for f in planned]
        lines.append(f"and on {self.branch}: delete what the Hub has under "
                     + ", ".join(f"build/{v}/" for v in self.variants)
                     + " (all of build/ and benchmarks/ if the branch is new) that is not listed above")
        if not self.not_nix:
            lines.append("built by Nix: every variant (kernel-builder provenance and digest)")
        else:
            verdict = f"allowed by {ALLOW_FLAG}" if self.allow_non_nix else f"refused (override: {ALLOW_FLAG})"
            lines.append(f"not built by Nix: {len(self.not_nix)} of {len(self.variants)} variant(s), {verdict}")
        return "\n".join(lines)


def _shown(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _variant_files(variant_dir: Path) -> Iterable[Path]:
    for p in sorted(variant_dir.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            yield p


def nix_build_problem(meta: dict) -> str | None:
    """Why a variant's metadata.json does not read as kernel-builder's Nix
    build; None when it does.

    The Nix build runs ``kernel-builder create-pyproject`` (which records
    ``provenance``: the kernel-builder version baked into it, and the kernel's
    commit that provenance-flags.nix passes), then its hash-kernel-hook
    (``kernel-builder hash``: the ``digest``). ltx_build records no
    kernel-builder and its own marker (layout.provenance). This reads what
    the metadata says; it is no proof (that is the release workflow's job)."""
    provenance = meta.get("provenance")
    if not isinstance(provenance, dict):
        return "metadata.json has no provenance"
    if provenance.get("builder") == layout.BUILDER:
        return f"built by {layout.BUILDER}"
    builder = provenance.get("kernel-builder")
    version = builder.get("version") if isinstance(builder, dict) else None
    if not version or version == layout.NO_KERNEL_BUILDER:
        return "its provenance names no kernel-builder"
    if not isinstance(meta.get("digest"), dict):
        return f"kernel-builder {version} without the Nix build's digest"
    return None


def _read_metadata(variant_dir: Path) -> tuple[dict | None, str | None]:
    """(metadata.json as JSON, None), or (None, why kernels cannot read it)."""
    from kernels._rust import Metadata

    path = variant_dir / "metadata.json"
    try:
        text = path.read_bytes()
        Metadata.from_bytes(text)  # what kernels' loader parses
        return json.loads(text), None
    except (OSError, ValueError) as e:
        return None, f"unreadable metadata.json ({e})"


def _variant_problems(variant_dir: Path, meta: dict, version: int, allow_dirty: bool, abi_check: bool) -> list[str]:
    name = variant_dir.name
    problems = []
    if meta.get("version") != version:
        problems.append(f"{name}: metadata.json has version {meta.get('version')}, build.toml has {version}")
    provenance = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    dirty = [f"op namespace {meta.get('id')}"] if str(meta.get("id", "")).endswith("_dirty") else []
    dirty += [f"provenance of the {what}" for what in ("kernel", "kernel-builder")
              if isinstance(provenance.get(what), dict) and provenance[what].get("dirty") is True]
    if dirty and not allow_dirty:
        problems.append(f"{name}: built from uncommitted changes ({', '.join(dirty)}); commit and rebuild, or "
                        "pass --allow-dirty")
    mismatch = checks.digest_mismatch(variant_dir)
    if mismatch:
        problems.append(f"{name}: files differ from metadata.json's digest (changed after the build?): "
                        + "; ".join(mismatch))
    libraries = sorted(variant_dir.glob("*.so"))
    if not libraries:
        problems.append(f"{name}: no shared object")
    for so in libraries if abi_check else []:
        try:
            manylinux, abi3 = checks.abi_violations(so)
        except ValueError as e:  # not an object file
            manylinux, abi3 = [f"the ABI check cannot read it ({e})"], []
        problems += [f"{name}/{so.name}: {v}" for v in manylinux + abi3]
    return problems


def make_plan(root: Path, *, repo_id: str | None = None, branch: str | None = None, allow_dirty: bool = False,
              abi_check: bool = True, allow_non_nix: bool = False) -> UploadPlan:
    """Render the card and list what goes where; ``problems`` says what blocks an upload."""
    root = Path(root).resolve()
    cfg = config.load(root)
    repo_id = repo_id or cfg.repo_id
    if not repo_id:
        raise BuildError("no repository: set [general.hub] repo-id in build.toml or pass --repo-id")
    build_dir = root / "build"
    variant_dirs = sorted(p for p in build_dir.iterdir() if (p / "metadata.json").is_file()) \
        if build_dir.is_dir() else []
    if not variant_dirs:
        raise BuildError(f"no built variant in {build_dir}: run `python3 -m ltx_build build` first")
    plan = UploadPlan(repo_id=repo_id, branch=branch or f"v{cfg.version}", variants=[v.name for v in variant_dirs],
                      allow_non_nix=allow_non_nix)
    card_path = card.write(root, build_dir)
    plan.files.append(PlannedFile(card_path, "README.md", MAIN_BRANCH))
    for variant_dir in variant_dirs:
        meta, unreadable = _read_metadata(variant_dir)
        if meta is None:
            plan.problems.append(f"{variant_dir.name}: {unreadable}")
        else:
            plan.problems += _variant_problems(variant_dir, meta, cfg.version, allow_dirty, abi_check)
            why = nix_build_problem(meta)
            if why:
                plan.not_nix.append(f"{variant_dir.name} ({why})")
        plan.files += [PlannedFile(p, f"build/{p.relative_to(build_dir).as_posix()}", plan.branch)
                       for p in _variant_files(variant_dir)]
    plan.files += [PlannedFile(p, f"benchmarks/{p.name}", plan.branch)
                   for p in sorted((root / "benchmarks").glob("benchmark*.py"))]
    if plan.not_nix and not allow_non_nix:
        plan.problems.append(NON_NIX_REFUSAL.format(variants="; ".join(plan.not_nix)))
    return plan


def stale_files(plan: UploadPlan, existing: list[str], new_branch: bool) -> list[str]:
    """Files on the version branch that the upload replaces by nothing."""
    uploading = {f.path_in_repo for f in plan.on(plan.branch)}
    if new_branch:
        prefixes = ["build/", "benchmarks/"]
    else:
        prefixes = [f"build/{v}/" for v in plan.variants]
    stale = [f for f in existing if f.startswith(tuple(prefixes)) and f not in uploading]
    if not new_branch:  # an existing branch also drops benchmark scripts this upload no longer has
        stale += [f for f in existing if f.startswith("benchmarks/benchmark") and f not in uploading]
    return sorted(set(stale))


def upload(plan: UploadPlan, api: Any, *, private: bool = False, log=print) -> list[str]:
    """Send ``plan`` through ``api`` (a ``huggingface_hub.HfApi``); returns the commit URLs."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    if plan.problems:
        raise BuildError("not uploading:\n  " + "\n  ".join(plan.problems))
    api.create_repo(plan.repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    refs = api.list_repo_refs(plan.repo_id, repo_type=REPO_TYPE)
    new_branch = plan.branch not in {b.name for b in refs.branches}
    if new_branch:
        api.create_branch(plan.repo_id, branch=plan.branch, repo_type=REPO_TYPE, exist_ok=True)
    existing = api.list_repo_files(plan.repo_id, revision=plan.branch, repo_type=REPO_TYPE)
    urls = []
    for branch in (MAIN_BRANCH, plan.branch):
        operations: list[Any] = [CommitOperationAdd(path_in_repo=f.path_in_repo, path_or_fileobj=str(f.local))
                                 for f in plan.on(branch)]
        if branch == plan.branch:
            operations += [CommitOperationDelete(path_in_repo=p) for p in stale_files(plan, existing, new_branch)]
        if not operations:
            continue
        log(f"uploading {len(operations)} operation(s) to {plan.repo_id}@{branch}"
            + (" (new branch)" if branch == plan.branch and new_branch else ""))
        info = api.create_commit(plan.repo_id, operations, commit_message=COMMIT_MESSAGE, repo_type=REPO_TYPE,
                                 revision=branch)
        urls.append(str(getattr(info, "commit_url", info)))
    return urls
