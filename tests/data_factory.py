"""Tiny rollouts folders built in code (written with the safetensors library, not with our writer), for tests of
what training and eval accept as data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from dspark_hub import schemas


def rollouts_manifest(config: Mapping[str, Any], shards: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A complete manifest of a rollouts folder recorded for the draft `config` (taps, hidden size, vocabulary)."""
    return {"schema": schemas.ROLLOUTS_DATA, "teacher": {"label": "teacher (sha256 config.json 0123)"},
            "chat_template_sha256": None, "shards": shards or [],
            "settings": {"teacher": "teacher", "prompts_sha256": "0" * 64, "max_new_tokens": 4,
                         "target_layer_ids": list(config["target_layer_ids"]),
                         "target_hidden_size": config["target_hidden_size"],
                         "target_num_hidden_layers": config["target_num_hidden_layers"],
                         "vocab_size": config["vocab_size"]}}


def write_rollouts(folder: Path, config: Mapping[str, Any], *, sequences: int = 2, length: int = 6,
                   prompt_length: int = 2, seed: int = 0) -> Path:
    """A rollouts folder of one shard holding `sequences` random sequences of `length` tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    hidden, taps = config["target_hidden_size"], len(config["target_layer_ids"])
    tensors, entries = {}, []
    for i in range(sequences):
        mask = torch.zeros(length, dtype=torch.uint8)
        mask[prompt_length:] = 1
        tensors.update({f"{i}.input_ids": torch.randint(0, config["vocab_size"], (length,), generator=g),
                        f"{i}.loss_mask": mask,
                        f"{i}.aux_hidden_states": torch.randn(length, taps * hidden, generator=g).bfloat16(),
                        f"{i}.final_hidden_states": torch.randn(length, hidden, generator=g).bfloat16()})
        entries.append({"prompt_index": i, "dataset": "d", "length": length, "prompt_length": prompt_length,
                        "supervised_tokens": length - prompt_length, "greedy_agreement": [0, 0]})
    save_file(tensors, str(folder / "shard-00000.safetensors"), metadata={"schema": schemas.ROLLOUTS_DATA})
    manifest = rollouts_manifest(config, [{"file": "shard-00000.safetensors", "sequences": entries}])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder
