"""`train.objective_speculators` against `speculators` 0.9.0 itself: loss terms, gradients, a 50-step curve.

Runs in the library's virtualenv (`$(bash .ci/venv-speculators.sh) -m pytest -m speculators`); elsewhere
the tests skip in one line, and `DSPARK_REQUIRE_SPECULATORS=1` turns that skip into a failure (CI sets it).
Both sides get the same weights (a checked-in fixture the library saved, in float32), the same packed
row (two documents, a prompt part outside the loss mask) and the same anchors: the library's random
`select_anchors` is replaced by one that returns ours, so the comparison is exact up to float32 rounding.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests.spec_fixtures import DSPARK, ROOT, VERIFIER

pytestmark = pytest.mark.speculators
MISSING = importlib.util.find_spec("speculators") is None
if MISSING and os.environ.get("DSPARK_REQUIRE_SPECULATORS", "") not in ("", "0"):
    raise RuntimeError("DSPARK_REQUIRE_SPECULATORS is set but speculators is not importable here; "
                       "run under $(bash .ci/venv-speculators.sh)")
if MISSING:
    pytest.skip("speculators is not importable here; run with $(bash .ci/venv-speculators.sh) -m pytest -m speculators",
                allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from speculators.config import SpeculatorModelConfig  # noqa: E402
from speculators.losses import resolve_loss_config  # noqa: E402
from speculators.models.dflash import core as dflash_core  # noqa: E402
from speculators.models.dspark.core import DSparkDraftModel  # noqa: E402

from dspark_hub.modeling.speculators_dspark import read_tensors  # noqa: E402
from dspark_hub.train.finetuning.objective_speculators import (  # noqa: E402
    Objective,
    PackedRow,
    SpeculatorsDSparkTrainer,
    library_anchors,
)

#: Every DSpark variant speculators 0.9.0 saved for us (attention kinds, Markov heads, confidence, vocabulary).
VARIANTS = [name for name in DSPARK if name != "dspark-sharded"]
LOSSES = {"kl": {"kl_div": 1.0}, "mixed": {"ce": 0.1, "tv": 0.9, "kl_div": 0.5}}


def _config(name: str, window: int | None) -> dict:
    config = json.loads((ROOT / name / "config.json").read_text())
    layer = config["transformer_layer_config"]
    if window is not None and layer.get("sliding_window") is not None:
        layer["sliding_window"] = window          # small enough to bind on the test row
    return config


def _library(name: str, config: dict, monkeypatch) -> DSparkDraftModel:
    monkeypatch.chdir(ROOT)                      # the fixtures name their verifier relative to this folder
    library_config = SpeculatorModelConfig.from_dict(copy.deepcopy(config))
    library_config.transformer_layer_config._attn_implementation = "eager"
    model = DSparkDraftModel.from_pretrained(ROOT / name, config=library_config, dtype=torch.float32)
    model.train()
    return model


def _ours(name: str, config: dict) -> SpeculatorsDSparkTrainer:
    target = read_tensors(VERIFIER)
    tensors = {k: (v.float() if v.is_floating_point() else v) for k, v in read_tensors(ROOT / name).items()}
    return SpeculatorsDSparkTrainer(config, tensors, target["model.embed_tokens.weight"].float(),
                                    target["lm_head.weight"].float(), target["model.norm.weight"].float())


def _row(config: dict, seed: int) -> PackedRow:
    """Two documents of 24 and 20 tokens; the first 6 of each are prompt (outside the loss mask)."""
    generator = torch.Generator().manual_seed(seed)
    hidden = config["transformer_layer_config"]["hidden_size"]
    taps = len(config["aux_hidden_state_layer_ids"])
    lengths = (24, 20)
    n = sum(lengths)
    mask = torch.cat([torch.cat([torch.zeros(6), torch.ones(length - 6)]) for length in lengths])
    return PackedRow(taps=torch.randn(n, taps * hidden, generator=generator),
                     input_ids=torch.randint(0, config["mask_token_id"], (n,), generator=generator),
                     loss_mask=mask, last_hidden=torch.randn(n, hidden, generator=generator),
                     document_ids=torch.cat([torch.full((length,), i) for i, length in enumerate(lengths)]),
                     positions=torch.cat([torch.arange(length) for length in lengths]))


def _library_step(model: DSparkDraftModel, row: PackedRow, anchors: torch.Tensor, objective: Objective, monkeypatch):
    monkeypatch.setattr(dflash_core, "select_anchors",
                        lambda loss_mask, num_anchors, block_size: (anchors.clone(),
                                                                    torch.ones(anchors.numel(), dtype=torch.bool)))
    spec = json.dumps(dict(objective.loss))
    _, loss, metrics = model(
        hidden_states=row.taps[None], input_ids=row.input_ids[None], loss_mask=row.loss_mask[None],
        verifier_last_hidden_states=row.last_hidden[None], document_ids=row.document_ids[None],
        position_ids=row.positions[None], max_anchors=anchors.numel(),
        loss_config=resolve_loss_config(spec, "eager"), tv_loss_fn=resolve_loss_config("tv", "eager")["tv"][0],
        gamma=objective.gamma, confidence_head_alpha=objective.alpha)
    return loss, metrics


def _close(ours: torch.Tensor, theirs: torch.Tensor, rtol: float, what: str) -> None:
    torch.testing.assert_close(ours.detach().float(), theirs.detach().float(), rtol=rtol, atol=rtol * 1e-2,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("name", VARIANTS)
def test_loss_terms_and_gradients_equal_the_librarys(name, loss, monkeypatch):
    config = _config(name, window=5)
    objective = Objective(loss=LOSSES[loss])
    library, ours = _library(name, config, monkeypatch), _ours(name, config)
    row = _row(config, seed=3)
    anchors = library_anchors(row.loss_mask, 9, ours.block_size, torch.Generator().manual_seed(11))

    theirs_loss, metrics = _library_step(library, row, anchors, objective, monkeypatch)
    theirs_loss.backward()
    result = ours.loss(row, anchors, objective)
    result.total.backward()

    _close(result.total, theirs_loss, 1e-5, "total loss")
    if len(objective.loss) > 1:
        for term, value in result.terms.items():
            _close(value, metrics[f"{term}_sum"], 1e-5, term)
    if result.confidence is not None:
        _close(result.confidence, metrics["confidence_loss_sum"], 1e-5, "confidence loss")
    else:
        assert "confidence_loss_sum" not in metrics
    library_grads = {n: p.grad for n, p in library.named_parameters() if p.requires_grad}
    ours_grads = {n: t.grad for n, t in ours.named_trainable().items()}
    assert set(ours_grads) == set(library_grads), "trainable tensors differ from the library's"
    for tensor, grad in library_grads.items():
        _close(ours_grads[tensor], grad, 1e-4, f"gradient of {tensor}")


def test_a_different_anchor_set_gives_a_different_loss(monkeypatch):
    """The control: the equality above is not reached whatever the anchors."""
    config = _config("dspark", window=5)
    ours = _ours("dspark", config)
    row = _row(config, seed=3)
    objective = Objective(loss=LOSSES["kl"])
    first = library_anchors(row.loss_mask, 9, ours.block_size, torch.Generator().manual_seed(11))
    second = library_anchors(row.loss_mask, 9, ours.block_size, torch.Generator().manual_seed(12))
    assert not torch.equal(first, second)
    assert not torch.allclose(ours.loss(row, first, objective).total, ours.loss(row, second, objective).total)


def test_anchors_follow_the_librarys_rule():
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 0, 1, 1, 1], dtype=torch.float32)
    anchors = library_anchors(mask, 100, 3)
    assert anchors.tolist() == [2, 3, 4, 5]          # supervised, and not in the last block_size rows
    assert library_anchors(mask, 2, 3, torch.Generator().manual_seed(0)).numel() == 2


@pytest.mark.parametrize("name", ["dspark", "dspark-bonus-anchor", "dspark-rnn-markov", "dspark-pruned-vocab"])
def test_fifty_steps_follow_the_librarys_curve(name, monkeypatch):
    """Same initial weights, AdamW, cosine-free constant LR, clipping at 1.0: the curves agree to 1e-3 each step."""
    config = _config(name, window=5)
    library, ours = _library(name, config, monkeypatch), _ours(name, config)
    objective = Objective(loss=LOSSES["kl"])
    library_params = [p for p in library.parameters() if p.requires_grad]
    library_opt = torch.optim.AdamW(library_params, lr=3e-3, weight_decay=0.01)
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=3e-3, weight_decay=0.01)
    generator = torch.Generator().manual_seed(5)
    for step in range(50):
        row = _row(config, seed=100 + step)
        anchors = library_anchors(row.loss_mask, 9, ours.block_size, generator)
        theirs, _ = _library_step(library, row, anchors, objective, monkeypatch)
        library_opt.zero_grad()
        theirs.backward()
        torch.nn.utils.clip_grad_norm_(library_params, 1.0)
        library_opt.step()
        result = ours.loss(row, anchors, objective)
        ours_opt.zero_grad()
        result.total.backward()
        torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        ours_opt.step()
        _close(result.total, theirs, 1e-3, f"loss at step {step}")


def test_frozen_tensors_stay_bit_identical_after_training(monkeypatch):
    config = _config("dspark-pruned-vocab", window=None)
    ours = _ours("dspark-pruned-vocab", config)
    before = load_file(str(Path(ROOT / "dspark-pruned-vocab" / "model.safetensors")))
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    row = _row(config, seed=1)
    for _ in range(3):
        optimizer.zero_grad()
        ours.loss(row, library_anchors(row.loss_mask, 9, ours.block_size), Objective(loss={"kl_div": 1.0})
                  ).total.backward()
        optimizer.step()
    state = ours.state()
    for frozen in ("lm_head.weight", "d2t", "t2d"):
        assert torch.equal(state[frozen], before[frozen].to(state[frozen].dtype)), frozen
    assert not torch.equal(state["fc.weight"], before["fc.weight"].float())
