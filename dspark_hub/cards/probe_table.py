"""`dspark-hub probe --json` read into the card's table of conventions checked by behaviour."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.cards.values import as_text, public_text, read_json
from dspark_hub.errors import UsageError


@dataclass(frozen=True)
class ProbeRow:
    """One convention as `dspark-hub probe` judged it, as a card shows it."""

    convention: str
    declared: str
    verdict: str                    # "as declared", the value the weights follow, or "cannot tell"
    statistic: str                  # the paired difference of the named (or closest) value, with its error


@dataclass
class ProbeCheck:
    """The conventions checked by behaviour (`dspark-hub probe --json`), for the results section."""

    rows: list[ProbeRow]
    anchors: int
    paths: int
    target: str
    rule: str
    above_untrained: bool


PROBE_SCHEMA = "dspark-hub/probe/1"


def load_probe(path: str | os.PathLike[str]) -> ProbeCheck:
    """Read `dspark-hub probe --json` output into the card's conventions table (the target by its Hub id or
    digests, never its path).

    Raises:
        UsageError: the file is missing, not JSON, or not a probe document.
    """
    p = Path(path)
    doc = read_json(p)
    if not isinstance(doc, Mapping) or doc.get("schema") != PROBE_SCHEMA or not isinstance(doc.get("conventions"),
                                                                                         list):
        raise UsageError(f"{p}: not a probe document (schema {PROBE_SCHEMA}); pass 'dspark-hub probe --json' output")
    rows = []
    for entry in doc["conventions"]:
        shown = {"other": entry.get("follows")}.get(entry.get("verdict"), entry.get("verdict"))
        named = [c for c in entry.get("candidates", []) if c.get("difference") is not None]
        chosen = next((c for c in named if c.get("value") == entry.get("follows")), None) or \
            max(named, key=lambda c: c.get("z") if isinstance(c.get("z"), (int, float)) else float("-inf"),
                default=None)
        statistic = "-" if chosen is None else (f"{as_text(chosen.get('value'))}: {chosen['difference']:+.5f} "
                                                f"± {chosen.get('standard_error') or 0:.5f}")
        rows.append(ProbeRow(as_text(entry.get("title")), as_text(entry.get("declared")), as_text(shown), statistic))
    decision: Mapping[str, Any] = doc["decision"] if isinstance(doc.get("decision"), Mapping) else {}
    untrained: Mapping[str, Any] = doc["untrained"] if isinstance(doc.get("untrained"), Mapping) else {}
    rule = (f"a value is named when its paired difference in expected accepted drafts per anchor clears "
            f"{decision.get('z', 4):g} standard errors and {decision.get('material', 0.01):.0%} of the draft's gain "
            "over its untrained level")
    return ProbeCheck(rows, int(doc.get("anchors") or 0), int(doc.get("paths") or 0),
                      public_text("teacher", doc.get("target_identity") or doc.get("target")), rule,
                      bool(untrained.get("above")))
