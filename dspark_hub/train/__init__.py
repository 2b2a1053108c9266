"""Training drop-in weights: teacher data, the DSpark objective, the trainer, and acceptance.

- `teacher`: loading a teacher and capturing its hidden states at the draft's taps.
- `rollouts`: teacher greedy continuations with their states, in resumable shards.
- `objective`: anchors, the per-slot losses and the confidence target.
- `trainer`: `finetune()` on one process or under torchrun (DDP / FSDP2).
- `evaluate`: acceptance with vLLM's definitions, simulated (next to a prompt-lookup drafter) or
  measured by vLLM itself (`vllm_eval`, which runs `vllm_eval_worker.py` in vLLM's interpreter).

Imports `verify`, `modeling` and the format core; never `cards`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

# `evaluate` is the submodule (`dspark_hub.train.evaluate.evaluate`): a lazy name equal to a submodule's
# would turn into that module as soon as anything imports it.
__getattr__, __dir__ = lazy_exports(__name__, {
    "TrainConfig": "trainer", "Trainer": "trainer", "finetune": "trainer", "chunkable_draft_logits": "trainer",
    "make_rollouts": "rollouts",
})
__all__ = ["TrainConfig", "Trainer", "chunkable_draft_logits", "finetune", "make_rollouts"]

if TYPE_CHECKING:
    from dspark_hub.train.rollouts import make_rollouts
    from dspark_hub.train.trainer import TrainConfig, Trainer, chunkable_draft_logits, finetune
