"""One target sequence and its states (`Rollout`), and how a transformers target produces them.

Shared by every engine (`train.engines`, `train.vllm_engine`) and by the rollouts folder
(`train.data.rollouts`), which sit above it: greedy continuations captured with forward hooks
(`generate_rollouts`), given sequences recorded as they are (`prefill_rollouts`), and the
greedy-agreement count every rollout carries. A sampled continuation (`eval --temperature`) is the same
greedy `generate` call with a `Draw` rule deciding each row's next token (the rule, vLLM's sampling, lives
with the evaluation that needs it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.progress import Progress

# torch and transformers are imported inside the functions that run the target: the CLI imports
# this module (through `engines`) for `--help`.

#: `draw(prompts)` -> `next_tokens(scores)`: for the rows of one `generate` call (`prompts`, in row order), the
#: token each row continues with, from that step's `[rows, V]` float32 logits. None: greedy (the argmax).
Draw = Callable[[list["Prompt"]], Callable[["torch.Tensor"], "torch.Tensor"]]

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from dspark_hub.train.target.target import CausalLM


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The target's decoder layer list (`model.model.layers` for Llama/Qwen/DeepSeek families)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise UsageError(f"target: {type(model).__name__} has no decoder .layers to tap; "
                         "use a transformers causal LM with a standard decoder stack")
    stack: torch.nn.ModuleList = layers
    return stack


@dataclass
class TargetStates:
    """What one target prefill pass yields for a batch of sequences `[B, T]`."""

    aux_hidden_states: torch.Tensor     # [B, T, len(layer_ids) * hidden]: layer outputs, ascending ids
    final_hidden_states: torch.Tensor   # [B, T, hidden]: input of lm_head (after the final norm)


def capture_states(model: PreTrainedModel, input_ids: torch.Tensor, layer_ids: list[int]) -> TargetStates:
    """One prefill forward; taps are captured with forward hooks on the named decoder layers.

    Args:
        model: a causal LM from `load_target`.
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
    return TargetStates(aux_hidden_states=aux, final_hidden_states=out.last_hidden_state)


@dataclass(frozen=True)
class Prompt:
    """One prompt as token ids."""

    index: int
    input_ids: list[int]
    dataset: str | None = None
    loss_mask: list[int] | None = None


@dataclass
class Rollout:
    """One target sequence with its states (tensors on CPU)."""

    prompt_index: int
    dataset: str | None
    input_ids: torch.Tensor                 # [T] int64
    prompt_length: int
    aux_hidden_states: torch.Tensor         # [T, n_taps * H]
    final_hidden_states: torch.Tensor       # [T, H]
    greedy_agreement: tuple[int, int] = (0, 0)
    mask: torch.Tensor | None = None        # [T] uint8 when given (prefill data); else 1 from prompt_length on

    @property
    def loss_mask(self) -> torch.Tensor:
        import torch

        if self.mask is not None:
            return self.mask.to(torch.uint8)
        mask = torch.zeros(self.input_ids.shape[0], dtype=torch.uint8)
        mask[self.prompt_length:] = 1
        return mask

    def entry(self) -> dict[str, Any]:
        return {"prompt_index": self.prompt_index, "dataset": self.dataset, "length": int(self.input_ids.shape[0]),
                "prompt_length": self.prompt_length, "supervised_tokens": int(self.loss_mask.sum()),
                "greedy_agreement": list(self.greedy_agreement)}



def greedy_agreement(final: Any, tokens: Any, mask: Any, lm_head: Any) -> tuple[int, int]:
    """(agree, total): how many supervised tokens `t >= 1` equal the argmax of the target's logits at `t - 1`.

    1.0 on a correct greedy rollout; on offline (prefill) data, how often the data is the target's greedy choice.
    """
    import torch

    positions = torch.nonzero(mask.bool()[1:]).flatten() + 1
    if positions.numel() == 0:
        return 0, 0
    logits = final[positions - 1].to(lm_head.dtype) @ lm_head.T
    agree = logits.argmax(-1) == tokens[positions].to(logits.device)
    return int(agree.sum()), int(agree.numel())


def _eos_ids(model: PreTrainedModel, ignore_eos: bool) -> list[int] | None:
    if ignore_eos:
        return None
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return None
    return [eos] if isinstance(eos, int) else list(eos)


def _trimmed_length(row: list[int], start: int, eos: list[int] | None) -> int:
    """Length up to and including the first EOS of the continuation."""
    if eos:
        for i in range(start, len(row)):
            if row[i] in eos:
                return i + 1
    return len(row)


def _batches(prompts: list[Prompt], batch_size: int) -> Iterator[list[Prompt]]:
    """Prompts of equal length batched together (no padding, so every row is exact)."""
    by_length: dict[int, list[Prompt]] = {}
    for prompt in prompts:
        by_length.setdefault(len(prompt.input_ids), []).append(prompt)
    for length in sorted(by_length):
        group = by_length[length]
        for i in range(0, len(group), batch_size):
            yield group[i:i + batch_size]


def _generation_batches(prompts: list[Prompt], batch_size: int) -> Iterator[list[Prompt]]:
    """Prompts sorted by length, `batch_size` at a time: full batches, with as little left padding as can be."""
    ordered = sorted(prompts, key=lambda p: (len(p.input_ids), p.index))
    for i in range(0, len(ordered), batch_size):
        yield ordered[i:i + batch_size]


