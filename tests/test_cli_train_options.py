"""The training commands' options: defaults typed once (`TrainConfig`), one dtype spelling, `--target`.

The commands run with their library call replaced by a recorder, so each test sees exactly what the
command line hands the library, without loading a model.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import CheckpointNotFoundError, UsageError
from dspark_hub.train.evaluation.evaluate import DTYPES, ENGINES
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.target.dtypes import canonical_dtype

from .cli_errors import assert_one_line_error


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


class Recorded(UsageError):
    """Raised by the recorder in place of the real call (exit 2), after it kept the arguments."""


@pytest.fixture
def finetune_config(monkeypatch):
    """`finetune`'s command line -> the `TrainConfig` it builds (the run itself is replaced)."""
    import dspark_hub.train.finetuning.trainer

    seen: list[TrainConfig] = []

    def record(config, progress=None):
        seen.append(config)
        raise Recorded("recorded")

    monkeypatch.setattr(dspark_hub.train.finetuning.trainer, "Trainer", record)   # what the k3_dspark run makes

    def invoke(*args: object) -> TrainConfig:
        result = run("finetune", "--base", "b", "--out", "o", *args)
        assert seen, result.output
        return seen.pop()

    return invoke


@pytest.fixture
def eval_call(monkeypatch):
    """`eval`'s command line -> the keyword arguments it hands `evaluate`."""
    import dspark_hub.cli.train

    seen: list[dict] = []

    def record(draft, **kwargs):
        seen.append(kwargs)
        raise Recorded("recorded")

    monkeypatch.setattr(dspark_hub.cli.train, "evaluate", record)

    def invoke(*args: object) -> dict:
        result = run("eval", "--draft", "d", *args)
        assert seen, result.output
        return seen.pop()

    return invoke


def test_finetune_without_options_builds_the_config_of_trainconfigs_own_defaults(finetune_config):
    built = finetune_config()
    assert built == TrainConfig(base="b", out="o")
    defaulted = [f.name for f in fields(TrainConfig) if f.name not in ("base", "out")]
    assert len(defaulted) >= 30     # every option, its default from one place


@pytest.mark.parametrize("flag, value, field, expected", [
    ("--lr", "0.01", "lr", 0.01), ("--anchors", "16", "max_anchors", 16), ("--keep-states", "0", "keep_states", 0),
    ("--loss", '{"kl":1}', "loss", {"kl": 1.0}), ("--dist-timeout", "5", "dist_timeout", 5.0),
])
def test_a_given_option_overrides_its_default(finetune_config, flag, value, field, expected):
    built = finetune_config(flag, value)
    assert getattr(built, field) == expected != getattr(TrainConfig(base="b", out="o"), field)


def test_betas_reach_the_config_as_two_numbers(finetune_config):
    assert finetune_config("--betas", "0.8,0.999").betas == (0.8, 0.999)
    assert finetune_config().betas == (0.9, 0.95) == TrainConfig(base="b", out="o").betas


@pytest.mark.parametrize("bad", ["0.9", "0.9,0.95,0.99", "0.9,1", "-0.1,0.9", "a,b", "0.9;0.95", ""])
def test_betas_that_are_not_two_numbers_in_0_1_are_refused_naming_the_flag(bad):
    result = run("finetune", "--base", "b", "--out", "o", "--betas", bad)
    line = assert_one_line_error(result, "--betas", "[0, 1)", one_line=False)
    assert "0.9,0.95" in line


@pytest.mark.parametrize("bad", [(0.9,), (0.9, 1.0), (1.5, 0.9), (0.9, -0.5), ("0.9", 0.95), (True, 0.9)])
def test_the_library_refuses_the_same_betas(bad):
    with pytest.raises(UsageError, match=r"two numbers in \[0, 1\)") as caught:
        TrainConfig(base="b", out="o", betas=bad)
    assert caught.value.param == "betas"


@pytest.mark.parametrize("spelling, canonical", [("fp32", "float32"), ("float32", "float32"),
                                                 ("bf16", "bfloat16"), ("bfloat16", "bfloat16")])
