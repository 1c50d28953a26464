#!/usr/bin/env bash
# The test command (README, CI): install what is missing, build the variant for
# the installed torch (incremental), check its ABI, load it through `kernels`,
# check the Nix files, then run every test. GPU tests skip without CUDA.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q torch==2.14.1
python3 -m pip install -q -r requirements-dev.txt
python3 -m ltx_build build
bash tools/check_flake.sh
set +e
python3 -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "no tests ran" >&2; exit 1; }
exit "$rc"
