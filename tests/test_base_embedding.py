"""finetune refuses a base whose frozen embedding is not the teacher's (issue 15): the runtime serves the
draft with the target's embedding, and training never changes the frozen copy."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.ops.init import init_checkpoint
from dspark_hub.train.finetuning.trainer import check_base_embedding

from . import test_hidden_state_files as hsf

CONFIG, SAMPLE = hsf.CONFIG, hsf.SAMPLE
pair = hsf.pair   # the fixture: a random F32 Llama teacher and a draft made with init --embed-from it


def test_a_random_base_is_refused_and_an_embed_from_base_passes(pair, tmp_path):
    random_base = init_checkpoint(tmp_path / "random", config=CONFIG).path
    with pytest.raises(UsageError, match=r"embed_tokens\.weight is not identical to the BF16 rounding") as refused:
        check_base_embedding(random_base, pair["teacher"])
    assert "'dspark-hub init DIR --embed-from TARGET'" in str(refused.value)
    # the fixture's draft was made with --embed-from: its embedding is the F32 teacher's exact BF16 rounding
    assert check_base_embedding(pair["draft"], pair["teacher"]).startswith("identical after BF16 rounding")
    draft = load_file(str(pair["draft"] / "model.safetensors"))["embed_tokens.weight"]
    teacher = load_file(f"{pair['teacher']}/model.safetensors")["model.embed_tokens.weight"]
    assert torch.equal(draft, teacher.to(torch.bfloat16))


def test_finetune_stops_in_one_line_before_training(pair, tmp_path):
    random_base = init_checkpoint(tmp_path / "random", config=CONFIG).path
    result = CliRunner().invoke(cli, ["finetune", "--base", str(random_base), "--teacher", pair["teacher"],
                                      "--data", str(SAMPLE), "--out", str(tmp_path / "out"), "--steps", "1"])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: --base: ") and "embed_tokens.weight" in line
    assert not (tmp_path / "out").exists()
