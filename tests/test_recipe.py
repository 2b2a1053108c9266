"""The README's toy training recipe, as written, and the plan `finetune` shows before step 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.train.finetuning.plan import step_plan

from .progress_recorder import RecordedProgress
from .toy_run import toy_block

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow
def test_the_readme_toy_recipe_runs_as_written(toy_run):
    """What it produces, never how long it took (its time: `bench/bench_toy_recipe.py`). The session's one run of
    the block (`tests/toy_run.py`), in a fresh folder."""
    commands = [line for line in toy_block().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert any(line.startswith("dspark-hub init-teacher") for line in commands)
    assert any(line.startswith("dspark-hub finetune") for line in commands)
    done = toy_run
    toy = done.folder / "toy"
    assert (toy / "tuned" / "model.safetensors").is_file()
    assert {"training_log.jsonl", "training_args.json"} <= {p.name for p in (toy / "tuned").iterdir()}
    assert not (toy / "tuned.state").exists()                   # no states asked for, no state folder
    assert "finetune plan" in done.stderr                       # the cost, before step 1
    assert "warning" not in done.stderr                         # the base's embedding is the teacher's
    assert "64 sequences, 4,096 supervised tokens" in done.stdout   # the teacher never stops early
    assert "OK  toy/tuned" in done.stdout and "embedding: bit-identical" in done.stdout
    # eval's table (or, when narrow, its blocks): the tuned draft beats the base it started from
    rows = dict(re.findall(r"^\W*all\W+(draft|reference)\W+(?:AL\s+)?(\d+\.\d+)", done.stdout, re.M))
    assert set(rows) == {"draft", "reference"} and float(rows["draft"]) > float(rows["reference"]), done.stdout


# ----------------------------------------------------------------------------- the plan


def _plan(anchors: int, positions: int = 538, **changes):
    values = dict(sequences=8, positions=positions, tokens=8 * positions, supervised_tokens=8 * 512, anchors=anchors,
                  valid_anchors=8 * anchors, block_size=7, vocabulary=512, target_hidden_size=64,
                  trained_parameters=103_985, frozen_parameters=32_768, loss_chunk=409)
    values.update(changes)
    return step_plan(contract.TINY_CONFIG, **values)


def test_the_plan_says_attention_dominates_at_512_anchors_of_the_tiny_profile():
    wide, narrow = _plan(512), _plan(16, positions=90)     # the toy recipe's step
    assert wide.dominant == "attention" and wide.flops["attention"] > 0.85 * wide.total_flops
    assert narrow.dominant != "attention"
    assert wide.block_rows == 8 * 512 * 7 and wide.keys_per_row == 538 + 512 * 7
    # Measured on this machine (8 sequences x 538 positions, one step): peak RSS 8.1 GiB at 512 anchors,
    # 2.7 GiB at 256, 1.1 GiB at 128, of which ~0.4 GiB is the runtime. The estimate stays within 10%.
    for anchors, measured in ((512, 8.1), (256, 2.7), (128, 1.1)):
        estimate = _plan(anchors).memory_bytes / 2**30 + 0.4
        assert estimate == pytest.approx(measured, rel=0.1), anchors
    assert max(wide.memory, key=wide.memory.get) == "attention"
    unchunked = _plan(512, loss_chunk=0)
    assert unchunked.memory["loss"] == 6 * 8 * 512 * 7 * 512 * 4 > wide.memory["loss"]
    sharded = _plan(16, world_size=4, sharded_states=True)
    assert sharded.memory["states"] == _plan(16).memory["states"] // 4
    doc = wide.to_dict()
    assert doc["dominant"] == "attention" and doc["memory_total_bytes"] == sum(doc["memory_bytes"].values())


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """A tiny-profile base, its random target and 8 rollouts of 12 new tokens."""
    root = tmp_path_factory.mktemp("tiny-data")
    assert run("init", root / "base").exit_code == 0
    assert run("init-teacher", root / "teacher", "--draft", root / "base").exit_code == 0
    (root / "p.jsonl").write_text("".join(json.dumps({"text": f"prompt {i:02d}"}) + "\n" for i in range(8)))
    made = run("rollouts", "--target", root / "teacher", "--prompts", root / "p.jsonl", "--draft-config",
               root / "base" / "config.json", "--out", root / "data", "--max-new-tokens", 12, "--ignore-eos")
    assert made.exit_code == 0, made.output
    return root


def test_the_plan_reaches_the_progress_callback_before_step_1_and_the_result(tiny_data, tmp_path):
    from dspark_hub.train import TrainConfig, finetune

    world = tiny_data
    bar = RecordedProgress()
    config = TrainConfig(base=str(world / "base"), out=str(tmp_path / "out"), data=str(world / "data"),
                         steps=2, batch_size=4, max_anchors=4)
    result = finetune(config, progress=bar)
    assert bar.kinds == ["total", "plan", "step", "step"]
    plan = bar.seen[1][1]
    assert result.plan is plan and (plan.sequences, plan.anchors, plan.block_size) == (4, 4, 7)
    assert result.to_dict()["plan"]["block_rows"] == 4 * 4 * 7
    shown = run("finetune", "--base", world / "base", "--data", world / "data", "--out", tmp_path / "cli",
                "--steps", 1, "--batch-size", 4, "--anchors", 4)
    assert shown.exit_code == 0, shown.output
    assert shown.stderr.index("finetune plan") < shown.stderr.index("memory ~")
    assert "4 x 4 anchors x block 7 = 112 block rows" in shown.stderr
    assert "measured peak" in shown.stdout
    quiet = run("finetune", "--base", world / "base", "--data", world / "data", "--out", tmp_path / "q",
                "--steps", 1, "--batch-size", 4, "--anchors", 4, "--quiet")
    assert quiet.exit_code == 0 and "finetune plan" not in quiet.stderr


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]


def test_the_plan_and_the_result_count_the_runs_anchors_and_supervised_block_slots(tiny_data, tmp_path):
    """Step 1's plan counts what step 1's loss counts; the result sums every step's log."""
    from dspark_hub.train import TrainConfig, finetune

    result = finetune(TrainConfig(base=str(tiny_data / "base"), out=str(tmp_path / "out"), data=str(tiny_data / "data"),
                                  steps=3, batch_size=4, max_anchors=4))
    log = _log(tmp_path / "out")
    plan = result.plan
    assert plan is not None and plan.layout == "padded" and plan.steps == 3
    assert (plan.step_anchors, plan.supervised_slots) == (log[0]["anchors"], log[0]["slots"])
    assert plan.step_anchors == 4 * 4 and 0 < plan.supervised_slots < 16 * 7     # 12 new tokens: blocks run out
    assert (plan.run_anchors, plan.run_supervised_slots) == (3 * 16, 3 * plan.supervised_slots)
    assert result.anchors == sum(e["anchors"] for e in log) == 48
    assert result.supervised_slots == sum(e["slots"] for e in log) < 48 * 7
    assert result.to_dict()["anchors"] == 48 and result.to_dict()["supervised_slots"] == result.supervised_slots


def test_finetune_json_shows_the_plan_and_progress_on_stderr_and_one_document_on_stdout(tiny_data, tmp_path,
                                                                                       monkeypatch):
    import dspark_hub.cli._output

    monkeypatch.setattr(dspark_hub.cli._output, "INTERVAL", 0.0)          # a line every step
    args = ["finetune", "--base", tiny_data / "base", "--data", tiny_data / "data", "--steps", 2, "--batch-size", 4,
            "--anchors", 4, "--json"]
    shown = run(*args, "--out", tmp_path / "shown")
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)                                         # stdout: the one document, nothing else
    assert doc["plan"]["step_anchors"] == 16 and doc["anchors"] == 32 and doc["supervised_slots"] > 0
    for words in ("finetune plan", "  the run: 2 steps x 16 anchors = ~32 anchors", "threads: ",
                  "finetune: 1 of 2 steps", "finetune: 2 of 2 steps"):
        assert words in shown.stderr, (words, shown.stderr)
    quiet = run(*args, "--quiet", "--out", tmp_path / "quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout)["anchors"] == 32
    human = run(*args[:-1], "--out", tmp_path / "human")
    assert f"2 steps, 32 anchors, {doc['supervised_slots']:,} supervised block slots" in human.stdout
