"""Speculators and vLLM-extraction hidden-state files as training data: detection, mapping, refusals, training.

`fixtures/speculators_sample` is real output of speculators 0.9.0's data pipeline against vLLM 0.32
(see its README); the other files are written here in the connector's layout. Files the real
engine writes are read and trained on in `test_engine_vllm.py`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import MissingDependencyError, UsageError
from dspark_hub.ops.init import init_checkpoint
from dspark_hub.train.data.hidden_state_files import (
    HiddenStateData,
    detect_format,
    open_training_data,
    parse_layer_ids,
    resolve_columns,
    write_hidden_state_file,
)
from dspark_hub.train.target.target import Target

from .cli_errors import assert_one_line_error
from .modeling_factory import tiny_config
from .teacher_factory import teacher_config

SAMPLE = Path(__file__).parent / "fixtures" / "speculators_sample"
CONFIG = tiny_config(vocab_size=256, draft_vocab_size=256, mask_token_id=253, pad_token_id=255)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A random teacher of the sample's shape (hidden 64, 6 layers, vocabulary 256) and a draft for it."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("hsf")
    torch.manual_seed(0)
    LlamaForCausalLM(teacher_config(vocab_size=256, num_attention_heads=2, num_key_value_heads=2)).save_pretrained(
        str(root / "teacher"))
    init_checkpoint(root / "draft", config=CONFIG, embed_from=root / "teacher")   # the teacher's frozen embedding
    return {"root": root, "teacher": str(root / "teacher"), "draft": root / "draft"}


def test_the_format_is_detected_from_the_folder(tmp_path):
    assert detect_format(SAMPLE) == detect_format(SAMPLE / "hidden_states") == "speculators"
    shutil.copytree(SAMPLE / "hidden_states", tmp_path / "files")
    assert detect_format(tmp_path / "files") == "vllm-extraction"
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "manifest.json").write_text("{}")
    assert detect_format(tmp_path / "r") == "rollouts"
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="empty: neither a rollouts folder"):
        detect_format(tmp_path / "empty")


def test_speculators_rows_give_masks_and_the_files_give_taps_and_the_normed_final_state(pair):
    import pyarrow.ipc as ipc

    data = open_training_data(SAMPLE, draft_config=CONFIG, target=pair["teacher"])
    assert isinstance(data, HiddenStateData) and (data.format, len(data), data.missing) == ("speculators", 4, 0)
    assert (data.layer_ids, data.columns) == ([2, 4, 5, 6], [0, 1, 2])     # the draft's [1, 3, 4] + 1, and the last
    rows = ipc.open_stream(str(SAMPLE / "data-00000-of-00001.arrow")).read_all().to_pylist()
    norm = Target.open(pair["teacher"]).final_norm()
    for i in range(4):
        row, raw = data[i], load_file(str(SAMPLE / "hidden_states" / f"hs_{i}.safetensors"))
        assert row.input_ids.tolist() == rows[i]["input_ids"] == raw["token_ids"].tolist()
        assert row.loss_mask.tolist() == rows[i]["loss_mask"] and row.prompt_length == rows[i]["loss_mask"].index(1)
        assert torch.equal(row.aux_hidden_states, raw["hidden_states"][:, :3].flatten(1))
        assert torch.equal(row.final_hidden_states, norm(raw["hidden_states"][:, 3]))
    # Pointing at the hidden_states folder is the same data; naming their ids is the same mapping.
    again = open_training_data(SAMPLE / "hidden_states", draft_config=CONFIG, target=pair["teacher"],
                               layer_ids=[2, 4, 5, 6])
    assert len(again) == 4 and torch.equal(again[3].aux_hidden_states, data[3].aux_hidden_states)


def test_files_with_more_taps_than_the_draft_needs_give_the_draft_its_columns(pair):
    draft = {**CONFIG, "target_layer_ids": [1, 4], "num_target_layers": 2}
    data = HiddenStateData(SAMPLE, draft_config=draft, target=pair["teacher"], layer_ids=[2, 4, 5])
    raw = load_file(str(SAMPLE / "hidden_states" / "hs_1.safetensors"))["hidden_states"]
    assert data.columns == [0, 2] and torch.equal(data[1].aux_hidden_states, raw[:, [0, 2]].flatten(1))


@pytest.mark.parametrize("layers,taps,ids,message", [
    (4, [1, 3], None, r"holds 4 layers, the draft's taps plus the last name 3 \(target_layer_ids \[1, 3\]\)"),
    (4, [1, 3, 4], [3, 4, 5], r"captured at vLLM/speculators ids \[3, 4, 5, 6\] = target_layer_ids \[2, 3, 4, 5\]; "
                              r"the draft taps \[1, 3, 4\], \[1\] missing"),
    (4, [1, 3, 4], [2, 4], r"holds 4 layers, the given layer ids name 3 \(\[2, 4, 6\], the last layer 6 included\)"),
])
def test_taps_that_do_not_fit_the_draft_are_refused_naming_the_file(layers, taps, ids, message):
    with pytest.raises(UsageError, match="f.safetensors: " + message):
        resolve_columns(layers, taps, 6, ids, "f.safetensors")


def test_a_hidden_size_or_layout_other_than_the_drafts_is_refused_in_one_line(pair, tmp_path):
    (tmp_path / "narrow").mkdir()
    write_hidden_state_file(tmp_path / "narrow" / "a.safetensors", torch.zeros(5, 4, 32), torch.arange(5))
    with pytest.raises(UsageError, match=r"a.safetensors: hidden size 32, the draft's target_hidden_size is 64$"):
        open_training_data(tmp_path / "narrow", draft_config=CONFIG, target=pair["teacher"])
    (tmp_path / "odd").mkdir()
    save_file({"hidden_states": torch.zeros(5, 64)}, str(tmp_path / "odd" / "b.safetensors"))
    with pytest.raises(UsageError, match=r"b\.safetensors: has hidden_states; a hidden-state file holds"):
        open_training_data(tmp_path / "odd", draft_config=CONFIG, target=pair["teacher"])
    with pytest.raises(UsageError, match="need the target folder"):
        open_training_data(SAMPLE, draft_config=CONFIG, target=None)


def test_a_rollouts_folder_takes_layer_ids_only_when_they_name_its_own_taps(tmp_path):
    from dspark_hub.train.data.rollouts import RolloutData

    from .data_factory import rollouts_manifest

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "manifest.json").write_text(json.dumps(rollouts_manifest(CONFIG)))
    for ids in ([2, 4, 5], [2, 4, 5, 6], [5, 4, 2]):   # the recipe's ids, with or without the last layer
        assert isinstance(open_training_data(tmp_path / "r", draft_config=CONFIG, target=None, layer_ids=ids),
                          RolloutData)
    with pytest.raises(UsageError, match=r"records its own taps, target_layer_ids \[1, 3, 4\] = vLLM/speculators "
                                         r"ids \[2, 4, 5\]; the layer ids \[2\] name others") as caught:
        open_training_data(tmp_path / "r", draft_config=CONFIG, target=None, layer_ids=[2])
    assert caught.value.param == "data_layer_ids"


def test_a_tap_at_the_teachers_last_layer_is_read_from_the_last_column(pair, tmp_path):
    """Taps [1, 5] of a 6-layer teacher: vLLM extracts ids [2, 6], and 6 is both a tap and the final state's input."""
    assert resolve_columns(2, [1, 5], 6, None, "f") == resolve_columns(2, [1, 5], 6, [2, 6], "f") == ([0, 1], [2, 6])
    (tmp_path / "files").mkdir()
    hidden = torch.randn(5, 2, 64)
    write_hidden_state_file(tmp_path / "files" / "a.safetensors", hidden, torch.arange(5))
    draft = {**CONFIG, "target_layer_ids": [1, 5], "num_target_layers": 2}
    for ids in (None, [2, 6], [2]):
        data = open_training_data(tmp_path / "files", draft_config=draft, target=pair["teacher"], layer_ids=ids)
        assert data.columns == [0, 1] and torch.equal(data[0].aux_hidden_states, hidden.flatten(1).bfloat16())


