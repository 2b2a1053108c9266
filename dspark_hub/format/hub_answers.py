"""What the Hub's answers to the routes dspark-hub uses look like, checked before huggingface_hub parses them.

huggingface_hub trusts an answer's shape: a tree listing that is an object, an entry without a `path`, an
empty `lfs` object or a `null` size end in a `KeyError` or `TypeError` deep inside it, or in a listing that
is silently wrong. `checker(method, path, status)` gives the check of a route's answer (None for a route not
checked); a check returns what is wrong, in words, or None. `format.hub_http` runs it on every answer of a
network scope.

Parsed by the strict loader (`jsonio.loads_strict`): a repeated key is refused, not resolved to its last value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format.jsonio import loads_strict

#: A check of an answer's body (bytes, Content-Type): what is wrong, or None.
Check = Callable[[bytes, str], "str | None"]

_REPO = r"/api/(?:models|datasets|spaces)/[^/]+/[^/]+"
_HEX40 = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _count(value: object) -> bool:
    """A byte count: a JSON integer, not negative (not a boolean, a float or null)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _repo_path(path: str) -> bool:
    """A path inside a repository: relative, no empty, `.` or `..` part, no control character."""
    return (not path.startswith("/") and "\\" not in path and not any(ord(c) < 0x20 or ord(c) == 0x7f for c in path)
            and all(part not in ("", ".", "..") for part in path.split("/")))


