"""`dspark-hub compare A.json B.json`: two acceptance measurements of the same prompts, paired, as a regression gate.

Two eval documents (`eval --json`, schema `dspark-hub/eval/3`: two drafts, two revisions of one draft, one
draft under two engines or engine versions, greedy or sampled) are compared prompt by prompt: each prompt's
drafts and accepted tokens are summed over its samples, and the difference B - A in acceptance length and in
each per-position rate gets a paired 95% interval over prompts (`acceptance_intervals.paired_difference`, the
linearized ratio of totals with prompts as clusters: what two measurements share, the prompt and with the same
seed the sampled path, cancels). When both documents carry the expected acceptance (simulations), that is the
number the gate reads (unbiased for the same acceptance, lower variance); the counts' difference is reported
beside it.

Refused, in one line: documents without units (`eval/2`), different prompt sets, k, output budget, decoding
(temperature, truncation, drafting method: the seed and the sample count may differ) or target.

`fail_if_worse=DELTA`: the comparison fails (exit 1) only when B is worse than A by more than DELTA with 95%
confidence: the interval's upper end lies below -DELTA.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError
from dspark_hub.format.jsonio import load_json_file
from dspark_hub.train.evaluation.acceptance_intervals import Interval, paired_difference
from dspark_hub.train.evaluation.units import LEVEL, by_prompt

#: The decoding keys two documents must share (`sampling`; a /2 document is greedy).
DECODING_KEYS = ("temperature", "top_k", "top_p", "min_p", "draft_sample_method")
GREEDY_DECODING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "draft_sample_method": "greedy"}
#: Prompts listed as the ones that moved most.
MOVERS = 5
#: How the interval of `ratio_b - ratio_a` is computed from `(num_a, den_a, num_b, den_b)`, `[prompt][1]` units.
DifferenceRule = Callable[..., Interval]


@dataclass(frozen=True)
class Side:
    """One eval document as compared: where it came from, its units, and what it measured."""

    path: str
    doc: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def has_expected(self) -> bool:
        return bool(self.doc.get("engine", "simulated") == "simulated")

    @property
    def label(self) -> str:
        harness = self.doc.get("harness") or {}
        return f"{self.path} ({harness.get('engine') or self.doc.get('engine', 'simulated')})"


@dataclass(frozen=True)
class Change(Document):
    """One number in A and in B, and the interval of B - A."""

    a: float
    b: float
    difference: Interval


@dataclass
class Comparison(Document):
    """What `dspark-hub compare` reports; its document is the `--json` output."""

    SCHEMA = schemas.command("compare")
    KEYS = ("ok", "worse", "fail_if_worse", "gated_on", "a", "b", "k", "prompts", "decoding", "acceptance_length",
            "per_position", "counts", "by_dataset", "movers", "level", "method")

    a: str
    b: str
    k: int
    prompts: int
    decoding: str
    gated_on: str                         # "expected" or "counts"
    acceptance_length: Change
    per_position: list[Change]
    counts: Change                   # the counts' AL difference (what a measurement by vLLM gives)
    by_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    movers: list[dict[str, Any]] = field(default_factory=list)
    fail_if_worse: float | None = None
    level: float = LEVEL

    @property
    def method(self) -> str:
        return self.acceptance_length.difference.method

    @property
    def worse(self) -> bool:
        """B is worse than A by more than `fail_if_worse` with 95% confidence (False without a gate)."""
        return self.fail_if_worse is not None and self.acceptance_length.difference.high < -self.fail_if_worse

    @property
    def ok(self) -> bool:
        return not self.worse


def read_side(path: str | os.PathLike[str], param: str) -> Side:
    """An eval document with its units, or a one-line refusal naming the file."""
    try:
        doc = load_json_file(path)
    except CheckpointNotFoundError:
        raise UsageError(f"{path}: no such file; pass the output of 'dspark-hub eval --json'", param=param) from None
    except CheckpointFormatError as e:
        raise UsageError(f"{path}: {e.detail}; pass the output of 'dspark-hub eval --json'", param=param) from None
    if not isinstance(doc, dict) or doc.get("schema") not in schemas.EVAL_READ:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"{path}: is {found!r}, not an eval document; pass 'dspark-hub eval --json' output",
                         param=param)
    records = doc.get("units")
    if not isinstance(records, list) or not records:
        raise UsageError(f"{path}: a {doc['schema']} document has no per-prompt units to pair; measure it again "
                         f"with this version's eval ({schemas.command('eval')})", param=param)
    return Side(str(path), doc, records)


def _decoding(doc: Mapping[str, Any]) -> dict[str, Any]:
    sampling = doc.get("sampling") or GREEDY_DECODING
    return {key: sampling.get(key, GREEDY_DECODING[key]) for key in DECODING_KEYS}


def _target(doc: Mapping[str, Any]) -> Any:
    harness = doc.get("harness") or {}
    identity = harness.get("teacher_identity")
    return identity.get("digests") or identity.get("label") if isinstance(identity, Mapping) else harness.get("teacher")


def refuse_unpaired(a: Side, b: Side) -> None:
    """The one-line refusals: what makes two documents measurements of different things."""
    if a.doc.get("k") != b.doc.get("k"):
        raise UsageError(f"{a.path} drafts k={a.doc.get('k')} a step, {b.path} k={b.doc.get('k')}; compare "
                         "measurements at the same k", param="b")
    if _decoding(a.doc) != _decoding(b.doc):
        differ = [f"{key} {_decoding(a.doc)[key]} against {_decoding(b.doc)[key]}" for key in DECODING_KEYS
                  if _decoding(a.doc)[key] != _decoding(b.doc)[key]]
        raise UsageError(f"{a.path} and {b.path} decode differently ({'; '.join(differ)}); compare measurements "
                         "of the same sampling (the seed and the samples may differ)", param="b")
    if _target(a.doc) != _target(b.doc):
        raise UsageError(f"{a.path} and {b.path} were measured against different targets; compare measurements "
                         "of one target", param="b")
    budgets = [(side.doc.get("harness") or {}).get("max_new_tokens") for side in (a, b)]
    if budgets[0] != budgets[1]:
        raise UsageError(f"{a.path} gives each prompt {budgets[0]} output tokens, {b.path} {budgets[1]}; compare "
                         "measurements with the same max_new_tokens", param="b")
    keys_a, keys_b = set(by_prompt(a.records)), set(by_prompt(b.records))
    if keys_a != keys_b:
        raise UsageError(f"{a.path} and {b.path} measured different prompts ({len(keys_a - keys_b)} only in A, "
                         f"{len(keys_b - keys_a)} only in B); compare measurements of the same prompts file",
                         param="b")


def _per_prompt(side: Side, keys: Sequence[str], numbers: str) -> tuple[list[list[float]], list[list[list[float]]]]:
    """`([prompt][1] drafts, [prompt][1][i] accepted)`: each prompt's samples summed, in the order of `keys`."""
    groups = by_prompt(side.records)
    drafts, accepted = [], []
    for key in keys:
        records = groups[key]
        drafts.append([float(sum(r["drafts"] for r in records))])
        accepted.append([[float(sum(col)) for col in zip(*(r[numbers] for r in records), strict=True)]])
    return drafts, accepted


