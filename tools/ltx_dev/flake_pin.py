"""`ltx-dev pin-kernel-builder --mirror DIR --rev SHA`: pin flake.lock's kernel-builder input
(github:huggingface/kernels) to one commit without the network, as `nix flake lock` would, from a
local git copy of huggingface/kernels. It writes

- flake.lock: the `kernel-builder` node (rev; lastModified = the committer timestamp; narHash = the
  NAR hash of the commit's tree, `git archive` extracted and hashed by `nix hash path`), and that
  commit's own flake.lock nodes under it, its root inputs becoming the node's inputs and its follows
  re-rooted under `kernel-builder`;
- tools/ltx_build/pinned-build-variants.json: the commit's nix-builder/build-variants.json, verbatim.

`--check` writes nothing and fails when either file differs from what the commit gives.
`--cross-check DIR` compares the result with every `*/flake.lock` of a huggingface/kernels-community
checkout that pins the same commit. docs/nix.md tells the method and the values."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import ROOT

NODE = "kernel-builder"  # the input's name in flake.nix
GITHUB = {"owner": "huggingface", "repo": "kernels", "type": "github"}
VARIANTS_IN_REPO = "nix-builder/build-variants.json"
FLAKE_LOCK = ROOT / "flake.lock"
PINNED_VARIANTS = ROOT / "tools" / "ltx_build" / "pinned-build-variants.json"


class PinError(RuntimeError):
    pass


def _git(mirror: Path, *args: str) -> bytes:
    res = subprocess.run(["git", "-C", str(mirror), *args], capture_output=True)
    if res.returncode != 0:
        raise PinError(f"git {' '.join(args)}: {res.stderr.decode().strip()}")
    return res.stdout


def nar_hash(tree: Path) -> str:
    """The SRI sha256 NAR hash of a directory, as Nix records it in flake.lock."""
    cmd = ["nix", "--extra-experimental-features", "nix-command", "hash", "path", str(tree)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise PinError("`nix` is not on PATH (Debian: apt-get install nix-bin)") from e
    if res.returncode != 0:
        raise PinError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout.strip()


def commit_nar_hash(mirror: Path, rev: str) -> str:
    """The NAR hash of the tree GitHub's tarball of `rev` unpacks to: `git archive` of it."""
    with tempfile.TemporaryDirectory(prefix="kernel-builder-src-") as tmp:
        archive = subprocess.Popen(["git", "-C", str(mirror), "archive", "--format=tar", rev],
                                   stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, capture_output=True)
        archive.stdout.close()
        if archive.wait() != 0 or untar.returncode != 0:
            raise PinError(f"git archive {rev} | tar -x failed: {untar.stderr.decode().strip()}")
        return nar_hash(Path(tmp))


def rerooted(ref, node: str = NODE):
    """An input reference of the upstream lock, seen from ours: a follows path (walked from the root)
    now starts at our `node`; a node name stays as it is."""
    return [node, *ref] if isinstance(ref, list) else ref


def lock_for(upstream: dict, rev: str, last_modified: int, nar: str) -> dict:
    """Our flake.lock: root -> kernel-builder (pinned at `rev`) -> the upstream lock's nodes."""
    up_nodes, up_root = upstream["nodes"], upstream["root"]
    clashes = {NODE, "root"} & (set(up_nodes) - {up_root})
    if clashes:  # `nix flake lock` would rename them (`_2` suffixes); not needed so far
        raise PinError(f"the upstream lock has nodes named {sorted(clashes)}: rename them by hand")
    nodes = {}
    for name, node in up_nodes.items():
        if name == up_root:
            continue
        node = json.loads(json.dumps(node))
        if "inputs" in node:
            node["inputs"] = {k: rerooted(v) for k, v in node["inputs"].items()}
        nodes[name] = node
    nodes[NODE] = {
        "inputs": {k: rerooted(v) for k, v in up_nodes[up_root].get("inputs", {}).items()},
        "locked": {"lastModified": last_modified, "narHash": nar, **GITHUB, "rev": rev},
        "original": dict(GITHUB),
    }
    nodes["root"] = {"inputs": {NODE: NODE}}
    return {"nodes": nodes, "root": "root", "version": 7}


