"""card lint: each check has a failing fixture and its passing twin; every finding names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.lint import lint_card
from dspark_hub.cards.render import render_card
from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from tests.card_fixtures import SDDD, SPECULATOR, write_sparse_reference

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"

FRONT = "---\nlicense: apache-2.0\nbase_model: org/teacher\ntags:\n  - dspark\npipeline_tag: text-generation\n---\n"


@pytest.fixture(scope="module")
def tiny_card(tmp_path_factory, tiny) -> str:
    """A card rendered (with computed checksums) for the tiny checkpoint: the passing twin."""
    folder = tmp_path_factory.mktemp("meta")
    meta = {"name": "Tiny", "front_matter": yaml.safe_load(FRONT.strip("-\n")),
            "architecture": {"block_size": 2}}
    (folder / "card.yaml").write_text(yaml.safe_dump(meta))
    return render_card(folder / "card.yaml", tiny)


def _lint(tmp_path: Path, text: str, checkpoint: Path | None = None):
    path = tmp_path / "README.md"
    path.write_text(text)
    return lint_card(path, checkpoint)


def _line_of(text: str, needle: str, occurrence: int = 1) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[occurrence - 1]


def _only_errors(report) -> list[tuple[str, str]]:
    return [(f.code, f.where) for f in report.sorted_findings() if f.severity == "error"]


LABEL = "Acceptance numbers: measured (vLLM 0.32.0, k=3, float32, prompts c98977eaff7b)"


def _acceptance_card(*rows: str, label: str | None = LABEL) -> str:
    head = "| Dataset | Pos 0 | Pos 1 | Pos 2 | Acceptance length |\n| --- | --- | --- | --- | --- |\n"
    tail = f"\n{label}\n" if label else ""
    return FRONT + "\n# Card\n\n## Results\n\n" + head + "\n".join(rows) + "\n" + tail


# ------------------------------------------------------------------ weight facts (tiny checkpoint)

def test_rendered_card_passes_against_its_checkpoint(tmp_path, tiny, tiny_card):
    report = _lint(tmp_path, tiny_card, tiny)
    assert report.ok and _only_errors(report) == []
    assert report.findings == []


def test_wrong_parameter_count(tmp_path, tiny, tiny_card):
    total = contract.parameter_counts(contract.TINY_CONFIG).total
    bad = tiny_card.replace(f"{total:,} parameters", f"{total + 1:,} parameters")
    assert bad != tiny_card
    errors = _only_errors(_lint(tmp_path, bad, tiny))
    assert ("PARAMETERS_MISMATCH", f"README.md:{_line_of(bad, f'{total + 1:,}')}") in errors
    assert {code for code, _ in errors} == {"PARAMETERS_MISMATCH", "PARAMETERS_INCONSISTENT"}


def test_wrong_trained_count(tmp_path, tiny, tiny_card):
    trained = contract.parameter_counts(contract.TINY_CONFIG).trained
    bad = tiny_card.replace(f"only {trained:,} parameters", f"only {trained - 7:,} parameters")
    report = _lint(tmp_path, bad, tiny)
    line = _line_of(bad, f"{trained - 7:,}")
    assert ("PARAMETERS_MISMATCH", f"README.md:{line}") in _only_errors(report)
    assert ("PARAMETERS_INCONSISTENT", f"README.md:{line}") in _only_errors(report)   # trained + frozen != total


def test_shape_that_disagrees_with_the_checkpoint(tmp_path, tiny, tiny_card):
    h, r = contract.TINY_CONFIG["hidden_size"], contract.TINY_CONFIG["q_lora_rank"]
    good_row = f"| `layers.{{0..1}}.self_attn.q_a_proj.weight` | {r} x {h} |"
    assert good_row in tiny_card
    bad = tiny_card.replace(good_row, f"| `layers.{{0..1}}.self_attn.q_a_proj.weight` | {h} x {r} |")
    report = _lint(tmp_path, bad, tiny)
    where = f"README.md:{_line_of(bad, 'q_a_proj')}"
    assert _only_errors(report) == [("SHAPE_MISMATCH", where), ("SHAPE_MISMATCH", where)]   # layers 0 and 1
    assert "layers.1.self_attn.q_a_proj.weight" in report.sorted_findings()[1].message


def test_tensor_the_checkpoint_does_not_have(tmp_path, tiny, tiny_card):
    bad = tiny_card.replace("`final_norm.weight`", "`norm.weight`")
    report = _lint(tmp_path, bad, tiny)
    assert _only_errors(report) == [("TENSOR_NOT_IN_CHECKPOINT", f"README.md:{_line_of(bad, '`norm.weight`')}")]


def test_wrong_target_layers_and_tensor_count(tmp_path, tiny, tiny_card):
    ids = contract.TINY_CONFIG["target_layer_ids"]
    n = len(contract.roster(contract.TINY_CONFIG))
    bad = tiny_card.replace(f"`{ids}`", "`[0, 1, 2]`").replace(f"across {n} tensors", f"across {n + 1} tensors")
    codes = {code for code, _ in _only_errors(_lint(tmp_path, bad, tiny))}
    assert codes == {"TARGET_LAYERS_MISMATCH", "TENSOR_COUNT_MISMATCH"}


def test_checksum_that_disagrees_with_the_file(tmp_path, tiny, tiny_card):
    import hashlib

    digest = hashlib.sha256((tiny / "config.json").read_bytes()).hexdigest()
    bad = tiny_card.replace(digest, "0" * 64)
    report = _lint(tmp_path, bad, tiny)
    assert _only_errors(report) == [("CHECKSUM_MISMATCH", f"README.md:{_line_of(bad, '`config.json`')}")]
    size = (tiny / "config.json").stat().st_size
    bad = tiny_card.replace(f"| `config.json` | {size:,} |", f"| `config.json` | {size + 1:,} |")
    assert _only_errors(_lint(tmp_path, bad, tiny)) == [
        ("CHECKSUM_SIZE_MISMATCH", f"README.md:{_line_of(bad, '`config.json`')}")]


def test_sddd_card_against_the_reference_shape_and_a_wrong_checkpoint(tmp_path, tiny):
    ref = write_sparse_reference(tmp_path / "ref")
    assert lint_card(SDDD / "README.md", ref).ok
    wrong = lint_card(SDDD / "README.md", tiny)
    assert {"PARAMETERS_MISMATCH", "TENSOR_COUNT_MISMATCH", "SHAPE_MISMATCH", "TARGET_LAYERS_MISMATCH",
            "LAYER_COUNT_MISMATCH", "CHECKSUM_SIZE_MISMATCH"} <= wrong.codes()


# ------------------------------------------------------------------ acceptance tables

def test_acceptance_length_that_is_not_one_plus_the_sum(tmp_path):
    good = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |")
    assert _lint(tmp_path, good).ok
    bad = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.10 |")
    assert _only_errors(_lint(tmp_path, bad)) == [("ACCEPTANCE_LENGTH_MISMATCH", f"README.md:{_line_of(bad, 'code')}")]


def test_acceptance_tolerance_follows_the_tables_rounding(tmp_path):
    # 1 + 0.813 + 0.673 + 0.569 = 3.055: printed as 3.05 or 3.06 both agree at two decimals.
    for shown in ("3.05", "3.06"):
        assert _lint(tmp_path, _acceptance_card(f"| he | 81.3% | 67.3% | 56.9% | {shown} |")).ok
    assert not _lint(tmp_path, _acceptance_card("| he | 81.3% | 67.3% | 56.9% | 3.07 |")).ok


def test_rates_that_increase_along_a_row(tmp_path):
    bad = _acceptance_card("| code | 30.0% | 60.0% | 10.0% | 2.00 |")
    assert _only_errors(_lint(tmp_path, bad)) == [("RATES_INCREASE", f"README.md:{_line_of(bad, 'code')}")]


def test_duplicated_row(tmp_path):
    good = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", "| chat | 50.0% | 30.0% | 10.0% | 1.90 |")
    assert _lint(tmp_path, good).ok
    bad = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", "| code | 50.0% | 30.0% | 10.0% | 1.90 |")
    report = _lint(tmp_path, bad)
    first, second = _line_of(bad, "| code", 1), _line_of(bad, "| code", 2)
    assert _only_errors(report) == [("DUPLICATE_ROW", f"README.md:{second}")]
    assert f"repeats line {first} with different values" in report.errors[0].message


def test_an_acceptance_table_must_say_which_numbers_it_shows(tmp_path):
    row = "| code | 60.0% | 30.0% | 10.0% | 2.00 |"
    bad = _acceptance_card(row, label=None)
    assert _only_errors(_lint(tmp_path, bad)) == [("ACCEPTANCE_UNLABELLED", f"README.md:{_line_of(bad, '| Dataset')}")]
    prose = _acceptance_card(row, label="These numbers were measured.")
    assert [c for c, _ in _only_errors(_lint(tmp_path, prose))] == ["ACCEPTANCE_UNLABELLED"]
    simulated = _acceptance_card(row, label="Acceptance numbers: simulated (vLLM's greedy verify loop replayed, k=3)")
    assert _lint(tmp_path, simulated).ok
    by_step = FRONT + "\n| Step | Acceptance length |\n| --- | --- |\n| 100 | 1.50 |\n"
    assert [c for c, _ in _only_errors(_lint(tmp_path, by_step))] == ["ACCEPTANCE_UNLABELLED"]


def test_a_per_position_table_without_an_acceptance_length_must_be_labelled(tmp_path):
    head = "| Dataset | Pos 0 | Pos 1 | Pos 2 | Mean accepted |\n| --- | --- | --- | --- | --- |\n"
    bad = FRONT + "\n## Results\n\n" + head + "| code | 60.0% | 30.0% | 10.0% | 1.00 |\n"
    assert _only_errors(_lint(tmp_path, bad)) == [("ACCEPTANCE_UNLABELLED", f"README.md:{_line_of(bad, '| Dataset')}")]
    assert _lint(tmp_path, bad + f"\n{LABEL}\n").ok
    one_position = FRONT + "\n| Name | Pos 0 |\n| --- | --- |\n| a | b |\n"     # not an acceptance table
    assert _lint(tmp_path, one_position).ok


def test_a_per_position_table_without_an_acceptance_length_gets_the_rate_checks(tmp_path):
    head = "| Dataset | Pos 0 | Pos 1 | Pos 2 |\n| --- | --- | --- | --- |\n"
    rising = FRONT + "\n## Results\n\n" + head + f"| code | 60.0% | 70.0% | 10.0% |\n\n{LABEL}\n"
    assert _only_errors(_lint(tmp_path, rising)) == [("RATES_INCREASE", f"README.md:{_line_of(rising, '| code')}")]
    over = rising.replace("| 60.0% | 70.0% |", "| 160.0% | 70.0% |")
    assert [c for c, _ in _only_errors(_lint(tmp_path, over))] == ["RATE_OUT_OF_RANGE"]
    fine = rising.replace("| 60.0% | 70.0% |", "| 80.0% | 70.0% |")
    assert _lint(tmp_path, fine).ok


@pytest.mark.parametrize("label, missing", [
    ("Acceptance numbers: measured ()", "the engine or k"),
    ("Acceptance numbers: measured (k=3, float32)", "the engine"),
    ("Acceptance numbers: measured (vLLM, k=3, float32)", "the vLLM version"),
    ("Acceptance numbers: measured (vLLM 0.32.0, float32)", "k"),
    ("Acceptance numbers: simulated ()", "the definition"),
    ("Acceptance numbers: simulated (k=3, float32)", "the definition"),
])
def test_a_label_that_leaves_a_part_out(tmp_path, label, missing):
    bad = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=label)
    report = _lint(tmp_path, bad)
    assert _only_errors(report) == [("ACCEPTANCE_LABEL_INCOMPLETE", f"README.md:{_line_of(bad, 'Acceptance numbers')}")]
    assert report.errors[0].message.endswith(f"label does not state {missing}")


@pytest.mark.parametrize("label", [
    LABEL,
    "Acceptance numbers: measured (vLLM, version not stated, k=3, dtype not stated, prompts not published)",
    "Acceptance numbers: measured (engine not stated, k not stated, dtype not stated, prompts not published)",
    "Acceptance numbers: measured (serving as published by RedHatAI, engine not named, k=3, dtype not stated)",
    "Acceptance numbers: simulated (definition not stated, k=3, float32, prompts c98977eaff7b)",
])
def test_a_label_that_states_every_part_or_says_it_is_not_stated(tmp_path, label):
    assert _lint(tmp_path, _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=label)).ok


def test_a_label_whose_k_is_not_the_tables(tmp_path):
    bad = _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=LABEL.replace("k=3", "k=4"))
    assert _only_errors(_lint(tmp_path, bad)) == [("ACCEPTANCE_LABEL_MISMATCH", f"README.md:{_line_of(bad, 'k=4')}")]


def _eval_doc(tmp_path: Path, **changes) -> Path:
    doc = json.loads((SPECDEC / "vllm_eval.json").read_text())
    doc["k"] = 3
    for key, value in changes.items():
        doc["measured_by"][key] = value
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("change, said", [
    ({"vllm_version": "0.33.0"}, "version 0.32.0, the eval file 0.33.0"),
    ({"dtype": "bfloat16"}, "dtype float32, the eval file bfloat16"),
    ({"prompts_sha256": "0" * 64}, "prompts c98977eaff7b, the eval file 000000000000"),
])
def test_a_label_that_contradicts_its_eval_file(tmp_path, change, said):
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |"))
    assert lint_card(card, eval_json=_eval_doc(tmp_path)).ok
    report = lint_card(card, eval_json=_eval_doc(tmp_path, **change))
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"] and said in report.errors[0].message


def test_a_measured_label_over_a_simulated_eval_file(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |"))
    simulated = tmp_path / "simulated.json"
    simulated.write_text(json.dumps({"per_position": [0.6, 0.3, 0.1], "k": 3,
                                     "harness": {"mode": "simulated", "prompts_sha256": "c98977eaff7b" + "0" * 52}}))
    report = lint_card(card, eval_json=simulated)
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"]
    assert "measured, the eval file simulated" in report.errors[0].message
    result = CliRunner().invoke(cli, ["card", "lint", str(card), "--eval", str(simulated)])
    assert result.exit_code == 1 and "ACCEPTANCE_LABEL_MISMATCH" in result.output


def test_a_table_without_position_columns_is_still_checked_against_its_eval_file(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(FRONT + "\n| Dataset | Acceptance length |\n| --- | --- |\n| code | 2.00 |\n\n" + LABEL + "\n")
    assert lint_card(card, eval_json=_eval_doc(tmp_path)).ok
    simulated = tmp_path / "simulated.json"
    simulated.write_text(json.dumps({"k": 3, "harness": {"mode": "simulated", "prompts_sha256": "c98977eaff7b"}}))
    report = lint_card(card, eval_json=simulated)
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"]
    assert "measured, the eval file simulated" in report.errors[0].message
    report = lint_card(card, eval_json=_eval_doc(tmp_path, vllm_version="0.33.0", dtype="bfloat16"))
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"] * 2


def test_a_card_rendered_from_a_vllm_measurement_is_labelled_with_it(tmp_path):
    meta = {"name": "Measured", "front_matter": yaml.safe_load(FRONT.strip("-\n")),
            "architecture": {"facts": {"block_size": 4}}, "results": {"eval": str(SPECDEC / "vllm_eval.json")}}
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(meta))
    card = tmp_path / "README.md"
    card.write_text(render_card(tmp_path / "card.yaml"))
    text = card.read_text()
    assert "Acceptance numbers: measured (vLLM 0.32.0, k=4, float32, prompts c98977eaff7b)" in text
    assert "drafts: 93 · accepted per position: 17, 4, 3, 3" in text       # vLLM's counts, in the harness line
    assert lint_card(card, eval_json=SPECDEC / "vllm_eval.json").ok


def test_speculator_mirror_duplicate_is_flagged_on_its_line():
    text = (SPECULATOR / "README.md").read_text()
    report = lint_card(SPECULATOR / "README.md")
    second = _line_of(text, "| Agent history QA | 12,000 |", 2)
    assert _only_errors(report) == [("DUPLICATE_ROW", f"README.md:{second}")]


def test_block_size_statements_must_agree(tmp_path):
    text = FRONT + "\nIt predicts `block_size=7` positions.\n\nHarness: block size: 8\n"
    assert _only_errors(_lint(tmp_path, text)) == [("BLOCK_SIZE_CONFLICT", f"README.md:{_line_of(text, 'Harness')}")]
    assert _lint(tmp_path, text.replace("block size: 8", "block size: 7")).ok


# ------------------------------------------------------------------ front matter

def test_invalid_license_key(tmp_path):
    good = FRONT + "\n# Card\n"
    assert _lint(tmp_path, good).ok
    bad = good.replace("license: apache-2.0", "license: apache2")
    assert _only_errors(_lint(tmp_path, bad)) == [("LICENSE_UNKNOWN", "README.md:2")]


@pytest.mark.parametrize("change, code, line", [
    (("pipeline_tag: text-generation", "pipeline_tag: drafting"), "PIPELINE_TAG_UNKNOWN", 6),
    (("base_model: org/teacher", "base_model: org/teacher\nbase_model_relation: distilled"),
     "BASE_MODEL_RELATION_UNKNOWN", 4),
    (("  - dspark", "  - dspark\n  -"), "NULL_ITEM", 4),
    (("tags:\n", "tags: [\n"), "FRONT_MATTER_INVALID_YAML", 5),      # where the YAML parser stops
])
def test_front_matter_problems_name_their_line(tmp_path, change, code, line):
    text = (FRONT + "\n# Card\n").replace(*change)
    assert _only_errors(_lint(tmp_path, text)) == [(code, f"README.md:{line}")]


def test_missing_front_matter(tmp_path):
    assert _only_errors(_lint(tmp_path, "# Card\n")) == [("FRONT_MATTER_MISSING", "README.md:1")]


# ------------------------------------------------------------------ CLI

def test_cli_exit_codes_and_json(tmp_path, tiny, tiny_card):
    runner = CliRunner()
    good = tmp_path / "good.md"
    good.write_text(tiny_card)
    ok = runner.invoke(cli, ["card", "lint", str(good), "--checkpoint", str(tiny), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout) == {"schema": "dspark-hub/card-lint/1", "ok": True, "input": str(good),
                                     "path": str(good), "checkpoint": str(tiny), "findings": []}
    failed = runner.invoke(cli, ["card", "lint", str(SPECULATOR / "README.md")])
    assert failed.exit_code == 1 and "repeats line" in failed.stdout and "README.md:" in failed.stdout
    missing = runner.invoke(cli, ["card", "lint", str(tmp_path / "nope.md")])
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    no_ckpt = runner.invoke(cli, ["card", "lint", str(good), "--checkpoint", str(tmp_path / "nope")])
    assert no_ckpt.exit_code == 2


# ------------------------------------------------------------------ a simulated eval file's label (issue 24, 2)

def _simulated_eval(tmp_path: Path) -> Path:
    """An eval file as `eval --json` (the simulation) writes it: the metric's definition paragraph at the top
    level and in the harness, the simulation's short name in `harness.simulation`."""
    from dspark_hub.train.evaluation.acceptance import DEFINITION, SIMULATION

    doc = json.loads((SPECDEC / "vllm_eval.json").read_text())
    doc.update(engine="simulated", measured_by=None, lossless=None)
    doc["harness"].update(mode="simulated", simulation=SIMULATION, definition=DEFINITION)
    doc["harness"].pop("engine")
    assert doc["definition"] == DEFINITION
    path = tmp_path / "simulated_eval.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_card_rendered_from_a_simulation_prints_the_documented_short_label(tmp_path):
    from dspark_hub.train.evaluation.acceptance import DEFINITION, SIMULATION

    meta = {"name": "Simulated", "front_matter": yaml.safe_load(FRONT.strip("-\n")),
            "architecture": {"facts": {"block_size": 4}}, "results": {"eval": str(_simulated_eval(tmp_path))}}
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(meta))
    text = render_card(tmp_path / "card.yaml")
    label = f"Acceptance numbers: simulated ({SIMULATION}, k=4, float32, prompts c98977eaff7b)"
    assert label in text.splitlines()
    assert DEFINITION not in [line.strip() for line in text.splitlines()] and f"({DEFINITION}" not in text
    card = tmp_path / "README.md"
    card.write_text(text)
    assert lint_card(card, eval_json=_simulated_eval(tmp_path)).ok


