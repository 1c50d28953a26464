"""flake.nix / flake.lock, and `ltx-dev pin-kernel-builder` that writes the lock (CPU only, no
network).

The lock pins github:huggingface/kernels (the kernel-builder flake) plus all of
that commit's transitive inputs, in the format `nix flake lock` writes
(version 7). See docs/nix.md for how it was computed. Checked here: its
structure; that it is what the pin tool makes of its own values (and, with
KERNELS_MIRROR set to a git copy of huggingface/kernels, exactly what the tool
derives from that commit); that docs/nix.md states its values; and the tool
itself on small git repositories made here (needs git and nix).
"""

import base64
import copy
import datetime
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ltx_dev import flake_pin

REPO = Path(__file__).resolve().parent.parent
FLAKE_NIX = REPO / "flake.nix"
FLAKE_LOCK = REPO / "flake.lock"

HEX40 = re.compile(r"^[0-9a-f]{40}$")
LOCK = json.loads(FLAKE_LOCK.read_text())
PINNED = LOCK["nodes"]["kernel-builder"]["locked"]
MIN_LAST_MODIFIED = int(
    datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
)


# --------------------------------------------------------------------------
# Validation helpers (pure functions on the parsed lock dict)
# --------------------------------------------------------------------------


def _resolve_input(nodes, root, ref, _seen=None):
    """Resolve an input reference to a node name.

    `ref` is either a node name (str) or a follows path (list of input names,
    walked from the root node).  Raises KeyError/ValueError if it dangles.
    """
    if isinstance(ref, str):
        if ref not in nodes:
            raise KeyError(f"node {ref!r} does not exist")
        return ref
    if not isinstance(ref, list) or not all(isinstance(s, str) for s in ref):
        raise ValueError(f"bad input reference {ref!r}")
    seen = set() if _seen is None else _seen
    key = tuple(ref)
    if key in seen:
        raise ValueError(f"follows cycle at {ref!r}")
    seen.add(key)
    cur = root
    for seg in ref:
        inputs = nodes[cur].get("inputs", {})
        if seg not in inputs:
            raise KeyError(f"follows path {ref!r}: node {cur!r} has no input {seg!r}")
        cur = _resolve_input(nodes, root, inputs[seg], seen)
    return cur


def validate_lock(lock):
    """Return a list of problems with a flake.lock dict (empty list == OK)."""
    errors = []
    if not isinstance(lock, dict):
        return ["lock is not a JSON object"]
    if lock.get("version") != 7:
        errors.append(f"version is {lock.get('version')!r}, expected 7")
    nodes = lock.get("nodes")
    if not isinstance(nodes, dict):
        return errors + ["missing 'nodes' object"]
    root = lock.get("root")
    if root not in nodes:
        return errors + [f"root node {root!r} missing"]
    if not nodes[root].get("inputs"):
        errors.append("root node has no inputs")

    # Every input of every node must resolve.
    reachable = {root}
    for name, node in nodes.items():
        for inp, ref in node.get("inputs", {}).items():
            try:
                _resolve_input(nodes, root, ref)
            except (KeyError, ValueError) as e:
                errors.append(f"{name}.inputs.{inp}: {e}")

    # Reachability from root (string inputs and resolved follows).
    stack = [root]
    while stack:
        cur = stack.pop()
        for ref in nodes[cur].get("inputs", {}).values():
            try:
                tgt = _resolve_input(nodes, root, ref)
            except (KeyError, ValueError):
                continue
            if tgt not in reachable:
                reachable.add(tgt)
                stack.append(tgt)
    for orphan in sorted(set(nodes) - reachable):
        errors.append(f"orphan node {orphan!r} not reachable from root")

    # Every non-root node must be locked.
    for name, node in nodes.items():
        if name == root:
            continue
        if "locked" not in node or "original" not in node:
            errors.append(f"node {name!r} lacks locked/original")
    return errors


