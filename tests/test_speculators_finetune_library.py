"""`finetune --base B`'s loop against `speculators` 0.9.0's model on the same rows: the same loss every step.

Runs in the library's virtualenv (`$(bash .ci/venv-speculators.sh) -m pytest -m speculators`), like
`test_speculators_objective.py`, whose helpers build the library's model. Our run reads vLLM-layout
hidden-state files (the taps plus the last layer's pre-norm output) through the command's own
data path, packs each step's sequences, draws the step's seeded anchors and takes AdamW steps
under the cosine schedule with clipping. The library's `DSparkDraftModel` gets the same packed row
(with the pre-norm final states it norms itself) and the same anchors, and the same optimizer,
schedule and clipping: the two loss curves agree to 1e-3 at every step, and each trained tensor's update
agrees to 1%. The written output loads in the library (`DSparkDraftModel.from_pretrained`) with our weights.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from dspark_hub.train.data.hidden_state_files import write_hidden_state_file
from dspark_hub.train.finetuning import objective
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.finetuning.draft_step import batch_indices
from dspark_hub.train.finetuning.finetune_speculators import SpeculatorsFinetune, packed_row
from tests.spec_fixtures import VERIFIER, fixture
from tests.test_speculators_objective import _config, _library, _library_step  # skips without speculators

pytestmark = pytest.mark.speculators


def _files(folder, count: int = 6) -> None:
    """Random states in vLLM's layout at B's aux ids [1, 3, 5] plus the last layer (6)."""
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        length = int(torch.randint(16, 24, (1,), generator=generator))
        write_hidden_state_file(folder / f"r{i}.safetensors", torch.randn(length, 4, 64, generator=generator),
                                torch.randint(0, 250, (length,), generator=generator))


@pytest.mark.parametrize("name", ["dspark", "dspark-bonus-anchor", "dspark-pruned-vocab"])
def test_our_finetune_loop_follows_the_librarys_model_step_by_step(name, tmp_path, monkeypatch):
    _files(tmp_path / "data")
    config = TrainConfig(base=str(fixture(name)), out=str(tmp_path / "out"), data=str(tmp_path / "data"),
                         target=str(VERIFIER), steps=12, lr=3e-3, warmup=2, batch_size=3, max_anchors=12,
                         loss={"kl_div": 1.0}, weight_decay=0.01, betas=(0.85, 0.99))   # not the default betas
    ours = SpeculatorsFinetune(config)
    library = _library(name, _config(name, window=None), monkeypatch)
    params = [p for p in library.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: objective.cosine_lr(
        s, total=config.steps, warmup=config.warmup, min_ratio=config.min_lr_ratio))
    for step in range(config.steps):
        indices = batch_indices(len(ours.data), config.batch_size, step, config.seed)
        row = packed_row([ours.data[i] for i in indices])
        row.taps = row.taps.float()
        row.last_hidden = torch.cat([load_file(str(ours.data.files[i][1].path))["hidden_states"][:, -1]
                                     for i in indices])                     # before the norm: the library norms
        anchors = ours.anchors(row, len(indices))
        theirs, _ = _library_step(library, row, anchors, ours.objective, monkeypatch)
        optimizer.zero_grad()
        theirs.backward()
        torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimizer.step()
        scheduler.step()
        entry = ours.train_step()
        ours.step += 1
        torch.testing.assert_close(torch.tensor(entry["loss"]), theirs.detach(), rtol=1e-3, atol=1e-6,
                                   msg=lambda m, step=step: f"loss at step {step + 1}: {m}")
    library_state = dict(library.named_parameters())
    initial = load_file(str(fixture(name) / "model.safetensors"))
    for tensor_name, tensor in ours.model.named_trainable().items():
        # Adam divides by each element's gradient scale, so float rounding in a near-zero gradient can move
        # one element by a step: compare each tensor's whole update instead, to 1% of its size.
        moved = (library_state[tensor_name].detach() - initial[tensor_name].float()).norm()
        apart = (tensor.detach() - library_state[tensor_name].detach()).norm()
        assert apart <= 1e-2 * moved, f"{tensor_name}: {float(apart):.3g} apart after updates of {float(moved):.3g}"
    # The drop-in output loads in the library as B does, holding our weights in B's dtype.
    ours.write_output()
    from speculators.models.dspark.core import DSparkDraftModel

    reloaded = dict(DSparkDraftModel.from_pretrained(tmp_path / "out", dtype=torch.float32).named_parameters())
    for tensor_name, tensor in ours.model.named_trainable().items():
        assert torch.equal(reloaded[tensor_name].detach(), tensor.detach().to(torch.bfloat16).float()), tensor_name