def _simulated_card_and_eval(tmp_path: Path, simulation: str) -> tuple[Path, Path]:
    """A k=3 card labelled `simulated (<simulation>, ...)`, and a k=3 simulated eval file."""
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |",
                                     label=f"Acceptance numbers: simulated ({simulation}, k=3, float32, "
                                           "prompts c98977eaff7b)"))
    doc = json.loads(_simulated_eval(tmp_path).read_text())
    doc["k"] = doc["harness"]["block_size"] = 3
    (tmp_path / "k3.json").write_text(json.dumps(doc))
    return card, tmp_path / "k3.json"


@pytest.mark.parametrize("simulation", [
    "DEFINITION",                                                       # the metric's paragraph, as cards printed
    "teacher-forced acceptance on the target's float32 greedy path",   # another simulation
    "vLLM's greedy verify loop replayed on the draft's own samples",    # a near miss
])
def test_lint_against_the_eval_file_catches_a_label_that_is_not_the_documented_one(tmp_path, simulation):
    from dspark_hub.train.evaluation.acceptance import DEFINITION

    card, eval_json = _simulated_card_and_eval(tmp_path, DEFINITION if simulation == "DEFINITION" else simulation)
    report = lint_card(card, eval_json=eval_json)
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"]
    assert "the simulation is" in report.errors[0].message
    result = CliRunner().invoke(cli, ["card", "lint", str(card), "--eval", str(eval_json)])
    assert result.exit_code == 1 and "ACCEPTANCE_LABEL_MISMATCH" in result.output


