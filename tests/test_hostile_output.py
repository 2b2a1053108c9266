"""Issue 29, item 11: human output stays small however many findings there are.

- A header naming thousands of tensors the roster does not name prints a few lines in human `verify`, `verify
  --runtime all` and `diff` (counted, never timed; `bench/bench_verify_output.py` times human against `--json`),
  while `--json` keeps every finding; a small set of findings is still listed whole.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli._render_verify import MESSAGE_CHARS, ROWS_PER_KIND
from dspark_hub.cli.main import cli

from .factories import write_checkpoint

EXTRA = 2_000


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """A tiny checkpoint whose header also names 2,000 tensors the roster does not name."""
    def extra(state):
        for i in range(EXTRA):
            state[f"extra.{i}.weight"] = torch.zeros(1, dtype=torch.bfloat16)
    return write_checkpoint(tmp_path_factory.mktemp("crowded") / "ckpt", mutate=extra)


def test_thousands_of_findings_print_a_few_lines_and_json_keeps_them_all(crowded):
    human = run("verify", crowded)
    assert human.exit_code == 1
    lines = human.stdout.splitlines()
    assert len(lines) < 20, len(lines)
    assert "extra.0.weight and 1,999 more like it" in human.stdout and f"FAILED ({EXTRA:,} errors)" in human.stdout
    as_json = json.loads(run("verify", crowded, "--json").stdout)
    assert sum(f["code"] == "UNEXPECTED_TENSOR" for f in as_json["findings"]) == EXTRA


def test_runtime_verdicts_and_their_findings_are_grouped_and_clipped(crowded):
    human = run("verify", crowded, "--runtime", "all")
    assert human.exit_code == 1
    assert len(human.stdout.splitlines()) < 150 and len(human.stdout) < 40_000, len(human.stdout)
    assert "more characters; --json has them all" in human.stdout      # ATOM's finding names every tensor
    doc = json.loads(run("verify", crowded, "--runtime", "all", "--json").stdout)
    drop = next(f for f in doc["findings"] if f["code"] == "RUNTIME_SILENT_DROP")
    assert f"extra.{EXTRA - 1}.weight" in drop["message"] and len(drop["message"]) > MESSAGE_CHARS


def test_diff_counts_what_it_does_not_list(crowded, tmp_path):
    plain = write_checkpoint(tmp_path / "plain")
    human = run("diff", plain, crowded)
    assert human.exit_code == 0, human.output       # diff reports differences; it finds no error
    assert len(human.stdout.splitlines()) < 30 and f"and {EXTRA - 20:,} more only in B" in human.stdout
    assert len(json.loads(run("diff", plain, crowded, "--json").stdout)["roster"]["added"]) == EXTRA


@pytest.mark.parametrize("distinct", [3, ROWS_PER_KIND])
def test_findings_up_to_the_cap_are_listed_whole(tmp_path, distinct):
    """The twin: up to `ROWS_PER_KIND` findings of one code each get their own row, named in full."""
    def extra(state):
        for i in range(distinct):
            state[f"extra.{i}.weight"] = torch.zeros(1, dtype=torch.bfloat16)
    human = run("verify", write_checkpoint(tmp_path / "c", mutate=extra))
    assert all(f"extra.{i}.weight" in human.stdout for i in range(distinct)) and "more like it" not in human.stdout