def dumps(lock: dict) -> str:
    """flake.lock's text as Nix writes it: sorted keys, two-space indent, a final newline."""
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Pin:
    rev: str
    last_modified: int
    nar_hash: str
    lock_text: str
    variants: bytes  # nix-builder/build-variants.json of rev


def derive(mirror: Path, rev: str) -> Pin:
    """Everything the pin writes, from the git copy of huggingface/kernels at `mirror`."""
    full = _git(mirror, "rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    last_modified = int(_git(mirror, "log", "-1", "--format=%ct", full).decode().strip())
    upstream = json.loads(_git(mirror, "show", f"{full}:flake.lock"))
    nar = commit_nar_hash(mirror, full)
    lock = lock_for(upstream, full, last_modified, nar)
    return Pin(full, last_modified, nar, dumps(lock), _git(mirror, "show", f"{full}:{VARIANTS_IN_REPO}"))


def outputs(pin: Pin, lock_path: Path = FLAKE_LOCK, variants_path: Path = PINNED_VARIANTS) -> dict[Path, bytes]:
    return {lock_path: pin.lock_text.encode(), variants_path: pin.variants}


def stale(files: dict[Path, bytes]) -> list[Path]:
    """The files whose content differs from what the pin gives."""
    return [p for p, data in files.items() if not p.is_file() or p.read_bytes() != data]


def cross_check(community: Path, pin: Pin) -> list[tuple[str, bool]]:
    """(path, whether its kernel-builder node locks what we lock) for every */flake.lock of a
    huggingface/kernels-community git copy (HEAD) that pins `pin.rev`."""
    res = subprocess.run(["git", "-C", str(community), "grep", "-l", pin.rev, "HEAD", "--", "*/flake.lock"],
                         capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 1: no match
        raise PinError(f"git grep in {community}: {res.stderr.strip()}")
    ours = json.loads(pin.lock_text)["nodes"][NODE]["locked"]
    found = []
    for line in res.stdout.split():
        path = line.split(":", 1)[1]
        theirs = json.loads(_git(community, "show", f"HEAD:{path}"))
        node = theirs["nodes"][theirs["nodes"][theirs["root"]]["inputs"][NODE]]
        found.append((path, node.get("locked") == ours))
    return found


def run(args) -> int:
    try:
        pin = derive(args.mirror, args.rev)
        files = outputs(pin, args.lock, args.variants)
        print(f"kernel-builder {pin.rev}: lastModified {pin.last_modified}, narHash {pin.nar_hash}")
        if args.cross_check:
            found = cross_check(args.cross_check, pin)
            for path, same in found:
                print(f"  {path}: {'same pin' if same else 'DIFFERENT lastModified/narHash'}")
            if not found:
                print(f"  no */flake.lock of {args.cross_check} pins {pin.rev}")
            if not all(same for _, same in found):
                return 1
    except PinError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = stale(files)
    if args.check:
        for p in changed:
            print(f"{p} differs from what {pin.rev} gives", file=sys.stderr)
        return 1 if changed else 0
    for p in changed:
        p.write_bytes(files[p])
        print(f"wrote {p}")
    if not changed:
        print("flake.lock and the pinned build variants are up to date")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("pin-kernel-builder", help="pin flake.lock's kernel-builder to a commit, offline",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror", type=Path, required=True, metavar="GIT_DIR",
                   help="a git copy (bare or not) of huggingface/kernels that has the commit")
    p.add_argument("--rev", required=True, metavar="SHA", help="the commit to pin (any form git accepts)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    p.add_argument("--cross-check", type=Path, metavar="GIT_DIR",
                   help="a git copy of huggingface/kernels-community: compare with its flake.locks of this commit")
    p.add_argument("--lock", type=Path, default=FLAKE_LOCK, help=argparse.SUPPRESS)
    p.add_argument("--variants", type=Path, default=PINNED_VARIANTS, help=argparse.SUPPRESS)
    p.set_defaults(run=run)
