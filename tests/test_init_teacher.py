"""`init-teacher`: a tiny random teacher with an offline tokenizer, paired with a tiny draft."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


# ----------------------------------------------------------------------------- init-teacher


def test_init_teacher_pairs_with_the_draft_and_tokenizes_offline(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run("init", tmp_path / "base").exit_code == 0
    result = run("init-teacher", tmp_path / "teacher", "--draft", tmp_path / "base", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "dspark-hub/init-teacher/1" and doc["embedding_from_draft"] is True
    assert (doc["hidden_size"], doc["num_hidden_layers"], doc["vocab_size"]) == (64, 6, 512)
    paired = run("verify", tmp_path / "base", "--target", tmp_path / "teacher", "--json")
    assert paired.exit_code == 0, paired.output
    codes = [f["code"] for f in json.loads(paired.stdout)["findings"]]
    assert "PAIRING_OK" in codes and not [c for c in codes if c.startswith("PAIRING_") and c != "PAIRING_OK"]

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "teacher"))
    ids = tokenizer("héllo, wörld")["input_ids"]
    assert tokenizer.decode(ids) == "héllo, wörld" and max(ids) < 512
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
    assert tokenizer.convert_ids_to_tokens(chat[0]) == "<|user|>" and chat[-1] == tokenizer.convert_tokens_to_ids(
        "<|assistant|>")
    # Byte b is the b-th id after the special ones (<unk> 0, <s> 1, </s> 2): the same map in every process.
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("A", "Ġ", "Ā")] == [3 + 65, 3 + 32, 3 + 0]
    tiny = contract.TINY_CONFIG
    assert tokenizer.convert_ids_to_tokens(tiny["mask_token_id"]) == "<|mask|>"
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        tiny["bos_token_id"], tiny["eos_token_id"], tiny["pad_token_id"])

    from safetensors.torch import load_file

    lm_head = load_file(str(tmp_path / "teacher" / "model.safetensors"))["lm_head.weight"]
    special = sorted(tokenizer.all_special_ids + [i for i in range(512) if i > 3 + 255])
    assert not lm_head[special].any() and lm_head[3:259].abs().sum(-1).min() > 0    # greedy picks bytes only
    again = run("init-teacher", tmp_path / "teacher")
    assert again.exit_code == 2 and "already exists" in again.output
    alone = run("init-teacher", tmp_path / "alone", "--profile", "tiny", "--seed", 3, "--json")
    assert alone.exit_code == 0 and json.loads(alone.stdout)["embedding_from_draft"] is False


def test_init_teacher_refuses_a_teacher_that_is_no_toy(tmp_path):
    (tmp_path / "k3").mkdir()
    (tmp_path / "k3" / "config.json").write_text(json.dumps(contract.REFERENCE_CONFIG))
    result = run("init-teacher", tmp_path / "teacher", "--draft", tmp_path / "k3")
    assert result.exit_code == 2 and "toy targets stop at 50,000,000" in result.output
    assert result.output.startswith("Error: --draft:") and not (tmp_path / "teacher").exists()


def test_init_teacher_head_dim_makes_a_teacher_vllms_cpu_attention_runs(tmp_path):
    from dspark_hub.errors import UsageError
    from dspark_hub.train.target.vllm_worker import _check_cpu_head_dim

    from .cli_errors import assert_one_line_error

    assert run("init-teacher", tmp_path / "narrow", "--quiet").exit_code == 0
    assert run("init-teacher", tmp_path / "wide", "--head-dim", 32, "--quiet").exit_code == 0
    config = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    with pytest.raises(UsageError, match=r"head_dim is 16; vLLM's CPU attention needs head_dim >= 32") as caught:
        _check_cpu_head_dim(tmp_path / "narrow")       # refused before vLLM's engine starts
    assert caught.value.param == "target"
    _check_cpu_head_dim(tmp_path / "wide")
    line = assert_one_line_error(run("init-teacher", tmp_path / "odd", "--head-dim", 24), "24 does not divide")
    assert line.startswith("Error: --head-dim: ") and not (tmp_path / "odd").exists()
