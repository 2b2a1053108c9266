"""How a card reads a value from someone else's JSON (an eval, a training log, a probe) and shows it: strict JSON,
the first of a value's aliases, a value as text, and a harness value with local paths replaced by what a reader may
see (a Hub id or digests)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError
from dspark_hub.format.jsonio import load_json_file
from dspark_hub.format.provenance import describe, is_hub_id


def read_json(path: Path) -> Any:
    try:
        return load_json_file(path)
    except CheckpointNotFoundError:
        raise UsageError(f"{path}: no such file; pass an existing evaluation JSON") from None
    except CheckpointFormatError as e:
        raise UsageError(f"{path}: {e.detail}; pass the output of 'dspark-hub eval --json'") from None


def first(mapping: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if mapping.get(name) is not None:
            return mapping[name]
    return None


def as_text(value: Any) -> str:
    if isinstance(value, Mapping):
        repo = value.get("repo") or value.get("repo_id") or value.get("name")
        rev = value.get("revision") or value.get("sha256") or value.get("digest")
        if repo:
            return f"{repo}@{rev}" if rev else str(repo)
        return ", ".join(f"{k} {as_text(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(as_text(v) for v in value)
    return str(value)


#: Harness labels whose values may be local paths.
_PATH_LABELS = {"teacher": "a local folder", "reference": "a local draft"}
#: `teacher_identity.label` of a folder without a Hub id: `name (sha256 config.json 1a2b..., ...)`.
_DIGEST_LABEL = re.compile(r"^.*?\((sha256 .+)\)$")
#: `eval`'s reference: `path (acceptance length 1.2345; ratio 1.0123)`.
_REFERENCE = re.compile(r"^(?P<what>.*?) \((?P<how>acceptance length .*)\)$")


def public_text(label: str, value: Any) -> str:
    """A harness value as a card may show it: a teacher or reference path becomes its Hub id or digests."""
    if label not in _PATH_LABELS:
        return as_text(value)
    if isinstance(value, Mapping):       # a TeacherIdentity: repo@revision, else its file digests
        repo = value.get("repo")
        if repo:
            return f"{repo}@{value['revision']}" if value.get("revision") else str(repo)
        named = describe({"sha256": value.get("digests")}) if isinstance(value.get("digests"), Mapping) else None
        return named or _PATH_LABELS[label]
    text = str(value)
    reference = _REFERENCE.match(text) if label == "reference" else None
    if reference:
        return f"{public_name(label, reference['what'])} ({reference['how']})"
    return public_name(label, text)


def public_name(label: str, text: str) -> str:
    """Digests or a Hub id, else what the value stands for (`a local draft`).

    `eval` records its reference as `describe(identify(...))`: digests, or `org/name@revision` for
    a Hub snapshot. A bare `org/name` there is an older file's path (`toy/base` reads as both).
    A teacher written by hand in `card.yaml` may be a bare Hub id, unless it names a local folder.
    """
    if text.startswith("sha256 "):
        return text
    trusted = "@" in text if label == "reference" else not Path(text).exists()
    if is_hub_id(text) and trusted:
        return text
    digests = _DIGEST_LABEL.match(text)
    return digests.group(1) if digests else _PATH_LABELS[label]