def test_files_and_rows_from_different_runs_are_refused_when_read(pair, tmp_path):
    shutil.copytree(SAMPLE, tmp_path / "s")
    hidden = tmp_path / "s" / "hidden_states"
    shutil.copy(hidden / "hs_0.safetensors", hidden / "hs_1.safetensors")
    data = open_training_data(tmp_path / "s", draft_config=CONFIG, target=pair["teacher"])
    with pytest.raises(UsageError, match=r"hs_1\.safetensors: token_ids differ from row 1's input_ids"):
        data[1]
    (tmp_path / "s" / "hidden_states" / "hs_3.safetensors").unlink()
    assert open_training_data(tmp_path / "s", draft_config=CONFIG, target=pair["teacher"]).missing == 1


def test_fp8_files_are_dequantized_with_their_per_token_scales(pair, tmp_path):
    raw = load_file(str(SAMPLE / "hidden_states" / "hs_2.safetensors"))
    hidden = raw["hidden_states"].float()
    scale = hidden.abs().amax(dim=(1, 2), keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
    (tmp_path / "fp8").mkdir()
    save_file({"hidden_states": (hidden / scale).to(torch.float8_e4m3fn), "hidden_states_scales": scale,
               "token_ids": raw["token_ids"]}, str(tmp_path / "fp8" / "hs_0.safetensors"))
    data = open_training_data(tmp_path / "fp8", draft_config=CONFIG, target=pair["teacher"])
    torch.testing.assert_close(data[0].aux_hidden_states.float(), hidden[:, :3].flatten(1), rtol=0.07, atol=0.02)


def test_speculators_data_without_pyarrow_names_the_install(pair, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.ipc", None)
    with pytest.raises(MissingDependencyError, match=r"needs pyarrow; pip install 'dspark-hub\[speculators\]'"):
        open_training_data(SAMPLE, draft_config=CONFIG, target=pair["teacher"])


def test_layer_ids_parse_from_a_list_or_commas():
    assert parse_layer_ids("3,24,48") == parse_layer_ids("[3, 24, 48]") == [3, 24, 48]
    assert parse_layer_ids(None) is None
    with pytest.raises(UsageError, match="layer ids 'a,b'"):
        parse_layer_ids("a,b")


def test_finetune_trains_on_speculators_data_and_refuses_ids_that_miss_a_tap(pair, tmp_path):
    common = ["finetune", "--base", str(pair["draft"]), "--data", str(SAMPLE), "--teacher", pair["teacher"],
              "--steps", "3", "--batch-size", "2", "--anchors", "4", "--lr", "3e-3", "--json"]
    result = CliRunner().invoke(cli, [*common, "--out", str(tmp_path / "a"), "--data-layer-ids", "2,4,5,6"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 3
    tuned = load_file(str(tmp_path / "a" / "model.safetensors"))
    base = load_file(str(pair["draft"] / "model.safetensors"))
    assert not torch.equal(tuned["context_proj.weight"], base["context_proj.weight"])
    refused = CliRunner().invoke(cli, [*common, "--out", str(tmp_path / "b"), "--data-layer-ids", "3,4,5"])
    assert_one_line_error(refused, "hs_0.safetensors: captured at vLLM/speculators ids [3, 4, 5, 6]", "[1] missing")