def _generate_left_padded(model: CausalLM, group: list[Prompt], config: Any, pad: int,
                          draw: Draw | None = None) -> list[torch.Tensor]:
    """Each prompt with its greedy continuation (EOS-padded to one length), the left padding taken off.

    Prompts of several lengths share one `generate` call: a real prompt set has many lengths, and
    batching only equal ones leaves most batches nearly empty. The attention mask hides the padding and
    transformers derives the positions from it, so each row continues as it would alone (the greedy
    agreement recorded per rollout checks it). With `draw`, each step's tokens are `draw(group)`'s
    (a logits processor leaves only that token finite, so the greedy step takes it).
    """
    import torch
    from transformers import LogitsProcessorList

    device = model.get_output_embeddings().weight.device
    width = max(len(p.input_ids) for p in group)
    ids = torch.full((len(group), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(group):
        ids[row, width - len(prompt.input_ids):] = torch.tensor(prompt.input_ids, dtype=torch.long)
        mask[row, width - len(prompt.input_ids):] = 1
    processors = LogitsProcessorList([_Drawn(draw(group))] if draw is not None else [])
    with torch.no_grad():
        sequences = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                   logits_processor=processors)
    return [sequences[row, width - len(prompt.input_ids):] for row, prompt in enumerate(group)]


class _Drawn:
    """A logits processor that leaves only the drawn token of each row finite (transformers calls it with the
    step's float32 logits after its own processors; greedy decoding then takes the drawn token)."""

    def __init__(self, next_tokens: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.next_tokens = next_tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        tokens = self.next_tokens(scores).to(scores.device).long()
        return torch.full_like(scores, -torch.inf).scatter_(1, tokens[:, None], 0.0)


def generate_rollouts(model: CausalLM, prompts: list[Prompt], layer_ids: list[int], *, max_new_tokens: int,
                      batch_size: int = 8, ignore_eos: bool = False, progress: Progress | None = None,
                      states_dtype: torch.dtype | None = None, draw: Draw | None = None) -> Iterator[Rollout]:
    """Greedy continuations and their states, one `Rollout` per prompt (order: by prompt length).

    Continuations are generated `batch_size` prompts at a time (left-padded); the states are then
    captured without padding, prompts of one length together, so every stored row is exact for its
    tokens. They are kept in `states_dtype` (default bfloat16, what a rollouts folder stores). With `draw`
    the continuations are sampled by that rule instead (`Draw`).
    """
    import torch
    from transformers import GenerationConfig

    eos = _eos_ids(model, ignore_eos)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else (eos[0] if eos else 0)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    for group in _generation_batches(prompts, batch_size):
        continued = dict(zip((p.index for p in group), _generate_left_padded(model, group, config, pad, draw),
                             strict=True))
        for same_length in _batches(group, batch_size):
            sequences = torch.stack([continued[p.index] for p in same_length])
            yield from _captured(model, same_length, sequences, layer_ids, eos, states_dtype)
        if progress:
            progress(len(group))


def _captured(model: CausalLM, group: list[Prompt], sequences: torch.Tensor, layer_ids: list[int],
              eos: list[int] | None, states_dtype: torch.dtype | None) -> Iterator[Rollout]:
    """The rollouts of prompts of one length: their states from one unpadded forward."""
    import torch

    lm_head = model.get_output_embeddings().weight
    states = capture_states(model, sequences, layer_ids)  # causal: rows past EOS do not change earlier ones
    start = len(group[0].input_ids)
    dtype = states_dtype or torch.bfloat16
    for row, prompt in enumerate(group):
        length = _trimmed_length(sequences[row].tolist(), start, eos)
        rollout = Rollout(prompt.index, prompt.dataset, sequences[row, :length].cpu().clone(), start,
                          states.aux_hidden_states[row, :length].to(dtype).cpu().clone(),
                          states.final_hidden_states[row, :length].to(dtype).cpu().clone())
        rollout.greedy_agreement = greedy_agreement(states.final_hidden_states[row, :length],
                                                    sequences[row, :length], rollout.loss_mask, lm_head)
        yield rollout


def prefill_rollouts(model: PreTrainedModel, prompts: list[Prompt], layer_ids: list[int], *, batch_size: int = 8,
                     progress: Progress | None = None, states_dtype: torch.dtype | None = None) -> Iterator[Rollout]:
    """The states of each prompt's sequence as it is (no generation), with its `loss_mask` (all ones if none),
    kept in `states_dtype` (default bfloat16)."""
    import torch

    lm_head = model.get_output_embeddings().weight
    for group in _batches(prompts, batch_size):
        ids = torch.tensor([p.input_ids for p in group], dtype=torch.long, device=lm_head.device)
        states = capture_states(model, ids, layer_ids)
        for row, prompt in enumerate(group):
            yield prefill_rollout(prompt, ids[row].cpu(), states.aux_hidden_states[row].cpu(),
                                  states.final_hidden_states[row], lm_head, states_dtype=states_dtype)
        if progress:
            progress(len(group))


def prefill_rollout(prompt: Prompt, tokens: torch.Tensor, aux: torch.Tensor, final: torch.Tensor,
                    lm_head: torch.Tensor, *, states_dtype: torch.dtype | None = None) -> Rollout:
    """A `Rollout` of a given sequence: its mask (all ones if none), states kept in `states_dtype` (default bf16)."""
    import torch

    dtype = states_dtype or torch.bfloat16

    mask = torch.tensor(prompt.loss_mask if prompt.loss_mask is not None else [1] * len(prompt.input_ids),
                        dtype=torch.uint8)
    start = int(mask.nonzero()[0]) if bool(mask.any()) else len(prompt.input_ids)
    return Rollout(prompt.index, prompt.dataset, tokens.long().clone(), start, aux.to(dtype).clone(),
                   final.to(dtype).cpu().clone(), greedy_agreement(final, tokens, mask, lm_head), mask)
