"""The simulated eval counts exactly what vLLM counts, on the fixtures of tests/fixtures/specdec/.

- Main suite: the simulated `drafts` and `accepted_per_position` equal the measurement vLLM 0.32.0
  recorded (`vllm_eval.json`, `eval --engine vllm --json`, the command in make_specdec_fixtures.py),
  and leaving the Markov head out of the simulation breaks that equality (the control).
- `vllm` marker (`$(.ci/venv-vllm.sh) -m pytest -m vllm`, a step of `.ci/run`): vLLM runs for real
  through the CPU interpreter route, and its counts equal the simulation's again. Where vllm cannot
  be imported these skip, unless DSPARK_REQUIRE_VLLM=1 (set by `.ci/run`), which turns that into a
  failure: the route leans on vLLM internals, so it must fail loudly when it breaks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import MissingDependencyError
from dspark_hub.train.evaluation.evaluate import evaluate

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"
DRAFT, TARGET, PROMPTS = SPECDEC / "dspark", SPECDEC / "target", SPECDEC / "prompts.jsonl"
RECORDED = json.loads((SPECDEC / "vllm_eval.json").read_text())
MAX_TOKENS = RECORDED["measured_by"]["max_tokens"]      # 16: parity still discriminates (see the control)
COUNTS = ("drafts", "draft_tokens", "accepted", "accepted_per_position", "tokens", "prompts", "k")
VLLM_MISSING = importlib.util.find_spec("vllm") is None


def counts(doc: dict) -> dict:
    return {key: doc[key] for key in COUNTS}


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def simulated() -> dict:
    return evaluate(DRAFT, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=MAX_TOKENS).to_dict()


@pytest.fixture(scope="module")
def without_markov() -> dict:
    return evaluate(DRAFT, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=MAX_TOKENS,
                    markov=False).to_dict()


def test_the_recorded_measurement_is_vllms_own():
    measured = RECORDED["measured_by"]
    assert (measured["vllm_version"], measured["model_runner"], measured["triton_interpret"],
            measured["dtype"]) == ("0.32.0", "v2", True, "float32")
    assert measured["speculative_config"]["method"] == "dspark"
    assert measured["speculative_config"]["num_speculative_tokens"] == RECORDED["k"] == 4
    assert RECORDED["lossless"] is True and RECORDED["engine"] == "vllm"


@pytest.mark.slow
def test_the_simulated_counts_equal_vllms(simulated):
    assert counts(simulated) == counts(RECORDED)
    assert simulated["engine"] == "simulated" and simulated["measured_by"] is None
    # vLLM's definitions, computed from the counts
    drafts = simulated["drafts"]
    assert simulated["per_position"] == [a / drafts for a in simulated["accepted_per_position"]]
    assert simulated["acceptance_length"] == 1 + sum(simulated["accepted_per_position"]) / drafts
    assert simulated["harness"]["prompts_sha256"] == RECORDED["measured_by"]["prompts_sha256"]


@pytest.mark.slow
def test_the_control_without_the_markov_head_breaks_parity(without_markov):
    assert without_markov["drafts"] != RECORDED["drafts"]
    assert without_markov["accepted_per_position"] != RECORDED["accepted_per_position"]


def test_the_engine_needs_an_interpreter_with_vllm(tmp_path):
    if not VLLM_MISSING:
        pytest.skip("vllm is importable here: the default interpreter works")
    with pytest.raises(MissingDependencyError, match="vllm_python"):
        evaluate(DRAFT, target=str(TARGET), prompts=str(PROMPTS), engine="vllm")


def test_an_interpreter_without_vllm_is_named_with_the_install_hint():
    """The worker runs in the given interpreter; one that cannot import vllm says so (before any engine)."""
    if not VLLM_MISSING:
        pytest.skip("this interpreter has vllm")
    result = run("eval", "--engine", "vllm", "--vllm-python", sys.executable, "--draft", DRAFT, "--teacher", TARGET,
                 "--prompts", PROMPTS, "--max-new-tokens", 4)
    assert result.exit_code == 2
    assert "--vllm-python" in result.output and "cannot import vllm" in result.output


# ----------------------------------------------------------------------------- vLLM for real

requires_vllm = pytest.mark.vllm
if VLLM_MISSING and os.environ.get("DSPARK_REQUIRE_VLLM", "") not in ("", "0"):
    pytest.fail("DSPARK_REQUIRE_VLLM is set but vllm is not importable in this interpreter", pytrace=False)


@pytest.fixture(scope="module")
def measured() -> dict:
    if VLLM_MISSING:
        pytest.skip("vllm is not importable here; run: $(.ci/venv-vllm.sh) -m pytest -m vllm")
    result = run("eval", "--engine", "vllm", "--draft", DRAFT, "--teacher", TARGET, "--prompts", PROMPTS,
                 "--max-new-tokens", MAX_TOKENS, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@requires_vllm
def test_vllm_measures_what_the_simulation_counts(measured, simulated):
    assert counts(measured) == counts(simulated) == counts(RECORDED)
    assert measured["lossless"] is True and measured["ok"] is True


@requires_vllm
def test_vllm_counts_every_prompt_as_the_simulation_does(measured, simulated):
    """vLLM's per-request counts (`per_request_spec_decode_metrics`) equal the simulation's, prompt by prompt."""
    def by_key(doc: dict) -> dict:
        return {u["prompt_key"]: (u["drafts"], u["accepted_per_position"]) for u in doc["units"]}

    assert len(measured["units"]) == 8 and by_key(measured) == by_key(simulated)


@requires_vllm
def test_vllm_ran_the_dspark_speculator_on_model_runner_v2_through_the_interpreter(measured):
    by = measured["measured_by"]
    assert by["vllm_version"] == "0.32.0" and not by["untested_version"]
    assert (by["model_runner"], by["triton_interpret"], by["dtype"], by["platform"]) == ("v2", True, "float32", "cpu")
    assert by["speculative_config"] == {"method": "dspark", "model": str(DRAFT.resolve()), "num_speculative_tokens": 4}
    # the lossless reference is vLLM's native CPU decoding, not the interpreted route
    assert by["plain_run"] == {"model_runner": "v1", "triton_interpret": False}
    assert measured["harness"]["mode"] == "measured" and measured["engine"] == "vllm"


@requires_vllm
def test_vllm_disagrees_with_the_control(measured, without_markov):
    assert counts(measured) != counts(without_markov)


@requires_vllm
def test_both_engines_print_the_same_counts(measured, capsys):
    """The human counts line of both runs: the simulated run's from the CLI, the vLLM run's drawn by the CLI's own
    renderer from that run's result (running vLLM again for its human output would double the step)."""
    from types import SimpleNamespace

    from dspark_hub.cli._render import render_eval

    line = (f"accepted per position {measured['accepted_per_position']} of {measured['drafts']} drafts "
            f"(k {measured['k']})")
    simulated = run("eval", "--draft", DRAFT, "--teacher", TARGET, "--prompts", PROMPTS, "--max-new-tokens",
                    MAX_TOKENS)
    assert simulated.exit_code == 0, simulated.output
    assert line in simulated.stdout
    capsys.readouterr()
    render_eval(SimpleNamespace(to_dict=lambda: measured))
    human = capsys.readouterr().out
    assert line in human and f"measured by vLLM {measured['measured_by']['vllm_version']}" in human
    assert "lossless: the outputs equal plain greedy decoding's" in human