def _shown(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse(body: bytes, content_type: str) -> tuple[Any, str | None]:
    """The JSON document of an answer, or (None, what it is instead)."""
    head = body.lstrip()[:1]
    if "html" in content_type.lower() or head == b"<":
        return None, f"HTML where the Hub sends JSON (Content-Type {content_type or 'none'!s})"
    try:
        return loads_strict(body, path="the answer"), None
    except CheckpointFormatError as e:   # not JSON, too deep, a repeated key, NaN, a lone surrogate
        start = _shown(body[:40].decode("utf-8", "replace"))
        return None, f"a body that is not strict JSON ({e.detail}; it starts {start})"


def _document(kind: type[dict[str, Any]] | type[list[Any]], check: Callable[[Any], str | None]) -> Check:
    """The check of a JSON answer that must be an object (`dict`) or an array (`list`), then pass `check`."""
    def run(body: bytes, content_type: str) -> str | None:
        doc, problem = parse(body, content_type)
        if problem is not None:
            return problem
        if not isinstance(doc, kind):
            return f"{_kind(doc)} where the Hub sends {_kind(kind())}"
        return check(doc)
    return run


def _model_info(doc: dict[str, Any]) -> str | None:
    if not _text(doc.get("id")):
        return "a model info without an id"
    if not isinstance(doc.get("sha"), str) or not _HEX40.fullmatch(doc["sha"]):
        return f"a model info whose sha is {_shown(doc.get('sha'))}, not a 40-hex commit"
    siblings = doc.get("siblings", [])
    if not isinstance(siblings, list) or not all(isinstance(s, dict) and _text(s.get("rfilename")) for s in siblings):
        return "a model info whose siblings are not a list of files"
    return None


def _entry(i: int, item: object, seen: set[str]) -> str | None:
    """One tree or paths-info entry."""
    if not isinstance(item, dict):
        return f"entry {i} is {_kind(item)}, not an object"
    path = item.get("path")
    if not isinstance(path, str) or not path:
        return f"entry {i} has no path"
    where = f"entry {i} ({_shown(path)})"
    if not _repo_path(path):
        return f"{where}: not a relative path inside the repository"
    if path in seen:
        return f"{where} is listed twice"
    seen.add(path)
    if not _text(item.get("oid")):
        return f"{where} has no oid"
    if item.get("type") == "directory":
        return None
    if item.get("type") != "file":
        return f"{where}: type {_shown(item.get('type'))} is neither 'file' nor 'directory'"
    size = item.get("size")
    if not _count(size):
        return f"{where}: size {_shown(size)} is not a byte count"
    lfs = item.get("lfs")
    if lfs is None:
        return None
    if not isinstance(lfs, dict) or not isinstance(lfs.get("oid"), str) or not _SHA256.fullmatch(lfs["oid"]):
        return f"{where}: its lfs {_shown(lfs)} has no SHA-256 oid"
    if lfs.get("size") != size or not _count(lfs.get("pointerSize")):
        return f"{where}: its lfs size {_shown(lfs.get('size'))} is not its size {size} (or pointerSize is missing)"
    return None


def _entries(doc: list[Any]) -> str | None:
    seen: set[str] = set()
    for i, item in enumerate(doc):
        problem = _entry(i, item, seen)
        if problem is not None:
            return problem
    return None


def _repo_url(doc: dict[str, Any]) -> str | None:
    return None if _text(doc.get("url")) else "no repository url"


def _preupload(doc: dict[str, Any]) -> str | None:
    files = doc.get("files")
    if not isinstance(files, list):
        return "a preupload answer without a files list"
    for i, item in enumerate(files):
        if not isinstance(item, dict) or not _text(item.get("path")) or item.get("uploadMode") not in (
                "lfs", "regular"):
            return f"preupload file {i} ({_shown(item)}) has no path or no uploadMode lfs or regular"
    return None


def _href(action: object) -> bool:
    return isinstance(action, dict) and isinstance(action.get("href"), str) and action["href"].startswith(
        ("http://", "https://"))


def _lfs_batch(doc: dict[str, Any]) -> str | None:
    objects = doc.get("objects")
    if not isinstance(objects, list):
        return "an LFS batch answer without an objects list"
    for i, item in enumerate(objects):
        if not isinstance(item, dict) or not isinstance(item.get("oid"), str) or not _count(item.get("size")):
            return f"LFS object {i} ({_shown(item)}) has no oid or size"
        actions = item.get("actions")
        if actions is not None and (not isinstance(actions, dict)
                                    or not all(_href(actions[k]) for k in ("upload", "verify") if k in actions)):
            return f"LFS object {i}: its actions {_shown(actions)} are not http(s) hrefs"
    return None


def _commit(doc: dict[str, Any]) -> str | None:
    if not isinstance(doc.get("commitOid"), str) or not _HEX40.fullmatch(doc["commitOid"]):
        return f"a commit answer whose commitOid is {_shown(doc.get('commitOid'))}, not a 40-hex commit"
    return None if _text(doc.get("commitUrl")) else "a commit answer without a commitUrl"


def _refs(doc: dict[str, Any]) -> str | None:
    for kind in ("branches", "tags"):
        refs = doc.get(kind)
        if not isinstance(refs, list) or not all(
                isinstance(r, dict) and _text(r.get("name")) and _text(r.get("targetCommit")) for r in refs):
            return f"refs whose {kind} are not a list of names and commits"
    return None


def _yaml_check(doc: dict[str, Any]) -> str | None:
    for kind in ("errors", "warnings"):
        notes = doc.get(kind, [])
        if not isinstance(notes, list) or not all(isinstance(n, dict) for n in notes):
            return f"a metadata check whose {kind} are not a list of objects"
    return None


#: (method, path pattern, statuses, check): the routes huggingface_hub parses for dspark-hub.
_ROUTES: list[tuple[str, re.Pattern[str], frozenset[int], Check]] = [
    ("GET", re.compile(rf"{_REPO}(?:/revision/.+)?$"), frozenset({200}), _document(dict, _model_info)),
    ("GET", re.compile(rf"{_REPO}/tree/"), frozenset({200}), _document(list, _entries)),
    ("POST", re.compile(rf"{_REPO}/paths-info/"), frozenset({200}), _document(list, _entries)),
    ("POST", re.compile(r"/api/repos/create$"), frozenset({200, 409}), _document(dict, _repo_url)),
    ("POST", re.compile(rf"{_REPO}/preupload/"), frozenset({200}), _document(dict, _preupload)),
    ("POST", re.compile(r"\.git/info/lfs/objects/batch$"), frozenset({200}), _document(dict, _lfs_batch)),
    ("POST", re.compile(rf"{_REPO}/commit/"), frozenset({200}), _document(dict, _commit)),
    ("GET", re.compile(rf"{_REPO}/refs$"), frozenset({200}), _document(dict, _refs)),
    ("POST", re.compile(r"/api/validate-yaml$"), frozenset({200}), _document(dict, _yaml_check)),
]


def checker(method: str, path: str, status: int) -> Check | None:
    """The check of a route's answer, or None where dspark-hub does not check that answer."""
    for route_method, pattern, statuses, check in _ROUTES:
        if method == route_method and status in statuses and pattern.search(path):
            return check
    return None
