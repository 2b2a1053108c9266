"""Training drop-in weights: the target's data, the DSpark objective, the trainers, and acceptance.

Four wings, each importing only the ones above it in this list:

- `target`: the target opened once (`target.target`), the engines that run it (`transformers`, `vllm`),
  and a toy target.
- `data`: rollouts folders, vLLM / speculators hidden-state files, a draft config's taps.
- `evaluation`: `eval`: acceptance with vLLM's definitions, simulated or measured by vLLM.
- `finetuning`: `finetune`, dispatched by the base's format to the k3_dspark trainer or the
  speculators one; the options, the loop and its parts, on-policy rounds.

Imports `verify`, `ops`, `modeling`, `vllm` and the format core; never `cards`, `hub` or `cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_hub._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "TrainConfig": "finetuning.config", "Trainer": "finetuning.trainer", "finetune": "finetuning.finetuners",
    "chunkable_draft_logits": "finetuning.draft_step", "make_rollouts": "data.rollouts",
    "EngineOptions": "target.engines", "open_engine": "target.engines",
    "open_training_data": "data.hidden_state_files",
})
__all__ = ["EngineOptions", "TrainConfig", "Trainer", "chunkable_draft_logits", "finetune", "make_rollouts",
           "open_engine", "open_training_data"]

if TYPE_CHECKING:
    from dspark_hub.train.data.hidden_state_files import open_training_data
    from dspark_hub.train.data.rollouts import make_rollouts
    from dspark_hub.train.finetuning.config import TrainConfig
    from dspark_hub.train.finetuning.draft_step import chunkable_draft_logits
    from dspark_hub.train.finetuning.finetuners import finetune
    from dspark_hub.train.finetuning.trainer import Trainer
    from dspark_hub.train.target.engines import EngineOptions, open_engine
