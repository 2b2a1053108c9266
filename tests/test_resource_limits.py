"""Inputs built to blow up: YAML alias bombs in card sources and front matter, and huge config values in messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.source import MAX_YAML_VALUES, load_yaml
from dspark_hub.cli.main import cli

from .factories import tiny_config, write_checkpoint

FRONT = "license: apache-2.0\nbase_model: org/teacher\ntags: [dspark]\npipeline_tag: text-generation\n"


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _laughs(indent: str, levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: `levels` nested aliases, each repeating the previous `width` times."""
    lines = [f"{indent}a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


#: Where a bomb hides in card.yaml: the top level, front matter (any keys), a mapping that takes any keys.
CARD_BOMBS = {
    "top_level": "name: T\nfront_matter: {license: mit}\n" + _laughs(""),
    "front_matter": "name: T\nfront_matter:\n  license: mit\n" + _laughs("  "),
    "results_harness": "name: T\nfront_matter: {license: mit}\nresults:\n  harness:\n" + _laughs("    "),
    "self_alias": "name: T\nfront_matter: {license: mit}\nresults:\n  harness:\n    loop: &x [*x, *x]\n",
    "wide_not_deep": "name: T\nfront_matter: {license: mit}\nresults:\n  harness:\n" + _laughs("    ", 3, 60),
}


@pytest.mark.parametrize("member", sorted(CARD_BOMBS))
def test_card_refuses_an_alias_bomb_at_once(tiny, tmp_path, member):
    meta = tmp_path / "card.yaml"
    meta.write_text(CARD_BOMBS[member])
    out = tmp_path / "README.md"
    result = run("card", tiny, "--meta", meta, "-o", out)
    assert result.exit_code == 2, result.output
    assert "alias" in result.stderr and str(meta) in result.stderr and len(result.stderr.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("member", ["front_matter", "self_alias"])
def test_card_lint_uses_the_same_guard(tmp_path, member):
    body = _laughs("") if member == "front_matter" else "loop: &x [*x]\n"
    card = tmp_path / "README.md"
    card.write_text(f"---\n{FRONT}{body}---\n# T\n")
    result = run("card", "lint", card, "--json")
    assert result.exit_code == 1
    assert "FRONT_MATTER_INVALID_YAML" in {f["code"] for f in json.loads(result.stdout)["findings"]}


def test_anchors_within_the_limit_still_load(tiny, tmp_path):
    """The twin: aliases are YAML, and a card source may use them."""
    text = ("name: T\nfront_matter: {license: mit}\nresults:\n  harness:\n    shared: &s {engine: vllm}\n"
            "    again: *s\n" + _laughs("    ", 2, 9))
    assert load_yaml(text)["results"]["harness"]["again"] == {"engine": "vllm"}
    meta = tmp_path / "card.yaml"
    meta.write_text(text)
    assert run("card", tiny, "--meta", meta, "-o", tmp_path / "README.md").exit_code == 0
    assert MAX_YAML_VALUES > 9 ** 3


#: A value of 3 MB: megabytes to print, yet a config.json that holds it stays under `MAX_CONFIG_BYTES` (4 MiB, read
#: whole; a larger one is `FILE_TOO_LARGE`).
HUGE = 3_000_000


def _reference(tmp_path: Path, **changes) -> Path:
    return write_checkpoint(tmp_path / "ref", config=tiny_config(**changes))


@pytest.mark.parametrize("member", ["ref_value", "ref_extra_key", "draft_value"])
def test_drop_in_shortens_a_huge_config_value(tmp_path, member):
    huge = "x" * HUGE
    if member == "ref_value":
        ref, draft = _reference(tmp_path, model_type=huge), write_checkpoint(tmp_path / "draft")
    elif member == "ref_extra_key":
        ref, draft = _reference(tmp_path, notes=huge), write_checkpoint(tmp_path / "draft")
    else:
        ref = _reference(tmp_path)
        draft = write_checkpoint(tmp_path / "draft", config=tiny_config(mask_token_id=huge))
    for args in (("verify", draft, "--drop-in", ref), ("verify", draft, "--drop-in", ref, "--json")):
        result = run(*args)
        assert result.exit_code == 1
        assert len(result.output) < 100_000, len(result.output)
        assert "xxxxxxxx..." in result.output


def test_drop_in_prints_a_short_value_whole(tmp_path):
    """The twin: a value of ordinary length is quoted in full."""
    ref = _reference(tmp_path, markov_rank=7)
    result = run("verify", write_checkpoint(tmp_path / "draft"), "--drop-in", ref, "--json")
    messages = [f["message"] for f in json.loads(result.stdout)["findings"] if f["code"] == "DROPIN_CONFIG_VALUE"]
    assert any("has 7;" in m for m in messages) and not any("..." in m for m in messages)


def test_a_huge_value_in_the_draft_config_is_shortened_by_verify(tmp_path):
    draft = write_checkpoint(tmp_path / "draft", config=tiny_config(markov_head_type="y" * HUGE))
    result = run("verify", draft)
    assert result.exit_code == 1 and len(result.output) < 100_000 and "yyyy..." in result.output


def test_the_front_matter_yaml_reader_is_the_guarded_one():
    with pytest.raises(yaml.YAMLError):
        load_yaml(_laughs(""))


@pytest.mark.parametrize("repo", ["org/" + "a" * 200, "org/" + "a" * 97, "o" * 97 + "/name", "org/a--b", "org/a.git"])
def test_package_refuses_a_repo_name_the_hub_refuses(tmp_path, repo):
    result = run("package", write_checkpoint(tmp_path / "c"), "--repo", repo, "-o", tmp_path / "p")
    assert result.exit_code == 2 and "--repo" in result.stderr and "not a Hub repository id" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "p").exists()


@pytest.mark.parametrize("repo", ["org/" + "a" * 96, "o" * 96 + "/n", "org/tiny.v2_draft-1"])
def test_package_takes_a_repo_name_the_hub_takes(tmp_path, repo):
    result = run("package", write_checkpoint(tmp_path / "c"), "--repo", repo, "-o", tmp_path / "p", "-q")
    assert result.exit_code == 0, result.output
