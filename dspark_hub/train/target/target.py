"""The target (target) side of training and evaluation: loading, tap capture, lm_head, identity.

The tap convention (what a `target_layer_ids` entry means)
----------------------------------------------------------
Entry `l` (0-based) names the OUTPUT of the target's decoder layer `l`: the residual stream
after that layer's attention and MLP blocks have been added, exactly what a forward hook on
`model.layers[l]` returns. In `output_hidden_states=True` indexing that is `hidden_states[l + 1]`
(`hidden_states[0]` is the embedding output). It is never the final-normed last entry of
`output_hidden_states` (transformers returns `norm(output of the last layer)` there), which is
why the config forbids the last layer id. The draft's context row `C[t]` is the concatenation of
the taps in ascending id order, width `len(target_layer_ids) * hidden_size`. Runtimes that record
the INPUT of a listed layer must shift by one (`l + 1`); DeepSpec, LumenRL and this module do not.

The target's final hidden state is the input of its `lm_head` (after the final norm); target
distributions are `softmax(final_hidden @ lm_head.weight.T)`, recomputed at training time from
the weight read straight out of the target's safetensors (`Target.lm_head`).

The target a command works against is one value, `Target`, opened once (`Target.open`): its path,
its `config.json` (read there, once), its tokenizer (loaded on first use), its identity (computed
on first use, once, from the files the one folder listing sees: `format.folder`) and readers of
single tensors (`lm_head`, `final_norm`, `embedding`) that never build the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from pickle import UnpicklingError  # the error type only: nothing here unpickles outside weights_only
from typing import TYPE_CHECKING, Any, TypeVar

from dspark_hub._text import plural, shortened
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError, about
from dspark_hub.format.contract import CONFIG_NAME, INDEX_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.folder import folder_files, list_folder
from dspark_hub.format.jsonio import read_json_input
from dspark_hub.format.taps import text_config
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.train.target.tensors import read_tensor

# torch, transformers and safetensors are imported inside the functions that load weights: config
# checks and identities (and the CLI's `--help`) import this module without them.

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    # What AutoModelForCausalLM.from_pretrained is annotated to return: a PreTrainedModel that generates.
    from transformers.models.auto.modeling_auto import _BaseModelWithGenerate

    CausalLM = _BaseModelWithGenerate

_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})")


# ----------------------------------------------------------------------------- identity


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TargetIdentity(Document):
    """Which target produced a measurement: `repo@revision` when the folder is a Hub snapshot,
    else the SHA-256 of its config and weight files."""

    KEYS = ("path", "repo", "revision", "digests", "label")

    path: str
    repo: str | None = None
    revision: str | None = None
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """`repo@revision`, else `folder (sha256 file abcdef123456, ...)` (12-digit prefixes)."""
        if self.repo:
            return f"{self.repo}@{self.revision}"
        digests = ", ".join(f"{name} {digest[:12]}" for name, digest in sorted(self.digests.items()))
        return f"{Path(self.path).name} (sha256 {digests})"


def target_identity(folder: str | os.PathLike[str]) -> TargetIdentity:
    """Identify a local target folder (see `TargetIdentity`): its config and weight files as the one
    folder listing (`format.folder.list_folder`) sees them, so a link out of the folder is never hashed.

    Raises:
        CheckpointFormatError: a config, index or weight file is left out of the listing (a link out of
            the folder, a special file): the identity would not be the files the target loads.
    """
    resolved = Path(folder).resolve()
    match = _SNAPSHOT.search(resolved.as_posix())
    if match:
        return TargetIdentity(str(folder), repo=f"{match['org']}/{match['name']}", revision=match["rev"])
    listing = list_folder(folder)
    left_out = [p for p in listing.problems if _identifies(p.path)]
    if left_out:
        first = left_out[0]
        raise CheckpointFormatError(first.code, f"{first.detail}; the target's identity is the files it loads",
                                    path=str(Path(folder) / first.path), hint=first.hint)
    return TargetIdentity(str(folder), digests={name: sha256_file(Path(folder) / name)
                                                 for name in listing.files if _identifies(name)})


def _identifies(name: str) -> bool:
    """A top-level file the identity hashes: the config, the index and the weight files."""
    return "/" not in name and (name.endswith(".safetensors") or name in (CONFIG_NAME, INDEX_NAME))


# ----------------------------------------------------------------------------- lm_head


def lm_head_name(names: Any, config: Mapping[str, Any]) -> str:
    """The tensor holding the target's output projection (its input embedding when tied)."""
    names = list(names)
    wanted = ["lm_head.weight"]
    if text_config(config).get("tie_word_embeddings", config.get("tie_word_embeddings")):
        wanted.append("embed_tokens.weight")
    for suffix in wanted:
        hits: list[str] = [n for n in names if n == suffix or n.endswith("." + suffix)]
        if len(hits) == 1:
            return hits[0]
    raise UsageError(f"target: no unique {' or '.join(wanted)} among {plural(len(names), 'tensor')}; "
                     "pass a causal LM checkpoint folder")


