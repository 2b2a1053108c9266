"""`init --target T`: size an untrained draft for any transformers causal LM, from T's files only.

Only T's `config.json`, its tokenizer JSON files (read as JSON, never run) and one tensor (the
embedding, or `lm_head.weight` for the rows a pruned speculators draft keeps) are read; T is never
loaded as a model.

- `tap_layers(L, fmt)`: the taps the K3 recipes use, spread over L layers. Both recipes tap a 93-layer
  target five times and never its final layer: `k3_dspark` at layers [2, 23, 47, 71, 89] (the published
  draft), the speculators DSpark at aux ids [24, 48, 72, 88, 92], i.e. layers [23, 47, 71, 87, 91] in our
  convention (`format.taps.TAP_CONVENTION`). Each reference layer l in [0, 91] is placed at
  round(l * (L - 2) / 91), so the reference target gets the reference taps back and the last tap stays
  below T's final layer; taps that coincide on a shallow target are merged.
- `pick_mask_token(...)`: a token id T never emits, and why (`MaskChoice.reason`).
- `draft_vocabulary(counts, V, N)`: the N most frequent target ids of some data, as `d2t`/`t2d`.
- `k3_config(...)` / `speculators_config(...)`: the draft's `config.json`; a k3_dspark draft's MLA widths
  scale with T's head size, or are a named profile's (`mla_widths_from`, e.g. `kimi-k3`: the widths vLLM's GPU
  MLA backends take).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format import contract, speculators, writer
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.format.registry import FORMATS, K3, SPECULATORS, DraftFormat, by_cli_name
from dspark_hub.format.taps import residual_index, text_config
from dspark_hub.format.tensorio import locate_tensor
from dspark_hub.format.writer import Checked, atomic_dir, check_writable, refuse_own_inputs, write_safetensors
from dspark_hub.ops.init import INIT_KINDS, INIT_STD, init_checkpoint

#: The reference target's layer count and the recipes' taps on it (our convention: layer outputs, 0-based).
REFERENCE_TARGET_LAYERS = 93
RECIPE_TAPS: dict[str, tuple[int, ...]] = {
    K3.name: (2, 23, 47, 71, 89),              # contract.REFERENCE_CONFIG target_layer_ids
    SPECULATORS.name: (23, 47, 71, 87, 91),    # RedHatAI/Kimi-K3-speculator.dspark: aux ids 24 48 72 88 92
}
DEFAULT_DRAFT_LAYERS = 2
#: The library version whose config layout `speculators_config` writes (format.speculators describes 0.9.0).
SPECULATORS_VERSION = "0.9.0"
DEFAULT_BLOCK_SIZE = 8
#: The MLA widths `mla_widths_from` takes from a profile (heads, q_lora_rank and the rest stay sized for T).
MLA_WIDTH_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def tap_layers(target_layers: int, fmt: DraftFormat) -> list[int]:
    """The recipe's taps for a target of `target_layers` decoder layers (ascending, distinct, our convention)."""
    if target_layers < 1:
        raise UsageError(f"the target has {target_layers} decoder layers; a draft taps at least one")
    top = REFERENCE_TARGET_LAYERS - 2
    span = max(0, target_layers - 2)
    return sorted({math.floor(layer * span / top + 0.5) for layer in RECIPE_TAPS[fmt.name]})


@dataclass(frozen=True)
class TargetFacts:
    """What a draft needs to know about its target, from `config.json` and the tokenizer files."""

    path: Path
    config: Mapping[str, Any]      # the language-model part (`text_config` when nested)
    hidden_size: int
    num_layers: int
    vocab_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int

    def special_ids(self) -> set[int]:
        """bos/eos/pad/unk ids of the config (ints or lists)."""
        out: set[int] = set()
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
            value = self.config.get(key)
            out.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
        return out


def _read_json(path: Path) -> Any:
    """The parsed file, or None when it does not exist (`UsageError` when it is not strict JSON)."""
    if not path.is_file():
        return None
    try:
        return loads_strict(path.read_bytes(), path=str(path))
    except CheckpointFormatError as e:
        raise UsageError(f"{path}: not readable JSON ({e.message}); pass a transformers model folder") from None


def _positive(config: Mapping[str, Any], key: str, where: Path) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{where}: {key} is {json.dumps(value)}, not a positive integer; pass a transformers "
                         "causal LM folder", param="target")
    return value


