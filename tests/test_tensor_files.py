"""`format.tensorio.tensor_files`: the one tensor-name -> file resolution the teacher readers, eval and the
speculators forward share (index first, validated; headers otherwise)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format import contract
from dspark_hub.format.reader import read_header
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.modeling.speculators_dspark import read_tensors
from dspark_hub.train.target.target import Target

from .factories import raw_safetensors, write_checkpoint


def test_a_sharded_folder_resolves_through_its_index(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt", shards=3)
    files = tensor_files(folder)
    index = json.loads((folder / contract.INDEX_NAME).read_text())["weight_map"]
    assert {name: path.name for name, path in files.items()} == index
    assert len(set(files.values())) == 3
    assert all(name in read_header(path).tensors for name, path in files.items())


def test_a_folder_without_index_resolves_through_every_header(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    save_file({"a.weight": torch.zeros(2)}, str(tmp_path / "one.safetensors"))
    save_file({"b.weight": torch.zeros(3), "c.weight": torch.ones(1)}, str(tmp_path / "two.safetensors"))
    (tmp_path / "notes.txt").write_text("not weights")
    assert tensor_files(tmp_path) == {"a.weight": tmp_path / "one.safetensors",
                                      "b.weight": tmp_path / "two.safetensors",
                                      "c.weight": tmp_path / "two.safetensors"}


def test_a_single_file_checkpoint_maps_every_tensor_to_it(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt")
    files = tensor_files(folder)
    assert files and set(files.values()) == {folder / contract.WEIGHTS_NAME}
    assert set(files) == set(read_header(folder / contract.WEIGHTS_NAME).tensors)


@pytest.mark.parametrize(("index", "code"), [
    ({"weight_map": {"a.weight": "../outside.safetensors"}}, "INDEX_UNSAFE_PATH"),
    ({"weight_map": {"a.weight": "/abs/outside.safetensors"}}, "INDEX_UNSAFE_PATH"),
    ({"weight_map": {"a.weight": 3}}, "INDEX_INVALID"),
    ({"metadata": {}}, "INDEX_INVALID"),
    (b"{not json", "INDEX_HEADER_NOT_JSON"),
    (b'{"weight_map": {}, "weight_map": {}}', "INDEX_DUPLICATE_KEY"),
])
def test_a_bad_index_is_refused_with_its_code(tmp_path, index, code):
    raw = index if isinstance(index, bytes) else json.dumps(index).encode()
    (tmp_path / contract.INDEX_NAME).write_bytes(raw)
    with pytest.raises(CheckpointFormatError) as e:
        tensor_files(tmp_path)
    assert e.value.code == code


@pytest.mark.parametrize("header", [b"{not json", b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 99]}}'])
def test_a_bad_header_is_refused(tmp_path, header):
    raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 8)
    with pytest.raises(CheckpointFormatError):
        tensor_files(tmp_path)


def test_the_speculators_forward_reads_no_file_an_unsafe_index_names(tmp_path):
    outside = tmp_path / "outside.safetensors"
    save_file({"fc.weight": torch.zeros(2, 2)}, str(outside))
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / contract.INDEX_NAME).write_text(json.dumps({"weight_map": {"fc.weight": "../outside.safetensors"}}))
    with pytest.raises(CheckpointFormatError) as e:
        read_tensors(folder)
    assert e.value.code == "INDEX_UNSAFE_PATH"
    (folder / contract.INDEX_NAME).unlink()
    save_file({"fc.weight": torch.ones(2, 2)}, str(folder / "model.safetensors"))
    assert torch.equal(read_tensors(folder)["fc.weight"], torch.ones(2, 2))


def test_the_teacher_lm_head_is_found_in_whichever_shard_holds_it(tmp_path):
    folder = tmp_path / "teacher"
    folder.mkdir()
    head = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    save_file({"model.embed_tokens.weight": torch.zeros(3, 2)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": head}, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 2, "vocab_size": 3}))
    assert torch.equal(Target.open(folder).lm_head(), head)
    (folder / "model-00001-of-00002.safetensors").rename(folder / "shard-a.safetensors")
    (folder / contract.INDEX_NAME).write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": "shard-a.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    assert torch.equal(Target.open(folder).lm_head(), head)
