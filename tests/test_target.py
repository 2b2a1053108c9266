"""The target opened once (`train.target.target.Target`): its identity is the files the one folder listing sees,
computed once, and a link out of the target folder is never hashed."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format.contract import CONFIG_NAME, INDEX_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.train.target import target as target_module
from dspark_hub.train.target.target import Target

WEIGHTS = "model.safetensors"


def write_target(folder, *, extra: dict | None = None):
    folder.mkdir(parents=True)
    (folder / CONFIG_NAME).write_text(json.dumps({"hidden_size": 2, "vocab_size": 3, "num_hidden_layers": 2}))
    save_file({"lm_head.weight": torch.ones(3, 2)}, str(folder / WEIGHTS))
    return folder


@pytest.fixture
def hashed(monkeypatch):
    """Every file the target module hashes, in order."""
    seen: list[str] = []

    def counting(path, **kwargs):
        seen.append(os.path.basename(path))
        return sha256_file(path, **kwargs)

    monkeypatch.setattr(target_module, "sha256_file", counting)
    return seen


def test_the_identity_is_the_config_and_weight_files_hashed_once(tmp_path, hashed):
    target = Target.open(write_target(tmp_path / "t"))
    (tmp_path / "t" / "notes.txt").write_text("not part of the identity")
    first = target.identity
    assert target.identity is first and set(first.digests) == {CONFIG_NAME, WEIGHTS}
    assert sorted(hashed) == [CONFIG_NAME, WEIGHTS]          # asked twice, hashed once
    assert Target.open(tmp_path / "t").identity == first     # another opening hashes again: the counter sees it
    assert len(hashed) == 4


@pytest.mark.parametrize("name", [WEIGHTS, CONFIG_NAME, INDEX_NAME, "model-00002-of-00002.safetensors"])
def test_a_file_of_the_identity_that_links_out_of_the_folder_is_refused_never_hashed(tmp_path, hashed, name):
    folder = write_target(tmp_path / "t")
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    os.replace(folder / name, outside) if (folder / name).exists() else outside.write_text("{}")
    (folder / name).symlink_to(outside)
    target = Target.open(folder) if name != CONFIG_NAME else Target(str(folder), {"hidden_size": 2})
    refusal = rf"target: .*{name}: is a symlink to .*outside the checkpoint.*copy the file"
    with pytest.raises(CheckpointFormatError, match=refusal) as info:
        _ = target.identity
    assert info.value.code == "LINK_OUTSIDE" and name not in hashed


def test_a_link_inside_the_folder_and_an_unrelated_link_out_are_fine(tmp_path, hashed):
    folder = write_target(tmp_path / "t")
    os.replace(folder / WEIGHTS, folder / "weights.bin.safetensors")
    (folder / WEIGHTS).symlink_to("weights.bin.safetensors")          # inside: listed under its own name
    (tmp_path / "readme.txt").write_text("outside")
    (folder / "README.txt").symlink_to(tmp_path / "readme.txt")       # out, but no file of the identity
    identity = Target.open(folder).identity
    assert set(identity.digests) == {CONFIG_NAME, WEIGHTS, "weights.bin.safetensors"}
    assert identity.digests[WEIGHTS] == identity.digests["weights.bin.safetensors"]


def test_a_hub_snapshot_is_identified_by_repo_and_revision_without_hashing(tmp_path, hashed):
    revision = "0123456789abcdef0123456789abcdef01234567"
    folder = write_target(tmp_path / "hub" / "models--org--name" / "snapshots" / revision)
    identity = Target.open(folder).identity
    assert identity.label == f"org/name@{revision}" and hashed == []