def read_target(target: str | Path) -> TargetFacts:
    """The target's shape facts (its `config.json` only).

    Raises:
        UsageError: T is not a folder with a transformers causal-LM `config.json`.
    """
    folder = Path(target)
    path = folder / contract.CONFIG_NAME
    if not path.is_file():
        raise UsageError(f"{folder}: no {contract.CONFIG_NAME}; pass the target model's folder", param="target")
    doc = _read_json(path)
    if not isinstance(doc, Mapping):
        raise UsageError(f"{path}: not a JSON object; pass a transformers model folder", param="target")
    cfg = text_config(doc)
    hidden = _positive(cfg, "hidden_size", path)
    heads = _positive(cfg, "num_attention_heads", path)
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = _positive(cfg, "num_hidden_layers", path)
    return TargetFacts(path=folder, config=cfg, hidden_size=hidden, num_layers=layers,
                       vocab_size=_positive(cfg, "vocab_size", path), heads=heads,
                       kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
                       intermediate_size=cfg.get("intermediate_size") or 4 * hidden)


# ---------------------------------------------------------------- the mask token

@dataclass(frozen=True)
class MaskChoice(Document):
    id: int
    content: str | None
    reason: str


def _added_tokens(folder: Path) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) of the tokenizer's added tokens (tokenizer.json and tokenizer_config.json)."""
    out: dict[int, tuple[str, bool]] = {}
    doc = _read_json(folder / "tokenizer.json")
    for entry in (doc or {}).get("added_tokens") or [] if isinstance(doc, Mapping) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            out[entry["id"]] = (entry["content"], entry.get("special") is True)
    config = _read_json(folder / "tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") if isinstance(config, Mapping) else None
    for key, entry in (decoder or {}).items() if isinstance(decoder, Mapping) else []:
        if key.isdigit() and isinstance(entry, Mapping) and isinstance(entry.get("content"), str):
            out[int(key)] = (entry["content"], entry.get("special") is True)
    return out


def _named_tokens(folder: Path) -> dict[str, str]:
    """`bos_token`, `eos_token`, `mask_token`, ... as the tokenizer config names them."""
    config = _read_json(folder / "tokenizer_config.json")
    if not isinstance(config, Mapping):
        return {}
    out = {}
    for key, value in config.items():
        text = value.get("content") if isinstance(value, Mapping) else value
        if key.endswith("_token") and isinstance(text, str):
            out[key] = text
    return out


def pick_mask_token(target: TargetFacts, *, seen: Sequence[int] = ()) -> MaskChoice:
    """A mask id T never emits: the tokenizer's own `mask_token` if it has one, else its highest special
    token that is none of bos/eos/pad/unk, not in the chat template and not in `seen` (ids of given data).

    Raises:
        UsageError: T's tokenizer names no such token.
    """
    added = _added_tokens(target.path)
    named = _named_tokens(target.path)
    by_content = {content: tid for tid, (content, _) in added.items()}
    mask = named.get("mask_token")
    if mask in by_content and by_content[mask] < target.vocab_size:
        return MaskChoice(by_content[mask], mask, "the tokenizer's own mask_token (tokenizer_config.json)")
    template_path = target.path / "chat_template.jinja"
    template = template_path.read_text(encoding="utf-8") if template_path.is_file() else ""
    config = _read_json(target.path / "tokenizer_config.json")
    if isinstance(config, Mapping) and isinstance(config.get("chat_template"), str):
        template += config["chat_template"]
    excluded = target.special_ids() | set(seen) | {by_content[t] for t in named.values() if t in by_content}
    candidates = [tid for tid, (content, special) in added.items()
                  if special and tid < target.vocab_size and tid not in excluded and content not in template]
    if not candidates:
        raise UsageError(f"{target.path}: the tokenizer names no special token besides bos/eos/pad/unk and the chat "
                         "template's; a draft needs a mask id the target never emits", param="target")
    tid = max(candidates)
    unseen = " and absent from the given data" if seen else ""
    return MaskChoice(tid, added[tid][0], f"a special token of the target's tokenizer that is none of its bos/eos/"
                      f"pad/unk ids nor in its chat template{unseen}: greedy generation ends at eos and never "
                      "produces it")


# ---------------------------------------------------------------- the draft vocabulary