def validate_kernel_builder(lock):
    """Return a list of problems with the kernel-builder node's pin."""
    errors = []
    nodes = lock.get("nodes", {})
    root = lock.get("root")
    try:
        name = _resolve_input(nodes, root, nodes[root]["inputs"]["kernel-builder"])
    except (KeyError, ValueError, TypeError) as e:
        return [f"root has no resolvable kernel-builder input: {e}"]
    locked = nodes[name].get("locked", {})
    original = nodes[name].get("original", {})
    if locked.get("type") != "github":
        errors.append(f"locked.type is {locked.get('type')!r}")
    if locked.get("owner") != "huggingface":
        errors.append(f"locked.owner is {locked.get('owner')!r}")
    if locked.get("repo") != "kernels":
        errors.append(f"locked.repo is {locked.get('repo')!r}")
    if not HEX40.match(str(locked.get("rev", ""))):
        errors.append(f"locked.rev {locked.get('rev')!r} is not 40 hex chars")
    nar = locked.get("narHash", "")
    if not isinstance(nar, str) or not nar.startswith("sha256-"):
        errors.append(f"narHash {nar!r} is not an SRI sha256 hash")
    else:
        try:
            raw = base64.b64decode(nar[len("sha256-"):], validate=True)
            if len(raw) != 32:
                errors.append(f"narHash decodes to {len(raw)} bytes, expected 32")
        except ValueError as e:
            errors.append(f"narHash is not valid base64: {e}")
    lm = locked.get("lastModified")
    if not isinstance(lm, int) or isinstance(lm, bool) or lm <= MIN_LAST_MODIFIED:
        errors.append(f"lastModified {lm!r} is not an int after 2025-01-01")
    if (original.get("type"), original.get("owner"), original.get("repo")) != (
        "github",
        "huggingface",
        "kernels",
    ):
        errors.append(f"original {original!r} is not github:huggingface/kernels")
    return errors


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lock():
    with FLAKE_LOCK.open() as f:
        return json.load(f)


# --------------------------------------------------------------------------
# Tests on the real flake.lock
# --------------------------------------------------------------------------


def test_lock_version(lock):
    assert lock["version"] == 7


def test_root_inputs_resolve(lock):
    nodes, root = lock["nodes"], lock["root"]
    assert root in nodes
    assert "kernel-builder" in nodes[root]["inputs"]
    for ref in nodes[root]["inputs"].values():
        assert _resolve_input(nodes, root, ref) in nodes


def test_lock_is_valid(lock):
    assert validate_lock(lock) == []


def test_follows_paths_resolve(lock):
    nodes, root = lock["nodes"], lock["root"]
    follows = [
        (name, inp, ref)
        for name, node in nodes.items()
        for inp, ref in node.get("inputs", {}).items()
        if isinstance(ref, list)
    ]
    for name, inp, ref in follows:
        # Dependency-lock follows are rebased under our root.
        assert ref[0] in nodes[root]["inputs"], (name, inp, ref)
        assert _resolve_input(nodes, root, ref) in nodes


def test_kernel_builder_pin(lock):
    assert validate_kernel_builder(lock) == []
    kb = lock["nodes"]["kernel-builder"]
    assert kb["locked"]["type"] == "github"
    assert kb["locked"]["owner"] == "huggingface"
    assert kb["locked"]["repo"] == "kernels"


def test_no_orphans(lock):
    assert not [e for e in validate_lock(lock) if "orphan" in e]


# --------------------------------------------------------------------------
# The validators must reject broken locks
# --------------------------------------------------------------------------


def test_rejects_dangling_input(lock):
    bad = copy.deepcopy(lock)
    bad["nodes"]["kernel-builder"]["inputs"]["nixpkgs"] = "no-such-node"
    errs = validate_lock(bad)
    assert any("no-such-node" in e for e in errs), errs


def test_rejects_dangling_root_input(lock):
    bad = copy.deepcopy(lock)
    bad["nodes"]["root"]["inputs"]["kernel-builder"] = "missing"
    assert validate_lock(bad)
    assert validate_kernel_builder(bad)


def test_rejects_dangling_follows(lock):
    bad = copy.deepcopy(lock)
    bad["nodes"]["kernel-builder"]["inputs"]["extra"] = ["kernel-builder", "nope"]
    errs = validate_lock(bad)
    assert any("nope" in e for e in errs), errs


def test_rejects_orphan(lock):
    bad = copy.deepcopy(lock)
    bad["nodes"]["stray"] = copy.deepcopy(lock["nodes"]["kernel-builder"])
    errs = validate_lock(bad)
    assert any("orphan" in e and "stray" in e for e in errs), errs


def test_rejects_wrong_version(lock):
    bad = copy.deepcopy(lock)
    bad["version"] = 6
    assert validate_lock(bad)


@pytest.mark.parametrize(
    "field,value",
    [
        ("type", "git"),
        ("owner", "someone-else"),
        ("repo", "kernel"),
        ("rev", "deadbeef"),
        ("narHash", "sha1-AAAA"),
        ("narHash", "sha256-AAAA"),  # valid base64 but 3 bytes
        ("narHash", "sha256-!!not-base64!!"),
        ("lastModified", 1600000000),
        ("lastModified", str(PINNED["lastModified"])),
    ],
)
def test_rejects_bad_kernel_builder_pin(lock, field, value):
    bad = copy.deepcopy(lock)
    bad["nodes"]["kernel-builder"]["locked"][field] = value
    assert validate_kernel_builder(bad)


