"""The serving tables of an eval JSON a card renders: acceptance and expected speedup per k (`eval --k`), and the
confidence head's calibration (`eval`'s `calibration`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dspark_hub.cards.labels import AcceptanceLabel
from dspark_hub.errors import UsageError


@dataclass(frozen=True)
class SweepRow:
    """One k of `eval --k`: its acceptance length and, with costs, the expected speedup and the two costs."""

    k: int
    acceptance_length: float | None
    draft_cost: float | None = None
    verify_cost: float | None = None
    expected_speedup: float | None = None


@dataclass
class SweepTable:
    """Acceptance per k, and the expected speedup with the label of its costs (an estimate)."""

    rows: list[SweepRow]
    label: AcceptanceLabel | None = None
    speedup_label: str | None = None
    best_k: int | None = None

    @property
    def has_speedup(self) -> bool:
        return any(r.expected_speedup is not None for r in self.rows)


@dataclass(frozen=True)
class CalibrationRow:
    """One draft position: the confidence head's mean estimated survival against the acceptance observed."""

    position: int
    drafts: int
    estimated: float
    observed: float
    ece: float


@dataclass
class CalibrationTable:
    """The confidence head's calibration at the eval's k (`eval`'s `calibration`)."""

    k: int
    rows: list[CalibrationRow]
    ece: float
    calibrated: bool
    threshold: float
    label: AcceptanceLabel | None = None

    @property
    def line(self) -> str:
        verdict = "calibrated" if self.calibrated else "not calibrated"
        return (f"Calibration: the confidence head's estimated prefix survival (the product of its per-slot "
                f"estimates) against the acceptance observed at k={self.k}; expected calibration error "
                f"{self.ece:.3f} over all positions, {verdict} (calibrated at {self.threshold} or less).")


def _number_at(value: Any, where: str) -> float | None:
    if value is None:
        return None
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None:
        raise UsageError(f"{where}: {json.dumps(value)} is not a number; pass the output of 'dspark-hub eval --json'")
    return number


def _by_k(block: Any) -> dict[int, Mapping[str, Any]]:
    rows = block.get("by_k") if isinstance(block, Mapping) else None
    return {int(k): v for k, v in rows.items() if str(k).isdigit() and isinstance(v, Mapping)} \
        if isinstance(rows, Mapping) else {}


def sweep_table(doc: Mapping[str, Any], where: str, label: AcceptanceLabel | None) -> SweepTable | None:
    """`eval --k` and `speedup`: one row per k, the acceptance label over the k range."""
    lengths, speed = _by_k(doc.get("sweep")), _by_k(doc.get("speedup"))
    ks = sorted(set(lengths) | set(speed))
    if not ks:
        return None
    rows = []
    for k in ks:
        at = f"{where}:k {k}"
        gain = speed.get(k, {})
        length = (lengths.get(k) or gain).get("acceptance_length")
        rows.append(SweepRow(k, _number_at(length, f"{at} acceptance_length"),
                             _number_at(gain.get("draft_cost"), f"{at} draft_cost"),
                             _number_at(gain.get("verify_cost"), f"{at} verify_cost"),
                             _number_at(gain.get("expected_speedup"), f"{at} expected_speedup")))
    if label is not None:
        label = replace(label, k=ks[0], k_range=None) if len(ks) == 1 else replace(label, k=None,
                                                                                     k_range=(ks[0], ks[-1]))
    found = doc.get("speedup")
    speedup: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    best = speedup.get("best_k")
    return SweepTable(rows, label, str(speedup["label"]) if speedup.get("label") else None,
                      best if isinstance(best, int) and not isinstance(best, bool) else None)


def calibration_table(doc: Mapping[str, Any], where: str, label: AcceptanceLabel | None) -> CalibrationTable | None:
    block = doc.get("calibration")
    if not isinstance(block, Mapping) or not isinstance(block.get("positions"), list):
        return None
    rows = []
    for i, entry in enumerate(block["positions"]):
        at = f"{where}:calibration.positions[{i}]"
        values = [_number_at(entry.get(key), f"{at} {key}") if isinstance(entry, Mapping) else None
                  for key in ("position", "drafts", "estimated", "observed", "ece")]
        if any(v is None for v in values):
            raise UsageError(f"{at}: needs position, drafts, estimated, observed and ece; pass the output of "
                             "'dspark-hub eval --json'")
        position, drafts, estimated, observed, ece = values
        assert position is not None and drafts is not None and estimated is not None and observed is not None \
            and ece is not None    # checked just above, for the type checker
        rows.append(CalibrationRow(int(position), int(drafts), estimated, observed, ece))
    ece = _number_at(block.get("ece"), f"{where}:calibration.ece")
    threshold = _number_at(block.get("calibrated_below"), f"{where}:calibration.calibrated_below")
    k = block.get("k")
    if ece is None or threshold is None or not isinstance(k, int) or not rows:
        return None
    return CalibrationTable(k, rows, ece, ece <= threshold, threshold, label)
