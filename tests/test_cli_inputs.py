"""Bad inputs to rollouts, eval, export-code and package: exit 2 with one line naming what to fix, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract

from .cli_errors import assert_one_line_error
from .factories import write_checkpoint


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """An untrained tiny Llama that pairs with the tiny draft config, plus prompts."""
    import torch
    from transformers import LlamaForCausalLM

    from .teacher_factory import teacher_config, write_prompts

    root = tmp_path_factory.mktemp("teacher")
    torch.manual_seed(0)
    LlamaForCausalLM(teacher_config()).save_pretrained(str(root / "teacher"))
    write_prompts(root / "p.jsonl", count=3, seed=1, length=4)
    (root / "draft.json").write_text(json.dumps(contract.TINY_CONFIG))
    return root


def rollouts(teacher, out, *extra, draft=None):
    return run("rollouts", "--teacher", teacher / "teacher", "--prompts", teacher / "p.jsonl", "--draft-config",
               draft or teacher / "draft.json", "--out", out, *extra)


@pytest.mark.parametrize("option", [("--batch-size", "0"), ("--max-new-tokens", "-1"), ("--shard-size", "0")])
def test_rollouts_counts_must_be_positive(teacher, tmp_path, option):
    result = rollouts(teacher, tmp_path / "out", *option)
    assert_one_line_error(result, option[0], "x>=1", one_line=False)   # click's usage error: usage line, then this
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", [("--block-size", "0"), ("--block-size", "-3"), ("--batch-size", "0"),
                                    ("--max-new-tokens", "0")])
def test_eval_counts_must_be_positive(tmp_path, option):
    result = run("eval", "--draft", tmp_path, "--data", tmp_path, *option)
    assert_one_line_error(result, option[0], "x>=1", one_line=False)


def test_rollouts_draft_config_must_be_a_config_file(teacher, tmp_path):
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    assert_one_line_error(rollouts(teacher, tmp_path / "a", draft=array), "array.json", "JSON array",
                       "pass the draft's config.json file")
    assert_one_line_error(rollouts(teacher, tmp_path / "b", draft=tmp_path), "is a folder",
                       "pass the draft's config.json file")
    no_taps = tmp_path / "no_taps.json"
    no_taps.write_text(json.dumps({k: v for k, v in contract.TINY_CONFIG.items() if k != "target_layer_ids"}))
    assert_one_line_error(rollouts(teacher, tmp_path / "c", draft=no_taps), "target_layer_ids",
                       "non-empty list of integers")
    assert not any((tmp_path / name).exists() for name in "abc")


def test_rollout_files_get_new_file_permissions(teacher, tmp_path):
    result = rollouts(teacher, tmp_path / "out", "--max-new-tokens", "2", "--shard-size", "2", "--json")
    assert result.exit_code == 0, result.output
    mask = os.umask(0)
    os.umask(mask)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"]   # no temp leftovers
    for name in files:
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


@pytest.mark.parametrize("config, words", [
    ("[1, 2]", ("config.json", "not an object")),
    (json.dumps({**contract.TINY_CONFIG, "auto_map": [1]}), ("config.json", "'auto_map'", "not an object")),
    (json.dumps({**contract.TINY_CONFIG, "auto_map": "x"}), ("config.json", "'auto_map'", "not an object")),
])
def test_export_code_refuses_malformed_config(tmp_path, config, words):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / "config.json").write_text(config)
    assert_one_line_error(run("export-code", ckpt), *words)
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("revision", ["main branch", "v1\t", "a..b", "x~1", "-rf", "tag.lock", "a:b", "@{1}"])
def test_package_refuses_revisions_git_would_refuse(tmp_path, revision):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    result = run("package", ckpt, "--repo", "org/tiny", "--revision", revision, "-o", tmp_path / "pkg")
    assert_one_line_error(result, "--revision", "commit sha")
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("endpoint", ["huggingface.co", "ftp://example.com", "http://", "http://x:99999",
                                      "https://exa mple.com"])
def test_package_refuses_endpoints_that_are_not_http_urls(tmp_path, endpoint):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    result = run("package", ckpt, "--repo", "org/tiny", "--endpoint", endpoint, "-o", tmp_path / "pkg")
    assert_one_line_error(result, "--endpoint", "http(s)://host")
    assert not (tmp_path / "pkg").exists()


def test_package_accepts_a_local_endpoint_and_a_sha(tmp_path):   # the passing twin
    ckpt = write_checkpoint(tmp_path / "ckpt")
    result = run("package", ckpt, "--repo", "org/tiny", "--revision", "0123abc", "--endpoint",
                 "http://127.0.0.1:8080", "-o", tmp_path / "pkg", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["webseeds"] == ["http://127.0.0.1:8080/org/tiny/resolve/"]


# ----------------------------------------------------------------------------- path options name their flag

@pytest.fixture(scope="module")
def pair(teacher):
    """The `teacher` fixture plus a draft sharing its embedding and a rollouts folder of it."""
    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.train.data.rollouts import make_rollouts

    init_checkpoint(teacher / "base", config=contract.TINY_CONFIG, embed_from=teacher / "teacher")
    make_rollouts(teacher / "teacher", teacher / "p.jsonl", teacher / "draft.json", teacher / "data",
                  max_new_tokens=2)
    return teacher


#: Where every model and engine of these commands is loaded: the definitions themselves (a class's method,
#: a module's function read at call time), so a caller that bound a name at import cannot slip past.
HEAVY = [("dspark_hub.train.target.target", "Target", "load"), ("dspark_hub.modeling", None, "load_checkpoint"),
         ("dspark_hub.modeling.speculators_dspark", "SpeculatorsDSpark", "from_folder"),
         ("dspark_hub.train.target.vllm_engine", "VllmEngine", "start")]


class Loaded(AssertionError):
    """A model or engine was loaded while the guard was on."""


def _no_heavy_loads(monkeypatch):
    """A model or engine loaded before the paths are checked fails the test (`Loaded`)."""
    def loaded(*_args, **_kwargs):
        raise Loaded("a model was loaded before the inputs were checked")

    for module, cls, name in HEAVY:
        owner = importlib.import_module(module)
        monkeypatch.setattr(getattr(owner, cls) if cls else owner, name, loaded)


def _path_commands(root, out):
    teacher, prompts, base, data = root / "teacher", root / "p.jsonl", root / "base", root / "data"
    return {
        "rollouts": ["rollouts", "--target", teacher, "--prompts", prompts, "--draft-config", base / "config.json",
                     "--out", out],
        "finetune": ["finetune", "--base", base, "--data", data, "--target", teacher, "--out", out, "--steps", "1"],
        "on-policy": ["finetune", "--base", base, "--target", teacher, "--out", out, "--steps", "1", "--on-policy",
                      "--prompts", prompts],
        "eval": ["eval", "--draft", base, "--target", teacher, "--prompts", prompts],
        "eval-data": ["eval", "--draft", base, "--data", data],
    }


@pytest.mark.parametrize("command", ["rollouts", "finetune", "on-policy", "eval", "eval-data"])
def test_the_guard_stops_each_commands_first_load(pair, tmp_path, monkeypatch, command):
    """The failing twin of the test below: with every path good, the command reaches a load, and the guard stops it
    (were a load to go around the patched definitions, the command would run on and this would fail)."""
    _no_heavy_loads(monkeypatch)
    result = run(*_path_commands(pair, tmp_path / "out")[command])
    assert isinstance(result.exception, Loaded), result.output


@pytest.mark.parametrize("command, option", [
    ("rollouts", "--target"), ("rollouts", "--prompts"), ("rollouts", "--draft-config"),
    ("finetune", "--base"), ("finetune", "--data"), ("finetune", "--target"), ("on-policy", "--prompts"),
    ("eval", "--draft"), ("eval", "--target"), ("eval", "--prompts"), ("eval", "--reference"),
    ("eval-data", "--data"),
])
def test_a_missing_path_names_its_option_before_anything_loads(pair, tmp_path, monkeypatch, command, option):
    args = _path_commands(pair, tmp_path / "out")[command]
    missing = tmp_path / "nope"
    if option in args:
        args[args.index(option) + 1] = missing
    else:
        args += [option, missing]
    _no_heavy_loads(monkeypatch)
    line = assert_one_line_error(run(*args), str(missing), "pass ")
    assert line.startswith(f"Error: {option}: "), line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.state").exists()


def test_finetune_checks_its_eval_data_before_loading(pair, tmp_path, monkeypatch):
    from dspark_hub.train.data.rollouts import make_rollouts

    make_rollouts(pair / "teacher", pair / "p.jsonl", pair / "draft.json", tmp_path / "data", max_new_tokens=2)
    args = _path_commands(pair, tmp_path / "out")["finetune"]
    args[args.index("--data") + 1] = tmp_path / "data"
    _no_heavy_loads(monkeypatch)
    line = assert_one_line_error(run(*args, "--eval-data", tmp_path / "nope", "--eval-every", "1"), "nope")
    assert line.startswith("Error: --eval-data: "), line


def test_rollouts_take_a_speculators_dspark_config_and_refuse_other_families(pair, tmp_path):
    """A speculators DSpark's taps are read (tests/test_speculators_finetune.py records them); its target is
    checked against the teacher, and a draft of another family is refused naming it."""
    from .spec_fixtures import fixture

    result = rollouts(pair, tmp_path / "out", draft=fixture("dspark") / "config.json")
    assert_one_line_error(result, "vocab_size is 512", "the draft's transformer_layer_config.vocab_size is 256")
    result = rollouts(pair, tmp_path / "out", draft=fixture("eagle3") / "config.json")
    line = assert_one_line_error(result, "draft config; rollouts and finetune read the taps of a k3_dspark or a "
                                         "speculators DSpark config")
    assert line.startswith("Error: --draft-config: ") and not (tmp_path / "out").exists()


@pytest.mark.parametrize("engine, option", [("transformers", ["--engine-python", "/opt/vllm/bin/python"]),
                                            ("vllm", ["--engine-device", "cpu"])])
def test_an_engine_option_the_engine_does_not_take_is_named_by_its_flag(pair, tmp_path, engine, option):
    result = rollouts(pair, tmp_path / "out", "--engine", engine, *option)
    line = assert_one_line_error(result, f"target engine '{engine}' does not take")
    assert line.startswith(f"Error: {option[0]}: "), line


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is importable here")
def test_on_policy_without_vllm_leaves_no_state_folder(pair, tmp_path):
    result = run(*_path_commands(pair, tmp_path / "out")["on-policy"], "--engine", "vllm")
    assert_one_line_error(result, "the vllm target engine needs vLLM 0.32")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
