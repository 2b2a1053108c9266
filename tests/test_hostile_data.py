"""Issue 29, items 9 and 10 (prompts): data folders follow a model folder's rules, and every prompt a command reads
is checked before anything runs.

A rollouts or hidden-state folder with a manifest missing a key or holding a value of the wrong type, a shard
named outside the folder, linked out of it or swapped for a FIFO, or tensors other than the manifest says, is
one line naming the file and the key, exit 2, for `eval` and `finetune` alike. A prompts file that is not UTF-8,
holds ids the target has no token for (or a `true`), values of the wrong JSON type, or a prompt that would run
past the target's context is refused naming its line. Each class has several members and a passing twin.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import CheckpointFormatError, DsparkError, UsageError
from dspark_hub.format import contract
from dspark_hub.train.data.hidden_state_files import open_training_data, write_hidden_state_file
from dspark_hub.train.data.rollouts import RolloutData, read_prompts

from . import test_cli_inputs
from .cli_errors import assert_one_line_error
from .data_factory import write_rollouts
from .test_folder import fifo_at

CONFIG = contract.TINY_CONFIG
#: A random tiny Llama target (`teacher`) and a draft that pairs with it (`pair`), from the CLI input tests.
teacher, pair = test_cli_inputs.teacher, test_cli_inputs.pair


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def world(pair):
    """A random tiny Llama target, a draft that pairs with it (`test_cli_inputs.pair`), and a rollouts folder
    recorded for the draft."""
    data = write_rollouts(pair / "data", CONFIG)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["settings"]["teacher"] = str(pair / "teacher")
    (data / "manifest.json").write_text(json.dumps(manifest))
    return pair


@pytest.fixture
def data(world, tmp_path):
    """A fresh copy of the world's rollouts folder."""
    return Path(shutil.copytree(world / "data", tmp_path / "data"))


def edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _seq(m):
    return m["shards"][0]["sequences"][0]


#: name -> (edit the manifest, words the one-line error holds besides manifest.json)
MANIFESTS = {
    "no shards": (lambda m: m.pop("shards"), ["no shards"]),
    "shards an object": (lambda m: m.update(shards={"file": "x"}), ["shards is", "not a list"]),
    "no settings": (lambda m: m.pop("settings"), ["no settings"]),
    "settings a list": (lambda m: m.update(settings=[1]), ["settings is", "not an object"]),
    "no target_layer_ids": (lambda m: m["settings"].pop("target_layer_ids"), ["no settings.target_layer_ids"]),
    "taps a string": (lambda m: m["settings"].update(target_layer_ids="1,3,4"), ["settings.target_layer_ids"]),
    "vocab_size true": (lambda m: m["settings"].update(vocab_size=True), ["settings.vocab_size is true"]),
    "no teacher label": (lambda m: m["teacher"].pop("label"), ["no teacher.label"]),
    "no shard file": (lambda m: m["shards"][0].pop("file"), ["no shards[0].file"]),
    "file a number": (lambda m: m["shards"][0].update(file=7), ["shards[0].file is 7"]),
    "no sequences": (lambda m: m["shards"][0].pop("sequences"), ["no shards[0].sequences"]),
    "no prompt_length": (lambda m: _seq(m).pop("prompt_length"), ["no shards[0].sequences[0].prompt_length"]),
    "length a string": (lambda m: _seq(m).update(length="6"), ["shards[0].sequences[0].length is \"6\""]),
    "prompt_index true": (lambda m: _seq(m).update(prompt_index=True), ["prompt_index is true"]),
    "prompt_index past int64": (lambda m: _seq(m).update(prompt_index=2 ** 63),
                                ["prompt_index is 9223372036854775808"]),
    "negative length": (lambda m: _seq(m).update(length=-6), ["length is -6"]),
    "prompt longer than the sequence": (lambda m: _seq(m).update(prompt_length=99), ["prompt_length 99 is longer"]),
    "dataset a number": (lambda m: _seq(m).update(dataset=3), ["dataset is 3"]),
    "agreement of three": (lambda m: _seq(m).update(greedy_agreement=[1, 2, 3]), ["greedy_agreement"]),
    "a prompt listed twice": (lambda m: m["shards"][0]["sequences"][1].update(prompt_index=0), ["listed twice"]),
}


