"""`modeling.speculators_dspark` against the outputs speculators' own training forward recorded.

`tests/fixtures/specdec/library_forward.safetensors` holds, per DSpark checkpoint, seeded random
taps and token ids, the anchors the library drew, and the Markov-corrected logits and confidence
logits `DSparkDraftModel.forward` handed to its loss (`make_specdec_fixtures.py`). Nothing here
imports speculators.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dspark_hub.errors import UsageError
from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark, read_tensors
from tests.spec_fixtures import ROOT as SPECULATORS_FIXTURES

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"
MANIFEST = json.loads((SPECDEC / "MANIFEST.json").read_text())
RECORDED = load_file(str(SPECDEC / "library_forward.safetensors"))
VARIANTS = MANIFEST["library_forward"]["variants"]


def _draft(name: str, **options) -> SpeculatorsDSpark:
    folder, target = ((SPECDEC / "dspark", SPECDEC / "target") if name == "trained"
                      else (SPECULATORS_FIXTURES / name, SPECULATORS_FIXTURES / "verifier-qwen3-tiny"))
    weights = read_tensors(target)
    return SpeculatorsDSpark.from_folder(folder, weights["model.embed_tokens.weight"], weights["lm_head.weight"],
                                         **options)


def test_every_recorded_variant_is_a_fixture():
    assert len(VARIANTS) == 13 and VARIANTS[0] == "trained"
    assert {"dspark-gated-markov", "dspark-rnn-markov", "dspark-pruned-vocab", "dspark-bonus-anchor"} <= set(VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_forward_equals_the_librarys_training_forward(name):
    draft = _draft(name)
    taps, ids = RECORDED[f"{name}.aux"], RECORDED[f"{name}.input_ids"]
    anchors = RECORDED[f"{name}.anchors"].tolist()
    assert len(anchors) == MANIFEST["library_forward"]["anchors"]
    for j, p in enumerate(anchors):
        logits, confidence = draft.teacher_forced(taps, ids, p)
        torch.testing.assert_close(logits, RECORDED[f"{name}.logits"][j], atol=2e-5, rtol=1e-5)
        if f"{name}.confidence" in RECORDED:
            torch.testing.assert_close(confidence, RECORDED[f"{name}.confidence"][j], atol=2e-5, rtol=1e-5)
        else:
            assert confidence is None


def test_dropping_the_markov_head_changes_the_logits():
    """The control the parity test leans on: without the head the forward is measurably another one."""
    name = "trained"
    taps, ids, p = RECORDED[f"{name}.aux"], RECORDED[f"{name}.input_ids"], int(RECORDED[f"{name}.anchors"][0])
    logits, _ = _draft(name, markov=False).teacher_forced(taps, ids, p)
    assert (logits - RECORDED[f"{name}.logits"][0]).abs().max() > 0.1


def test_proposals_chain_the_markov_head_on_the_drafts_own_tokens():
    draft = _draft("trained")
    taps, ids = RECORDED["trained.aux"], RECORDED["trained.input_ids"]
    kv = draft.context_kv(draft.context(taps))
    p = 12
    drafts = draft.propose(kv, int(ids[p]), p, 4)
    # Teacher-forcing the drafts themselves as predecessors reproduces the chain slot by slot.
    forced = ids.clone()
    forced[p + 1:p + 5] = torch.tensor(drafts)
    logits, _ = draft.teacher_forced(taps, forced, p)
    assert logits.argmax(-1).tolist() == drafts


def test_only_a_speculators_dspark_is_accepted():
    config = json.loads((SPECULATORS_FIXTURES / "dflash" / "config.json").read_text())
    with pytest.raises(UsageError, match="speculators DSpark only"):
        SpeculatorsDSpark(config, {}, torch.zeros(1, 1), torch.zeros(1, 1))


def test_margins_are_each_slots_lead_of_its_top_logit_over_the_second():
    """`propose(margins=...)` (bench/parity_probe.py's near-tie finder) reports the lead of the logit it chose over
    the runner-up, slot by slot, and drafts the same tokens as without it."""
    draft = _draft("trained")
    taps, ids = RECORDED["trained.aux"], RECORDED["trained.input_ids"]
    kv = draft.context_kv(draft.context(taps))
    p, margins = 12, []
    drafts = draft.propose(kv, int(ids[p]), p, 4, margins=margins)
    assert drafts == draft.propose(kv, int(ids[p]), p, 4)
    forced = ids.clone()
    forced[p + 1:p + 5] = torch.tensor(drafts)
    top = draft.teacher_forced(taps, forced, p)[0].topk(2, dim=-1).values
    torch.testing.assert_close(torch.tensor(margins), top[:, 0] - top[:, 1], atol=1e-5, rtol=1e-5)
    assert all(m > 0 for m in margins)


def test_a_bfloat16_stored_draft_is_computed_in_float32_from_its_exact_values():
    """`finetune --dtype bfloat16` saves BF16 weights (config dtype bfloat16); vLLM runs a draft in its target's
    dtype (vllm/config/speculative.py, `dtype=self.target_model_config.dtype`), float32 here, and so does the
    simulation: the BF16 file gives exactly the logits of its values stored as float32. The twin: computing in
    bfloat16 gives other logits, so the check sees the compute dtype."""
    folder = SPECDEC / "dspark"
    config = {**json.loads((folder / "config.json").read_text()), "dtype": "bfloat16"}
    stored = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in read_tensors(folder).items()}
    as_f32 = {name: t.float() if t.is_floating_point() else t for name, t in stored.items()}
    weights = read_tensors(SPECDEC / "target")
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    taps, ids, p = RECORDED["trained.aux"], RECORDED["trained.input_ids"], int(RECORDED["trained.anchors"][0])
    from_bf16 = SpeculatorsDSpark(config, stored, embed, head).teacher_forced(taps, ids, p)[0]
    assert torch.equal(from_bf16, SpeculatorsDSpark(config, as_f32, embed, head).teacher_forced(taps, ids, p)[0])
    in_bf16 = SpeculatorsDSpark(config, stored, embed, head, dtype=torch.bfloat16).teacher_forced(taps, ids, p)[0]
    assert not torch.equal(from_bf16, in_bf16.float())
