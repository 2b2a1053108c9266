"""A served k larger than the block the draft was trained for (`SERVED_K_BEYOND_BLOCK`), with its measured cost.

A DSpark draft trains each slot of its block; served with more drafted tokens a step than that, the slots past
the block were never trained, and the runtimes do not refuse it: a block-5 checkpoint served with k = 7
halved its acceptance length (vllm#41834). The served k is the serving commands' (`verify --block-size`, else
the config's: a speculators `speculative_tokens`, the reference 7 for k3_dspark); the trained one is the
config's block (speculators) or the `block_size` `finetune` recorded in `training_args.json`
(`format.speculation_profile.trained_k`). Given an `eval --json` document of a k sweep (`eval --k`) or a
`speculation_profile.json`, the finding states what serving beyond the block measured: the acceptance length
at the served k against the best within the block (and the expected speedups, when the document has them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.checkpoint import CheckpointView
from dspark_hub.format.jsonio import load_json_file, object_or_raise
from dspark_hub.format.speculation_profile import accept_length_by_k, expected_speedup_by_k, trained_k
from dspark_hub.report import Finding, warning
from dspark_hub.verify.family import detect

CODE = "SERVED_K_BEYOND_BLOCK"


def read_measurement(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An `eval --json` document or a `speculation_profile.json`, as a JSON object.

    Raises:
        UsageError: not a readable JSON object, or it holds no acceptance length per k.
    """
    try:
        doc = object_or_raise(load_json_file(Path(path)), path=str(path))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: {e}; pass an eval's JSON or a speculation_profile.json", param="eval_json") from None
    if not accept_length_by_k(doc):
        raise UsageError(f"{path}: holds no acceptance length per k; pass the JSON of an eval with `ks` (a k "
                         "sweep), or a speculation_profile.json", param="eval_json")
    return doc


def _cost(served: int, trained: int, doc: Mapping[str, Any], name: str) -> str:
    """What the document measured of serving `served` against the best k up to `trained`."""
    lengths = accept_length_by_k(doc)
    within = {k: al for k, al in lengths.items() if k <= trained}
    if served not in lengths or not within:
        return f"{name} did not measure k={served} and a k up to {trained} (it has k {', '.join(map(str, lengths))})"
    best = max(within, key=lambda k: (within[k], -k))
    text = (f"measured ({name}): acceptance length {lengths[served]:.2f} at k={served}, {within[best]:.2f} at "
            f"k={best}")
    gains = expected_speedup_by_k(doc)
    if served in gains and gains:
        top = max((k for k in gains if k <= trained), key=lambda k: gains[k], default=None)
        if top is not None:
            text += f"; expected speedup {gains[served]:.2f}x at k={served}, {gains[top]:.2f}x at k={top}"
    return text


def served_k_findings(view: CheckpointView, served: int | None, measured: Mapping[str, Any] | None = None,
                      measured_name: str = "the eval") -> list[Finding]:
    """`SERVED_K_BEYOND_BLOCK` when the served k exceeds the trained one; none when either is unknown."""
    fmt, _ = detect(view.config, view.tensors)
    if fmt is None or view.config is None:
        return []
    if served is None:
        served = fmt.serving(view.config).num_speculative_tokens
    trained, source = trained_k(fmt, view.config, view.source)
    if served is None or trained is None or served <= trained:
        return []
    cost = _cost(served, trained, measured, measured_name) if measured is not None else \
        "not measured here (the eval JSON of a k sweep, or a speculation_profile.json, given to verify states it)"
    return [warning(CODE, "runtime:serving", f"serves k={served} drafted tokens a step on a draft trained to draft "
                    f"{trained} ({source}): the slots past {trained} were never trained and no runtime refuses them "
                    f"(vllm#41834: a block-5 draft served at k=7 halved its acceptance length); {cost}",
                    f"serve num_speculative_tokens {trained} or less, or train with the block you serve")]