@dataclass(frozen=True)
class FinalNorm:
    """The target's final RMSNorm, read from its files: what turns the last layer's output into the lm_head input.

    Engines that capture the last decoder layer's output before the norm (vLLM, speculators' data)
    get the lm_head input by applying it: `weight * x / sqrt(mean(x^2) + eps)`, normalised in
    float32 and cast back before the scale (transformers' Llama/DeepSeek/Kimi RMSNorm).
    """

    tensor: str
    weight: torch.Tensor     # [hidden]
    eps: float

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch

        dtype = hidden.dtype
        x = hidden.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(device=hidden.device, dtype=dtype) * x.to(dtype)

    def describe(self) -> str:
        return (f"target final norm {self.tensor} (eps {self.eps}) applied to the last decoder layer's "
                "pre-norm output: w * x / sqrt(mean(x^2) + eps), normalised in float32")


#: Final-norm tensor names by family: the text model's `norm` (multimodal targets nest it).
_FINAL_NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight")
#: Families whose RMSNorm scales by (1 + weight): applying `FinalNorm` to them would be silently wrong.
_ONE_PLUS_WEIGHT_NORMS = ("gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_next")


def final_norm_of(folder: Path, config: Mapping[str, Any], files: Mapping[str, Path]) -> FinalNorm:
    """The final norm weight and epsilon of the target in `folder` (its config and tensor files; no model built).

    Raises:
        UsageError: no unique final norm tensor, or a family whose norm is not `w * x / rms`.
    """
    text = text_config(config)
    if text.get("model_type") in _ONE_PLUS_WEIGHT_NORMS or config.get("model_type") in _ONE_PLUS_WEIGHT_NORMS:
        raise UsageError(f"{folder}: model_type {text.get('model_type') or config.get('model_type')} scales its "
                         "norm by (1 + weight); its final states cannot be rebuilt from a pre-norm capture here")
    names = [n for n in files if any(n == suffix or n.endswith("." + suffix) for suffix in _FINAL_NORM_NAMES)]
    if len(names) != 1:
        raise UsageError(f"{folder}: no unique final norm tensor ({' or '.join(_FINAL_NORM_NAMES)}) among "
                         f"{len(files)} tensors; use a causal LM checkpoint folder")
    eps = text.get("rms_norm_eps", config.get("rms_norm_eps", 1e-6))
    return FinalNorm(names[0], read_tensor(files[names[0]], names[0]), float(eps))


def eos_ids_of(folder: Path, config: Mapping[str, Any]) -> list[int]:
    """The ids a greedy continuation stops at: `generation_config.json`'s `eos_token_id`, else `config.json`'s.

    The transformers engine gets the same ids from `model.generation_config`, which is read from the same files.
    """
    eos = None
    if (folder / "generation_config.json").is_file():
        eos = read_json_input(folder / "generation_config.json").get("eos_token_id")
    if eos is None:
        eos = text_config(config).get("eos_token_id", config.get("eos_token_id"))
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


# ----------------------------------------------------------------------------- model + taps


M = TypeVar("M", bound="PreTrainedModel")


def moved(model: M, where: torch.device | torch.dtype | str) -> M:
    """`model.to(where)`, typed: transformers wraps `PreTrainedModel.to` in `functools.wraps`, which
    mypy reads as a function without `self` (the one ignore for every caller)."""
    return model.to(where)   # type: ignore[arg-type,no-any-return]