def _difference(a: Side, b: Side, keys: Sequence[str], numbers: str, difference: DifferenceRule) -> list[Change]:
    """[AL, position 1, ..., position k] of B - A over the prompts `keys`, paired."""
    den_a, acc_a = _per_prompt(a, keys, numbers)
    den_b, acc_b = _per_prompt(b, keys, numbers)
    k = len(acc_a[0][0])
    out = []
    for i in [None, *range(k)]:
        num_a = [[sum(row[0]) if i is None else row[0][i]] for row in acc_a]
        num_b = [[sum(row[0]) if i is None else row[0][i]] for row in acc_b]
        interval = difference(num_a, den_a, num_b, den_b, level=LEVEL, over="prompts")
        ratio_a = sum(r[0] for r in num_a) / sum(r[0] for r in den_a)
        ratio_b = sum(r[0] for r in num_b) / sum(r[0] for r in den_b)
        shift = 1.0 if i is None else 0.0
        out.append(Change(ratio_a + shift, ratio_b + shift, interval))
    return out


def _movers(a: Side, b: Side, keys: Sequence[str], numbers: str) -> list[dict[str, Any]]:
    """The prompts whose AL moved most (B - A), largest change first."""
    groups_a, groups_b = by_prompt(a.records), by_prompt(b.records)
    moved: list[dict[str, Any]] = []
    for key in keys:
        al = []
        for records in (groups_a[key], groups_b[key]):
            drafts = sum(r["drafts"] for r in records)
            al.append(1.0 + sum(sum(r[numbers]) for r in records) / drafts if drafts else math.nan)
        record = groups_a[key][0]
        moved.append({"prompt_key": key, "prompt_index": record.get("prompt_index"), "dataset": record.get("dataset"),
                      "a": al[0], "b": al[1], "difference": al[1] - al[0]})
    moved = [m for m in moved if not math.isnan(float(m["difference"]))]
    return sorted(moved, key=lambda m: abs(float(m["difference"])), reverse=True)[:MOVERS]


