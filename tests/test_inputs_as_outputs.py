"""Issue 29 item 6: no writer writes over one of its own inputs, with or without --force.

An output is refused when it is an input (the same path, a link to it, a hard link of it), contains
one, or lies inside an input folder (a folder output anywhere there; a file output over a file the
folder holds, but not a new file such as the card's own `README.md`). Every writer command is tried:
`card`, `golden`, `convert`, `package`, `init` (`--embed-from`, `--target`, `--vocab-from`),
`init-teacher`, `rollouts`, `finetune` (`--out`, `--state-dir`) and `eval --plot`; each refusal leaves
every input as it was, and each has a passing twin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.format.writer import refuse_own_inputs

from .cli_errors import assert_one_line_error
from .factories import tree_digest
from .test_publish import FRONT

REFUSED = "a command never writes over what it reads; choose another path"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dspark-hub")


@pytest.fixture
def ws(tmp_path):
    """A workspace: a checkpoint, a card source, an eval JSON, a training log, prompts, a data folder."""
    assert run("init", tmp_path / "ckpt").exit_code == 0
    (tmp_path / "card.yaml").write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT,
                                                         "architecture": {"block_size": 2},
                                                         "results": {"eval": "declared-eval.json"}}))
    for name in ("eval.json", "declared-eval.json"):
        (tmp_path / name).write_text(json.dumps({"schema": "dspark-hub/eval/1"}))
    (tmp_path / "log.jsonl").write_text("")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    return tmp_path


def refused(ws: Path, *args, force: bool = True) -> None:
    """The command fails in one line naming the rule, with and without --force; nothing in the workspace changed."""
    before = tree_digest(ws)
    for extra in ((), ("--force",)) if force else ((),):
        assert_one_line_error(run(*args, *extra), REFUSED)
    assert tree_digest(ws) == before


# ---------------------------------------------------------------- card

CARD_OUTPUTS = {
    "the checkpoint's config.json": lambda ws: ws / "ckpt" / "config.json",
    "the checkpoint's weights": lambda ws: ws / "ckpt" / "model.safetensors",
    "the checkpoint folder": lambda ws: ws / "ckpt",
    "the folder holding the checkpoint": lambda ws: ws,
    "the card source": lambda ws: ws / "card.yaml",
    "the eval JSON": lambda ws: ws / "eval.json",
    "the eval JSON the card source names": lambda ws: ws / "declared-eval.json",
    "the training log": lambda ws: ws / "log.jsonl",
    "the checksum manifest": lambda ws: ws / "prompts.jsonl",
    "a link to config.json": lambda ws: _link(ws / "link.json", ws / "ckpt" / "config.json"),
    "a hard link of config.json": lambda ws: _hard_link(ws / "hard.json", ws / "ckpt" / "config.json"),
    "config.json through a linked folder": lambda ws: _link(ws / "alias", ws / "ckpt") / "config.json",
}


def _link(link: Path, target: Path) -> Path:
    os.symlink(target, link)
    return link


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    return path


def _hard_link(link: Path, target: Path) -> Path:
    os.link(target, link)
    return link


@pytest.mark.parametrize("name", list(CARD_OUTPUTS))
def test_card_refuses_to_write_over_its_inputs(ws, name):
    out = CARD_OUTPUTS[name](ws)
    given = [] if "card source names" in name else ["--eval", ws / "eval.json"]     # a given --eval wins
    refused(ws, "card", ws / "ckpt", "--meta", ws / "card.yaml", *given, "--train-log", ws / "log.jsonl",
            "--checksums-from", ws / "prompts.jsonl", "-o", out)


@pytest.mark.parametrize("existing", [False, True])
def test_card_writes_its_own_readme_in_the_checkpoint(ws, existing):
    card = ws / "ckpt" / "README.md"
    if existing:
        card.write_text("old card\n")
    result = run("card", ws / "ckpt", "--meta", ws / "card.yaml", "-o", card, *(["--force"] if existing else []))
    assert result.exit_code == 0, result.output
    assert card.read_text().startswith("---\n")


# ---------------------------------------------------------------- golden, convert, package

@pytest.mark.parametrize("name", ["config.json", "lm_head", "hard link"])
def test_golden_refuses_to_write_over_its_inputs(ws, name):
    head = ws / "head.safetensors"
    head.write_bytes(b"not read")
    out = {"config.json": ws / "ckpt" / "config.json", "lm_head": head,
           "hard link": _hard_link(ws / "hard.json", ws / "ckpt" / "config.json") if name == "hard link" else None}
    refused(ws, "golden", ws / "ckpt", "--lm-head", head, "-o", out[name])


FOLDER_OUTPUTS = {
    "the input": lambda src: src,
    "inside the input": lambda src: src / "converted",
    "the folder holding the input": lambda src: src.parent,
    "a link to the input": lambda src: _link(src.parent / "alias", src),
}


@pytest.mark.parametrize("name", list(FOLDER_OUTPUTS))
def test_convert_refuses_to_write_over_its_source(ws, name):
    refused(ws, "convert", ws / "ckpt", FOLDER_OUTPUTS[name](ws / "ckpt"))


@pytest.mark.parametrize("name", list(FOLDER_OUTPUTS))
def test_package_refuses_to_write_over_its_checkpoint(ws, name):
    refused(ws, "package", ws / "ckpt", "--repo", "org/name", "-o", FOLDER_OUTPUTS[name](ws / "ckpt"))


@pytest.mark.parametrize("command", [("convert", "{ckpt}", "{out}"), ("package", "{ckpt}", "--repo", "org/n", "-o",
                                                                       "{out}")])
def test_convert_and_package_write_beside_their_input(ws, command):
    out = ws / "beside"
    result = run(*[part.format(ckpt=ws / "ckpt", out=out) for part in command])
    assert result.exit_code == 0, result.output
    assert out.is_dir()


# ---------------------------------------------------------------- init, init-teacher

@pytest.mark.parametrize("name", list(FOLDER_OUTPUTS))
@pytest.mark.parametrize("option", ["--embed-from", "--target"])
def test_init_refuses_to_write_over_the_model_it_reads(ws, name, option):
    refused(ws, "init", FOLDER_OUTPUTS[name](ws / "target"), option, ws / "target")


@pytest.mark.parametrize("name", ["the input", "inside the input"])
def test_init_refuses_to_write_over_the_data_it_counts(ws, name):
    refused(ws, "init", FOLDER_OUTPUTS[name](ws / "data"), "--target", ws / "target", "--vocab-from", ws / "data",
            "--draft-vocab", 8, "--format", "speculators")


@pytest.mark.parametrize("name", list(FOLDER_OUTPUTS))
def test_init_teacher_refuses_to_write_over_its_draft(ws, name):
    refused(ws, "init-teacher", FOLDER_OUTPUTS[name](ws / "ckpt"), "--draft", ws / "ckpt")


# ---------------------------------------------------------------- rollouts, finetune, eval

ROLLOUT_OUTPUTS = {
    "the target": lambda ws: ws / "target",
    "inside the target": lambda ws: ws / "target" / "rollouts",
    "the prompts file": lambda ws: ws / "prompts.jsonl",
    "the folder holding the draft config": lambda ws: ws / "ckpt",
}


@pytest.mark.parametrize("name", list(ROLLOUT_OUTPUTS))
def test_rollouts_refuse_to_write_over_their_inputs(ws, name):
    refused(ws, "rollouts", "--target", ws / "target", "--prompts", ws / "prompts.jsonl", "--draft-config",
            ws / "ckpt" / "config.json", "--out", ROLLOUT_OUTPUTS[name](ws), "--max-new-tokens", 4)


FINETUNE_PATHS = {
    "--out is --base": ("--out", lambda ws: ws / "ckpt"),
    "--out is --data": ("--out", lambda ws: ws / "data"),
    "--out inside --data": ("--out", lambda ws: ws / "data" / "tuned"),
    "--out holds --base": ("--out", lambda ws: ws),
    "--out is --target": ("--out", lambda ws: ws / "target"),
    "--out is --prompts": ("--out", lambda ws: ws / "prompts.jsonl"),
    "--out links to --base": ("--out", lambda ws: _link(ws / "alias", ws / "ckpt")),
    "--out holds --engine-python": ("--engine-python", lambda ws: _file(ws / "tuned" / "bin" / "python")),
    "--state-dir is --base": ("--state-dir", lambda ws: ws / "ckpt"),
    "--state-dir is --data": ("--state-dir", lambda ws: ws / "data"),
    "--state-dir inside --target": ("--state-dir", lambda ws: ws / "target" / "states"),
    "--state-dir is --out": ("--state-dir", lambda ws: ws / "tuned"),
    "--state-dir inside --out": ("--state-dir", lambda ws: ws / "tuned" / "states"),
}


@pytest.mark.parametrize("name", list(FINETUNE_PATHS))
def test_finetune_refuses_outputs_over_its_inputs(ws, name):
    option, path = FINETUNE_PATHS[name]
    paths = {"--out": ws / "tuned", option: path(ws)}
    before = tree_digest(ws)
    for force in ((), ("--force",)):
        result = run("finetune", "--base", ws / "ckpt", "--data", ws / "data", "--target", ws / "target",
                     "--prompts", ws / "prompts.jsonl", "--steps", 1, *[str(x) for kv in paths.items() for x in kv],
                     *force)
        line = assert_one_line_error(result)
        assert REFUSED in line or "which the run replaces at its end" in line, line
    assert tree_digest(ws) == before


def test_finetune_refuses_an_out_that_is_the_target_its_data_names(ws, monkeypatch):
    """The target can come from the rollouts manifest instead of --target: it is an input all the same."""
    from dspark_hub.train.finetuning.config import TrainConfig

    config = TrainConfig(base=str(ws / "ckpt"), out=str(ws / "target"), data=str(ws / "data"))
    with pytest.raises(UsageError, match="is the input `target`"):
        config.refuse_own_inputs(target=str(ws / "target"))
    TrainConfig(base=str(ws / "ckpt"), out=str(ws / "tuned"), data=str(ws / "data")).refuse_own_inputs(
        target=str(ws / "target"))     # the twin: a new folder beside them


@pytest.mark.parametrize("name", ["the draft's config.json", "the draft folder", "the prompts file",
                                  "the target's config.json"])
def test_eval_refuses_a_plot_over_its_inputs(ws, name):
    plot = {"the draft's config.json": ws / "ckpt" / "config.json", "the draft folder": ws / "ckpt",
            "the prompts file": ws / "prompts.jsonl", "the target's config.json": ws / "target" / "config.json"}
    refused(ws, "eval", "--draft", ws / "ckpt", "--target", ws / "target", "--prompts", ws / "prompts.jsonl",
            "--plot", plot[name])         # --force or not: a plot is never written over an input


def test_eval_takes_a_new_plot_path(ws):
    result = run("eval", "--draft", ws / "ckpt", "--target", ws / "target", "--prompts", ws / "prompts.jsonl",
                 "--plot", ws / "plot.png")
    assert REFUSED not in result.output                 # past the check (then it needs matplotlib, or runs)
    assert "already exists" not in result.output


def _existing(plot: Path, kind: str) -> None:
    if kind == "a file":
        plot.write_bytes(b"last run's png")
    elif kind == "a dangling link":
        plot.symlink_to(plot.parent / "gone.png")
    else:
        plot.mkdir()


@pytest.mark.parametrize("kind", ["a file", "a dangling link", "a folder"])
def test_eval_refuses_to_replace_a_plot_without_force_before_any_work(ws, kind):
    plot = ws / "plot.png"
    _existing(plot, kind)
    before = tree_digest(ws)
    result = run("eval", "--draft", ws / "ckpt", "--target", ws / "target", "--prompts", ws / "prompts.jsonl",
                 "--plot", plot)
    assert_one_line_error(result, str(plot), "already exists", "--force")
    assert tree_digest(ws) == before


@pytest.mark.parametrize("kind", ["a file", "a dangling link"])
def test_the_twin_eval_with_force_goes_past_an_existing_plot(ws, kind):
    plot = ws / "plot.png"
    _existing(plot, kind)
    result = run("eval", "--draft", ws / "ckpt", "--target", ws / "target", "--prompts", ws / "prompts.jsonl",
                 "--plot", plot, "--force")
    assert "already exists" not in result.output and REFUSED not in result.output


# ---------------------------------------------------------------- the rule itself

@pytest.mark.parametrize("output, folder, keep", [
    ("beside", True, ()),                    # a new folder next to the input
    ("ckpt/README.md", False, ("README.md",)),   # the card's own file, existing or not
    ("ckpt/golden/new.safetensors", False, ()),  # a new file inside an input folder
    ("ckpt/new.md", False, ()),
])
def test_outputs_that_touch_no_input_pass(ws, output, folder, keep):
    (ws / "ckpt" / "README.md").write_text("card\n")
    refuse_own_inputs(ws / output, [("ckpt", ws / "ckpt"), ("missing", ws / "nowhere"), ("none", None)],
                      param="out", folder=folder, keep=keep)


@pytest.mark.parametrize("output, folder", [("ckpt/README.md", False), ("ckpt/new", True), ("ckpt/config.json", False)])
def test_outputs_that_touch_an_input_are_refused_naming_it(ws, output, folder):
    (ws / "ckpt" / "README.md").write_text("card\n")         # without `keep`, a file of the folder like any
    with pytest.raises(UsageError, match=r"the input `ckpt` \(") as caught:
        refuse_own_inputs(ws / output, [("ckpt", ws / "ckpt")], param="out", folder=folder)
    assert caught.value.param == "out"
