"""The probe's matrix: trained drafts, each convention mistake made to them as a user would make it, and the
untrained base, each probed on the same greedy paths (docs/probe.md; bench/real_probe_matrix.py prints it,
tests/test_probe_real.py keeps it right on SmolLM2 and tests/test_train.py on the toy world).

A mutant is what a wrong pipeline hands a runtime, weights whose behaviour follows another value than their config
declares: the config or one tensor changed, everything else bit for bit (`_mistakes.write_draft_copy`).

- `taps shifted`: the config's tap ids one layer off (`_mistakes.taps_mistake`): the weights follow the original
  ids, one layer away from the declared ones;
- `slot layout flipped`: speculators `sample_from_anchor` negated: the weights follow the original layout;
- `d2t written as absolute ids`: an exporter that stores the target id itself, `i + d2t[i]`: the weights follow
  "absolute ids" (unlike `_mistakes`' serving-side copy, whose no reading recovers the draft);
- `Markov output zeroed`: `markov_w2` zero, the head exported empty: the weights follow "without";
- `RoPE rows half-split` (k3_dspark): the rope rows of `q_b_proj` and `kv_a_proj_with_mqa` in rotate-half order,
  as a port from a Llama-style layout writes them: the weights follow "half-split";
- `served with a longer block`: the served k raised by two (speculators `speculative_tokens`; k3_dspark has no key,
  so the probe is told `block_size`): the weights follow the block they were trained for;
- `untrained base`: the `init` draft the trained one started from: "cannot tell" everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _mistakes import (
    D2T,
    MARKOV_OUTPUT,
    _read_tensor,
    _tensor_bytes,
    shifted_taps,
    write_config_change,
    write_draft_copy,
    write_zero_markov_output,
)

from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.train.evaluation.inputs import read_draft


@dataclass(frozen=True)
class Row:
    """One row of the matrix: a draft folder, how it was made, the served k the probe is told (None: the config's),
    and what the probe must say per convention (conventions not listed: "cannot tell")."""

    name: str
    draft: Path
    block_size: int | None = None
    truth: Mapping[str, str] | None = None      # convention -> the value the weights follow ("declared" or a value)


def write_d2t_as_absolute(src: Path, dst: Path) -> None:
    """A draft copy whose `d2t` holds the target ids `i + d2t[i]` (an exporter that wrote absolute ids)."""
    import torch

    d2t = _read_tensor(src, D2T)
    write_draft_copy(src, dst, replace={D2T: _tensor_bytes(d2t + torch.arange(d2t.numel(), dtype=d2t.dtype))})


def write_half_split_rope(src: Path, dst: Path) -> None:
    """A k3_dspark copy whose query and key rope rows are in rotate-half order: serving them half-split is serving
    the original interleaved (`expected.half_split_rope` undoes exactly this)."""
    import torch

    from dspark_hub.train.evaluation.expected import rope_rows

    config = json.loads((src / CONFIG_NAME).read_text())
    rope, nope, heads = config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["num_attention_heads"]
    order = torch.tensor(rope_rows(rope // 2))
    replace = {}
    for name in tensor_files(src):
        if name.endswith("self_attn.q_b_proj.weight"):
            weight = _read_tensor(src, name)
            per_head = weight.view(heads, nope + rope, -1).clone()
            rows = per_head[:, nope:].clone()
            per_head[:, nope:][:, order] = rows
            replace[name] = _tensor_bytes(per_head.view_as(weight))
        elif name.endswith("self_attn.kv_a_proj_with_mqa.weight"):
            weight = _read_tensor(src, name).clone()
            rows = weight[config["kv_lora_rank"]:].clone()
            weight[config["kv_lora_rank"]:][order] = rows
            replace[name] = _tensor_bytes(weight)
    write_draft_copy(src, dst, replace=replace)


def write_served_tokens(tokens: int) -> Callable[[Path, Path], None]:
    """A speculators draft copy whose `speculative_tokens` is `tokens` (served with another k than trained)."""
    def write(src: Path, dst: Path) -> None:
        config = json.loads((src / CONFIG_NAME).read_text())
        config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = tokens
        write_draft_copy(src, dst, config=config)
    return write


def mutants(trained: Path, base: Path | None, work: Path, target_layers: int) -> list[Row]:
    """The trained draft, every mutant that applies to it (written into `work`), and the untrained base."""
    draft = read_draft(trained)
    fmt, config, weights = draft.format, draft.config, set(tensor_files(trained))
    rows = [Row("trained", trained, truth={})]

    def add(name: str, write: Callable[[Path, Path], None], truth: Mapping[str, str], **options: Any) -> None:
        out = work / name.replace(" ", "-")
        write(trained, out)
        rows.append(Row(name, out, truth=truth, **options))

    shifted, shift = shifted_taps(draft.taps, target_layers)
    if min(shifted) >= 0:
        word = "one layer later" if shift == -1 else "one layer earlier"      # the original, seen from the copy
        add(f"taps shifted {shift:+d}", write_config_change(fmt.taps_key, fmt.to_native_taps(shifted)),
            {"taps": word})
    if fmt.anchor_layout_key is not None:
        value = bool(config[fmt.anchor_layout_key])
        add("slot layout flipped", write_config_change(fmt.anchor_layout_key, not value),
            {"slot_layout": json.dumps(value)})
    if D2T in weights:
        add("d2t written as absolute ids", write_d2t_as_absolute, {"d2t": "absolute ids"})
    if MARKOV_OUTPUT in weights:
        add("Markov output zeroed", write_zero_markov_output, {"markov": "without"})
    if fmt.rope_pairing is not None:
        add("RoPE rows half-split", write_half_split_rope, {"rope": "half-split"})
    if fmt.anchor_layout_key is not None:
        add(f"served k = {draft.k + 2}", write_served_tokens(draft.k + 2), {"block": f"k = {draft.k}"})
    else:
        rows.append(Row(f"served k = {draft.k + 2}", trained, block_size=draft.k + 2,
                        truth={"block": f"k = {draft.k}"}))
    if base is not None:
        rows.append(Row("untrained base", base, truth=None))
    return rows


def verdict_of(result: Any, key: str) -> str:
    """A convention's verdict as the matrix shows it: "as declared", the value named (its first words), or
    "cannot tell"; "-" where the convention does not apply."""
    found = next((c for c in result.conventions if c.key == key), None)
    if found is None:
        return "-"
    if found.verdict == "other":
        return str(found.follows).split(":")[0].split(" (")[0]
    return str(found.verdict)


def matches(truth: Mapping[str, str] | None, result: Any, key: str) -> bool:
    """Whether the probe's verdict on `key` is right: the named value where the row has one, never a wrong name
    (a convention a young draft cannot show may stay "cannot tell"), and "cannot tell" for the untrained base."""
    said = verdict_of(result, key)
    if said == "-":
        return True
    if truth is None:
        return said == "cannot tell"
    expected = truth.get(key, "as declared")
    return said in (expected, "cannot tell")


CONVENTIONS = ("taps", "slot_layout", "final_norm", "d2t", "markov", "block", "rope")