def test_lint_accepts_the_documented_simulation_label(tmp_path):
    from dspark_hub.train.evaluation.acceptance import SIMULATION

    card, eval_json = _simulated_card_and_eval(tmp_path, SIMULATION)
    assert lint_card(card, eval_json=eval_json).ok


def test_lint_catches_a_measured_label_naming_another_engine(tmp_path):
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |",
                                     label=LABEL.replace("vLLM 0.32.0", "SGLang 0.32.0")))
    report = lint_card(card, eval_json=_eval_doc(tmp_path))
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"]
    assert "the engine is 'sglang 0.32.0', the eval file 'vllm'" in report.errors[0].message.lower()


# ------------------------------------------------------------------ Python reprs in a card (issue 24, 3)

@pytest.mark.parametrize("printed", [
    "It has ParameterCounts(total=136753, frozen=0, trained=136753, maps=0) parameters.",     # dataclass
    "Components: [Component(name='fc.weight', shape=(64, 192), count=1, kind='tensor')]",     # list of them
    "Parameters: {'total': 136753, 'trained': 136753, 'frozen': 0}",                          # dict
    "Files: ['config.json', 'model.safetensors']",                                            # list of strings
    "Facts: <dspark_hub.cards.render.CardFacts object at 0x7f3a2c1b9d90>",                    # default repr
    "| Parameters | `ParameterCounts(total=5, frozen=0, trained=5, maps=0)` |",                 # in a table cell
])
def test_a_python_repr_in_a_card_is_flagged(tmp_path, printed):
    text = FRONT + "\n# Card\n\n" + printed + "\n"
    assert _only_errors(_lint(tmp_path, text)) == [("PYTHON_REPR", f"README.md:{_line_of(text, printed[:12])}")]


