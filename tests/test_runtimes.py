"""Per-runtime verdicts: the same checkpoint is loaded, skipped, ignored or fatal depending on the runtime."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.verify.checks import verify
from dspark_hub.verify.runtimes import RUNTIMES, runtime_verdicts, serving_parameters

from .factories import tensors_for, write_checkpoint

TINY = contract.TINY_CONFIG
TRAINER = {"fc.weight": "context_proj.weight", "hidden_norm.weight": "context_norm.weight",
           "norm.weight": "final_norm.weight"}


def renamed(mapping):
    def mutate(tensors):
        for new, old in mapping.items():
            tensors[new] = tensors.pop(old)
    return mutate


def verdicts(folder, runtime):
    report = verify(folder, runtime=runtime)
    data = report.sections["runtimes"][runtime]
    tensors = {v["tensor"]: v["verdict"] for v in data["verdicts"]}
    unfilled = {u["parameter"]: u["verdict"] for u in data["unfilled"]}
    return report, tensors, unfilled


@pytest.fixture
def trainer_named(tmp_path):
    return write_checkpoint(tmp_path / "trainer", mutate=renamed(TRAINER))


#: Trainer-named export: what each runtime does with the three wrong names and the three contract parameters
#: they leave unfilled. vLLM: the names raise; the norms fail its strict check, context_proj is exempt from it.
TRAINER_EXPECTED = {
    "vllm": ("fatal", {"context_proj.weight": "ignored", "context_norm.weight": "fatal",
                       "final_norm.weight": "fatal"}),
    "tokenspeed": ("fatal", dict.fromkeys(TRAINER.values(), "fatal")),
    "atom": ("ignored", dict.fromkeys(TRAINER.values(), "ignored")),
    "sglang": ("ignored", dict.fromkeys(TRAINER.values(), "ignored")),
}


@pytest.mark.parametrize("runtime", list(TRAINER_EXPECTED))
def test_trainer_names_are_fatal_in_some_runtimes_and_silently_ignored_in_others(trainer_named, runtime):
    expected, unfilled_expected = TRAINER_EXPECTED[runtime]
    report, tensors, unfilled = verdicts(trainer_named, runtime)
    assert {wrong: tensors[wrong] for wrong in TRAINER} == dict.fromkeys(TRAINER, expected)
    assert unfilled == unfilled_expected
    assert tensors["layers.0.self_attn.q_a_proj.weight"] == "loaded"
    assert tensors["embed_tokens.weight"] == "skipped"
    assert tensors["confidence_head.proj.weight"] == ("loaded" if runtime == "vllm" else "skipped")
    codes = {f.code for f in report.findings if f.where == f"runtime:{runtime}"}
    assert codes == ({"RUNTIME_LOAD_FAILS"} if expected == "fatal" else {"RUNTIME_SILENT_DROP"})


def test_atom_silent_drop_spells_out_the_consequence(trainer_named):
    report = verify(trainer_named, runtime="atom")
    (finding,) = [f for f in report.findings if f.code == "RUNTIME_SILENT_DROP"]
    assert finding.severity == "error"
    assert finding.message.startswith("ATOM would ignore fc.weight, hidden_norm.weight, norm.weight and starts and "
                                      "serves with context_norm.weight, context_proj.weight, final_norm.weight at "
                                      "their init values: the context path is dropped")
    assert "acceptance collapses" in finding.message


def test_shipped_lm_head_is_skipped_by_design_everywhere(tmp_path):
    folder = write_checkpoint(tmp_path / "lm",
                              mutate=lambda t: t.update({"lm_head.weight": t["embed_tokens.weight"].clone()}))
    for runtime in RUNTIMES:
        report, tensors, unfilled = verdicts(folder, runtime)
        assert tensors["lm_head.weight"] == "skipped", runtime
        assert set(tensors.values()) == {"loaded", "skipped"} and unfilled == {}
        assert [f.code for f in report.findings if f.where == f"runtime:{runtime}"] == ["RUNTIME_LOADS"]


def test_model_prefix_is_stripped_by_tokenspeed_only(tmp_path):
    folder = write_checkpoint(tmp_path / "p", tensors={f"model.{n}": t for n, t in tensors_for(TINY).items()})
    name = "model.layers.0.mlp.gate_proj.weight"
    expected = {"tokenspeed": ("loaded", "skipped"), "vllm": ("fatal", "skipped"),
                "atom": ("ignored", "ignored"), "sglang": ("ignored", "ignored")}
    for runtime, (layer_verdict, embed_verdict) in expected.items():
        _, tensors, _ = verdicts(folder, runtime)
        assert tensors[name] == layer_verdict, runtime
        assert tensors["model.embed_tokens.weight"] == embed_verdict, runtime
    # the ignored prefixed embedding costs nothing in ATOM (it would be skipped anyway): not named as a drop
    (drop,) = [f for f in verify(folder, runtime="atom").findings if f.code == "RUNTIME_SILENT_DROP"]
    assert "model.embed_tokens.weight" not in drop.message and "model.context_proj.weight" in drop.message


def test_fused_parameters_are_named(tmp_path):
    folder = write_checkpoint(tmp_path / "ok")
    result = runtime_verdicts(list(contract.roster(TINY)), TINY, RUNTIMES["tokenspeed"])
    assert result.tensors["layers.1.self_attn.kv_a_proj_with_mqa.weight"] == ("loaded", "stacked into fused_qkv_a_proj")
    assert result.tensors["layers.1.mlp.up_proj.weight"] == ("loaded", "stacked into gate_up_proj")
    assert result.tensors["layers.1.self_attn.kv_b_proj.weight"] == ("loaded", "loaded as is")
    assert verify(folder, runtime="all").ok


def test_missing_tensor_is_fatal_or_silent_by_runtime(tmp_path):
    folder = write_checkpoint(tmp_path / "m", mutate=lambda t: t.pop("markov_head.markov_w2.weight"))
    assert verdicts(folder, "tokenspeed")[2] == {"markov_head.markov_w2.weight": "fatal"}
    for runtime, state in (("vllm", "uninitialised"), ("atom", "at its init value")):
        report, _, unfilled = verdicts(folder, runtime)
        assert unfilled == {"markov_head.markov_w2.weight": "ignored"}
        (drop,) = [f for f in report.findings if f.code == "RUNTIME_SILENT_DROP"]
        assert f"starts and serves with markov_head.markov_w2.weight {state}: the Markov head is random" \
            in drop.message


def test_every_rule_cites_a_source_and_says_whether_it_was_executed_or_read():
    for spec in RUNTIMES.values():
        assert spec.rules and all(rule.source.strip() and rule.rule.strip() for rule in spec.rules)
        assert spec.serving.source.strip()
        assert all(rule.evidence in ("executed", "read") and rule.id for rule in spec.rules), spec.name
        assert len({rule.id for rule in spec.rules}) == len(spec.rules), spec.name
    assert {rule.evidence for rule in RUNTIMES["vllm"].rules} == {"executed"}
    for name in ("tokenspeed", "atom", "sglang"):
        assert {rule.evidence for rule in RUNTIMES[name].rules} == {"read"}
        assert all("@" in rule.source or "searched" in rule.source or "Lumen" in rule.source
                   or "plugin" in rule.source for rule in RUNTIMES[name].rules), name


def test_serving_fragments_follow_the_config_and_block_size():
    vllm = serving_parameters(TINY, RUNTIMES["vllm"], draft="org/draft", target="org/target")
    args = shlex.split(vllm["command"])
    assert args[:3] == ["vllm", "serve", "org/target"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "model": "org/draft", "num_speculative_tokens": 7}
    assert vllm["target_layer_ids"] == TINY["target_layer_ids"]
    ts = shlex.split(serving_parameters(TINY, RUNTIMES["tokenspeed"], block_size=5)["command"])
    assert ts[ts.index("--speculative-num-steps") + 1] == "5"
    assert ts[ts.index("--speculative-num-draft-tokens") + 1] == "6"
    atom = shlex.split(serving_parameters(TINY, RUNTIMES["atom"], draft="d")["command"])
    assert atom[atom.index("--method") + 1] == "dspark" and atom[atom.index("--draft-model") + 1] == "d"
    sgl = shlex.split(serving_parameters(TINY, RUNTIMES["sglang"], block_size=3)["command"])
    assert sgl[sgl.index("--speculative-dspark-block-size") + 1] == "3"


def test_cli_runtime_choices_come_from_the_registry(tmp_path):
    option = next(p for p in cli.commands["verify"].params if p.name == "runtime")
    assert list(option.type.choices) == [*RUNTIMES, "all"]
    folder = write_checkpoint(tmp_path / "c", mutate=renamed(TRAINER))
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "all", "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 1
    assert list(doc["sections"]["runtimes"]) == list(RUNTIMES)
    assert doc["sections"]["family"]["family"] == "k3_dspark"
    human = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--block-size", "5"])
    # vLLM refuses the trainer names, so no command is offered for it
    assert "per-tensor verdicts" in human.stdout and "no serving command: vLLM refuses" in human.stdout
    loading = CliRunner().invoke(cli, ["verify", str(write_checkpoint(tmp_path / "ok")), "--runtime", "vllm",
                                       "--block-size", "5"])
    assert '"num_speculative_tokens": 5' in loading.stdout
    assert CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "trt"]).exit_code == 2


def test_serving_commands_paste_into_a_shell(tmp_path):
    odd = str(tmp_path / "my draft's dir")
    vllm = serving_parameters(contract.TINY_CONFIG, RUNTIMES["vllm"], draft=odd)["command"]
    argv = shlex.split(vllm)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == odd
    atom = serving_parameters(contract.TINY_CONFIG, RUNTIMES["atom"], draft="hf://org/name@abc123")["command"]
    assert shlex.split(atom)[shlex.split(atom).index("--draft-model") + 1] == "org/name"