@pytest.mark.parametrize("name", list(MANIFESTS))
def test_a_manifest_missing_a_key_or_of_the_wrong_type_is_one_line_naming_it(data, name):
    edit, words = MANIFESTS[name]
    edit_manifest(data, edit)
    with pytest.raises(UsageError) as caught:
        RolloutData(data)
    assert "manifest.json: " in str(caught.value) and all(w in str(caught.value) for w in words), str(caught.value)
    assert "\n" not in str(caught.value)


#: name -> (damage the folder, with `outside` a folder beside it; words of the one-line error)
SHARDS = {
    "named ../outside": (lambda d, o: edit_manifest(d, lambda m: m["shards"][0].update(
        file="../outside/shard-00000.safetensors")), ["../outside", "outside"]),
    "named by an absolute path": (lambda d, o: edit_manifest(d, lambda m: m["shards"][0].update(
        file=str(o / "shard-00000.safetensors"))), ["a path outside"]),
    "named through a subfolder and ..": (lambda d, o: edit_manifest(d, lambda m: m["shards"][0].update(
        file="sub/../shard-00000.safetensors")), ["a path outside"]),
    "named but absent": (lambda d, o: edit_manifest(d, lambda m: m["shards"][0].update(
        file="shard-00009.safetensors")), ["shard-00009.safetensors", "not a regular file"]),
    "a link out of the folder": (lambda d, o: (d / "shard-00000.safetensors").unlink() or
                                 (d / "shard-00000.safetensors").symlink_to(o / "shard-00000.safetensors"),
                                 ["LINK_OUTSIDE", "symlink"]),
    "the manifest a link out": (lambda d, o: (d / "manifest.json").unlink() or
                                (d / "manifest.json").symlink_to(o / "manifest.json"), ["manifest.json", "symlink"]),
    "a folder named like the shard": (lambda d, o: (d / "shard-00000.safetensors").unlink() or
                                      (d / "shard-00000.safetensors").mkdir(), ["not a regular file"]),
    "a sequence's tensor missing": (lambda d, o: _rewrite_shard(d, lambda t: t.pop("1.final_hidden_states")),
                                    ["no tensor '1.final_hidden_states'"]),
    "a length the tensors do not have": (lambda d, o: edit_manifest(d, lambda m: _seq(m).update(length=5)),
                                         ["0.input_ids is I64 [6]", "[5]"]),
    "hidden states of another width": (lambda d, o: _rewrite_shard(d, lambda t: t.update(
        {"0.aux_hidden_states": torch.zeros(6, 7, dtype=torch.bfloat16)})), ["0.aux_hidden_states", "[6, 7]"]),
    "token ids as floats": (lambda d, o: _rewrite_shard(d, lambda t: t.update(
        {"0.input_ids": torch.zeros(6)})), ["0.input_ids is F32"]),
    "not a safetensors file": (lambda d, o: (d / "shard-00000.safetensors").write_bytes(b"\x00" * 4),
                               ["shard-00000.safetensors"]),
}


