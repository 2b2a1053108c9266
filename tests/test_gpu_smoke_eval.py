"""bench/gpu_smoke_eval_vllm.py's own judgement: its parity rule, its options, the draft it accepts, and
(on the cached SmolLM2 world, marked `real`) its `--no-engine` run. The vLLM measurement itself needs a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.vllm.pin import PINNED_VERSION

from .test_real_world import WORLD, needs_world

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPT = BENCH / "gpu_smoke_eval_vllm.py"


@pytest.fixture
def smoke(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_smoke_eval_vllm

    return gpu_smoke_eval_vllm


def _simulated():
    return {"drafts": 40, "accepted_per_position": [30, 20, 10, 5, 2, 1, 0], "tokens": 256, "k": 7,
            "acceptance_length": 2.7}


def _measured(**changes):
    doc = {**_simulated(), "lossless": True,
           "measured_by": {"vllm_version": PINNED_VERSION,
                           "speculative_config": {"method": "dspark", "num_speculative_tokens": 7}}}
    doc.update(changes)
    return doc


def test_float32_counts_equal_to_the_simulation_pass(smoke):
    assert smoke.parity_failures(_simulated(), _measured(), "float32") == []


@pytest.mark.parametrize("changes, words", [
    ({"drafts": 41}, "differ in ['drafts']"),
    ({"accepted_per_position": [30, 20, 10, 5, 2, 0, 1]}, "accepted_per_position"),
    ({"tokens": 255}, "tokens"),
    ({"lossless": False}, "differ from plain greedy"),
    ({"measured_by": {"vllm_version": "0.31.0",
                      "speculative_config": {"method": "dspark", "num_speculative_tokens": 7}}}, "unexpected engine"),
    ({"measured_by": {"vllm_version": PINNED_VERSION,
                      "speculative_config": {"method": "eagle3", "num_speculative_tokens": 7}}}, "unexpected engine"),
    ({"measured_by": {"vllm_version": PINNED_VERSION,
                      "speculative_config": {"method": "dspark", "num_speculative_tokens": 5}}}, "unexpected engine"),
])
def test_any_difference_in_float32_fails(smoke, changes, words):
    failures = smoke.parity_failures(_simulated(), _measured(**changes), "float32")
    assert len(failures) == 1 and words in failures[0]


@pytest.mark.parametrize("measured_al, ok", [(2.7, True), (2.61, True), (2.79, True), (2.59, False), (2.85, False)])
def test_bfloat16_asks_only_for_acceptance_lengths_within_a_tenth(smoke, measured_al, ok):
    measured = _measured(drafts=39, tokens=250, acceptance_length=measured_al)
    failures = smoke.parity_failures(_simulated(), measured, "bfloat16")
    assert (failures == []) == ok, failures


@pytest.mark.parametrize("argv, steps, tokens", [
    ([], 150, 32),
    (["--world", "smollm2"], 300, 96),
    (["--world", "smollm2", "--steps", "0", "--max-new-tokens", "8"], 0, 8),
])
def test_each_world_has_its_own_defaults(smoke, argv, steps, tokens):
    args = smoke.parse_args(argv)
    assert (args.steps, args.max_new_tokens) == (steps, tokens)


@pytest.mark.parametrize("argv", [["--target", "T"], ["--draft", "D"], ["--world", "tiny", "--draft", "D"],
                                  ["--world", "small"]])
def test_options_of_another_world_are_usage_errors(argv):
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("gpu_smoke_eval_vllm.py: error:")


# ---------------------------------------------------------------- the draft --draft may name

@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    folder = tmp_path_factory.mktemp("teacher") / "tiny-teacher"
    assert CliRunner().invoke(cli, ["init-teacher", str(folder), "-q"]).exit_code == 0
    return folder


def _init(*args):
    result = CliRunner().invoke(cli, ["init", *map(str, args), "-q"])
    assert result.exit_code == 0, result.output
    return Path(args[0])


def test_a_paired_draft_with_gpu_mla_widths_is_taken(smoke, teacher, tmp_path):
    draft = _init(tmp_path / "d", "--target", teacher, "--mla-widths-from", "kimi-k3", "--taps", "1,3")
    config = smoke.check_given_draft(draft, teacher)
    assert config["target_layer_ids"] == [1, 3] and config["kv_lora_rank"] == 512


@pytest.mark.parametrize("make, words", [
    (lambda d, t: _init(d, "--target", t), "MLA widths"),                                  # T-scaled widths
    (lambda d, t: _init(d, "--target", t, "--mla-widths-from", "tiny"), "MLA widths"),
    (lambda d, t: _init(d), "does not pair"),                                              # random embedding
    (lambda d, t: d, "does not pair"),                                                     # no folder at all
])
def test_a_draft_that_does_not_fit_is_refused_naming_why(smoke, teacher, tmp_path, make, words):
    with pytest.raises(smoke.Failed, match=words):
        smoke.check_given_draft(make(tmp_path / "d", teacher), teacher)


# ---------------------------------------------------------------- the CPU run on SmolLM2

@pytest.mark.slow
@pytest.mark.real
@needs_world
def test_smollm2_no_engine_run_checks_everything_but_vllm(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--world", "smollm2", "--target", str(WORLD / "f32"),
                           "--no-engine", "--train", "8", "--heldout", "4", "--steps", "10", "--max-new-tokens", "32",
                           "--batch-size", "4", "--anchors", "8", "--threads", "1", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    simulated = next(line for line in done.stdout.splitlines() if line.startswith("simulated:"))
    assert '"untrained base"' in simulated and '"prompt lookup"' in simulated
    assert done.stdout.strip().splitlines()[-1].startswith("OK: --no-engine")
