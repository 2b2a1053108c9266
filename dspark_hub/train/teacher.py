"""The teacher (target) side of training and evaluation: loading, tap capture, lm_head, identity.

The tap convention (what a `target_layer_ids` entry means)
----------------------------------------------------------
Entry `l` (0-based) names the OUTPUT of the teacher's decoder layer `l`: the residual stream
after that layer's attention and MLP blocks have been added, exactly what a forward hook on
`model.layers[l]` returns. In `output_hidden_states=True` indexing that is `hidden_states[l + 1]`
(`hidden_states[0]` is the embedding output). It is never the final-normed last entry of
`output_hidden_states` (transformers returns `norm(output of the last layer)` there), which is
why the config forbids the last layer id. The draft's context row `C[t]` is the concatenation of
the taps in ascending id order, width `len(target_layer_ids) * hidden_size`. Runtimes that record
the INPUT of a listed layer must shift by one (`l + 1`); DeepSpec, LumenRL and this module do not.

The teacher's final hidden state is the input of its `lm_head` (after the final norm); target
distributions are `softmax(final_hidden @ lm_head.weight.T)`, recomputed at training time from
the weight read straight out of the teacher's safetensors (`read_lm_head`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from pickle import UnpicklingError  # the error type only: nothing here unpickles outside weights_only
from typing import TYPE_CHECKING, Any, TypeVar

from dspark_hub._text import plural, shortened
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, DsparkError, UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.folder import folder_files
from dspark_hub.format.jsonio import json_type, load_json_object
from dspark_hub.format.taps import require_tap_layers, text_config
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.train.data_checks import read_tensor

# torch, transformers and safetensors are imported inside the functions that load weights: config
# checks and identities (and the CLI's `--help`) import this module without them.

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    # What AutoModelForCausalLM.from_pretrained is annotated to return: a PreTrainedModel that generates.
    from transformers.models.auto.modeling_auto import _BaseModelWithGenerate

    CausalLM = _BaseModelWithGenerate

_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})")


class TeacherMismatchError(DsparkError):
    """The teacher and the draft's config disagree on a pairing key (hidden size, layers, vocabulary)."""


# ----------------------------------------------------------------------------- config pairing


