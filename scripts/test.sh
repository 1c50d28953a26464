#!/usr/bin/env bash
# The test command (README, CI): install what is missing, build the variant for
# the installed torch (incremental), check its ABI, load it through `kernels`
# (scripts/install_and_build.sh), check the Nix files, then run every test.
# GPU tests skip without CUDA.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install_and_build.sh
bash tools/check_flake.sh
set +e
python3 -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no tests ran" >&2; exit 1; }
exit "$rc"
