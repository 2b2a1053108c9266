"""diff A B: config keys, roster, per-tensor byte identity and relative L2 change (streamed)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.format.tensorio import locate_tensor
from dspark_hub.ops.diff import compare_tensor, diff

from .factories import tensors_for, tiny_config, write_checkpoint

MATRIX = "layers.1.self_attn.o_proj.weight"


@pytest.fixture
def state():
    return tensors_for(contract.TINY_CONFIG, seed=3)


def test_identical_checkpoints(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    b = write_checkpoint(tmp_path / "b", tensors={k: v.clone() for k, v in state.items()})
    result = diff(a, b)
    doc = result.to_dict()
    assert doc["schema"] == "dspark-hub/diff/1" and doc["ok"] is True
    assert doc["identical"] and doc["weights_only"] and doc["layout"]["same"]
    assert doc["summary"] == {"compared": len(state), "identical": len(state), "changed": 0, "renamed": 0}
    assert doc["differs"] == []
    assert all(t == {"identical": True, "rel_l2": 0.0, "abs_l2": 0.0} for t in doc["tensors"].values())


def test_one_changed_tensor_reports_relative_l2(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    changed = dict(state)
    changed[MATRIX] = (state[MATRIX].float() + 0.001 * torch.randn(state[MATRIX].shape)).to(torch.bfloat16)
    b = write_checkpoint(tmp_path / "b", tensors=changed)
    result = diff(a, b)
    assert result.weights_only and not result.identical
    assert list(result.changed) == [MATRIX]
    xa, xb = state[MATRIX].double(), changed[MATRIX].double()
    expected = ((xb - xa).norm() / xa.norm()).item()
    assert result.tensors[MATRIX].rel_l2 == pytest.approx(expected, rel=1e-9)
    assert result.tensors["embed_tokens.weight"].identical   # "embed_tokens stayed frozen"


def test_lockstep_chunks_do_not_change_the_result(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    changed = dict(state, **{MATRIX: -state[MATRIX]})
    b = write_checkpoint(tmp_path / "b", tensors=changed)
    la, lb = locate_tensor(a, [MATRIX]), locate_tensor(b, [MATRIX])
    whole = compare_tensor(la, lb)
    chunked = compare_tensor(la, lb, chunk_elements=37)
    assert whole.rel_l2 == pytest.approx(2.0) and chunked.rel_l2 == pytest.approx(2.0)


def test_config_keys_added_removed_changed(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    cfg = tiny_config(markov_head_type="gated", rope_interleave=True, _torchspec_version=...)
    b = write_checkpoint(tmp_path / "b", tensors=state, config=cfg)
    doc = diff(a, b).to_dict()
    assert doc["config"] == {"added": {"rope_interleave": True},
                             "removed": {"_torchspec_version": "0.1.0"},
                             "changed": {"markov_head_type": {"a": "vanilla", "b": "gated"}}}
    assert not doc["weights_only"] and not doc["identical"]
    assert doc["summary"]["changed"] == 0


def test_roster_differences(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    other = dict(state)
    del other["final_norm.weight"]
    other["lm_head.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    other["context_norm.weight"] = torch.ones(3, dtype=torch.bfloat16)
    other[MATRIX] = state[MATRIX].float()        # same values, F32
    b = write_checkpoint(tmp_path / "b", tensors=other)
    doc = diff(a, b).to_dict()
    assert doc["roster"]["removed"] == {"final_norm.weight": {"shape": [64], "dtype": "BF16"}}
    assert doc["roster"]["added"] == {"lm_head.weight": {"shape": [4, 4], "dtype": "BF16"}}
    assert doc["roster"]["shape"] == {"context_norm.weight": {"a": [64], "b": [3]}}
    assert doc["roster"]["dtype"] == {MATRIX: {"a": "BF16", "b": "F32"}}
    assert doc["tensors"][MATRIX] == {"identical": False, "rel_l2": 0.0, "abs_l2": 0.0}   # bytes differ, not values
    assert "context_norm.weight" not in doc["tensors"]


def test_cli_diff_json_and_human(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    b = write_checkpoint(tmp_path / "b", tensors=dict(state, **{MATRIX: state[MATRIX] * 2}))
    runner = CliRunner()
    result = runner.invoke(cli, ["diff", str(a), str(b), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["tensors"][MATRIX]["rel_l2"] == pytest.approx(1.0)
    human = runner.invoke(cli, ["diff", str(a), str(b)])
    assert human.exit_code == 0 and MATRIX in human.stdout and "only the weights differ" in human.stdout
    missing = runner.invoke(cli, ["diff", str(a), str(tmp_path / "nope")])
    assert missing.exit_code == 2 and missing.stdout == ""


def test_diff_exits_1_when_a_side_cannot_be_read(tmp_path):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli
    from tests.factories import write_checkpoint

    a = write_checkpoint(tmp_path / "a")
    b = write_checkpoint(tmp_path / "b")
    assert CliRunner().invoke(cli, ["diff", str(a), str(b)]).exit_code == 0
    (b / "config.json").unlink()
    assert CliRunner().invoke(cli, ["diff", str(a), str(b)]).exit_code == 1
    result = CliRunner().invoke(cli, ["diff", str(a), str(b), "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and doc["ok"] is False and doc["problems"][0]["side"] == "b"


def test_single_file_and_sharded_copies_are_not_a_drop_in(tmp_path):
    from tests.factories import write_checkpoint

    single = write_checkpoint(tmp_path / "single")
    sharded = write_checkpoint(tmp_path / "sharded", shards=2)
    report = diff(single, sharded)
    assert not report.changed                        # the same bytes, tensor by tensor ...
    assert not report.same_layout and not report.weights_only and not report.identical   # ... in another layout
    doc = report.to_dict()["layout"]
    assert doc["a"]["files"] == ["model.safetensors"] and len(doc["b"]["files"]) == 2
    assert diff(single, write_checkpoint(tmp_path / "again")).identical


def test_a_renamed_tensor_is_a_rename_in_json_and_human_output(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    moved = {("fc.weight" if k == "context_proj.weight" else k): v for k, v in state.items()}
    b = write_checkpoint(tmp_path / "b", tensors=moved)
    doc = diff(a, b).to_dict()
    shape = list(state["context_proj.weight"].shape)
    assert doc["roster"]["renamed"] == {"context_proj.weight": {
        "to": "fc.weight", "shape": shape, "dtype": "BF16",
        "sha256": doc["roster"]["renamed"]["context_proj.weight"]["sha256"]}}
    assert doc["roster"]["added"] == {} and doc["roster"]["removed"] == {}
    assert doc["differs"] == ["roster"] and doc["summary"]["renamed"] == 1
    human = CliRunner().invoke(cli, ["diff", str(a), str(b)]).stdout
    assert "context_proj.weight -> fc.weight" in human and "renamed" in human
    assert "only in" not in human.replace("(1 renamed)", "")


def test_a_removed_and_added_tensor_with_other_bytes_is_no_rename(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    moved = {("fc.weight" if k == "context_proj.weight" else k): v for k, v in state.items()}
    moved["fc.weight"] = moved["fc.weight"] * 2
    doc = diff(a, write_checkpoint(tmp_path / "b", tensors=moved)).to_dict()
    assert doc["roster"]["renamed"] == {}
    assert list(doc["roster"]["removed"]) == ["context_proj.weight"] and list(doc["roster"]["added"]) == ["fc.weight"]


def test_the_verdict_says_what_differs_when_the_weights_do_not(tmp_path, state):
    a = write_checkpoint(tmp_path / "a", tensors=state)
    b = write_checkpoint(tmp_path / "b", tensors=state, metadata={"format": "pt"})
    doc = diff(a, b).to_dict()
    assert doc["differs"] == ["metadata"] and not doc["weights_only"]
    verdict = CliRunner().invoke(cli, ["diff", str(a), str(b)]).stdout.splitlines()[-1]
    assert verdict.startswith("different: safetensors metadata; the weights are the same")
    assert f"{len(state)} of {len(state)} common tensors byte-identical" in verdict
    changed = write_checkpoint(tmp_path / "c", tensors=dict(state, **{MATRIX: state[MATRIX] * 2}),
                               metadata={"format": "pt"})
    verdict = CliRunner().invoke(cli, ["diff", str(a), str(changed)]).stdout.splitlines()[-1]
    assert verdict.startswith("different: safetensors metadata; weights: ") and "1 changed" in verdict


@pytest.mark.parametrize(("before", "after"), [
    (lambda t: torch.zeros_like(t), lambda t: t),                               # zero-initialised, then trained
    (lambda t: torch.zeros_like(t), lambda t: torch.full_like(t, 0.5)),         # a constant fill
    (lambda t: torch.zeros_like(t), lambda t: -t),
])
def test_a_tensor_zero_in_a_that_changed_shows_how_far_it_moved(tmp_path, state, before, after):
    a = write_checkpoint(tmp_path / "a", tensors=dict(state, **{MATRIX: before(state[MATRIX])}))
    b = write_checkpoint(tmp_path / "b", tensors=dict(state, **{MATRIX: after(state[MATRIX])}))
    delta = diff(a, b).tensors[MATRIX]
    expected = (after(state[MATRIX]).double() - before(state[MATRIX]).double()).norm().item()
    assert delta.rel_l2 is None and delta.abs_l2 == pytest.approx(expected, rel=1e-9)
    out = CliRunner().invoke(cli, ["diff", str(a), str(b)])
    row = next(line for line in out.stdout.splitlines() if MATRIX in line)
    assert f"from zero: ||b-a|| {expected:.3e}" in row
    assert not row.rstrip(" │").endswith("-")


def test_a_changed_non_float_tensor_says_so(tmp_path, state):
    ints = dict(state, d2t=torch.arange(8, dtype=torch.int64))
    a = write_checkpoint(tmp_path / "a", tensors=ints)
    b = write_checkpoint(tmp_path / "b", tensors=dict(ints, d2t=torch.arange(8, dtype=torch.int64) * 2))
    out = CliRunner().invoke(cli, ["diff", str(a), str(b)])
    row = next(line for line in out.stdout.splitlines() if "d2t" in line and "│" in line)
    assert "changed (not a float tensor)" in row
