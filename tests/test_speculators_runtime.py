"""--runtime vllm on speculators DSpark checkpoints: per-tensor verdicts as vLLM 0.32.0 behaved, and the
serving command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.verify.checks import verify
from dspark_hub.verify.runtimes.speculators_rules import RULES, serving_parameters

from .spec_fixtures import DSPARK, copy_fixture, edit_config, fixture, read_config, set_key

#: What vLLM 0.32.0's Qwen3DSparkForCausalLM.load_weights did with each fixture, as run for the research
#: (evidence/probe_vllm.txt: "ACCEPT load ..." / "REJECT load ... ValueError ...").
EXECUTED = {name: name not in ("dspark-gated-markov", "dspark-rnn-markov") for name in DSPARK}
#: Mutated copies of `dspark` run through the same loader (config edit -> accepted?).
EXECUTED_MUTANTS = [
    ("target_hidden_size", 128, False, "fc.weight"),
    ("aux_hidden_state_layer_ids", [1, 3], False, "fc.weight"),
    ("confidence_head_with_markov", False, False, "confidence_head.proj.weight"),
    ("enable_confidence_head", False, True, None),
    ("markov_rank", 8, False, "confidence_head.proj.weight"),
    ("markov_head_type", "rnn", True, None),        # vLLM never reads the type: vanilla tensors load
]
SEED_CARD_LINE = ("vllm serve moonshotai/Kimi-K3 --spec-method dspark --spec-model RedHatAI/Kimi-K3-speculator.dspark "
                  "--spec-tokens 8")


def vllm(folder, **kwargs):
    report = verify(folder, runtime="vllm", **kwargs)
    data = report.sections["runtimes"]["vllm"]
    return report, {v["tensor"]: (v["verdict"], v["rule"]) for v in data["verdicts"]}, data


@pytest.mark.parametrize("name", DSPARK)
def test_verdicts_agree_with_the_executed_loader(name):
    report, verdicts, data = vllm(fixture(name))
    loads = not any(v == "fatal" for v, _ in verdicts.values()) and not data["unfilled"]
    assert loads is EXECUTED[name]
    codes = {f.code for f in report.findings if f.where == "runtime:vllm"} - {"SERVING_TOKEN_COUNT"}
    assert codes == ({"RUNTIME_LOADS"} if loads else {"RUNTIME_LOAD_FAILS"})
    assert all(rule in RULES for _, rule in verdicts.values())


def test_gated_and_rnn_heads_fail_on_their_extra_tensors_biases_included():
    _, gated, _ = vllm(fixture("dspark-gated-markov"))
    assert gated["markov_head.gate_proj.weight"] == ("fatal", "vanilla_markov")
    assert gated["markov_head.gate_proj.bias"] == ("fatal", "vanilla_markov")    # gate_up_proj is no module
    _, rnn, _ = vllm(fixture("dspark-rnn-markov"))
    assert rnn["markov_head.joint_proj.weight"] == ("fatal", "vanilla_markov")
    report, _, _ = vllm(fixture("dspark-gated-markov"))
    assert "RUNTIME_SILENT_DROP" not in report.codes()      # the load fails: nothing is dropped silently


def test_pruned_vocabulary_loads_lm_head_and_d2t_and_skips_t2d():
    _, verdicts, _ = vllm(fixture("dspark-pruned-vocab"))
    assert verdicts["lm_head.weight"][0] == verdicts["d2t"][0] == "loaded"
    assert verdicts["t2d"] == ("skipped", "t2d_skipped")
    assert verdicts["layers.0.self_attn.q_proj.weight"] == ("loaded", "stacked")


@pytest.mark.parametrize("key,value,accepted,culprit", EXECUTED_MUTANTS)
def test_verdicts_agree_with_the_executed_mutants(tmp_path, key, value, accepted, culprit):
    folder = edit_config(copy_fixture(tmp_path, "dspark"), set_key(key, value))
    _, verdicts, data = vllm(folder)
    fatal = {n for n, (v, _) in verdicts.items() if v == "fatal"} | {u["parameter"] for u in data["unfilled"]}
    assert (not fatal) is accepted
    if culprit:
        assert culprit in fatal


def test_confidence_tensors_are_dropped_when_the_flag_is_absent_or_false(tmp_path):
    folder = edit_config(copy_fixture(tmp_path, "dspark"), set_key("enable_confidence_head", ...))
    report, verdicts, _ = vllm(folder)
    assert verdicts["confidence_head.proj.weight"] == ("skipped", "confidence_dropped")
    assert ("CONFIG_MISSING_KEY", "config.json:enable_confidence_head") in {(f.code, f.where) for f in report.findings}


def test_a_missing_tensor_starts_uninitialised_because_no_strict_check_runs(tmp_path):
    from .spec_fixtures import drop, edit_tensors

    folder = edit_tensors(copy_fixture(tmp_path, "dspark"), drop("hidden_norm.weight"))
    report, _, data = vllm(folder)
    (entry,) = data["unfilled"]
    assert (entry["parameter"], entry["verdict"], entry["rule"]) == ("hidden_norm.weight", "ignored", "no_strict_check")
    (drop_finding,) = [f for f in report.findings if f.code == "RUNTIME_SILENT_DROP"]
    assert "vLLM starts and serves with hidden_norm.weight uninitialised" in drop_finding.message


def test_every_rule_is_data_with_a_source_and_evidence():
    for rule_id, rule in RULES.items():
        assert rule.id == rule_id and rule.source.startswith("vLLM 0.32.0 vllm/")
        assert rule.evidence in ("executed", "read")
        assert re.search(r"\.py:\d+", rule.source) or rule.evidence == "read", rule_id
    data = verify(fixture("dspark"), runtime="vllm").sections["runtimes"]["vllm"]
    assert {r["id"] for r in data["rules"]} == set(RULES)
    assert all(r["evidence"] for r in data["rules"])


# ---------------------------------------------------------------- serving

def test_serving_commands_both_spellings_with_n_from_speculators_config():
    serving = verify(fixture("dspark"), runtime="vllm").sections["runtimes"]["vllm"]["serving"]
    argv = shlex.split(serving["command"])
    assert argv[:3] == ["vllm", "serve", "verifier-qwen3-tiny"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "dspark", "model": str(fixture("dspark")), "num_speculative_tokens": 4}
    (alt,) = serving["alternatives"]
    assert alt == ("vllm serve verifier-qwen3-tiny --spec-method dspark "
                   f"--spec-model {fixture('dspark')} --spec-tokens 4")
    assert serving["target_layer_ids"] == [1, 3, 5] and "[0, 2, 4]" in serving["target_layer_ids_source"]


def test_the_command_matches_the_seed_cards_spelling():
    config = read_config(fixture("dspark"))
    config.update(block_size=8, aux_hidden_state_layer_ids=[24, 48, 72, 88, 92])
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 8
    config["speculators_config"]["verifier"]["name_or_path"] = "moonshotai/Kimi-K3"
    serving = serving_parameters(config, draft="hf://RedHatAI/Kimi-K3-speculator.dspark@main")
    assert serving["alternatives"][0] == SEED_CARD_LINE
    for seeds in (Path(__file__).resolve().parents[2] / "shared" / "seeds", Path("/work/shared/seeds")):
        card = seeds / "kimi-k3-speculator-dspark-mirror-page.txt"
        if card.is_file():
            assert SEED_CARD_LINE in card.read_text()
            break


def test_bonus_anchor_draft_gives_n_explicitly_and_is_flagged():
    report = verify(fixture("dspark-bonus-anchor"), runtime="vllm")
    serving = report.sections["runtimes"]["vllm"]["serving"]
    assert serving["num_speculative_tokens"] == 3 and serving["alternatives"][0].endswith("--spec-tokens 3")
    assert "bonus-anchor" in serving["note"]
    (warn,) = [f for f in report.findings if f.code == "SERVING_TOKEN_COUNT"]
    assert warn.severity == "warning" and "runs 5 query slots" in warn.message
    assert "SERVING_TOKEN_COUNT" not in verify(fixture("dspark"), runtime="vllm").codes()   # its twin


def test_block_size_overrides_n_and_says_so():
    serving = verify(fixture("dspark"), runtime="vllm", block_size=6).sections["runtimes"]["vllm"]["serving"]
    assert serving["num_speculative_tokens"] == 6 and "overrides" in serving["block_size_source"]


def test_runtimes_without_loader_rules_are_said_not_judged():
    report = verify(fixture("dspark"), runtime="tokenspeed")
    assert [(f.code, f.severity) for f in report.findings] == [("RUNTIME_NO_RULES", "warning")]
    everything = verify(fixture("dspark"), runtime="all")
    section = everything.sections["runtimes"]
    assert section["vllm"]["supported"] is True and section["sglang"]["supported"] is False
    assert "RUNTIME_NO_RULES" not in everything.codes()


def test_cli_prints_both_commands_and_the_json_section(tmp_path):
    human = CliRunner().invoke(cli, ["verify", str(fixture("dspark")), "--runtime", "vllm"])
    assert human.exit_code == 0
    assert "--spec-method dspark --spec-model" in human.stdout and "--speculative-config" in human.stdout
    doc = json.loads(CliRunner().invoke(cli, ["verify", str(fixture("dspark-pruned-vocab")), "--runtime", "vllm",
                                              "--json"]).stdout)
    assert doc["sections"]["runtimes"]["vllm"]["counts"] == {"loaded": 31, "skipped": 1, "ignored": 0, "fatal": 0}
    assert doc["summary"]["parameters"]["maps"] == 320


@pytest.mark.parametrize("block_size", [..., "4"])
def test_a_bonus_anchor_draft_with_a_bad_block_size_is_a_finding_not_a_crash(tmp_path, block_size):
    # serving_findings added 1 to block_size whatever it was: a missing one raised TypeError out of verify.
    folder = edit_config(copy_fixture(tmp_path, "dspark-bonus-anchor"), set_key("block_size", block_size))
    report = verify(folder, runtime="vllm")
    assert not report.ok and "SERVING_TOKEN_COUNT" not in report.codes()
    assert any("block_size" in f.message for f in report.findings if f.severity == "error")
