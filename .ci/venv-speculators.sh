#!/usr/bin/env bash
# The speculators virtualenv: the real `speculators` library, used only to (re)generate the
# checked-in fixtures under tests/fixtures/speculators/ (make_fixtures.py). The test suite never
# needs it: tests read the checked-in files.
#
#   bash .ci/venv-speculators.sh            # create (or reuse) the venv, print its python
#   bash .ci/venv-speculators.sh --check    # ... then rebuild every fixture and compare bytes
#   bash .ci/venv-speculators.sh --write    # ... then regenerate the fixtures in place
#   bash .ci/venv-speculators.sh --check-specdec / --write-specdec   # the same for tests/fixtures/specdec/
#                                           # (the acceptance-parity target and trained DSpark, make_specdec_fixtures.py;
#                                           # it pins torch's float32 kernels to one code path, ATEN_CPU_CAPABILITY=default
#                                           # and MKL_CBWR=COMPATIBLE, so an AVX2 and an AVX512 machine write the same bytes)
#
# It lives outside the clone (speculators pins its own torch, so it is never a dependency of
# dspark-hub): ${DSPARK_VENV_CACHE:-$HOME/.cache/dspark-hub}/speculators-0.9.0.
set -euo pipefail
cd "$(dirname "$0")/.."

SPECULATORS_VERSION=0.9.0
TORCH_VERSION=2.13.0          # the CPU build the project's own venv uses; speculators 0.9.0 allows >=2.9,<=2.14.1
TRANSFORMERS_VERSION=5.19.0   # the newest speculators 0.9.0 allows; fixture bytes depend on it (to_diff_dict)
VENV="${DSPARK_VENV_CACHE:-$HOME/.cache/dspark-hub}/speculators-${SPECULATORS_VERSION}"

# Checked once, then remembered in the stamp (with the versions it found): the checks import speculators, torch
# and transformers, 12 s on the 2-core machine, which every `.ci/run` paid.
STAMP="$VENV/.dspark-hub-ready-1"
if [ ! -f "$STAMP" ]; then
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import speculators" 2>/dev/null; then
        rm -rf "$VENV"
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q "torch==${TORCH_VERSION}" "speculators==${SPECULATORS_VERSION}" \
            "transformers==${TRANSFORMERS_VERSION}"
        # speculators requires torchvision and torchaudio, which do not work beside the CPU torch build
        # (they are built against another torch) and are never imported by the fixture script.
        "$VENV/bin/pip" uninstall -q -y torchvision torchaudio
    fi
    # The equality tests against the library (tests/test_speculators_objective.py) run in this venv.
    "$VENV/bin/python" -c "import pytest, hypothesis" 2>/dev/null || "$VENV/bin/pip" install -q "pytest>=8" "hypothesis>=6.100" >&2
    "$VENV/bin/python" -c "from speculators.version import version; import torch, transformers; print('speculators', version, 'torch', torch.__version__, 'transformers', transformers.__version__)" > "$STAMP.tmp"
    mv "$STAMP.tmp" "$STAMP"
fi
cat "$STAMP" >&2
echo "$VENV/bin/python"

case "${1:-}" in
    --check) OMP_NUM_THREADS=1 "$VENV/bin/python" tests/fixtures/speculators/make_fixtures.py --check ;;
    --write) OMP_NUM_THREADS=1 "$VENV/bin/python" tests/fixtures/speculators/make_fixtures.py ;;
    --check-specdec) OMP_NUM_THREADS=1 "$VENV/bin/python" tests/fixtures/specdec/make_specdec_fixtures.py --check ;;
    --write-specdec) OMP_NUM_THREADS=1 "$VENV/bin/python" tests/fixtures/specdec/make_specdec_fixtures.py ;;
    "") ;;
    *) echo "usage: $0 [--check|--write|--check-specdec|--write-specdec]" >&2; exit 2 ;;
esac
