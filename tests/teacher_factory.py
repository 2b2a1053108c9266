"""A tiny real teacher for the training tests: a Llama trained briefly on a synthetic "word" language.

A random teacher's greedy continuations loop and carry nothing to learn beyond the loop, so the
teacher here first learns a language with structure a draft can pick up from the teacher's states:
sentences are chains of words (fixed token strings over a small shared alphabet, so a token alone
does not say what comes next), each word followed by a preferred successor most of the time.
Shapes match `contract.TINY_CONFIG`'s target: hidden 64, 6 layers, vocabulary 512.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from dspark_hub.format import contract

ALPHABET = list(range(10, 70))     # far from the draft's mask id (509) and pad/eos ids


def word_language(seed: int = 0, words: int = 40) -> tuple[list[list[int]], list[list[int]]]:
    """(word token strings, per-word successor preference list)."""
    rng = random.Random(seed)
    vocab = [[rng.choice(ALPHABET) for _ in range(rng.randint(2, 4))] for _ in range(words)]
    successors = [rng.sample(range(words), 3) for _ in range(words)]
    return vocab, successors


def sentence(rng: random.Random, vocab: list[list[int]], successors: list[list[int]], length: int) -> list[int]:
    word = rng.randrange(len(vocab))
    out: list[int] = []
    while len(out) < length:
        out.extend(vocab[word])
        roll = rng.random()
        word = successors[word][0] if roll < 0.7 else successors[word][1] if roll < 0.9 else rng.randrange(len(vocab))
    return out[:length]


def teacher_config(**overrides: object):
    from transformers import LlamaConfig

    tiny = contract.TINY_CONFIG
    values = dict(vocab_size=tiny["vocab_size"], hidden_size=tiny["target_hidden_size"], intermediate_size=128,
                  num_hidden_layers=tiny["target_num_hidden_layers"], num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=None,
                  pad_token_id=0)
    values.update(overrides)
    return LlamaConfig(**values)


def build_teacher(folder: Path, *, seed: int = 0, steps: int = 150, **overrides: object) -> Path:
    """Train a tiny Llama on the word language (fixed seed) and save it to `folder`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(teacher_config(**overrides))
    vocab, successors = word_language(seed)
    rng = random.Random(seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = torch.tensor([sentence(rng, vocab, successors, 48) for _ in range(16)])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(str(folder))
    return folder


def write_prompts(path: Path, *, count: int, seed: int, length: int = 12, dataset: str | None = None,
                  language_seed: int = 0) -> Path:
    """Raw input_ids prompts drawn from the word language (seed picks the stream)."""
    vocab, successors = word_language(language_seed)
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(count):
            record = {"input_ids": sentence(rng, vocab, successors, length)}
            if dataset:
                record["dataset"] = dataset
            handle.write(json.dumps(record) + "\n")
    return path


def write_draft_base(folder: Path, teacher: Path, *, seed: int = 0) -> Path:
    """A random tiny k3_dspark draft whose frozen embed_tokens is the teacher's embedding (bf16)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .modeling_factory import write_tiny_checkpoint

    write_tiny_checkpoint(folder, seed=seed)
    with safe_open(str(teacher / "model.safetensors"), framework="pt") as handle:
        embedding = handle.get_tensor("model.embed_tokens.weight")
    with safe_open(str(folder / contract.WEIGHTS_NAME), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
        metadata = handle.metadata()
    tensors["embed_tokens.weight"] = embedding.to(torch.bfloat16)
    save_file(tensors, str(folder / contract.WEIGHTS_NAME), metadata=metadata)
    return folder