def compare(a: str | os.PathLike[str], b: str | os.PathLike[str], *, fail_if_worse: float | None = None,
            difference: DifferenceRule = paired_difference) -> Comparison:
    """B against A, paired over prompts (module docstring).

    Args:
        a, b: `eval --json` documents (`dspark-hub/eval/3`) of the same prompts, k, decoding and target.
        fail_if_worse: DELTA >= 0: `ok` is False when B's AL is below A's by more than DELTA with 95% confidence.
        difference: how the interval of a difference is computed (tests pass an unpaired twin).

    Raises:
        UsageError: a file that is not an eval document with units, or two that measure different things.
    """
    if fail_if_worse is not None and not (fail_if_worse >= 0 and math.isfinite(fail_if_worse)):
        raise UsageError(f"{fail_if_worse}; pass a difference in acceptance length >= 0, e.g. 0.02",
                         param="fail_if_worse")
    side_a, side_b = read_side(a, "a"), read_side(b, "b")
    refuse_unpaired(side_a, side_b)
    keys = list(by_prompt(side_a.records))
    if len(keys) < 2:
        raise UsageError(f"{side_a.path}: {len(keys)} prompt; a paired interval needs 2 or more", param="a")
    gated_on = "expected" if side_a.has_expected and side_b.has_expected else "counts"
    field_name = "expected_per_position" if gated_on == "expected" else "accepted_per_position"
    numbers = _difference(side_a, side_b, keys, field_name, difference)
    counts = numbers[0] if gated_on == "counts" else _difference(side_a, side_b, keys, "accepted_per_position",
                                                                   difference)[0]
    by_dataset: dict[str, dict[str, Any]] = {}
    datasets = sorted({str(r["dataset"]) for r in side_a.records if r.get("dataset") is not None})
    for name in datasets:
        inside = [key for key in keys if by_prompt(side_a.records)[key][0].get("dataset") == name]
        if len(inside) >= 2:
            by_dataset[name] = {"prompts": len(inside),
                                **_difference(side_a, side_b, inside, field_name, difference)[0].to_dict()}
    decoding = (side_a.doc.get("sampling") or {}).get("describe", "greedy")
    return Comparison(a=side_a.label, b=side_b.label, k=int(side_a.doc["k"]), prompts=len(keys), decoding=decoding,
                      gated_on=gated_on, acceptance_length=numbers[0], per_position=numbers[1:], counts=counts,
                      by_dataset=by_dataset, movers=_movers(side_a, side_b, keys, field_name),
                      fail_if_worse=fail_if_worse)
