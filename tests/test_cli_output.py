"""Where output goes: progress lines off a terminal, and human views that never cut a name, number or code."""

from __future__ import annotations

import itertools
import json
import warnings
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from dspark_hub._text import plural
from dspark_hub.cli import _output
from dspark_hub.cli._output import LogProgress
from dspark_hub.cli._render import render_eval
from dspark_hub.cli.main import cli

from .factories import write_checkpoint


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, [str(a) for a in args])


class FakeClock:
    def __init__(self, *times: float) -> None:
        self.times = iter(times)

    def __call__(self) -> float:
        return next(self.times)


# ----------------------------------------------------------------------------- progress off a terminal

def test_log_progress_prints_at_the_interval_with_rate_and_eta():
    lines: list[str] = []
    bar = LogProgress("sha256", write=lines.append, clock=FakeClock(0, 5, 10, 12, 20, 50), interval=10)
    bar.set_total(100_000_000)
    bar(10_000_000)   # t=5: too soon
    bar(10_000_000)   # t=10
    bar(10_000_000)   # t=12: too soon after the last line
    bar(10_000_000)   # t=20
    bar.finish()      # t=50
    assert lines == [
        "sha256: 20.0 MB of 100.0 MB (20%), 2.0 MB/s, ETA 40s, elapsed 10s",
        "sha256: 40.0 MB of 100.0 MB (40%), 2.0 MB/s, ETA 30s, elapsed 20s",
        "sha256: 40.0 MB of 100.0 MB (40%), 800.0 kB/s, ETA 1m15s, elapsed 50s, done",
    ]


def test_log_progress_counts_items_and_stages():
    lines: list[str] = []
    bar = LogProgress("finetune", unit="steps", total=20, write=lines.append, clock=FakeClock(0, 10, 4000),
                      interval=10)
    bar(5)
    bar.stage("pieces", 20, 20)
    assert lines == ["finetune: 5 of 20 steps (25%), 0.50 steps/s, ETA 30s, elapsed 10s",
                     "pieces: 20 of 20 steps (100%), 0.01 steps/s, elapsed 1h06m"]


@pytest.mark.parametrize(("total", "calls"), [(1, [1]), (5, [2, 3]), (100, [100])])
def test_the_count_reaching_its_total_prints_one_done_line_not_two(total, calls):
    """init-teacher (one teacher, 20 s) printed `1 of 1 (100%) ...` and then the same line with `, done`."""
    lines: list[str] = []
    bar = LogProgress("init-teacher", unit="teachers", total=total, write=lines.append,
                      clock=FakeClock(0, *[20 * (i + 1) for i in range(len(calls))], 999), interval=10)
    for n in calls:
        bar(n)
    bar.finish()
    assert lines[-1].startswith(f"init-teacher: {total} of {total} teachers (100%)") and lines[-1].endswith(", done")
    assert sum(f"{total} of {total}" in line for line in lines) == 1, lines


def test_a_run_shorter_than_the_interval_prints_nothing():
    lines: list[str] = []
    bar = LogProgress("sha256", write=lines.append, clock=FakeClock(0, 1, 2), interval=10)
    bar(5)
    bar.finish()
    assert lines == []


@pytest.fixture
def slow_clock(monkeypatch):
    """Every reading of the progress clock is 11 s after the last: each progress call prints a line."""
    ticks = itertools.count(step=11)
    monkeypatch.setattr(_output, "CLOCK", lambda: next(ticks))