def test_finetune_takes_either_dtype_spelling(finetune_config, spelling, canonical):
    assert finetune_config("--dtype", spelling).dtype == canonical


@pytest.mark.parametrize("bad", ["fp16", "float16", "float64", "BF16", "int8"])
def test_finetune_refuses_a_dtype_it_cannot_train_in_naming_the_flag(bad):
    result = run("finetune", "--base", "b", "--out", "o", "--dtype", bad)
    line = assert_one_line_error(result, repr(bad), one_line=False)
    assert "--dtype" in line and "bfloat16" in line and "bf16" in line


@pytest.mark.parametrize("spelling, canonical", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"),
                                                 *((name, name) for name in DTYPES)])
def test_eval_takes_either_dtype_spelling(eval_call, spelling, canonical):
    assert eval_call("--dtype", spelling)["dtype"] == canonical


@pytest.mark.parametrize("bad", ["float64", "half", "BF16"])
def test_eval_refuses_an_unknown_dtype(bad):
    assert_one_line_error(run("eval", "--draft", "d", "--dtype", bad), repr(bad), one_line=False)


def test_eval_engines_are_the_librarys(eval_call):
    for engine in ENGINES:
        assert eval_call("--engine", engine)["engine"] == engine
    assert run("eval", "--draft", "d", "--engine", "hf").exit_code == 2


def test_the_dtype_normaliser_is_the_one_the_library_applies():
    assert TrainConfig(base="b", out="o", dtype="bf16").dtype == "bfloat16"
    assert canonical_dtype("fp16", DTYPES) == "float16"
    for bad in ("float16", "fp16", "float64"):
        with pytest.raises(UsageError, match=rf"^dtype: '{bad}'; use one of float32, bfloat16, fp32, bf16$"):
            TrainConfig(base="b", out="o", dtype=bad)


def test_eval_in_the_library_normalises_before_it_judges_the_dtype(tmp_path):
    from dspark_hub.train.evaluation.evaluate import evaluate

    with pytest.raises(UsageError, match="the simulation runs in float32"):
        evaluate(tmp_path / "none", dtype="bf16")
    with pytest.raises(CheckpointNotFoundError, match="none") as passed:     # fp32 is float32: on to reading the draft
        evaluate(tmp_path / "none", dtype="fp32")
    assert "simulation runs in float32" not in str(passed.value)


@pytest.mark.parametrize("command", ["rollouts", "finetune", "eval"])
def test_the_target_flag_is_target_and_teacher_still_works_unshown(command):
    shown = run(command, "--help").output
    assert "--target DIR" in shown and "--teacher" not in shown


@pytest.mark.parametrize("flag", ["--target", "--teacher"])
def test_both_spellings_of_the_target_reach_the_library(finetune_config, eval_call, flag):
    assert finetune_config(flag, "big").target == "big"
    assert eval_call(flag, "big")["target"] == "big"


def test_the_engine_dtype_takes_either_spelling(monkeypatch):
    import dspark_hub.cli.train

    seen: list = []

    def record(*args, **kwargs):
        seen.append(kwargs["engine_options"])
        raise Recorded("recorded")

    monkeypatch.setattr(dspark_hub.cli.train, "make_rollouts", record)
    for spelling, canonical in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("auto", "auto")):
        run("rollouts", "--target", "t", "--prompts", "p", "--draft-config", "c", "--out", "o",
            "--engine-dtype", spelling)
        assert seen.pop().dtype == canonical


def test_eval_without_options_hands_evaluate_its_own_defaults(eval_call):
    import inspect

    from dspark_hub.train.evaluation.evaluate import evaluate

    given = eval_call()
    defaults = {name: p.default for name, p in inspect.signature(evaluate).parameters.items()
                if p.default is not inspect.Parameter.empty and name in given and name != "progress"}
    assert len(defaults) >= 10 and {name: given[name] for name in defaults} == defaults
    assert eval_call("--max-new-tokens", "9")["max_new_tokens"] == 9 != defaults["max_new_tokens"]
