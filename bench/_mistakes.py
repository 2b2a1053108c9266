"""The classic export and serving convention mistakes, each as a mutation of an artifact (docs/convention-mistakes.md).

A mistake is what a wrong pipeline would hand a runtime: a copy of a trained draft folder with one config
key or tensor changed, or a copy of the held-out rollouts with the last tap's rows captured the other way.
Every writer here goes through the project's writers (`format.writer.atomic_dir`, `write_weights_like`):
the copy is built in a temporary sibling and renamed, the input is only read, and the weights not named
are copied bit for bit.

- `taps shifted`: every tap id one layer off (`target_layer_ids`, or speculators `aux_hidden_state_layer_ids`),
  +1, or -1 when +1 would leave the target (a draft that taps the final layer);
- `slot layout flipped`: speculators `sample_from_anchor` negated (k3_dspark has no such key: its block
  layout is fixed by the format);
- `final norm on last tap`: the held-out rollouts' last tap replaced by the target's final-normed state
  (what transformers' `hidden_states[-1]` gives), where the draft taps the final layer;
- `d2t read as absolute`: a pruned speculators vocabulary served as draft id i -> target id d2t[i]
  instead of i + d2t[i] (the copy stores d2t[i] - i, which the correct reading maps to d2t[i]);
- `Markov bias dropped`: `markov_w2` zeroed, which is what a runtime that ignores `markov_head.*` computes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.registry import DraftFormat
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.format.writer import atomic_dir, write_weights_like
from dspark_hub.train.data.rollouts import MANIFEST
from dspark_hub.train.evaluation.inputs import read_draft

MARKOV_OUTPUT = "markov_head.markov_w2.weight"
D2T = "d2t"


@dataclass(frozen=True)
class Mistake:
    """One convention mistake as it applies to one draft: what it is, and how its artifact is written."""

    key: str                      # short name, the JSON key and the work-folder name
    title: str
    mutates: str                  # "draft" (a draft-folder copy) or "data" (a held-out rollouts copy)
    change: str                   # what the copy changes, in words
    reason_not_applicable: str | None = None
    write: Callable[[Path, Path], None] | None = None   # (source, destination)

    @property
    def applicable(self) -> bool:
        return self.reason_not_applicable is None


# ------------------------------------------------------------------------------------- writers


def _tensor_bytes(tensor: Any) -> bytes:
    """A tensor's raw little-endian bytes, as safetensors stores them."""
    import torch

    return bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def _read_tensor(folder: Path, name: str) -> Any:
    from safetensors import safe_open

    with safe_open(str(tensor_files(folder)[name]), framework="pt") as handle:
        return handle.get_tensor(name)


