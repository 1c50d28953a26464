"""Upload build/ to the Hub the way kernel-builder's ``upload`` does.

The rendered card (build/CARD.md) goes to the ``main`` branch as README.md;
every file of every variant in build/ (``build/<variant>/...``) and
``benchmarks/benchmark*.py`` go to the version branch ``v<version>`` of a
repository of type ``kernel``. Files the branch already has under an
uploaded variant's directory (or, on a new branch, anywhere under build/ and
benchmarks/) that this upload does not contain are deleted, so a variant on
the Hub is exactly the local one; variants not uploaded now are left alone.

Before anything is sent, each variant is checked: metadata.json present and of
the branch's version, an op namespace not built from a dirty tree, and a
shared object that passes the ABI check (manylinux_2_28, abi3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from . import BuildError, card, checks, config

MAIN_BRANCH = "main"
REPO_TYPE = "kernel"
COMMIT_MESSAGE = "Uploaded with ltx_build"


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
    problems: list[str] = field(default_factory=list)

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
        return "\n".join(lines)


def _shown(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _variant_files(variant_dir: Path) -> Iterable[Path]:
    for p in sorted(variant_dir.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            yield p


def _variant_problems(variant_dir: Path, version: int, allow_dirty: bool, abi_check: bool) -> list[str]:
    name = variant_dir.name
    try:
        meta = json.loads((variant_dir / "metadata.json").read_text())
    except (OSError, ValueError) as e:
        return [f"{name}: unreadable metadata.json ({e})"]
    problems = []
    if meta.get("version") != version:
        problems.append(f"{name}: metadata.json has version {meta.get('version')}, build.toml has {version}")
    if str(meta.get("id", "")).endswith("_dirty") and not allow_dirty:
        problems.append(f"{name}: built from uncommitted changes (op namespace {meta.get('id')}); commit and "
                        "rebuild, or pass --allow-dirty")
    libraries = sorted(variant_dir.glob("*.so"))
    if not libraries:
        problems.append(f"{name}: no shared object")
    for so in libraries if abi_check else []:
        manylinux, abi3 = checks.abi_violations(so)
        problems += [f"{name}/{so.name}: {v}" for v in manylinux + abi3]
    return problems


def make_plan(root: Path, *, repo_id: str | None = None, branch: str | None = None, allow_dirty: bool = False,
              abi_check: bool = True) -> UploadPlan:
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
    plan = UploadPlan(repo_id=repo_id, branch=branch or f"v{cfg.version}", variants=[v.name for v in variant_dirs])
    card_path = card.write(root, build_dir)
    plan.files.append(PlannedFile(card_path, "README.md", MAIN_BRANCH))
    for variant_dir in variant_dirs:
        plan.problems += _variant_problems(variant_dir, cfg.version, allow_dirty, abi_check)
        plan.files += [PlannedFile(p, f"build/{p.relative_to(build_dir).as_posix()}", plan.branch)
                       for p in _variant_files(variant_dir)]
    plan.files += [PlannedFile(p, f"benchmarks/{p.name}", plan.branch)
                   for p in sorted((root / "benchmarks").glob("benchmark*.py"))]
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
