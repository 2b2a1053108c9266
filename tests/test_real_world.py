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


@pytest.mark.real
@needs_world
@pytest.mark.parametrize("fmt, extra", [("k3_dspark", ()), ("speculators", ("--draft-vocab", "4096"))])
def test_init_target_sizes_a_draft_for_smollm2_that_pairs(tmp_path, fmt, extra):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli
    from dspark_hub.verify.checks import verify

    target = WORLD / "bf16"
    args = ["init", str(tmp_path / "d"), "--target", str(target), "--format", fmt, "--json", *extra]
    if extra:
        args += ["--vocab-from", str(PROMPTS / "smollm2-train.jsonl")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["target_layer_ids"] == ([1, 7, 14, 22, 27] if fmt == "k3_dspark" else [7, 14, 22, 27, 28])
    assert doc["mask_token"]["id"] == 16     # <empty_output>: special, not bos/eos/pad/unk, not in the template
    report = verify(tmp_path / "d", target=target)
    assert report.ok, [f.to_dict() for f in report.findings]
    if fmt == "k3_dspark":
        assert report.sections["pairing"]["embedding"]["verdict"] == "bit-identical"


@pytest.mark.real
@pytest.mark.slow
@needs_world
def test_the_ci_sized_real_recipe_runs_and_training_beats_the_untrained_draft(real_drafts):
    """bench/real_recipe.py --ci (the session's one build, tests/real_drafts.py): both formats through init --target,
    rollouts, finetune, eval, verify and card."""
    run = real_drafts["k3_dspark"].draft.parent
    summary = json.loads((run / "recipe.json").read_text())
    per_draft = ["finetune", "eval", "verify", "card", "card lint"]
    assert [s["step"] for s in summary["steps"]] == [
        "init k3", "rollouts train", "rollouts held-out", "init spec",
        *(f"{step} k3" for step in per_draft), *(f"{step} spec" for step in per_draft)]
    assert all(s["exit"] == 0 and s["peak_rss_mib"] > 0 for s in summary["steps"])
    assert set(summary["drafts"]) == {"k3_dspark", "speculators"}
    for draft in summary["drafts"].values():
        simulated = draft["simulated"]
        assert simulated["trained"]["acceptance_length"] > simulated["untrained base"]["acceptance_length"]
        assert set(draft["by_dataset"]) <= {"chat", "code", "lists", "arithmetic", "explanation"}
    card = (run / "card-k3.md").read_text()
    assert "simulated" in card