@pytest.mark.parametrize("printed", [
    "It has 136,753 parameters (136,753 trained, 0 frozen).",
    "auxiliary hidden states at layers `[2, 23, 47, 71, 89]`.",
    'The config sets `{"block_size": 4}` and `Qwen3Config` is loaded by `AutoConfig.from_pretrained(path)`.',
    "Files: config.json, model.safetensors",
    "```python\nprint(ParameterCounts(total=5, frozen=0, trained=5, maps=0))\n```",          # code: shown on purpose
])
def test_text_a_reader_expects_is_not_a_repr(tmp_path, printed):
    assert _only_errors(_lint(tmp_path, FRONT + "\n# Card\n\n" + printed + "\n")) == []


# ------------------------------------------------------------------ sampled numbers

SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "draft_sample_method": "greedy",
           "samples": 4, "seed": 0, "describe": "temperature 1, top-p 0.9; greedy drafting; 4 samples a prompt"}
SAMPLED_PART = "temperature 1, top-p 0.9, greedy drafting, 4 samples x 8 prompts, AL 95% interval +-0.031"


def _sampled_eval(tmp_path: Path, sampling: dict | None = SAMPLED) -> Path:
    """The vLLM measurement of the fixtures, as a sampled eval/3 file says it (or greedy: `sampling` None)."""
    doc = json.loads((SPECDEC / "vllm_eval.json").read_text())
    doc.update(k=3, schema="dspark-hub/eval/3", prompts=8, intervals={"half_width": 0.0312},
               sampling=sampling or {"temperature": 0.0, "describe": "greedy"})
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_sampled_eval_is_labelled_with_its_decoding_samples_and_interval(tmp_path):
    from dspark_hub.cards.labels import acceptance_label, parse_label

    label = acceptance_label(json.loads(_sampled_eval(tmp_path).read_text()))
    assert label is not None and label.text.endswith(f"prompts c98977eaff7b, {SAMPLED_PART})")
    read = parse_label(label.line)
    assert read is not None and (read.text, read.decoding) == (label.text, label.decoding)
    assert read.sampling == {"temperature": 1.0, "top-p": 0.9, "drafting": "greedy"}
    greedy = acceptance_label(json.loads(_sampled_eval(tmp_path, None).read_text()))
    assert greedy is not None and greedy.decoding is None and greedy.text == LABEL.split(": ", 1)[1]