@pytest.mark.parametrize("command", [
    lambda ckpt, out: ["checksums", ckpt],
    lambda ckpt, out: ["verify", ckpt, "--deep"],
    lambda ckpt, out: ["convert", ckpt, out],
    lambda ckpt, out: ["diff", ckpt, ckpt],
    lambda ckpt, out: ["init", out, "--embed-from", ckpt],   # a random embedding would add a warning
])
def test_long_commands_log_progress_when_stderr_is_not_a_terminal(tmp_path, slow_clock, command):
    result = run(*command(write_checkpoint(tmp_path / "ckpt"), tmp_path / "out"))
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines and all("/s, " in line and ", elapsed " in line for line in lines), result.stderr
    assert " of " in lines[0] and "%)" in lines[0] and lines[-1].endswith(", done")
    assert len(lines) < 2 or lines[-2].split(",")[0] != lines[-1].split(",")[0], f"the end printed twice: {lines}"
    for quiet in ("--quiet", "--json"):
        args = command(write_checkpoint(tmp_path / f"ckpt{quiet}"), tmp_path / f"out{quiet}")
        again = run(*args, quiet)
        assert again.exit_code == 0 and again.stderr == "", again.stderr


# ----------------------------------------------------------------------------- never cut

@pytest.mark.parametrize("columns", ["40", "200"])
def test_every_where_and_code_appears_whole(tmp_path, columns):
    folder = write_checkpoint(tmp_path / "d1", mutate=lambda t: t.update({"fc.weight": t.pop("context_proj.weight")}))
    findings = json.loads(run("verify", folder, "--drop-in", "kimi-k3", "--json").stdout)["findings"]
    assert len(findings) > 20 and any(f["where"] == "config.json:bos_token_id" for f in findings)
    result = run("verify", folder, "--drop-in", "kimi-k3", env={"COLUMNS": columns})
    assert result.exit_code == 1
    for f in findings:
        assert f["code"] in result.stdout and f["where"] in result.stdout, (f["code"], f["where"])
    assert "…" not in result.stdout
    assert ("┃" in result.stdout) == (columns == "200")   # a table when it fits, blocks when it does not


def test_narrow_blocks_put_the_key_cells_on_one_line(tmp_path):
    folder = write_checkpoint(tmp_path / "d1", mutate=lambda t: t.update({"fc.weight": t.pop("context_proj.weight")}))
    out = run("verify", folder, env={"COLUMNS": "40"}).stdout.splitlines()
    head = out.index("error  TRAINER_NAME  fc.weight")
    assert out[head + 1].startswith("    is the trainer-internal name of context_proj.weight")
    assert out[head + 2] == "    hint: rename fc.weight -> context_proj.weight ('dspark-hub convert')"


@pytest.mark.parametrize("columns", ["40", "200"])
def test_eval_numbers_and_drafter_names_are_never_cut(monkeypatch, capsys, columns):
    monkeypatch.setenv("COLUMNS", columns)
    stats = {"acceptance_length": 1.0, "per_position": [0.0] * 7, "accepted_per_position": [0] * 7, "prompts": 3,
             "tokens": 12, "drafts": 9, "k": 7}
    doc = {**stats, "by_dataset": {"a-rather-long-dataset-name": {**stats, "baseline": stats}}, "baseline": stats,
           "reference": None, "harness": {"block_size": 7, "teacher": "t"}, "definition": "d", "plot": None,
           "measured_by": None, "lossless": None, "sampling": {"temperature": 0.0, "describe": "greedy"},
           "intervals": None, "expected": None}
    render_eval(SimpleNamespace(to_dict=lambda: doc))
    out = capsys.readouterr().out
    assert "1.0000" in out and "draft" in out and "prompt lookup" in out and "a-rather-long-dataset-name" in out
    assert "…" not in out and "0.000" in out


def test_plural():
    assert [plural(1, "problem"), plural(2, "problem"), plural(0, "error")] == ["1 problem", "2 problems", "0 errors"]
    assert plural(1234, "byte") == "1,234 bytes" and plural(2, "entry", "entries") == "2 entries"


def test_a_table_without_rows_prints_its_title(capsys):
    from dspark_hub.cli._render import Column, print_table

    print_table("nothing to show", (Column("file"), Column("message", prose=True)), [])
    assert "nothing to show" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the training commands off a terminal

