"""Which trainer `finetune` runs for a base: the train layer's extension of the format registry.

`finetune` is the command's entry point. A format whose `DraftFormat.trainable` is set trains in
`train.trainer.Trainer` (the k3_dspark model). Any other format trains in the trainer this table
names, keyed by `DraftFormat.name` (the registry's rule for tables outside `format/`): a speculators DSpark in
`train.finetune_speculators`, with the library's own model and objective. A base of a draft family
no trainer takes is refused in one line before anything is read but its config.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.registry import FORMATS, SPECULATORS

if TYPE_CHECKING:
    from dspark_hub.progress import Progress
    from dspark_hub.train.finetuning.trainer import TrainConfig, TrainResult

Finetuner = Callable[["TrainConfig", "Progress | None"], "TrainResult"]


def _speculators(config: TrainConfig, progress: Progress | None) -> TrainResult:
    from dspark_hub.train.finetuning.finetune_speculators import finetune_speculators  # torch: only a run pays for it

    return finetune_speculators(config, progress)


#: Format name -> its own trainer, for the formats `Trainer` does not build (`trainable` is False).
FINETUNERS: dict[str, Finetuner] = {SPECULATORS.name: _speculators}


def finetuner_for(base: str | os.PathLike[str]) -> Finetuner | None:
    """The trainer of `base`'s format when it is not `Trainer` (None: `Trainer`, which reports a bad base).

    Raises:
        UsageError: the base is of a draft family no trainer takes (an EAGLE-3, a DFlash, ...).
    """
    from dspark_hub.verify.family import detect

    try:
        config: Any = load_json_object(Path(base) / contract.CONFIG_NAME)
    except (CheckpointFormatError, CheckpointNotFoundError, OSError):
        return None             # `Trainer` names the missing or broken config.json
    fmt, found = detect(config)
    if fmt is None:
        if found.family == "unknown":
            return None
        trainable = ", ".join([f.title for f in FORMATS.values() if f.trainable or f.name in FINETUNERS])
        raise UsageError(f"{base}: is {found.spec.title}; finetune trains {trainable} drafts", param="base")
    return None if fmt.trainable else FINETUNERS.get(fmt.name)


def _k3_dspark(config: TrainConfig, progress: Progress | None) -> TrainResult:
    # torch: only a run pays for it
    from dspark_hub.train.finetuning.distributed import leaving_process_group
    from dspark_hub.train.finetuning.trainer import Trainer

    with leaving_process_group():     # the Trainer joins torchrun's group; the run leaves it
        return Trainer(config, progress).fit()


def finetune(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Fine-tune `config.base` (`dspark-hub finetune`, `dspark_hub.train.finetune`) in the trainer of its format:
    a k3_dspark base in `trainer.Trainer`, a speculators DSpark in `finetune_speculators`; returns what the run
    wrote and measured.

    Raises:
        UsageError: the base is of a draft family no trainer takes; and whatever that trainer raises.
    """
    config.refuse_own_inputs()
    run = finetuner_for(config.base) or _k3_dspark
    return run(config, progress)
