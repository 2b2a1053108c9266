"""`--threads` and its default (`train.finetuning.threads`): one thread on a loaded machine, every core idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.train.finetuning import threads as threads_module
from dspark_hub.train.finetuning.threads import choose_threads, default_threads


@pytest.mark.parametrize("cores, load, expected", [
    (2, 0.0, 2), (2, 0.4, 2),              # idle: every core
    (2, 1.0, 2), (2, 1.4, 2),              # one core busy: ours plus the idle one
    (2, 1.6, 1), (2, 2.0, 1), (2, 12.3, 1),  # busy: one thread
    (8, 3.0, 6), (8, 7.9, 1), (1, 0.0, 1),
    (4, None, 4),                           # load unknown: torch's own default
])
def test_default_is_one_plus_the_idle_cores(cores, load, expected):
    assert default_threads(cores, load) == expected


@pytest.fixture
def machine(monkeypatch):
    """Two cores at a chosen load; OMP_NUM_THREADS and torch's thread count restored afterwards."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads_module, "usable_cores", lambda: 2)
    before = torch.get_num_threads()

    def at_load(load):
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))

    yield at_load
    torch.set_num_threads(before)
    os.environ.pop("OMP_NUM_THREADS", None)


def test_choice_comes_from_the_request_then_the_environment_then_the_load(machine, monkeypatch):
    machine(5.0)
    assert (choose_threads(2).threads, choose_threads(2).source) == (2, "requested")
    assert (choose_threads().threads, choose_threads().source) == (1, "default")
    assert "load average 5.0" in choose_threads().reason
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert (choose_threads().threads, choose_threads().source) == (2, "environment")
    for ignored in ("0", "", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert choose_threads().source == "default"


@pytest.mark.parametrize("bad", [0, -1])
def test_a_thread_count_below_one_is_refused(bad):
    with pytest.raises(UsageError, match="at least 1"):
        choose_threads(bad)


@pytest.mark.parametrize("command", [["eval", "--draft", "NOPE"], ["finetune", "--base", "NOPE", "--out", "OUT"],
                                     ["rollouts", "--teacher", "NOPE", "--prompts", "NOPE", "--draft-config", "NOPE",
                                      "--out", "OUT"]])
@pytest.mark.parametrize("requested, load, threads", [([], 0.0, 2), ([], 3.7, 1), (["--threads", "2"], 3.7, 2)])
def test_training_commands_apply_the_choice_and_a_refusal_stays_one_line(machine, tmp_path, command, requested,
                                                                           load, threads):
    import torch

    machine(load)
    args = [str(tmp_path / a) if a in ("NOPE", "OUT") else a for a in command]
    result = CliRunner().invoke(cli, [*args, *requested])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "threads:" not in result.stderr
    assert torch.get_num_threads() == threads and os.environ["OMP_NUM_THREADS"] == str(threads)


@pytest.mark.parametrize("requested, load, line", [
    ([], 3.7, "threads: 1 (2 cores at load average 3.7; --threads N to choose)"),
    (["--threads", "2"], 3.7, "threads: 2 (as requested"),
    (["--quiet"], 3.7, None),
])
def test_rollouts_says_its_thread_choice_once_work_starts(machine, tmp_path, requested, load, line):
    import json

    machine(load)
    runner = CliRunner()
    assert runner.invoke(cli, ["init-teacher", str(tmp_path / "teacher"), "-q"]).exit_code == 0
    assert runner.invoke(cli, ["init", str(tmp_path / "draft"), "--target", str(tmp_path / "teacher")]).exit_code == 0
    (tmp_path / "p.jsonl").write_text(json.dumps({"input_ids": [5, 6, 7]}) + "\n")
    result = runner.invoke(cli, ["rollouts", "--teacher", str(tmp_path / "teacher"), "--prompts",
                                 str(tmp_path / "p.jsonl"), "--draft-config", str(tmp_path / "draft" / "config.json"),
                                 "--out", str(tmp_path / "out"), "--max-new-tokens", "2", *requested])
    assert result.exit_code == 0, result.output
    if line is None:
        assert "threads:" not in result.stderr
    else:
        assert result.stderr.count("threads:") == 1 and line in result.stderr


def test_threads_zero_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["eval", "--draft", str(tmp_path), "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.stderr


BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_bench_threads_reports_the_median_of_per_round_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_threads

    # a round disturbed by another process must not decide: the median of 2, 1, 3, 2.5, 2 is 2
    default, one = [4.0, 1.0, 3.0, 5.0, 2.0], [2.0, 1.0, 1.0, 2.0, 1.0]
    assert bench_threads.round_ratios(default, one) == pytest.approx((2.0, 1.0, 3.0))
    assert bench_threads.MIN_REPEAT >= 5


def test_bench_threads_refuses_fewer_than_five_rounds():
    run = subprocess.run([sys.executable, str(BENCH / "bench_threads.py"), "--repeat", "4"], capture_output=True,
                         text=True)
    assert run.returncode == 2 and "at least 5" in run.stderr
