"""The fine-tuning wing: drop-in weights trained on the target's states.

- `finetuners`: `finetune`, the run in the trainer of the base's format.
- `config`: `TrainConfig`, the `finetune` options (torch-free: the CLI's defaults come from it).
- `trainer` (k3_dspark): the loop; its parts `draft_step` (the module DDP/FSDP2 wrap),
  `distributed`, `checkpointer` (training states, rotation, resume), `training_log`, `plan` (a
  step's cost), `on_policy` (the rounds), `objective` (anchors, per-slot losses).
- `finetune_speculators`, `objective_speculators`: a speculators DSpark, with the library's objective.
- `threads`: the measured CPU thread default.

The top wing: imports target, data and evaluation (held-out acceptance in the log).
"""
