#!/usr/bin/env bash
# The install and build part of scripts/setup.sh and scripts/test.sh: install
# torch 2.14.1 when this Python has none, the tools (ltx_build, ltx_dev) editable
# with their dev extra (tools/pyproject.toml) and the diffusers integration
# (integrations/diffusers), then build the variant for the installed torch
# (incremental; arguments go to `ltx-build build`).
# LTX_OFFLINE=1 (a machine without an index, its wheels installed another way):
# pip installs the tools alone, --no-build-isolation --no-deps.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip=(python3 -m pip install -q)
python3 -c "import torch" 2>/dev/null || "${pip[@]}" torch==2.14.1
if [ -n "${LTX_OFFLINE:-}" ]; then
  "${pip[@]}" --no-build-isolation --no-deps -e tools -e integrations/diffusers
else
  "${pip[@]}" -e "tools[dev]" -e integrations/diffusers
fi
# The module, not the console script: it is this python3's, whatever PATH holds.
python3 -m ltx_build build "$@"
