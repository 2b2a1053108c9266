"""`dspark-hub init`: conforming output, determinism, atomic and non-clobbering."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.format.reader import read_header
from dspark_hub.verify.checks import verify

from .cli_errors import assert_one_line_error
from .factories import file_digest


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_init_tiny_passes_verify(tmp_path):
    result = run("init", tmp_path / "c", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["profile"] == "tiny" and doc["weights_bytes"] == contract.expected_file_size(contract.TINY_CONFIG)
    report = verify(tmp_path / "c")
    assert report.ok and report.findings == []
    assert (tmp_path / "c" / "config.json").read_bytes() == contract.config_bytes(contract.TINY_CONFIG)
    header = read_header(tmp_path / "c" / "model.safetensors")
    assert header.metadata == contract.TORCHSPEC_METADATA
    assert list(header.tensors) == sorted(header.tensors)


def test_init_matches_what_safetensors_writes(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file
    run("init", tmp_path / "c")
    tensors = load_file(str(tmp_path / "c" / "model.safetensors"))
    save_file(tensors, str(tmp_path / "again.safetensors"), metadata=contract.TORCHSPEC_METADATA)
    assert file_digest(tmp_path / "again.safetensors") == file_digest(tmp_path / "c" / "model.safetensors")
    assert torch.all(tensors["final_norm.weight"] == 1) and tensors["layers.0.mlp.up_proj.weight"].std() > 0.01


def test_seed_determinism(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        run("init", tmp_path / name, "--seed", seed)
    digest = {n: file_digest(tmp_path / n / "model.safetensors") for n in "abc"}
    assert digest["a"] == digest["b"] != digest["c"]


def test_zeros(tmp_path):
    from safetensors.torch import load_file
    run("init", tmp_path / "z", "--init", "zeros")
    tensors = load_file(str(tmp_path / "z" / "model.safetensors"))
    assert not tensors["context_proj.weight"].any() and tensors["context_norm.weight"].eq(1).all()


def test_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run("init", out)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert run("init", out, "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and verify(out).ok
    assert [p.name for p in tmp_path.iterdir()] == ["c"]   # no temporary leftovers


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from dspark_hub.ops import init

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(init, "write_safetensors", boom)
    result = run("init", tmp_path / "c")
    assert result.exit_code == 2 and "No space left" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_refuses_the_current_folder_and_its_parents(tmp_path, monkeypatch):
    work = tmp_path / "s" / "a"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    for dst in (".", "..", str(work), str(tmp_path), "../a", "x/..", "s/a/.."):
        assert_one_line_error(run("init", dst, "--force"), dst, "current folder", "new folder name")
    assert (work / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["a"]


@pytest.fixture(params=["renameat2", "no renameat2"])
def rename_kind(request, monkeypatch):
    """Both ways a writer's final rename runs: renameat2's no-replace and exchange, and the fallback without it
    (a hard link or a plain rename to take a free name, moving the old output aside to replace it)."""
    from dspark_hub.format import renames

    if request.param == "no renameat2":
        monkeypatch.setattr(renames, "_renameat2", lambda: None)
    return request.param


def test_failed_final_rename_keeps_the_old_output(tmp_path, monkeypatch, rename_kind):
    from dspark_hub.format import renames, writer

    out = tmp_path / "c"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    real_rename, real_exchange = writer.os.rename, renames.exchange

    def rename(src, dst):
        if str(src).startswith(str(tmp_path / ".c.tmp-")):
            raise OSError(18, "Invalid cross-device link")
        return real_rename(src, dst)

    def exchange(a, b):
        if str(a).startswith(str(tmp_path / ".c.tmp-")):
            raise OSError(18, "Invalid cross-device link")
        return real_exchange(a, b)
    monkeypatch.setattr(writer.os, "rename", rename)
    monkeypatch.setattr(renames, "exchange", exchange)
    result = run("init", out, "--force")
    assert result.exit_code == 2 and "cross-device" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["c"]   # neither the temp folder nor a hidden .c.old-PID


def test_atomic_path_gives_umask_permissions_even_after_save_file(tmp_path):
    import os

    import torch
    from safetensors.torch import save_file

    from dspark_hub.format.writer import atomic_path

    out = tmp_path / "t.safetensors"
    with atomic_path(out) as tmp:
        save_file({"x": torch.zeros(2)}, str(tmp))
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


# ---------------------------------------------------------------- --embed-from

def _llama_teacher(folder, *, dtype=None, shard=None, **overrides):
    import torch
    from transformers import LlamaForCausalLM

    from .teacher_factory import teacher_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(teacher_config(**overrides))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(folder), **({"max_shard_size": shard} if shard else {}))
    return folder, model.model.embed_tokens.weight.detach()


def _embedding_bytes(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return f.get_tensor("embed_tokens.weight")


def test_embed_from_an_f32_teacher_is_its_exact_bf16_rounding_and_pairs(tmp_path, monkeypatch):
    import torch

    from dspark_hub.ops import init as init_module

    teacher, embed = _llama_teacher(tmp_path / "teacher")       # save_pretrained of a small model: F32
    assert read_header(teacher / "model.safetensors").tensors["model.embed_tokens.weight"].dtype == "F32"
    monkeypatch.setattr(init_module, "_EMBED_CHUNK_BYTES", 1002)  # streamed in pieces that split elements
    result = run("init", tmp_path / "d", "--embed-from", teacher, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    where = f"{teacher / 'model.safetensors'}:model.embed_tokens.weight"
    assert doc["embedding"] == {"source": "teacher", "teacher": where, "teacher_dtype": "F32",
                                "cast": "BF16 rounding (nearest even) of the F32"}
    assert doc["warnings"] == []
    assert torch.equal(_embedding_bytes(tmp_path / "d").view(torch.int16), embed.to(torch.bfloat16).view(torch.int16))
    report = verify(tmp_path / "d", target=teacher, frozen_embed=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.sections["pairing"]["embedding"]["verdict"] == \
        "identical after BF16 rounding (nearest even) of the F32 target"
    assert report.sections["frozen_embed"]["compared_as"] == "cast"


def test_embed_from_a_sharded_bf16_teacher_copies_the_bytes(tmp_path):
    import torch

    teacher, embed = _llama_teacher(tmp_path / "teacher", dtype=torch.bfloat16, shard="60KB")
    assert (teacher / contract.INDEX_NAME).is_file()
    result = run("init", tmp_path / "d", "--embed-from", teacher)
    assert result.exit_code == 0, result.output
    assert "embed_tokens from" in result.stdout and "warning" not in result.stderr
    assert torch.equal(_embedding_bytes(tmp_path / "d").view(torch.int16), embed.view(torch.int16))
    section = verify(tmp_path / "d", frozen_embed=teacher).sections["frozen_embed"]
    assert (section["compared_as"], section["verdict"]) == ("bytes", "bit-identical")


def test_embed_from_a_teacher_of_another_shape_is_refused_in_one_line(tmp_path):
    teacher, _ = _llama_teacher(tmp_path / "teacher", vocab_size=256)
    result = run("init", tmp_path / "d", "--embed-from", teacher)
    assert_one_line_error(result, "--embed-from", "[256, 64]", "[512, 64]", "vocab_size x hidden_size")
    assert not (tmp_path / "d").exists()
    missing = run("init", tmp_path / "d", "--embed-from", tmp_path / "nope")
    assert missing.exit_code == 2 and not (tmp_path / "d").exists()


def test_init_without_embed_from_warns_that_the_frozen_embedding_is_random(tmp_path):
    human = run("init", tmp_path / "c")
    assert human.exit_code == 0
    assert "random" in human.stderr and "--embed-from" in human.stderr and "verify --target" in human.stderr
    assert len(human.stderr.splitlines()) == 1            # never hard-wrapped: the command in it stays whole
    doc = json.loads(run("init", tmp_path / "j", "--json").stdout)
    assert doc["embedding"]["source"] == "random" and len(doc["warnings"]) == 1
    assert "--" not in doc["warnings"][0]                # library words: no CLI flag


@pytest.mark.parametrize("args, option", [
    (["--layers", "3"], "--layers"),
    (["--format", "speculators"], "--format"),
    (["--format", "k3_dspark"], "--format"),          # even the default, when typed, is refused
    (["--taps", "1,2"], "--taps"),
    (["--block-size", "4"], "--block-size"),
    (["--draft-vocab", "8"], "--draft-vocab"),
    (["--vocab-from", "data.jsonl"], "--vocab-from"),
    (["--mla-widths-from", "kimi-k3"], "--mla-widths-from"),
])
def test_options_for_a_target_without_one_are_refused_in_one_line(tmp_path, args, option):
    result = run("init", tmp_path / "c", *args)
    assert_one_line_error(result, option, "--target", f"drop {option}")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args", [[], ["--profile", "tiny"], ["--seed", "3", "--init", "zeros"]])
def test_profile_options_without_a_target_are_taken(tmp_path, args):
    result = run("init", tmp_path / "c", *args)
    assert result.exit_code == 0, result.output
    assert verify(tmp_path / "c").ok