def load_target(folder: str | os.PathLike[str], *, dtype: str = "float32") -> CausalLM:
    """`AutoModelForCausalLM` from a local folder, in eval mode, gradients off."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (Path(folder) / CONFIG_NAME).is_file():
        raise CheckpointNotFoundError(f"{folder}: no config.json; pass a local transformers causal LM folder")
    folder_files(folder)     # a model folder's rules before transformers opens its files natively
    try:   # weights_only: a `.bin` pickle is read as tensors only, never run (transformers' default, said here)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype), weights_only=True)
    except UnpicklingError as e:
        raise UsageError(f"{folder}: its weights are a pickle a weights-only load refuses ({weights_only_refusal(e)}); "
                         "nothing in it ran", hint="give the target's weights as safetensors") from None
    model.eval().requires_grad_(False)
    return model


def weights_only_refusal(error: Exception) -> str:
    """Why `torch.load(weights_only=True)` refused a file, in one line: the global it would import, else why."""
    text = str(error)
    if found := re.search(r"GLOBAL ([\w.]+)", text):
        return f"it would import {found.group(1)}"
    if found := re.search(r"(Unsupported [^\n]+)", text):
        return f"not tensors and plain values: {shortened(found.group(1).strip(), 80)}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"not a file torch.save wrote: {shortened(first, 80)}"


# ----------------------------------------------------------------------------- the target, opened once


@dataclass(frozen=True, eq=False)
class Target:
    """The target a command works against, opened once (`Target.open`).

    `config` is its `config.json`, read when it was opened; the tokenizer, the identity, the EOS ids
    and the chat template's digest are computed on first use and kept, so a command that needs them
    several times (rollouts, on-policy rounds, eval) reads and hashes the folder once. Single tensors
    (`lm_head`, `final_norm`, `embedding`) are read from its safetensors without building the model.
    """

    path: str
    config: dict[str, Any]
    param: str | None = "target"

    @classmethod
    def open(cls, folder: str | os.PathLike[str] | Target, *, param: str | None = "target") -> Target:
        """The target in `folder` (a `Target` is returned as it is).

        Raises:
            CheckpointNotFoundError, UsageError: no readable `config.json` object in `folder` (about `param`).
        """
        if isinstance(folder, Target):
            return folder
        config = read_json_input(Path(folder) / CONFIG_NAME, what="a target folder that holds config.json",
                                 param=param)
        return cls(str(folder), config, param)

    @property
    def folder(self) -> Path:
        return Path(self.path)

    @property
    def text(self) -> Mapping[str, Any]:
        """The text model's config (a multimodal target nests it; `format.taps.text_config`)."""
        return text_config(self.config)

    @cached_property
    def identity(self) -> TargetIdentity:
        """`repo@revision` of a Hub snapshot, else the SHA-256 of its config and weight files (once)."""
        with self._about():
            return target_identity(self.path)

    @cached_property
    def tensor_files(self) -> dict[str, Path]:
        """Tensor name -> the file that holds it (`format.tensorio.tensor_files`: headers only)."""
        with self._about():
            return tensor_files(self.path)

    @cached_property
    def eos_ids(self) -> list[int]:
        """The ids a greedy continuation stops at (`generation_config.json`, else `config.json`)."""
        return eos_ids_of(self.folder, self.config)

    @cached_property
    def _tokenizer(self) -> tuple[PreTrainedTokenizerBase | None, str | None]:
        """(the tokenizer, None), or (None, why it could not be loaded)."""
        from transformers import AutoTokenizer

        if self.folder.is_dir():
            folder_files(self.folder)   # a model folder's rules before the tokenizer library opens its files natively
        try:
            return AutoTokenizer.from_pretrained(self.path), None
        except (OSError, ValueError, TypeError) as exc:
            return None, str(exc)

    def tokenizer(self, *, required: bool) -> PreTrainedTokenizerBase | None:
        """The target's tokenizer (loaded once), or None when the folder ships none and `required` is False.

        Raises:
            UsageError: `required` and no usable tokenizer.
        """
        tokenizer, why = self._tokenizer
        if tokenizer is None and required:
            raise UsageError(f"{self.path}: no usable tokenizer ({why}); give prompts as input_ids "
                             "or use a target folder with a tokenizer")
        return tokenizer

    @cached_property
    def chat_template_sha256(self) -> str | None:
        """SHA-256 of the tokenizer's chat template (None when it has none, or no tokenizer)."""
        template = getattr(self.tokenizer(required=False), "chat_template", None)
        if isinstance(template, dict):
            template = json.dumps(template, sort_keys=True)
        return sha256_text(template)

    def lm_head(self) -> torch.Tensor:
        """The lm_head weight `[vocab, hidden]` (its input embedding when tied): that one tensor is read."""
        name = lm_head_name(self.tensor_files, self.config)
        return read_tensor(self.tensor_files[name], name)

    def final_norm(self) -> FinalNorm:
        """The final RMSNorm (weight and epsilon), read from the files.

        Raises:
            UsageError: no unique final norm tensor, or a family whose norm is not `w * x / rms`.
        """
        return final_norm_of(self.folder, self.config, self.tensor_files)

    def embedding(self) -> torch.Tensor:
        """The input embedding `[V, H]`, read from its safetensors (no model built).

        Raises:
            UsageError: no unique `embed_tokens.weight`.
        """
        files = self.tensor_files
        hits = [n for n in files if n == "embed_tokens.weight" or n.endswith(".embed_tokens.weight")]
        if len(hits) != 1:
            raise UsageError(f"{self.path}: no unique embed_tokens.weight among {len(files)} tensors; pass a causal "
                             "LM checkpoint folder", param=self.param)
        return read_tensor(files[hits[0]], hits[0])

    def load(self, *, dtype: str = "float32") -> CausalLM:
        """The model (`AutoModelForCausalLM`) in eval mode, gradients off."""
        return load_target(self.path, dtype=dtype)

    def _about(self) -> AbstractContextManager[None]:
        return about(self.param) if self.param else nullcontext()