@dataclass(frozen=True)
class DraftVocabulary:
    target_ids: list[int]          # ascending; draft id i is target id target_ids[i]
    covered: float                 # share of the data's tokens the draft vocabulary can emit

    def d2t(self) -> list[int]:
        """speculators' offsets: `target_id = draft_id + d2t[draft_id]`."""
        return [tid - i for i, tid in enumerate(self.target_ids)]


def draft_vocabulary(counts: Mapping[int, int], vocab_size: int, size: int, *,
                     always: Sequence[int] = ()) -> DraftVocabulary:
    """The `size` most frequent ids of `counts` (ties: lower id first), `always` included, padded with the
    lowest unused ids when the data has fewer distinct tokens.

    Raises:
        UsageError: `size` is not in [1, vocab_size], or an id of `counts` is outside the vocabulary.
    """
    if not 0 < size <= vocab_size:
        raise UsageError(f"a draft vocabulary of {size} does not fit the target's {vocab_size}", param="draft_vocab")
    outside = [t for t in counts if not 0 <= t < vocab_size]
    if outside:
        raise UsageError(f"token id {outside[0]} of the data is outside the target's vocabulary [0, {vocab_size}); "
                         "pass data tokenized by this target", param="vocab_from")
    chosen = [t for t in dict.fromkeys(always) if 0 <= t < vocab_size][:size]
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    chosen += [t for t in ranked if t not in set(chosen)][: size - len(chosen)]
    taken = set(chosen)
    chosen += [t for t in range(vocab_size) if t not in taken][: size - len(chosen)]
    total = sum(counts.values())
    covered = sum(counts[t] for t in chosen if t in counts) / total if total else 0.0
    return DraftVocabulary(sorted(chosen), covered)


# ---------------------------------------------------------------- configs

def _even(n: int) -> int:
    return max(2, n - n % 2)


