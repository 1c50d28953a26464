"""Structural checks on flake.nix / flake.lock (CPU only, no network, no Nix needed).

The lock pins github:huggingface/kernels (the kernel-builder flake) plus all of
that commit's transitive inputs, in the format `nix flake lock` writes
(version 7). See docs/nix.md for how it was computed.
"""

import base64
import copy
import datetime
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLAKE_NIX = REPO / "flake.nix"
FLAKE_LOCK = REPO / "flake.lock"

HEX40 = re.compile(r"^[0-9a-f]{40}$")
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
        ("lastModified", "1776798953"),
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