# --------------------------------------------------------------------------
# flake.nix
# --------------------------------------------------------------------------


def _strip_ws(s):
    return re.sub(r"\s+", " ", s)


def test_flake_nix_template():
    text = _strip_ws(FLAKE_NIX.read_text())
    assert "github:huggingface/kernels" in text
    assert "genKernelFlakeOutputs" in text
    assert "inherit self;" in text
    assert "path = ./.;" in text
    # `rev = ...` is deprecated and throws in gen-flake-outputs.nix.
    assert not re.search(r"\brev\s*=", text)


@pytest.mark.skipif(
    shutil.which("nix-instantiate") is None, reason="nix-instantiate not on PATH"
)
def test_flake_nix_parses():
    res = subprocess.run(
        ["nix-instantiate", "--parse", str(FLAKE_NIX)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------
# The lock is what `ltx-dev pin-kernel-builder` writes
# --------------------------------------------------------------------------


def upstream_of(lock):
    """The pinned commit's own flake.lock, recovered from ours: the kernel-builder node becomes the
    root and the follows lose their `kernel-builder` prefix."""
    nodes = copy.deepcopy(lock["nodes"])
    del nodes["root"]
    kb = nodes.pop("kernel-builder")
    for node in [*nodes.values(), kb]:
        for k, ref in node.get("inputs", {}).items():
            if isinstance(ref, list):
                assert ref[0] == "kernel-builder", ref
                node["inputs"][k] = ref[1:]
    nodes["root"] = {"inputs": kb["inputs"]}
    return {"nodes": nodes, "root": "root", "version": 7}


def test_lock_text_is_in_the_format_nix_writes():
    text = FLAKE_LOCK.read_text()
    assert flake_pin.dumps(json.loads(text)) == text


def test_lock_is_the_pin_tools_lock_for_its_own_values(lock):
    # kernel-builder -> the commit's own lock, re-rooted, and nothing else
    rebuilt = flake_pin.lock_for(upstream_of(lock), PINNED["rev"], PINNED["lastModified"], PINNED["narHash"])
    assert rebuilt == lock


def test_docs_state_the_locked_values():
    docs = (REPO / "docs" / "nix.md").read_text()
    date = datetime.datetime.fromtimestamp(PINNED["lastModified"], datetime.timezone.utc)
    for value in (PINNED["rev"], str(PINNED["lastModified"]), PINNED["narHash"], date.strftime("%Y-%m-%d %H:%M:%S")):
        assert value in docs, value


MIRROR = os.environ.get("KERNELS_MIRROR")


@pytest.mark.skipif(not MIRROR, reason="set KERNELS_MIRROR to a git copy of huggingface/kernels")
@pytest.mark.skipif(shutil.which("nix") is None, reason="nix not on PATH")
def test_lock_and_pinned_variants_are_what_the_pinned_commit_gives():
    pin = flake_pin.derive(Path(MIRROR), PINNED["rev"])
    assert flake_pin.stale(flake_pin.outputs(pin)) == []


# --------------------------------------------------------------------------
# The pin tool on git repositories made here
# --------------------------------------------------------------------------

needs_nix = pytest.mark.skipif(shutil.which("nix") is None or shutil.which("git") is None,
                               reason="needs git and nix (Debian: nix-bin)")

UPSTREAM_LOCK = {
    "nodes": {
        "nixpkgs": {"locked": {"lastModified": 1700000000, "narHash": "sha256-" + "A" * 43 + "=",
                               "owner": "NixOS", "repo": "nixpkgs", "rev": "1" * 40, "type": "github"},
                    "original": {"owner": "NixOS", "repo": "nixpkgs", "type": "github"}},
        "rust-overlay": {"inputs": {"nixpkgs": ["nixpkgs"]},
                         "locked": {"lastModified": 1700000001, "narHash": "sha256-" + "B" * 43 + "=",
                                    "owner": "oxalica", "repo": "rust-overlay", "rev": "2" * 40, "type": "github"},
                         "original": {"owner": "oxalica", "repo": "rust-overlay", "type": "github"}},
        "root": {"inputs": {"nixpkgs": "nixpkgs", "rust-overlay": "rust-overlay"}},
    },
    "root": "root",
    "version": 7,
}
VARIANTS = b'{\n  "x86_64-linux": {"cuda": ["torch299-cxx11-cu999-x86_64-linux"]}\n}\n'


def commit(repo, date, message, files=None, chmod=()):
    """Write `files`, make the `chmod` ones executable, commit at `date`; returns the sha."""
    for rel, data in (files or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    for rel in chmod:
        (repo / rel).chmod(0o755)
    env = {**os.environ, "GIT_AUTHOR_DATE": f"@{date} +0000", "GIT_COMMITTER_DATE": f"@{date} +0000"}
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True, env=env)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, env=env, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "kernels"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = commit(repo, 1750000000, "first", {"flake.lock": json.dumps(UPSTREAM_LOCK).encode(),
                                                "nix-builder/build-variants.json": VARIANTS,
                                                "tool.sh": b"echo hi\n"})
    return repo, first


@needs_nix
def test_pin_reroots_the_commits_lock_under_kernel_builder(upstream):
    repo, rev = upstream
    pin = flake_pin.derive(repo, rev[:8])  # any form git accepts; the lock gets the full sha
    lock = json.loads(pin.lock_text)
    assert validate_lock(lock) == [] and validate_kernel_builder(lock) == []
    kb = lock["nodes"]["kernel-builder"]
    assert kb["inputs"] == {"nixpkgs": "nixpkgs", "rust-overlay": "rust-overlay"}
    assert kb["locked"]["rev"] == rev and kb["locked"]["lastModified"] == 1750000000
    assert lock["nodes"]["rust-overlay"]["inputs"] == {"nixpkgs": ["kernel-builder", "nixpkgs"]}
    assert lock["nodes"]["nixpkgs"] == UPSTREAM_LOCK["nodes"]["nixpkgs"]
    assert lock["nodes"]["root"] == {"inputs": {"kernel-builder": "kernel-builder"}}
    assert pin.variants == VARIANTS


@needs_nix
def test_nar_hash_follows_the_tree_not_the_commit(upstream):
    repo, first = upstream
    same_tree = commit(repo, 1760000000, "nothing changes")
    exec_bit = commit(repo, 1770000000, "tool.sh becomes executable", chmod=["tool.sh"])
    a, b, c = (flake_pin.derive(repo, r) for r in (first, same_tree, exec_bit))
    assert a.nar_hash == b.nar_hash and a.last_modified != b.last_modified
    assert c.nar_hash != a.nar_hash  # NAR records the executable bit


@needs_nix
def test_pin_command_writes_checks_and_is_idempotent(upstream, tmp_path, capsys):
    from ltx_dev.cli import main

    repo, rev = upstream
    lock, variants = tmp_path / "flake.lock", tmp_path / "pinned.json"
    lock.write_text(FLAKE_LOCK.read_text())
    argv = ["pin-kernel-builder", "--mirror", str(repo), "--rev", rev, "--lock", str(lock), "--variants",
            str(variants)]
    assert main([*argv, "--check"]) == 1 and lock.read_text() == FLAKE_LOCK.read_text()  # --check writes nothing
    assert main(argv) == 0
    assert json.loads(lock.read_text())["nodes"]["kernel-builder"]["locked"]["rev"] == rev
    assert variants.read_bytes() == VARIANTS
    capsys.readouterr()
    assert main(argv) == 0 and "up to date" in capsys.readouterr().out
    assert main([*argv, "--check"]) == 0


def test_pin_refuses_an_upstream_lock_whose_node_names_clash_with_ours():
    clashing = copy.deepcopy(UPSTREAM_LOCK)
    clashing["nodes"]["kernel-builder"] = copy.deepcopy(clashing["nodes"]["nixpkgs"])
    with pytest.raises(flake_pin.PinError, match="kernel-builder"):
        flake_pin.lock_for(clashing, "3" * 40, 1750000000, "sha256-" + "C" * 43 + "=")


@needs_nix
def test_cross_check_tells_a_matching_pin_from_a_different_one(upstream, tmp_path):
    repo, rev = upstream
    pin = flake_pin.derive(repo, rev)
    other = json.loads(pin.lock_text)
    other["nodes"]["kernel-builder"]["locked"]["narHash"] = "sha256-" + "D" * 43 + "="
    community = tmp_path / "community"
    community.mkdir()
    subprocess.run(["git", "init", "-q", str(community)], check=True)
    commit(community, 1750000000, "kernels", {"same/flake.lock": pin.lock_text.encode(),
                                              "other/flake.lock": flake_pin.dumps(other).encode(),
                                              "unrelated/flake.lock": FLAKE_LOCK.read_bytes()})
    assert sorted(flake_pin.cross_check(community, pin)) == [("other/flake.lock", False), ("same/flake.lock", True)]
