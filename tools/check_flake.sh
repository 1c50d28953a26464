#!/usr/bin/env bash
# Sanity-check the Nix flake files without fetching anything:
#   - flake.nix must parse (nix-instantiate --parse)
#   - flake.lock must be valid JSON
# Installs Debian's nix-bin via apt-get if nix-instantiate is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v nix-instantiate >/dev/null 2>&1; then
  echo "nix-instantiate not found; installing nix-bin with apt-get" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq nix-bin >/dev/null
fi

if ! command -v nix-instantiate >/dev/null 2>&1; then
  echo "error: nix-instantiate still not available" >&2
  exit 1
fi

nix-instantiate --parse flake.nix >/dev/null
echo "flake.nix parses"

python3 - <<'PY'
import json, sys
try:
    with open("flake.lock") as f:
        lock = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"error: flake.lock is not valid JSON: {e}")
if not isinstance(lock, dict) or "nodes" not in lock or "root" not in lock:
    sys.exit("error: flake.lock lacks 'nodes'/'root'")
print("flake.lock is valid JSON (version %s, %d nodes)" % (lock.get("version"), len(lock["nodes"])))
PY