def k3_config(target: TargetFacts, *, layers: int, taps: Sequence[int], mask_token_id: int,
              mla_widths_from: str | None = None) -> dict[str, Any]:
    """A k3_dspark config sized for `target`, in the published key order (ranks scaled as in the tiny profile:
    q_lora_rank H/2, kv_lora_rank H/4, markov_rank min(256, H/4); MLA head widths from T's head size, or
    `MLA_WIDTH_KEYS` copied from the profile `mla_widths_from`)."""
    h, d = target.hidden_size, target.head_dim
    cfg = contract.profile_config("tiny")
    cfg.update({
        "hidden_size": h, "intermediate_size": target.intermediate_size, "num_hidden_layers": layers,
        "num_attention_heads": target.heads, "num_key_value_heads": target.heads,
        "q_lora_rank": max(1, h // 2), "kv_lora_rank": max(1, h // 4), "qk_nope_head_dim": d,
        "qk_rope_head_dim": _even(d // 2), "v_head_dim": d, "vocab_size": target.vocab_size,
        "rms_norm_eps": target.config.get("rms_norm_eps", cfg["rms_norm_eps"]),
        "max_position_embeddings": target.config.get("max_position_embeddings", cfg["max_position_embeddings"]),
        "num_target_layers": len(taps), "target_hidden_size": h, "target_num_hidden_layers": target.num_layers,
        "target_layer_ids": list(taps), "mask_token_id": mask_token_id, "markov_rank": min(256, max(1, h // 4)),
        "draft_vocab_size": target.vocab_size,
    })
    if mla_widths_from is not None:
        cfg.update({key: mla_profile(mla_widths_from)[key] for key in MLA_WIDTH_KEYS})
    rope = cfg["rope_parameters"]    # the reference's YaRN, its factor kept, sized to T's context and base
    rope.update({"original_max_position_embeddings": max(1, int(cfg["max_position_embeddings"] // rope["factor"])),
                 "rope_theta": _rope_theta(target.config, rope["rope_theta"])})
    cfg["rope_theta"] = rope["rope_theta"]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = target.config.get(key)
        cfg[key] = value[0] if isinstance(value, list) and value else value
    return cfg


def mla_profile(name: str) -> Mapping[str, Any]:
    """The profile whose MLA widths a draft takes (`UsageError` naming the profiles when there is none)."""
    if name not in contract.PROFILES:
        raise UsageError(f"{name!r} is not one of {', '.join(sorted(contract.PROFILES))}", param="mla_widths_from")
    return contract.PROFILES[name]


def _rope_theta(config: Mapping[str, Any], default: float) -> float:
    nested = config.get("rope_parameters")
    theta = nested.get("rope_theta") if isinstance(nested, Mapping) else config.get("rope_theta")
    return float(theta) if isinstance(theta, int | float) and not isinstance(theta, bool) else default


def speculators_config(target: TargetFacts, *, layers: int, taps: Sequence[int], mask_token_id: int,
                       draft_vocab_size: int, block_size: int, dtype: str, verifier: str) -> dict[str, Any]:
    """A speculators 0.9.0 DSpark config (keys sorted, as the library's `save_pretrained` writes them)."""
    architectures = target.config.get("architectures") or ["LlamaForCausalLM"]
    layer = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None,
        "head_dim": target.head_dim, "hidden_act": "silu", "hidden_size": target.hidden_size,
        "initializer_range": 0.02, "intermediate_size": target.intermediate_size,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": target.config.get("max_position_embeddings", 2048), "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": target.heads, "num_hidden_layers": layers,
        "num_key_value_heads": target.kv_heads, "pad_token_id": None,
        "rms_norm_eps": target.config.get("rms_norm_eps", 1e-6),
        "rope_parameters": target.config.get("rope_parameters") or {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": target.vocab_size,
    }
    cfg = {
        "architectures": ["DSparkDraftModel"], "auto_map": {"": "config.DSparkSpeculatorConfig"},
        speculators.AUX_IDS_KEY: [residual_index(t) for t in taps], "block_size": block_size,
        "confidence_head_with_markov": True, "draft_vocab_size": draft_vocab_size, "dtype": dtype,
        "enable_confidence_head": True, "markov_head_type": "vanilla",
        "markov_rank": min(256, max(1, target.hidden_size // 4)), "mask_token_id": mask_token_id,
        "sample_from_anchor": True, "sliding_window_non_causal": False,
        "speculators_config": {
            "algorithm": speculators.DSPARK, "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": block_size, "verifier_accept_k": 1}],
            "verifier": {"architectures": list(architectures), "name_or_path": verifier},
        },
        speculators.TYPE_KEY: speculators.DSPARK, "speculators_version": SPECULATORS_VERSION,
        "target_hidden_size": None, "tie_word_embeddings": False,
        speculators.LAYER_CONFIG_KEY: layer,
    }
    return dict(sorted(cfg.items()))


# ---------------------------------------------------------------- writing

#: Beside the weights: how `init --target` sized the draft (taps, mask token and why, draft vocabulary).
PROVENANCE_NAME = "dspark_init.json"


@dataclass(frozen=True)
class TargetInitResult:
    """What `init_for_target` wrote."""

    path: Path
    format: str
    target: str
    layers: int
    taps: list[int]
    block_size: int
    mask: MaskChoice
    draft_vocab_size: int
    vocab_coverage: float | None
    weights_bytes: int
    embedding: str                # where the saved vocabulary rows came from, or why none are saved
    mla_widths_from: str | None = None    # k3_dspark: the profile whose MLA widths it has (None: T's head size)

    def provenance(self) -> dict[str, Any]:
        return {"schema": schemas.INIT_TARGET, "format": self.format, "target": Path(self.target).name,
                "layers": self.layers, "target_layer_ids": self.taps, "block_size": self.block_size,
                "mla_widths_from": self.mla_widths_from,
                "mask_token": self.mask.to_dict(), "draft_vocab_size": self.draft_vocab_size,
                "vocab_coverage": self.vocab_coverage, "embedding": self.embedding}

    def to_dict(self) -> dict[str, Any]:
        return {**self.provenance(), "schema": schemas.command("init"), "path": str(self.path), "target": self.target,
                "weights_bytes": self.weights_bytes}


def _provenance_bytes(result: TargetInitResult) -> bytes:
    return (json.dumps(result.provenance(), indent=2) + "\n").encode("utf-8")


def init_for_target(dst: str | Path, target: str | Path, *, fmt: str = "k3_dspark", layers: int = DEFAULT_DRAFT_LAYERS,
                    block_size: int = DEFAULT_BLOCK_SIZE, taps: Sequence[int] | None = None,
                    draft_vocab: int | None = None, token_counts: Mapping[int, int] | None = None, seed: int = 0,
                    init: str = "random", mla_widths_from: str | None = None, force: bool = False,
                    progress: Any = None) -> TargetInitResult:
    """Write an untrained draft sized for `target` (a transformers causal-LM folder).

    Args:
        fmt: a format's command-line name: `k3_dspark` (full vocabulary, `embed_tokens` copied from T) or
            `speculators` (a DSpark in the speculators 0.9.0 layout; with `draft_vocab` a pruned vocabulary:
            `lm_head` rows copied from T).
        taps: T's layers to tap (our convention); default `tap_layers(T's layers, fmt)`.
        draft_vocab: speculators only: keep the `draft_vocab` most frequent ids of `token_counts`.
        token_counts: target id -> count in some data (needed with `draft_vocab`; also keeps the mask off them).
        init: `random` (seeded N(0, 0.02) matrices) or `zeros`; norms are ones and T's rows are copied either way.
        mla_widths_from: k3_dspark only: a profile name (`contract.PROFILES`) whose MLA widths
            (`MLA_WIDTH_KEYS`) the draft takes instead of widths scaled from T's head size.

    Raises:
        UsageError: a bad option, or a target that is not a transformers causal LM.
        RefusedOverwriteError: `dst` exists and `force` is False.
    """
    try:
        draft_format = by_cli_name(fmt)
    except (KeyError, StopIteration):
        names = ", ".join(f.cli_name for f in FORMATS.values())
        raise UsageError(f"{fmt!r} is not one of {names}", param="format") from None
    if layers < 1 or block_size < 1:
        raise UsageError("a draft needs at least one layer and a block of at least one token", param="layers")
    refuse_own_inputs(dst, [("target", target)], param="dst", folder=True)
    checked = check_writable(Path(dst), force=force)
    facts = read_target(target)
    chosen = sorted(set(taps)) if taps else tap_layers(facts.num_layers, draft_format)
    if any(not 0 <= t < facts.num_layers for t in chosen):
        raise UsageError(f"taps {list(chosen)} are not all in [0, {facts.num_layers}) for {target}", param="taps")
    if init not in INIT_KINDS:
        raise UsageError(f"{init!r} is not one of {', '.join(INIT_KINDS)}", param="init")
    if mla_widths_from is not None and draft_format.target_embedding is None:    # only _write_k3 reads them
        raise UsageError(f"MLA widths are a k3_dspark setting; a {draft_format.cli_name} draft's attention is sized "
                         "by the target's heads", param="mla_widths_from")
    if draft_vocab is not None and speculators.FROZEN_TENSORS[0] not in draft_format.frozen_tensors:
        raise UsageError("a pruned draft vocabulary is a speculators-format feature; k3_dspark keeps the target's",
                         param="draft_vocab")
    if draft_vocab is not None and not 0 < draft_vocab <= facts.vocab_size:
        raise UsageError(f"a draft vocabulary of {draft_vocab} does not fit the target's {facts.vocab_size}",
                         param="draft_vocab")
    if draft_vocab is not None and draft_vocab < facts.vocab_size and token_counts is None:
        raise UsageError("a pruned draft vocabulary needs token frequencies from some data", param="vocab_from")
    mask = pick_mask_token(facts, seen=sorted(token_counts or ()))
    common = {"target": str(target), "layers": layers, "taps": chosen, "block_size": block_size, "mask": mask}
    if draft_format.target_embedding is not None:     # it saves the target's embedding: k3_dspark
        return _write_k3(dst, facts, {**common, "mla_widths_from": mla_widths_from}, seed=seed, init=init,
                         force=force, progress=progress, checked=checked)
    return _write_speculators(dst, facts, common, draft_vocab=draft_vocab or facts.vocab_size,
                              counts=token_counts or {}, seed=seed, init=init, force=force, checked=checked)


def _write_k3(dst: str | Path, facts: TargetFacts, common: dict[str, Any], *, seed: int, init: str, force: bool,
              progress: Any, checked: Checked) -> TargetInitResult:
    cfg = k3_config(facts, layers=common["layers"], taps=common["taps"], mask_token_id=common["mask"].id,
                    mla_widths_from=common["mla_widths_from"])
    embedding = f"embed_tokens.weight copied from {Path(common['target']).name}"
    draft = TargetInitResult(path=Path(dst), format=K3.cli_name, draft_vocab_size=facts.vocab_size,
                             vocab_coverage=None, weights_bytes=0, embedding=embedding, **common)
    result = init_checkpoint(dst, config=cfg, init=init, seed=seed, force=force, embed_from=facts.path,
                             progress=progress, checked=checked,
                             extra_files={PROVENANCE_NAME: _provenance_bytes(draft)})
    if result.embedding.cast:
        embedding += f" ({result.embedding.cast})"
    written = TargetInitResult(**{**draft.__dict__, "weights_bytes": result.weights_bytes, "embedding": embedding})
    writer.write_file(Path(dst) / PROVENANCE_NAME, _provenance_bytes(written))
    return written


#: Float dtypes a speculators draft is saved in; others become BF16.
_SPECULATORS_DTYPES = {"F32": "float32", "BF16": "bfloat16"}


def _write_speculators(dst: str | Path, facts: TargetFacts, common: dict[str, Any], *, draft_vocab: int,
                       counts: Mapping[int, int], seed: int, init: str, force: bool,
                       checked: Checked) -> TargetInitResult:
    tied = facts.config.get("tie_word_embeddings", False) is True
    head = locate_tensor(facts.path, contract.TARGET_EMBED_NAMES if tied else ("lm_head.weight",))
    dtype = head.info.dtype if head.info.dtype in _SPECULATORS_DTYPES else contract.CONTRACT_DTYPE
    vocab = (draft_vocabulary(counts, facts.vocab_size, draft_vocab, always=[common["mask"].id])
             if draft_vocab < facts.vocab_size else None)
    cfg = speculators_config(facts, layers=common["layers"], taps=common["taps"], mask_token_id=common["mask"].id,
                             draft_vocab_size=draft_vocab, block_size=common["block_size"],
                             dtype=_SPECULATORS_DTYPES.get(dtype, "bfloat16"), verifier=facts.path.name)
    specs = speculators.roster(cfg, dtype=dtype)
    tensors = _speculators_tensors(specs, head, vocab, facts.vocab_size, seed, zeros=init == "zeros")
    embedding = (f"lm_head.weight: rows of {facts.path.name}:{head.name} picked by t2d"
                 + ("" if head.info.dtype == dtype else f" (cast from {head.info.dtype} to {dtype})")
                 if vocab else "none saved: the draft scores through the target's own lm_head")
    result = TargetInitResult(path=Path(dst), format=SPECULATORS.cli_name, draft_vocab_size=draft_vocab,
                              vocab_coverage=vocab.covered if vocab else None, weights_bytes=0,
                              embedding=embedding, **common)
    with atomic_dir(dst, force=force, checked=checked) as tmp:
        writer.write_file(tmp / contract.CONFIG_NAME, json.dumps(cfg, indent=2) + "\n")
        size = write_safetensors(tmp / contract.WEIGHTS_NAME, list(specs.values()),
                                 lambda spec: [tensors[spec.name].contiguous().view(-1).view(_uint8()).numpy().data],
                                 metadata={"format": "pt"})
        result = TargetInitResult(**{**result.__dict__, "weights_bytes": size})
        writer.write_file(tmp / PROVENANCE_NAME, _provenance_bytes(result))
    return result


def _uint8() -> Any:
    import torch
    return torch.uint8


def _speculators_tensors(specs: Mapping[str, contract.TensorSpec], head: Any, vocab: DraftVocabulary | None,
                         vocab_size: int, seed: int, *, zeros: bool = False) -> dict[str, Any]:
    """Random weights (norms ones, biases zeros, matrices N(0, 0.02) or `zeros`), T's lm_head rows, d2t and t2d."""
    import torch
    from safetensors import safe_open

    torch_dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[next(
        s.dtype for s in specs.values() if s.name.endswith("norm.weight"))]
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if name == "d2t" and vocab:
            out[name] = torch.tensor(vocab.d2t(), dtype=torch.int64)
        elif name == "t2d" and vocab:
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[vocab.target_ids] = True
            out[name] = mask
        elif name == "lm_head.weight" and vocab:
            with safe_open(str(head.path), framework="pt") as f:
                rows = f.get_slice(head.name)[:][vocab.target_ids]
            out[name] = rows.to(torch_dtype)
        elif name.endswith("norm.weight"):
            out[name] = torch.ones(spec.shape, dtype=torch_dtype)
        elif name.endswith(".bias") or zeros:
            out[name] = torch.zeros(spec.shape, dtype=torch_dtype)
        else:
            out[name] = torch.empty(spec.shape).normal_(0.0, INIT_STD, generator=generator).to(torch_dtype)
    return out
