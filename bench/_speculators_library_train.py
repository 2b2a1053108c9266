"""speculators 0.9.0's own DSpark training step on a dspark-hub rollouts folder (run in the library's venv).

Run by bench/real_speculators_quality.py as
    PYTHONPATH=<clone> $(bash .ci/venv-speculators.sh) bench/_speculators_library_train.py '<json settings>'
Settings: base, data, out, steps, batch_size, lr, warmup, min_lr_ratio, clip, max_anchors, loss, gamma, seed.

The model, its forward and its loss are the library's (`DSparkDraftModel.from_pretrained`, its training
`forward`, which draws its own random anchors with `select_anchors`); the optimizer and schedule are
what the library's Trainer builds for one process (AdamW; warmup then cosine), with the numbers
`dspark-hub finetune` gets: betas (0.9, 0.95), no weight decay, linear warmup then cosine to
`min_lr_ratio`, gradient-norm clipping. The library's `speculators.train` Trainer itself is not used:
it moves the model to `local_rank` (a CUDA device) and reads the library's own data files.

Data: the same batches as `finetune` (`trainer.batch_indices`, same seed), packed into one row the way
the library packs a batch (`finetune_speculators.packed_row`: document ids, per-document positions).
Rollouts hold the target's final states AFTER its final norm, so the library's `verifier_norm` (applied
to `verifier_last_hidden_states`) is replaced by the identity: the targets are the same logits.
Writes `out` with the library's `save_pretrained` and `out/library_training_log.jsonl`.
"""

from __future__ import annotations

import json
import sys
import time


def main(settings: dict) -> None:
    import torch
    from speculators.config import SpeculatorModelConfig
    from speculators.models.dspark.core import DSparkDraftModel

    from dspark_hub.train.data.rollouts import RolloutData
    from dspark_hub.train.finetuning.finetune_speculators import packed_row
    from dspark_hub.train.finetuning.objective import cosine_lr
    from dspark_hub.train.finetuning.trainer import batch_indices

    config = SpeculatorModelConfig.from_pretrained(settings["base"])
    config.transformer_layer_config._attn_implementation = "eager"
    model = DSparkDraftModel.from_pretrained(settings["base"], config=config, dtype=torch.float32)
    model.verifier_norm = torch.nn.Identity()          # rollouts store the final states already normed
    kwargs, _ = DSparkDraftModel.get_trainer_kwargs(loss_fn=settings["loss"], loss_implementation="eager",
                                                    max_anchors=settings["max_anchors"],
                                                    dflash_decay_gamma=settings["gamma"])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.0)
    steps = settings["steps"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(
        s, total=steps, warmup=settings["warmup"], min_ratio=settings["min_lr_ratio"]))
    data = RolloutData(settings["data"])
    torch.manual_seed(settings["seed"])                 # the library's own anchor draws
    model.train()
    log, tokens, started = [], 0, time.perf_counter()
    for step in range(steps):
        row = packed_row([data[i] for i in batch_indices(len(data), settings["batch_size"], step, settings["seed"])])
        _, loss, _ = model(hidden_states=row.taps[None].float(), input_ids=row.input_ids[None],
                           loss_mask=row.loss_mask[None], verifier_last_hidden_states=row.last_hidden[None].float(),
                           document_ids=row.document_ids[None], position_ids=row.positions[None], **kwargs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings["clip"])
        optimizer.step()
        scheduler.step()
        tokens += int(row.loss_mask.sum())
        log.append({"step": step + 1, "loss": float(loss.detach()), "tokens": int(row.loss_mask.sum())})
    seconds = time.perf_counter() - started
    model.eval()
    model.save_pretrained(settings["out"])
    with open(f"{settings['out']}/library_training_log.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(entry) + "\n" for entry in log)
    print(json.dumps({"steps": steps, "tokens": tokens, "train_seconds": seconds,
                      "last_loss": log[-1]["loss"] if log else None}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