def write_draft_copy(src: Path, dst: Path, *, config: Mapping[str, Any] | None = None,
                     replace: Mapping[str, bytes] | None = None) -> None:
    """`src`'s weights (some tensors' bytes replaced) and config (or `config`) into a new folder `dst`: what eval
    reads; the training log and init notes stay behind."""
    with atomic_dir(dst) as tmp:
        write_weights_like(src, tmp, replace or {})
        if config is not None:
            (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def write_config_change(key: str, value: Any) -> Callable[[Path, Path], None]:
    """A writer of a draft copy whose config has `key` set to `value`."""
    def write(src: Path, dst: Path) -> None:
        config = json.loads((src / CONFIG_NAME).read_text(encoding="utf-8"))
        write_draft_copy(src, dst, config={**config, key: value})
    return write


def write_zero_markov_output(src: Path, dst: Path) -> None:
    """A draft copy whose Markov output matrix is zero: the Markov bias W2 e is 0 for every predecessor."""
    nbytes = _read_tensor(src, MARKOV_OUTPUT).nbytes
    write_draft_copy(src, dst, replace={MARKOV_OUTPUT: bytes(nbytes)})


def write_d2t_read_as_absolute(src: Path, dst: Path) -> None:
    """A draft copy whose `d2t` makes the correct reading (i + d2t'[i]) give the mistaken one (d2t[i])."""
    import torch

    d2t = _read_tensor(src, D2T)
    mistaken = d2t - torch.arange(d2t.numel(), dtype=d2t.dtype)
    write_draft_copy(src, dst, replace={D2T: _tensor_bytes(mistaken)})


def normed_last_tap(aux: Any, final: Any, hidden: int) -> Any:
    """`aux` `[T, n*H]` with its last H columns replaced by the final-normed states `final` `[T, H]`."""
    out = aux.clone()
    out[:, -hidden:] = final
    return out


def write_rollouts_with_normed_last_tap(src: Path, dst: Path) -> None:
    """A copy of a rollouts folder whose last tap rows are the target's final-normed states.

    The project captures a tap of the final layer as vLLM does, before the final norm; transformers'
    `hidden_states[-1]` is after it. The rollouts already hold that normed state (`final_hidden_states`,
    the input of the target's lm_head), so the copy takes it from there.
    """
    from safetensors import safe_open

    replace: dict[str, bytes] = {}
    for file in sorted(set(tensor_files(src).values())):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():   # noqa: SIM118 (safe_open is no mapping)
                if not name.endswith(".aux_hidden_states"):
                    continue
                final = handle.get_tensor(name.replace(".aux_hidden_states", ".final_hidden_states"))
                replace[name] = _tensor_bytes(normed_last_tap(handle.get_tensor(name), final, final.shape[-1]))
    with atomic_dir(dst) as tmp:
        write_weights_like(src, tmp, replace)
        shutil.copyfile(src / MANIFEST, tmp / MANIFEST)


# ------------------------------------------------------------------------------------- which apply


def shifted_taps(taps: list[int], target_layers: int) -> tuple[list[int], int]:
    """Every tap one layer later, or one earlier when a later one would leave the target: (taps, shift)."""
    shift = 1 if max(taps) + 1 < target_layers else -1
    return [t + shift for t in taps], shift


def taps_mistake(fmt: DraftFormat, config: Mapping[str, Any], taps: list[int], target_layers: int) -> Mistake:
    shifted, shift = shifted_taps(taps, target_layers)
    if min(shifted) < 0:
        return Mistake("taps_shifted", "taps shifted by one", "draft", "",
                       f"taps {taps} span the whole target: no shift by one stays inside it")
    native = fmt.to_native_taps(shifted)
    change = (f"{fmt.taps_key} {list(config[fmt.taps_key])} -> {native} ({shift:+d}"
              + ("" if shift == 1 else f": +1 would tap layer {target_layers}, past the target's last")
              + "); held-out rollouts re-captured with the shifted taps")
    return Mistake("taps_shifted", "taps shifted by one", "draft", change,
                   write=write_config_change(fmt.taps_key, native))


def slot_layout_mistake(fmt: DraftFormat, config: Mapping[str, Any]) -> Mistake:
    key = fmt.anchor_layout_key
    if key is None:
        return Mistake("slot_layout_flipped", "slot layout flipped", "draft", "",
                       f"{fmt.title} has no slot-layout key: the format fixes its block layout (slot k of "
                       "[anchor, mask, ...] predicts the token k + 1 after the anchor, speculators' "
                       "sample_from_anchor true), so no config can flip it")
    value = bool(config[key])
    return Mistake("slot_layout_flipped", "slot layout flipped", "draft", f"{key} {value} -> {not value}",
                   write=write_config_change(key, not value))


def final_norm_mistake(taps: list[int], target_layers: int) -> Mistake:
    if taps[-1] != target_layers - 1:
        return Mistake("final_norm_on_last_tap", "final norm applied to the last tap", "data", "",
                       f"the last tap is layer {taps[-1]}, not the final layer {target_layers - 1}: no norm sits "
                       "between it and the next layer's input")
    return Mistake("final_norm_on_last_tap", "final norm applied to the last tap", "data",
                   f"held-out rollouts: the last tap (layer {taps[-1]}, the final layer) replaced by the target's "
                   "final-normed state, as transformers' hidden_states[-1] gives it",
                   write=write_rollouts_with_normed_last_tap)


def d2t_mistake(weights: set[str]) -> Mistake:
    if D2T not in weights:
        return Mistake("d2t_absolute", "d2t read as absolute ids", "draft", "",
                       "no pruned vocabulary (no d2t tensor): draft ids are target ids")
    return Mistake("d2t_absolute", "d2t read as absolute ids", "draft",
                   "d2t[i] -> d2t[i] - i, so draft id i is served as target id d2t[i] instead of i + d2t[i]",
                   write=write_d2t_read_as_absolute)


def markov_mistake(weights: set[str]) -> Mistake:
    if MARKOV_OUTPUT not in weights:
        return Mistake("markov_dropped", "Markov bias dropped", "draft", "", "the draft has no Markov head")
    return Mistake("markov_dropped", "Markov bias dropped", "draft",
                   f"{MARKOV_OUTPUT} zeroed (the bias a runtime that ignores markov_head.* adds: none)",
                   write=write_zero_markov_output)


def mistakes_for(draft: Path, target_layers: int) -> list[Mistake]:
    """Every mistake, as it applies to this draft (format, taps, vocabulary, heads) on a target of that depth."""
    under_test = read_draft(draft)
    weights = set(tensor_files(draft))
    return [taps_mistake(under_test.format, under_test.config, under_test.taps, target_layers),
            slot_layout_mistake(under_test.format, under_test.config),
            final_norm_mistake(under_test.taps, target_layers),
            d2t_mistake(weights),
            markov_mistake(weights)]


def target_layers(target: Path) -> int:
    """The target's decoder-layer count (its config's `num_hidden_layers`, a nested text config's first)."""
    from dspark_hub.format.taps import text_config

    return int(text_config(json.loads((target / CONFIG_NAME).read_text(encoding="utf-8")))["num_hidden_layers"])


# ------------------------------------------------------------------------------------- the paired measure


def expected_accepted(draft: Path, data: Path, target: Path) -> Any:
    """Per held-out anchor, the expected number of accepted drafts if each slot were sampled from the draft.

    The product's measure (`dspark_hub.train.evaluation.expected`, which `dspark-hub probe` decides by), on the
    taps the rollouts folder stores: teacher-forced on the rollouts' greedy path, as the draft is served (the
    format's block layout, its Markov head chained on the true tokens, its vocabulary map): with `q_i` the
    probability the draft gives the path's token `i + 1` after the anchor, the value is `sum_i prod_{j <= i} q_j`.
    It uses every anchor of every held-out sequence and the draft's probabilities, not only its argmax, so two
    drafts measured on the same anchors differ by far less noise than their greedy acceptance.

    Returns:
        A float64 tensor, one value per anchor (sequence by sequence, anchor by anchor).
    """
    import torch

    from dspark_hub.train.evaluation.expected import Scorer
    from dspark_hub.train.evaluation.expected import expected_accepted as per_anchor
    from dspark_hub.train.evaluation.greedy_paths import stored_paths
    from dspark_hub.train.target.target import Target

    scorer = Scorer.open(read_draft(draft), Target.open(target))
    declared = scorer.declared()
    slots = scorer.slot_values(stored_paths(data), [declared])[declared]
    return torch.cat([per_anchor(q) for q in slots])


def paired_z(good: Any, bad: Any) -> float:
    """How many standard errors the mean per-anchor difference `good - bad` lies above zero (paired, each anchor a
    unit: `expected.paired` with runs of one)."""
    from dspark_hub.train.evaluation.expected import paired

    return paired([bad], [good], run=1).z
