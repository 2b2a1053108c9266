"""The switches `.ci/run` relies on do what it relies on them for."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is importable here")
def test_a_required_vllm_that_is_missing_fails_the_run_instead_of_skipping():
    env = {**os.environ, "DSPARK_REQUIRE_VLLM": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider",
                          "tests/test_engine_vllm.py", "tests/test_vllm_conformance.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "DSPARK_REQUIRE_VLLM is set but vllm is not importable" in run.stderr
    unset = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider",
                            "tests/test_engine_vllm.py"], cwd=ROOT, env={**env, "DSPARK_REQUIRE_VLLM": ""},
                           capture_output=True, text=True)
    assert unset.returncode == 0 and "skipped" in unset.stdout