def read_json(path: str | os.PathLike[str], *, what: str = "the file or a folder that holds it",
              param: str | None = None) -> dict[str, Any]:
    """Read a JSON object from `path`.

    Args:
        path: the file.
        what: what the caller should pass instead, for the error messages.
        param: the caller's argument the file came from (the errors' `param`).

    Raises:
        CheckpointNotFoundError: `path` does not exist.
        UsageError: `path` is a folder, not strict UTF-8 JSON (`jsonio.loads_strict`: no repeated
            keys, no NaN), or not a JSON object (one line ending `pass <what>`).
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; pass {what}", param=param)
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: not found; pass {what}", param=param)
    try:
        return load_json_object(path)
    except CheckpointFormatError as e:
        raise UsageError(f"{e.message}; pass {what}", param=param) from None


def read_teacher_config(folder: str | os.PathLike[str], *, param: str | None = None) -> dict[str, Any]:
    """The target folder's `config.json`: the one way every part of `train` reads it.

    Raises:
        CheckpointNotFoundError, UsageError: as `read_json`'s, asking for a folder that holds config.json
            (about `param`, the caller's argument, when given).
    """
    return read_json(Path(folder) / CONFIG_NAME, what="a teacher folder that holds config.json", param=param)


def check_teacher_matches(teacher_config: Mapping[str, Any], draft_config: Mapping[str, Any], *,
                          teacher_name: str = "teacher") -> list[int]:
    """Refuse a teacher whose hidden size, layer count or vocabulary disagree with the draft config.

    Returns:
        The draft's tap ids (checked by `format.taps`, the rule `verify` applies).

    Raises:
        UsageError: either config is not an object, or `target_layer_ids` break the tap rule.
        TeacherMismatchError: one line naming the first disagreeing key.
    """
    if not isinstance(draft_config, Mapping):
        raise UsageError(f"the draft's config is a JSON {json_type(draft_config)}, not an object; "
                         "pass the draft's config.json file")
    if not isinstance(teacher_config, Mapping):
        raise UsageError(f"{teacher_name}: config.json is a JSON {json_type(teacher_config)}, not an object; "
                         "pass a transformers causal LM folder")
    teacher = text_config(teacher_config)
    pairs = (("hidden_size", "target_hidden_size"), ("num_hidden_layers", "target_num_hidden_layers"),
             ("vocab_size", "vocab_size"), ("vocab_size", "draft_vocab_size"))
    for teacher_key, draft_key in pairs:
        have, want = teacher.get(teacher_key), draft_config.get(draft_key)
        if have != want:
            raise TeacherMismatchError(
                f"{teacher_name}: {teacher_key} is {have}, the draft's {draft_key} is {want}; "
                "pair the draft with the teacher it was built for")
    return require_tap_layers(draft_config, target_layers=teacher["num_hidden_layers"])


# ----------------------------------------------------------------------------- identity


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TeacherIdentity:
    """Which teacher produced a measurement: `repo@revision` when the folder is a Hub snapshot,
    else the SHA-256 of its config and weight files."""

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

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "repo": self.repo, "revision": self.revision, "digests": dict(self.digests),
                "label": self.label}


def teacher_identity(folder: str | os.PathLike[str]) -> TeacherIdentity:
    """Identify a local teacher folder (see `TeacherIdentity`)."""
    resolved = Path(folder).resolve()
    match = _SNAPSHOT.search(resolved.as_posix())
    if match:
        return TeacherIdentity(str(folder), repo=f"{match['org']}/{match['name']}", revision=match["rev"])
    files = sorted(p for p in resolved.iterdir() if p.is_file() and
                   (p.suffix == ".safetensors" or p.name in (CONFIG_NAME, "model.safetensors.index.json")))
    return TeacherIdentity(str(folder), digests={p.name: sha256_file(p) for p in files})


# ----------------------------------------------------------------------------- lm_head


def lm_head_name(names: Any, config: Mapping[str, Any]) -> str:
    """The tensor holding the teacher's output projection (its input embedding when tied)."""
    names = list(names)
    wanted = ["lm_head.weight"]
    if text_config(config).get("tie_word_embeddings", config.get("tie_word_embeddings")):
        wanted.append("embed_tokens.weight")
    for suffix in wanted:
        hits: list[str] = [n for n in names if n == suffix or n.endswith("." + suffix)]
        if len(hits) == 1:
            return hits[0]
    raise UsageError(f"teacher: no unique {' or '.join(wanted)} among {plural(len(names), 'tensor')}; "
                     "pass a causal LM checkpoint folder")


def read_lm_head(folder: str | os.PathLike[str]) -> torch.Tensor:
    """The teacher's lm_head weight `[vocab, hidden]` read from its safetensors (no model built).

    Only the header and that one tensor are read, so this is cheap even for a huge teacher.
    """

    folder = Path(folder)
    config = read_teacher_config(folder)
    files = tensor_files(folder)
    name = lm_head_name(files, config)
    return read_tensor(files[name], name)


@dataclass(frozen=True)
class FinalNorm:
    """The teacher's final RMSNorm, read from its files: what turns the last layer's output into the lm_head input.

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
        return (f"teacher final norm {self.tensor} (eps {self.eps}) applied to the last decoder layer's "
                "pre-norm output: w * x / sqrt(mean(x^2) + eps), normalised in float32")


#: Final-norm tensor names by family: the text model's `norm` (multimodal teachers nest it).
_FINAL_NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight")
#: Families whose RMSNorm scales by (1 + weight): applying `FinalNorm` to them would be silently wrong.
_ONE_PLUS_WEIGHT_NORMS = ("gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_next")


def read_final_norm(folder: str | os.PathLike[str]) -> FinalNorm:
    """The teacher's final norm weight and epsilon, read from its safetensors and config (no model built).

    Raises:
        UsageError: no unique final norm tensor, or a family whose norm is not `w * x / rms`.
    """

    folder = Path(folder)
    config = read_teacher_config(folder)
    text = text_config(config)
    if text.get("model_type") in _ONE_PLUS_WEIGHT_NORMS or config.get("model_type") in _ONE_PLUS_WEIGHT_NORMS:
        raise UsageError(f"{folder}: model_type {text.get('model_type') or config.get('model_type')} scales its "
                         "norm by (1 + weight); its final states cannot be rebuilt from a pre-norm capture here")
    files = tensor_files(folder)
    names = [n for n in files if any(n == suffix or n.endswith("." + suffix) for suffix in _FINAL_NORM_NAMES)]
    if len(names) != 1:
        raise UsageError(f"{folder}: no unique final norm tensor ({' or '.join(_FINAL_NORM_NAMES)}) among "
                         f"{len(files)} tensors; use a causal LM checkpoint folder")
    weight = read_tensor(files[names[0]], names[0])
    eps = text.get("rms_norm_eps", config.get("rms_norm_eps", 1e-6))
    return FinalNorm(names[0], weight, float(eps))


def teacher_eos_ids(folder: str | os.PathLike[str]) -> list[int]:
    """The ids a greedy continuation stops at: `generation_config.json`'s `eos_token_id`, else `config.json`'s.

    The transformers engine gets the same ids from `model.generation_config`, which is read from the same files.
    """
    folder = Path(folder)
    eos = None
    if (folder / "generation_config.json").is_file():
        eos = read_json(folder / "generation_config.json").get("eos_token_id")
    if eos is None:
        config = read_teacher_config(folder)
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


def load_teacher(folder: str | os.PathLike[str], *, dtype: str = "float32") -> CausalLM:
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


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The teacher's decoder layer list (`model.model.layers` for Llama/Qwen/DeepSeek families)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise UsageError(f"teacher: {type(model).__name__} has no decoder .layers to tap; "
                         "use a transformers causal LM with a standard decoder stack")
    stack: torch.nn.ModuleList = layers
    return stack


@dataclass
class TeacherStates:
    """What one teacher prefill pass yields for a batch of sequences `[B, T]`."""

    aux_hidden_states: torch.Tensor     # [B, T, len(layer_ids) * hidden]: layer outputs, ascending ids
    final_hidden_states: torch.Tensor   # [B, T, hidden]: input of lm_head (after the final norm)


def capture_states(model: PreTrainedModel, input_ids: torch.Tensor, layer_ids: list[int]) -> TeacherStates:
    """One prefill forward; taps are captured with forward hooks on the named decoder layers.

    Args:
        model: a causal LM from `load_teacher`.
        input_ids: `[B, T]` (no padding: every row is attended in full).
        layer_ids: the draft's `target_layer_ids`; concatenated in ascending order.
    """
    import torch

    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}

    def hook_for(layer: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:   # output: a layer's, any shape
            captured[layer] = output[0] if isinstance(output, tuple) else output
        return hook

    handles = [layers[layer].register_forward_hook(hook_for(layer)) for layer in sorted(set(layer_ids))]
    try:
        with torch.no_grad():
            out = model.get_decoder()(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    aux = torch.cat([captured[layer] for layer in sorted(layer_ids)], dim=-1)
    return TeacherStates(aux_hidden_states=aux, final_hidden_states=out.last_hidden_state)


def chat_template_digest(folder: str | os.PathLike[str]) -> str | None:
    """SHA-256 of the teacher tokenizer's chat template (None when it has none or no tokenizer)."""
    tokenizer = load_tokenizer(folder, required=False)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(template, dict):
        template = json.dumps(template, sort_keys=True)
    return sha256_text(template)


def load_tokenizer(folder: str | os.PathLike[str], *, required: bool) -> PreTrainedTokenizerBase | None:
    """The teacher's tokenizer, or None when the folder ships none and `required` is False."""
    from transformers import AutoTokenizer

    if Path(folder).is_dir():
        folder_files(folder)     # a model folder's rules before the tokenizer library opens its files natively
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as exc:
        if required:
            raise UsageError(f"{folder}: no usable tokenizer ({exc}); give prompts as input_ids "
                             "or use a teacher folder with a tokenizer") from exc
        return None