def _rewrite_shard(folder: Path, edit) -> None:
    tensors = load_file(str(folder / "shard-00000.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "shard-00000.safetensors"))


@pytest.mark.parametrize("name", list(SHARDS))
def test_a_shard_outside_the_folder_or_unlike_its_manifest_is_never_read(data, tmp_path, name):
    outside = Path(shutil.copytree(data, tmp_path / "outside"))
    damage, words = SHARDS[name]
    damage(data, outside)
    with pytest.raises(DsparkError) as caught:
        RolloutData(data)
    text = f"{getattr(caught.value, 'code', '')} {caught.value}"
    assert all(w in text for w in words), text


@pytest.mark.parametrize("member", ["shard", "manifest", "a stray entry"])
def test_a_fifo_in_a_data_folder_stops_eval_and_finetune_at_once(world, data, tmp_path, member):
    pipe = {"shard": "shard-00000.safetensors", "manifest": "manifest.json", "a stray entry": "notes"}[member]
    with fifo_at(data / pipe):
        evaluated = run("eval", "--draft", world / "base", "--data", data)
        tuned = run("finetune", "--base", world / "base", "--data", data, "--target", world / "teacher", "--out",
                    tmp_path / "out", "--steps", "1")
    for result in (evaluated, tuned):
        assert_one_line_error(result, pipe)
    assert not (tmp_path / "out").exists()


def test_a_shard_swapped_for_a_fifo_after_the_folder_was_checked_is_refused_unopened(data):
    rollouts = RolloutData(data)
    with fifo_at(data / "shard-00000.safetensors"), pytest.raises(CheckpointFormatError) as caught:
        rollouts[0]
    assert caught.value.code == "SPECIAL_FILE"


@pytest.mark.parametrize("member", ["an id past the vocabulary", "a negative id", "a mask of 2"])
def test_values_a_step_cannot_use_are_refused_naming_the_tensor(data, member):
    def edit(tensors):
        if member == "a mask of 2":
            tensors["0.loss_mask"][3] = 2
        else:
            tensors["0.input_ids"][2] = CONFIG["vocab_size"] if member == "an id past the vocabulary" else -4

    _rewrite_shard(data, edit)
    rollouts = RolloutData(data)
    with pytest.raises(UsageError, match="0.loss_mask" if member == "a mask of 2" else "0.input_ids: token id"):
        rollouts[0]


@pytest.mark.parametrize("name", ["no shards", "length a string", "prompt_index true", "a prompt listed twice"])
def test_eval_and_finetune_name_the_manifest_key_in_one_line(world, data, tmp_path, name):
    edit_manifest(data, MANIFESTS[name][0])
    for result in (run("eval", "--draft", world / "base", "--data", data),
                   run("finetune", "--base", world / "base", "--data", data, "--target", world / "teacher", "--out",
                       tmp_path / "out", "--steps", "1")):
        assert_one_line_error(result, "manifest.json", *MANIFESTS[name][1])


@pytest.mark.parametrize("key, value", [("target_hidden_size", 32), ("target_layer_ids", [0, 2, 4]),
                                        ("vocab_size", 1024)])
def test_a_rollouts_folder_recorded_for_another_draft_is_refused_by_finetune(world, tmp_path, key, value):
    data = write_rollouts(tmp_path / "data", {**CONFIG, key: value})
    result = run("finetune", "--base", world / "base", "--data", data, "--target", world / "teacher", "--out",
                 tmp_path / "out", "--steps", "1")
    assert_one_line_error(result, "--data", f"recorded {key} {value}, the draft reads {CONFIG[key]}")


def test_a_sound_rollouts_folder_is_read_and_evaluated(world, data):
    """The twin: the folder as written reads whole, and eval measures on it."""
    rollouts = RolloutData(data)
    assert len(rollouts) == 2 and rollouts[1].input_ids.shape == (6,) and rollouts[1].loss_mask.tolist()[2:] == [1] * 4
    assert torch.equal(rollouts[0].aux_hidden_states, load_file(str(data / "shard-00000.safetensors"))[
        "0.aux_hidden_states"])
    assert run("eval", "--draft", world / "base", "--data", data, "--json").exit_code == 0


# ---------------------------------------------------------------- hidden-state folders

def hidden_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(2):
        write_hidden_state_file(folder / f"hs_{i}.safetensors", torch.randn(5, 4, CONFIG["target_hidden_size"]),
                                torch.arange(5))
    return folder


#: name -> damage a folder of hidden-state files (with `outside` beside it)
HIDDEN = {
    "a link out": lambda f, o: (f / "hs_1.safetensors").unlink() or (f / "hs_1.safetensors").symlink_to(
        o / "hs_1.safetensors"),
    "a fifo": lambda f, o: (f / "hs_1.safetensors").unlink() or os.mkfifo(f / "hs_1.safetensors"),
    "a directory link": lambda f, o: (f / "more").symlink_to(o),
    "token ids past the vocabulary": lambda f, o: write_hidden_state_file(
        f / "hs_1.safetensors", torch.randn(5, 4, CONFIG["target_hidden_size"]), torch.full((5,), 10 ** 6)),
}


@pytest.mark.parametrize("name", list(HIDDEN))
def test_hidden_state_folders_follow_the_same_rules(world, tmp_path, name):
    folder = hidden_folder(tmp_path)
    outside = Path(shutil.copytree(folder, tmp_path / "outside"))
    HIDDEN[name](folder, outside)
    with pytest.raises(DsparkError) as caught:
        data = open_training_data(folder, draft_config=CONFIG, target=str(world / "teacher"))
        [data[i] for i in range(len(data))]
    assert "hs_1.safetensors" in str(caught.value) or "more" in str(caught.value), str(caught.value)


SAMPLE = Path(__file__).parent / "fixtures" / "speculators_sample"
SAMPLE_CONFIG = {**CONFIG, "vocab_size": 256, "draft_vocab_size": 256, "mask_token_id": 253, "pad_token_id": 255,
                 "target_hidden_size": 64, "target_num_hidden_layers": 6}


def _state(folder: Path, filename: object) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": filename}]
    (folder / "state.json").write_text(json.dumps(state))


#: name -> (damage a copy of the speculators data sample, with `outside` beside it; words of the error)
SPECULATORS = {
    "an Arrow file named ../outside": (lambda f, o: _state(f, "../outside/data-00000-of-00001.arrow"),
                                       ["DATA_PATH_OUTSIDE", "../outside"]),
    "an Arrow file named by an absolute path": (lambda f, o: _state(f, str(o / "data-00000-of-00001.arrow")),
                                                ["DATA_PATH_OUTSIDE"]),
    "an Arrow file that is not there": (lambda f, o: _state(f, "data-9.arrow"), ["DATA_FILE_MISSING"]),
    "an Arrow file named by a number": (lambda f, o: _state(f, 7), ["DATA_FILE_MISSING"]),
    "an Arrow file that is a FIFO": (lambda f, o: (f / "data-00000-of-00001.arrow").unlink() or os.mkfifo(
        f / "data-00000-of-00001.arrow"), ["SPECIAL_FILE"]),
    "a hidden-state file linked out": (lambda f, o: (f / "hidden_states" / "hs_0.safetensors").unlink() or (
        f / "hidden_states" / "hs_0.safetensors").symlink_to(o / "hidden_states" / "hs_0.safetensors"),
                                       ["LINK_OUTSIDE"]),
}


def speculators_data(folder: Path, tmp_path: Path):
    """The speculators sample at `folder` read as training data, its target a config of the sample's shape."""
    pytest.importorskip("pyarrow")
    from dspark_hub.train.data.hidden_state_files import HiddenStateData
    from dspark_hub.train.target.target import FinalNorm

    from .teacher_factory import teacher_config

    (tmp_path / "target").mkdir(exist_ok=True)      # the pairing reads the target's config only
    teacher_config(vocab_size=256, num_attention_heads=2, num_key_value_heads=2).to_json_file(
        str(tmp_path / "target" / "config.json"))
    norm = FinalNorm("model.norm.weight", torch.ones(64), 1e-6)
    return HiddenStateData(folder, draft_config=SAMPLE_CONFIG, target=str(tmp_path / "target"), final_norm=norm)


@pytest.mark.parametrize("name", list(SPECULATORS))
def test_speculators_data_names_only_files_inside_its_folder(tmp_path, name):
    folder = Path(shutil.copytree(SAMPLE, tmp_path / "data"))
    outside = Path(shutil.copytree(SAMPLE, tmp_path / "outside"))
    damage, words = SPECULATORS[name]
    damage(folder, outside)
    with pytest.raises(DsparkError) as caught:
        speculators_data(folder, tmp_path)
    text = f"{getattr(caught.value, 'code', '')} {caught.value}"
    assert all(w in text for w in words), text


def test_the_speculators_sample_reads_whole(tmp_path):
    """The twin: the sample as speculators wrote it (state.json naming its Arrow file) reads, every row."""
    data = speculators_data(Path(shutil.copytree(SAMPLE, tmp_path / "data")), tmp_path)
    assert (len(data), data.missing) == (4, 0) and data[3].input_ids.shape[0] == data[3].loss_mask.shape[0]


def test_a_sound_hidden_state_folder_reads(world, tmp_path):
    data = open_training_data(hidden_folder(tmp_path), draft_config=CONFIG, target=str(world / "teacher"))
    assert len(data) == 2 and data[1].aux_hidden_states.shape == (5, 3 * CONFIG["target_hidden_size"])


# ---------------------------------------------------------------- prompts files

#: name -> (the prompts file's bytes, words of the one-line error besides the file name)
PROMPTS = {
    "latin-1 text": (b'{"text": "caf\xe9"}\n', [":1: byte 0xe9 is not UTF-8"]),
    "a stray byte on line 2": (b'{"input_ids": [1]}\n{"input_ids": [2, \xff]}\n', [":2: byte 0xff"]),
    "true as a token id": (b'{"input_ids": [1, true]}\n', ["input_ids holds true"]),
    "a float id": (b'{"input_ids": [1, 2.0]}\n', ["input_ids holds 2.0"]),
    "a negative id": (b'{"input_ids": [-3]}\n', ["input_ids holds -3"]),
    "an id past int64": (b'{"input_ids": [9223372036854775808]}\n', ["9223372036854775808"]),
    "an id past the vocabulary": (b'{"input_ids": [1, 512]}\n', ["token id 512 is outside", "[0, 512)"]),
    "ids as a string": (b'{"input_ids": "1 2"}\n', ["input_ids holds \"1 2\""]),
    "no ids": (b'{"input_ids": []}\n', ["input_ids holds []"]),
    "text a number": (b'{"text": 5}\n', ["text is 5"]),
    "messages a string": (b'{"messages": "hi"}\n', ["messages is \"hi\""]),
    "a message without a role": (b'{"messages": [{"content": "hi"}]}\n', ["messages is"]),
    "dataset a list": (b'{"input_ids": [1], "dataset": ["a"]}\n', ["dataset is [\"a\"]"]),
    "longer than the context": (json.dumps({"input_ids": [1] * 600}).encode() + b"\n", ["600 tokens",
                                                                                       "context of 512"]),
    "fits only without the tokens to generate": (json.dumps({"input_ids": [1] * 510}).encode() + b"\n",
                                                 ["510 tokens + 4 tokens to generate"]),
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_prompt_the_target_cannot_take_is_refused_naming_its_line(world, tmp_path, name):
    raw, words = PROMPTS[name]
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(raw)
    with pytest.raises(UsageError) as caught:
        read_prompts(prompts, world / "teacher", budget=4)
    assert str(caught.value).startswith(f"{prompts}:") and all(w in str(caught.value) for w in words), caught.value


@pytest.mark.parametrize("name", ["latin-1 text", "true as a token id", "an id past the vocabulary",
                                  "longer than the context"])
def test_rollouts_eval_and_on_policy_refuse_the_prompt_before_running(world, tmp_path, name):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(PROMPTS[name][0])
    base, target = world / "base", world / "teacher"
    for args in (["rollouts", "--target", target, "--prompts", prompts, "--draft-config", base / "config.json",
                  "--out", tmp_path / "out", "--max-new-tokens", "4"],
                 ["eval", "--draft", base, "--target", target, "--prompts", prompts, "--max-new-tokens", "4"],
                 ["finetune", "--base", base, "--target", target, "--on-policy", "--prompts", prompts, "--out",
                  tmp_path / "ft", "--steps", "1", "--max-new-tokens", "4"]):
        assert_one_line_error(run(*args), "p.jsonl:", *PROMPTS[name][1])
    assert not (tmp_path / "out").exists() and not (tmp_path / "ft").exists()


def test_a_fifo_as_the_prompts_file_is_refused_unopened(world, tmp_path):
    with fifo_at(tmp_path / "p.jsonl"):
        result = run("eval", "--draft", world / "base", "--target", world / "teacher", "--prompts",
                     tmp_path / "p.jsonl")
    assert_one_line_error(result, "p.jsonl", "named pipe (FIFO)")


def test_prompts_the_target_can_take_are_read_whole(world, tmp_path):
    """The twin: ids at the edges of the vocabulary, a prompt that just fits, a line separator inside a string."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [0, 511], "dataset": "edge"}) + "\n\n"
                       + json.dumps({"input_ids": [1] * 508}) + "\n"
                       + '{"input_ids": [2], "dataset": "a\u2028b"}\n', encoding="utf-8")
    read = read_prompts(prompts, world / "teacher", budget=4)
    assert [p.input_ids[:2] for p in read] == [[0, 511], [1, 1], [2]] and read[2].dataset == "a\u2028b"
