"""`init-teacher`: a tiny random transformers target for toy runs of the training commands.

The training commands need a target: a transformers causal LM whose hidden size, layer count and
vocabulary match the draft's `target_hidden_size`, `target_num_hidden_layers` and `vocab_size`.
`init_teacher` writes one at the `tiny` profile's size (`contract.TINY_CONFIG`'s target: hidden
64, 6 layers, vocabulary 512), or at the size a given draft names, with an offline tokenizer:

- a Llama (`LlamaForCausalLM`, random N(0, 0.02) weights from `seed`), stored in BF16 like the
  draft, untied `lm_head`, `bos`/`eos`/`pad` ids from the draft's config; the `lm_head` rows of
  every special and reserved id are zero, so greedy decoding always picks a byte (a random row
  wins with probability 1 - 2^-256): the target writes text and never stops early;
- a byte-level BPE tokenizer without merges (`tokenizer.json`, one token per UTF-8 byte, so any
  text encodes) plus special tokens: `<unk>`, `<s>`, `</s>`, role markers for a small chat
  template (so `messages` prompts work), the draft's `mask_token_id` as `<|mask|>`, `<pad>`, and
  `<|reserved_N|>` for the ids left;
- with `draft=`, the draft's frozen `embed_tokens.weight` as the target's input embedding, bit
  for bit, so the pair passes `verify --target` (a `k3_dspark` draft must carry a copy of its
  target's embedding).

Nothing is downloaded. A random target's greedy continuations soon repeat themselves, so a
draft trained on them learns little beyond that: the toy runs check the plumbing and the cost,
not the quality.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.writer import atomic_dir, check_writable, refuse_own_inputs
from dspark_hub.progress import Progress, announce_total
from dspark_hub.train.target.target import moved

# torch, transformers, tokenizers and safetensors are imported inside the writers: the CLI imports
# this module for `--help`.

#: Profiles `init_teacher` writes (a Kimi-K3-sized target is not a toy).
TEACHER_PROFILES = ("tiny",)
#: The largest target `init_teacher` writes, in parameters.
MAX_PARAMETERS = 50_000_000
ROLES = ("system", "user", "assistant")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@dataclass(frozen=True)
class TeacherInitResult(Document):
    """What `init_teacher` wrote."""

    SCHEMA = schemas.command("init-teacher")

    path: Path
    profile: str | None           # None when the shapes came from a draft
    draft: str | None
    seed: int
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    parameters: int
    embedding_from_draft: bool


#: The toy target's attention head size unless asked for another (vLLM's CPU attention needs 32 or more).
DEFAULT_HEAD_DIM = 16


def teacher_shapes(draft_config: Mapping[str, Any], head_dim: int | None = None) -> dict[str, Any]:
    """The `LlamaConfig` keywords of a toy target for a draft config (k3_dspark keys).

    `head_dim` (default `DEFAULT_HEAD_DIM`, or the hidden size when that does not divide it) must
    divide the hidden size.

    Raises:
        UsageError: the config lacks a pairing key, a head size that does not divide the hidden
            size, or the target would not be a toy.
    """
    try:
        hidden, layers, vocab = (int(draft_config[k]) for k in ("target_hidden_size", "target_num_hidden_layers",
                                                                 "vocab_size"))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"the draft config has no usable {exc}; pass a k3_dspark checkpoint", param="draft") from None
    if head_dim is None:
        head_dim = DEFAULT_HEAD_DIM if hidden % DEFAULT_HEAD_DIM == 0 else hidden
    elif head_dim <= 0 or hidden % head_dim:
        raise UsageError(f"{head_dim} does not divide the hidden size {hidden}; pass a divisor of it",
                         param="head_dim")
    heads = hidden // head_dim
    intermediate = 2 * hidden
    parameters = 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden) + hidden
    if parameters > MAX_PARAMETERS:
        raise UsageError(f"a target of hidden {hidden:,} x {layers} layers x vocabulary {vocab:,} has about "
                         f"{parameters:,} parameters; toy targets stop at {MAX_PARAMETERS:,}", param="draft")
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
                max_position_embeddings=int(draft_config.get("max_position_embeddings") or 2048),
                tie_word_embeddings=False, bos_token_id=draft_config.get("bos_token_id"),
                eos_token_id=draft_config.get("eos_token_id"), pad_token_id=draft_config.get("pad_token_id"))


def special_tokens(vocab_size: int, config: Mapping[str, Any]) -> dict[int, str]:
    """Id -> special token: `<unk>` 0, `<s>`/`</s>`/`<pad>`/`<|mask|>` at the config's ids, role markers
    right after the 256 byte tokens, `<|reserved_N|>` for the ids left over.

    Raises:
        UsageError: the vocabulary cannot hold the byte tokens and the special tokens.
    """
    named = {"<s>": config.get("bos_token_id"), "</s>": config.get("eos_token_id"),
             "<pad>": config.get("pad_token_id"), "<|mask|>": config.get("mask_token_id")}
    fixed: dict[int, str] = {}
    for token, token_id in named.items():
        if isinstance(token_id, int) and 0 <= token_id < vocab_size and token_id not in fixed:
            fixed[token_id] = token
    if 0 not in fixed:
        fixed[0] = "<unk>"
    roles = [f"<|{role}|>" for role in ROLES]
    free = [i for i in range(vocab_size) if i not in fixed]
    if len(free) < 256 + len(roles):
        raise UsageError(f"a vocabulary of {vocab_size} ids cannot hold 256 byte tokens and {len(fixed) + len(roles)} "
                         "special tokens", param="draft")
    specials = dict(fixed)
    specials.update(zip(free[256:256 + len(roles)], roles, strict=True))
    specials.update((i, f"<|reserved_{i}|>") for i in free[256 + len(roles):])
    return specials


def byte_level_alphabet() -> list[str]:
    """The 256 characters byte-level BPE writes for bytes 0..255, in byte order (GPT-2's `bytes_to_unicode`).

    `tokenizers`' `ByteLevel.alphabet()` holds the same characters in no fixed order, which would give
    every run another byte -> id map.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def build_tokenizer(vocab_size: int, config: Mapping[str, Any]) -> Any:
    """A `PreTrainedTokenizerFast`: byte-level BPE without merges plus `special_tokens` (offline)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = special_tokens(vocab_size, config)
    byte_ids = [i for i in range(vocab_size) if i not in specials][:256]
    vocab = {char: i for char, i in zip(byte_level_alphabet(), byte_ids, strict=True)}
    vocab.update({token: i for i, token in specials.items()})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=specials.get(0, "<unk>")))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for _, token in sorted(specials.items())])
    names = set(specials.values())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token=specials.get(0, "<unk>"),
        bos_token="<s>" if "<s>" in names else None, eos_token="</s>" if "</s>" in names else None,
        pad_token="<pad>" if "<pad>" in names else None, mask_token="<|mask|>" if "<|mask|>" in names else None,
        add_bos_token=False, add_eos_token=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_teacher(dst: str | os.PathLike[str], *, profile: str | None = "tiny",
                 draft: str | os.PathLike[str] | None = None, seed: int = 0, force: bool = False,
                 head_dim: int | None = None, progress: Progress | None = None) -> TeacherInitResult:
    """Write a tiny random Llama target with an offline tokenizer to `dst` (atomically).

    Args:
        dst: output folder.
        profile: `tiny` (the target `init --profile tiny` drafts for); ignored when `draft` is given.
        draft: a k3_dspark checkpoint folder: the target takes its shapes and special-token ids from
            the draft's `config.json` and its input embedding from the draft's `embed_tokens.weight`.
        seed: seeds the random weights.
        force: replace an existing `dst`.
        head_dim: attention head size (default 16; vLLM's CPU attention needs 32 or more).
        progress: told 1 when the folder is written.

    Raises:
        UsageError: an unknown profile, a draft folder without a config or an embedding of the
            right shape, or a target too large to be a toy.
        RefusedOverwriteError: `dst` exists and `force` is False.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dst = Path(dst)
    refuse_own_inputs(dst, [("draft", draft)], param="dst", folder=True)
    checked = check_writable(dst, force=force)
    if draft is not None:
        config_path = Path(draft) / CONFIG_NAME
        if not config_path.is_file():
            raise UsageError(f"{draft}: no config.json; pass a k3_dspark checkpoint folder", param="draft")
        draft_config = load_json_object(config_path)
        profile = None
    elif profile in TEACHER_PROFILES:
        draft_config = contract.PROFILES[profile]
    else:
        raise UsageError(f"{profile!r} is not one of {', '.join(TEACHER_PROFILES)}", param="profile")
    announce_total(progress, 1)
    shapes = teacher_shapes(draft_config, head_dim)
    torch.manual_seed(seed)
    model = moved(LlamaForCausalLM(LlamaConfig(**shapes, initializer_range=0.02)), torch.bfloat16).eval()
    if draft is not None:
        _copy_embedding(model, Path(draft))
    model.generation_config.do_sample = False
    tokenizer = build_tokenizer(shapes["vocab_size"], draft_config)
    with torch.no_grad():     # only bytes win the argmax: text, full-length continuations
        model.get_output_embeddings().weight[sorted(special_tokens(shapes["vocab_size"], draft_config))] = 0
    with atomic_dir(dst, force=force, checked=checked) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        for file in tmp.iterdir():          # safetensors writes 0600; give every file a new file's mode
            file.chmod(tmp.stat().st_mode & 0o666)
    if progress is not None:
        progress(1)
    return TeacherInitResult(dst, profile, None if draft is None else str(draft), seed, shapes["hidden_size"],
                             shapes["num_hidden_layers"], shapes["vocab_size"],
                             sum(p.numel() for p in model.parameters()), draft is not None)


def _copy_embedding(model: Any, draft: Path) -> None:
    """Put the draft's `embed_tokens.weight` (exactly, in the target's BF16) into the target."""
    import torch
    from safetensors import safe_open

    weights = draft / contract.WEIGHTS_NAME
    if not weights.is_file():
        raise UsageError(f"{draft}: no {contract.WEIGHTS_NAME}; the target copies the draft's embedding from it",
                         param="draft")
    name = contract.FROZEN_TENSORS[0]
    with safe_open(str(weights), framework="pt") as handle:
        if name not in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
            raise UsageError(f"{weights}: no {name}", param="draft")
        embedding = handle.get_tensor(name)
    target = model.get_input_embeddings().weight
    if tuple(embedding.shape) != tuple(target.shape):
        raise UsageError(f"{weights}: {name} is {list(embedding.shape)}, the target's embedding "
                         f"{list(target.shape)}", param="draft")
    if embedding.dtype != torch.bfloat16:
        model.to(embedding.dtype)
    with torch.no_grad():
        target.copy_(embedding)

