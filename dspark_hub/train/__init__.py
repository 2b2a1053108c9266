"""Training drop-in weights: teacher data, the DSpark objective, the trainer, and acceptance.

- `teacher`: loading a teacher and capturing its hidden states at the draft's taps.
- `engines`: the teacher-engine registry (`transformers`, `vllm`) and its options;
  `vllm_engine`, `vllm_worker`, `vllm_connector`: the vLLM engine, its process, its CPU connector.
- `rollouts`: teacher greedy continuations with their states, in resumable shards.
- `hidden_state_files`: vLLM-extraction and speculators hidden-state files read as rollouts.
- `objective`: anchors, the per-slot losses and the confidence target.
- `config`: `TrainConfig`, the `finetune` options (torch-free: the CLI's defaults come from it), and
  the one dtype spelling.
- `trainer`: `finetune()` on one process or under torchrun, on the rank's device; its parts:
  `draft_step` (the module DDP/FSDP2 wrap), `distributed` (device, process group, wrapping),
  `checkpointer` (training states, rotation, resume), `training_log`, `on_policy` (the rounds).
- `evaluate`: acceptance with vLLM's definitions, simulated (`acceptance`: the counts, the verify
  loop, the drafters; `eval_inputs`: the draft, target and rollouts) or measured by vLLM itself
  (`vllm_eval`, which runs `vllm_eval_worker.py` in vLLM's interpreter).

Imports `verify`, `modeling` and the format core; never `cards`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

# `evaluate` is the submodule (`dspark_hub.train.evaluate.evaluate`): a lazy name equal to a submodule's
# would turn into that module as soon as anything imports it.
__getattr__, __dir__ = lazy_exports(__name__, {
    "TrainConfig": "config", "Trainer": "trainer", "finetune": "trainer", "chunkable_draft_logits": "draft_step",
    "make_rollouts": "rollouts", "EngineOptions": "engines", "open_engine": "engines",
    "open_training_data": "hidden_state_files",
})
__all__ = ["EngineOptions", "TrainConfig", "Trainer", "chunkable_draft_logits", "finetune", "make_rollouts",
           "open_engine", "open_training_data"]

if TYPE_CHECKING:
    from dspark_hub.train.config import TrainConfig
    from dspark_hub.train.draft_step import chunkable_draft_logits
    from dspark_hub.train.engines import EngineOptions, open_engine
    from dspark_hub.train.hidden_state_files import open_training_data
    from dspark_hub.train.rollouts import make_rollouts
    from dspark_hub.train.trainer import Trainer, finetune