@pytest.mark.parametrize("label, eval_sampling, said", [
    (LABEL, SAMPLED, "greedy numbers, the eval file sampled at temperature 1"),                 # sampled as greedy
    (f"{LABEL[:-1]}, {SAMPLED_PART})", None, "sampled at temperature 1 numbers, the eval file greedy"),  # reverse
    (f"{LABEL[:-1]}, {SAMPLED_PART.replace('temperature 1', 'temperature 0.7')})", SAMPLED,
     "sampled at temperature 0.7 numbers, the eval file sampled at temperature 1"),
    (f"{LABEL[:-1]}, {SAMPLED_PART.replace(', top-p 0.9', '')})", SAMPLED, "top-p off, the eval file 0.9"),
    (f"{LABEL[:-1]}, {SAMPLED_PART.replace('greedy drafting', 'probabilistic drafting')})", SAMPLED,
     "drafting probabilistic, the eval file greedy"),
])
def test_lint_catches_a_sampled_number_presented_as_greedy_or_the_reverse(tmp_path, label, eval_sampling, said):
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=label))
    report = lint_card(card, eval_json=_sampled_eval(tmp_path, eval_sampling))
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_MISMATCH"], report.errors
    assert said in report.errors[0].message


@pytest.mark.parametrize("label, eval_sampling", [(LABEL, None), (f"{LABEL[:-1]}, {SAMPLED_PART})", SAMPLED)])
def test_a_label_that_says_its_decoding_as_the_eval_file_does_passes(tmp_path, label, eval_sampling):
    card = tmp_path / "README.md"
    card.write_text(_acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=label))
    assert lint_card(card, eval_json=_sampled_eval(tmp_path, eval_sampling)).ok


@pytest.mark.parametrize("part, missing", [
    ("greedy drafting, ", "the drafting method"), ("4 samples x 8 prompts, ", "the samples"),
    (", AL 95% interval +-0.031", "the interval")])
def test_a_sampled_label_must_state_its_drafting_samples_and_interval(tmp_path, part, missing):
    label = f"{LABEL[:-1]}, {SAMPLED_PART.replace(part, '')})"
    report = _lint(tmp_path, _acceptance_card("| code | 60.0% | 30.0% | 10.0% | 2.00 |", label=label))
    assert [f.code for f in report.errors] == ["ACCEPTANCE_LABEL_INCOMPLETE"]
    assert report.errors[0].message.endswith(f"does not state {missing}")
