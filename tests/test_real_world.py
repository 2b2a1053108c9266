"""The real-model world (docs/real-model.md): the prompt set, and the tests that run on SmolLM2 when
`.ci/real-target.sh` has cached it (marked `real`; skipped otherwise)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "prompts"
KINDS = {"chat", "code", "lists", "arithmetic", "explanation"}
WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"
WORLD_READY = (WORLD / ".dspark-hub-ready-1").is_file()
needs_world = pytest.mark.skipif(
    not WORLD_READY, reason="the SmolLM2 world is not cached; build it: .ci/real-target.sh")


def _prompt_texts(split: str) -> list[tuple[str, str]]:
    lines = (PROMPTS / f"smollm2-{split}.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["dataset"], r["messages"][-1]["content"]) for r in records]


@pytest.mark.parametrize("split, count", [("train", 200), ("heldout", 40)])
def test_prompt_split_has_every_kind_in_equal_shares_and_no_repeats(split, count):
    prompts = _prompt_texts(split)
    assert len(prompts) == count
    assert {kind for kind, _ in prompts} == KINDS
    assert all(sum(k == kind for k, _ in prompts) == count // len(KINDS) for kind in KINDS)
    assert len({text for _, text in prompts}) == count


def test_heldout_prompts_are_not_in_train():
    train = {text for _, text in _prompt_texts("train")}
    assert not train & {text for _, text in _prompt_texts("heldout")}
