"""Issue 29, items 11 and 12: human output stays small however many findings there are, and `--deep` counts NaN
and Inf in each FP8 format's own encoding.

- A header naming thousands of tensors the roster does not name prints a few lines in human `verify`, `verify
  --runtime all` and `diff` (counted, never timed; `bench/bench_verify_output.py` times human against `--json`),
  while `--json` keeps every finding; a small set of findings is still listed whole.
- FP8 tensors (E4M3FN: NaN is S.1111.111 and there is no Inf; E5M2: IEEE-like Inf and NaN; E8M0: 0xFF is NaN,
  every other pattern a power of two) holding special patterns are counted, and their finite values give the
  same statistics as torch's own decoding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli._render_verify import MESSAGE_CHARS, ROWS_PER_KIND
from dspark_hub.cli.main import cli
from dspark_hub.verify.checks import verify
from dspark_hub.verify.tensor_stats import FP8

from .factories import write_checkpoint

EXTRA = 2_000
MATRIX = "layers.0.mlp.up_proj.weight"


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


# ---------------------------------------------------------------- FP8

#: torch dtype -> (bit patterns written into the tensor, NaN count, Inf count)
SPECIALS = {
    torch.float8_e4m3fn: ([0x7F, 0xFF, 0x7E, 0xFE], 2, 0),     # 0x7E, 0xFE: ±448, the largest finite
    torch.float8_e5m2: ([0x7C, 0xFC, 0x7D, 0xFF], 2, 2),      # ±Inf, then two NaNs
    torch.float8_e8m0fnu: ([0xFF, 0xFF, 0xFF, 0xFE], 3, 0),   # 0xFE is 2^127
}


def fp8_checkpoint(folder, dtype, patterns):
    def mutate(state):
        values = state[MATRIX].float()
        bits = (values.abs() if dtype == torch.float8_e8m0fnu else values).to(dtype).view(torch.uint8).clone()
        bits.view(-1)[:len(patterns)] = torch.tensor(patterns, dtype=torch.uint8)
        state[MATRIX] = bits.view(dtype)
    return write_checkpoint(folder, mutate=mutate)


@pytest.mark.parametrize("dtype", list(SPECIALS), ids=str)
def test_fp8_nan_and_inf_are_counted_in_each_formats_encoding(tmp_path, dtype):
    patterns, nan, inf = SPECIALS[dtype]
    report = verify(fp8_checkpoint(tmp_path / "c", dtype, patterns), deep=True)
    stats = report.sections["deep"]["tensors"][MATRIX]
    assert (stats["nan"], stats["inf"]) == (nan, inf)
    codes = {f.code for f in report.findings if f.where == MATRIX}
    assert ("TENSOR_NAN" in codes) == bool(nan) and ("TENSOR_INF" in codes) == bool(inf)


@pytest.mark.parametrize("dtype", list(SPECIALS), ids=str)
def test_finite_fp8_scans_clean_with_torchs_statistics(tmp_path, dtype):
    """The twin: the same tensor without special patterns has no NaN or Inf, and its mean and max |x| are
    what torch's own decoding gives."""
    folder = fp8_checkpoint(tmp_path / "c", dtype, [])
    stats = verify(folder, deep=True).sections["deep"]["tensors"][MATRIX]
    from safetensors.torch import load_file

    values = load_file(str(folder / "model.safetensors"))[MATRIX].double()
    assert (stats["nan"], stats["inf"], stats["all_zero"]) == (0, 0, False)
    assert stats["max_abs"] == float(values.abs().max())
    assert stats["mean"] == pytest.approx(float(values.mean()), rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("dtype", list(SPECIALS), ids=str)
def test_the_fp8_tables_decode_every_pattern_as_torch_does(dtype):
    name = {torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.float8_e8m0fnu: "F8_E8M0"}[dtype]
    ours = FP8[name].values
    theirs = torch.arange(256, dtype=torch.uint8).view(dtype).float().numpy()
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])


def test_an_all_zero_fp8_matrix_is_all_zero_but_e8m0_has_no_zero(tmp_path):
    for dtype, zero in ((torch.float8_e4m3fn, True), (torch.float8_e8m0fnu, False)):
        def mutate(state, dtype=dtype):
            state[MATRIX] = torch.zeros(state[MATRIX].shape, dtype=torch.uint8).view(dtype)
        stats = verify(write_checkpoint(tmp_path / str(dtype), mutate=mutate), deep=True).sections["deep"]
        assert stats["tensors"][MATRIX]["all_zero"] is zero