@pytest.fixture
def transformers_bars():
    """transformers' progress bars on, as in a fresh process (another test may have turned them off)."""
    from transformers.utils import logging as hf_logging

    def turn(on: bool) -> None:
        with warnings.catch_warnings():   # the hub's bars may be off by environment; transformers' own switch is ours
            warnings.simplefilter("ignore")
            (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()

    was = hf_logging.is_progress_bar_enabled()
    turn(True)
    yield hf_logging
    turn(was)


def test_transformers_bars_stay_off_when_stderr_is_not_a_terminal(transformers_bars, monkeypatch):
    monkeypatch.setattr(_output.stderr, "_force_terminal", False)   # rich asks this first: not a terminal
    _output.quiet_transformers(False)
    assert not transformers_bars.is_progress_bar_enabled()


def test_transformers_bars_stay_on_a_terminal(transformers_bars, monkeypatch):
    monkeypatch.setattr(_output.stderr, "_force_terminal", True)
    _output.quiet_transformers(False)
    assert transformers_bars.is_progress_bar_enabled()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """`init --profile tiny` and `init-teacher --draft` of it, and four prompts."""
    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.train.target.toy import init_teacher

    from .teacher_factory import write_prompts

    root = tmp_path_factory.mktemp("toy")
    init_checkpoint(root / "base", profile="tiny")
    init_teacher(root / "teacher", draft=root / "base")
    write_prompts(root / "p.jsonl", count=4, seed=1, length=4)
    return root


def _progress_lines(result, command: str) -> list[str]:
    assert result.exit_code == 0, result.output
    assert "Loading weights" not in result.stderr and "%|" not in result.stderr, result.stderr   # transformers' bars
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{command}:")]
    assert len(lines) >= 2 and all("/s, " in line and ", elapsed " in line for line in lines), result.stderr
    assert lines[-1].endswith(", done"), lines
    return lines


@pytest.mark.slow
def test_rollouts_finetune_and_eval_log_progress_when_stderr_is_not_a_terminal(toy, tmp_path, slow_clock,
                                                                                transformers_bars):
    lines = _progress_lines(run("rollouts", "--teacher", toy / "teacher", "--prompts", toy / "p.jsonl",
                                "--draft-config", toy / "base" / "config.json", "--out", tmp_path / "data",
                                "--max-new-tokens", 4, "--batch-size", 2), "rollouts")
    assert lines[-1].startswith("rollouts: 4 of 4 prompts (100%)"), lines
    lines = _progress_lines(run("finetune", "--base", toy / "base", "--data", tmp_path / "data", "--out",
                                tmp_path / "tuned", "--steps", 3, "--batch-size", 2, "--anchors", 2), "finetune")
    assert lines[-1].startswith("finetune: 3 of 3 steps (100%)"), lines
    lines = _progress_lines(run("eval", "--draft", tmp_path / "tuned", "--teacher", toy / "teacher", "--prompts",
                                toy / "p.jsonl", "--max-new-tokens", 4), "eval")
    # Two stages, each counting the 4 prompts once: never "of 8 prompts".
    assert any(line.startswith("eval: target continuations: 4 of 4 prompts") for line in lines), lines
    assert lines[-1].startswith("eval: draft: 4 of 4 prompts (100%)"), lines
    assert not any(" of 8 " in line for line in lines), lines


@pytest.mark.parametrize("group", [[], ["card"], ["golden"]])
def test_command_lists_show_each_summary_whole(group):
    from dspark_hub.cli._framework import first_sentence

    result = CliRunner().invoke(cli, [*group, "--help"], terminal_width=80)
    listing = " ".join(result.stdout.split("Commands:")[1].split())
    assert result.exit_code == 0 and "..." not in listing
    command = cli.commands[group[0]] if group else cli
    for sub in command.commands.values():
        assert " ".join(first_sentence(sub).split()) in listing
