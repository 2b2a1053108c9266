"""Strict JSON: the one loader for every config, index, manifest and record dspark-hub reads.

Python's `json` keeps the last of two equal keys and accepts `NaN`/`Infinity`; both hide
mistakes (two readers of one config disagree on which key wins; a NaN rope factor loads as
a float). Here duplicate keys are refused at any depth, non-finite literals are refused
naming the key that holds them, and the bytes must be UTF-8.

Two more refusals keep every reader downstream safe: a document nested deeper than
`MAX_DEPTH` (no config needs more than a few levels, and copying or printing a deep one
exhausts Python's recursion), and a string holding a lone surrogate escape (`"\\ud800"`:
JSON allows it, but it is no Unicode text; safetensors refuses such a header and no UTF-8
writer or terminal can encode it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, UsageError
from dspark_hub.format.folder import read_regular

#: code -> meaning, for the JSON failures every caller shares (prefixed by callers that need to).
JSON_CODES: dict[str, str] = {
    "NOT_UTF8": "the file is not valid UTF-8",
    "NOT_JSON": "the file is not valid JSON",
    "DUPLICATE_KEY": "a JSON object repeats a key",
    "NON_FINITE_NUMBER": "a value is NaN or Infinity, which JSON does not allow",
    "NOT_OBJECT": "the document is not a JSON object",
}
#: Deepest nesting of arrays and objects read (a config holds 3 or 4 levels; a safetensors header 3).
MAX_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _NonFinite(float):
    """A NaN/Infinity literal, kept as a marker so the key holding it can be named."""

    literal: str

    def __new__(cls, literal: str) -> _NonFinite:
        value = super().__new__(cls, float(literal.replace("Infinity", "inf")))
        value.literal = literal
        return value


_INFINITY = float("inf")


def _overflow(text: str) -> _NonFinite:
    """A number beyond a 64-bit float (`1e400`, `-1e400`, a 400-digit integer): every runtime reads it as infinity,
    so it is refused like `Infinity`."""
    marker = _NonFinite("-Infinity" if text.startswith("-") else "Infinity")
    shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"
    marker.literal = f"{shown} (beyond a 64-bit float: it reads as infinity)"
    return marker


def _float(text: str) -> float:
    value = float(text)
    return _overflow(text) if value in (_INFINITY, -_INFINITY) else value


def _int(text: str) -> int | float:
    value = int(text)
    try:
        float(value)                 # how runtimes read a config number
    except OverflowError:
        return _overflow(text)
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _walk(doc: Any) -> Iterator[tuple[str, int, Any, bool]]:
    """(dotted path, depth, value, is_key) of every value and every key of a decoded document, in document
    order, without recursion."""
    stack: list[tuple[str, int, Any, bool]] = [("", 0, doc, False)]
    while stack:
        where, depth, value, is_key = stack.pop()
        yield where, depth, value, is_key
        if isinstance(value, dict):
            for k, v in reversed(value.items()):
                path = f"{where}.{k}" if where else str(k)
                stack += [(path, depth + 1, v, False), (path, depth + 1, k, True)]
        elif isinstance(value, list):
            stack.extend(reversed([(f"{where}[{i}]", depth + 1, v, False) for i, v in enumerate(value)]))


def printable(text: str) -> str:
    """`text` with lone surrogates written as `\\udXXX` escapes (so it can be printed and encoded)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(text) else text


def _refusal(doc: Any) -> tuple[str, str, str] | None:
    """(code, message, key) for the first too-deep value, NaN/Infinity or lone surrogate of a decoded document."""
    for where, depth, value, is_key in _walk(doc):
        key = printable(where)
        if depth > MAX_DEPTH:
            return "NOT_JSON", f"nested more than {MAX_DEPTH} levels deep (at {key[:80]}...); no config needs that", ""
        if isinstance(value, _NonFinite):
            return "NON_FINITE_NUMBER", f"{key or 'the document'} is {value.literal}, which is not JSON; " \
                "write a finite number", key
        if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
            what = "the key" if is_key else f"{key or 'the document'}: the string"
            return "NOT_UTF8", f"{what} \"{printable(value)[:80]}\" holds a lone surrogate escape, which is no " \
                "Unicode text (safetensors and UTF-8 writers refuse it); write the character itself or a valid " \
                "surrogate pair", key
    return None


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer: an `int` that is not a `bool` (`true` decodes to `True`, an `int`)."""
    return isinstance(value, int) and not isinstance(value, bool)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (`object`, `array`, `string`, ...), for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def loads_strict(raw: bytes | str, *, path: str, codes: Mapping[str, str] | None = None) -> Any:
    """Parse UTF-8 JSON, refusing duplicate keys at any depth, NaN/Infinity literals, nesting deeper
    than `MAX_DEPTH` and strings or keys holding a lone surrogate escape.

    Args:
        raw: the bytes (or text) of the document.
        path: the file name used in messages.
        codes: renames of the `JSON_CODES` a caller reports under its own codes
            (the safetensors reader says `HEADER_NOT_JSON`).

    Raises:
        CheckpointFormatError: `NOT_UTF8` (also a lone surrogate), `NOT_JSON` (also too deep),
            `DUPLICATE_KEY` or `NON_FINITE_NUMBER` (renamed through `codes`); `tensor` holds the
            offending key where there is one (lone surrogates written as `\\udXXX`).
    """
    def code(name: str) -> str:
        return (codes or {}).get(name, name)

    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointFormatError(code("NOT_UTF8"), f"not valid UTF-8 at byte {e.start}", path=path) from None
    else:
        text = raw
    try:
        doc = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_NonFinite, parse_float=_float,
                         parse_int=_int)
    except _DuplicateKey as e:
        raise CheckpointFormatError(
            code("DUPLICATE_KEY"), f"key {printable(e.key)!r} appears twice; readers disagree on which one wins, "
            "so write it once", path=path, tensor=printable(e.key)) from None
    except RecursionError:
        raise CheckpointFormatError(code("NOT_JSON"), "not valid JSON (nested too deeply to read)", path=path) from None
    except ValueError as e:
        raise CheckpointFormatError(code("NOT_JSON"), f"not valid JSON ({str(e).splitlines()[0]})",
                                    path=path) from None
    refused = _refusal(doc)
    if refused:
        name, message, key = refused
        raise CheckpointFormatError(code(name), message, path=path, tensor=key or None)
    return doc


def load_json_file(path: str | os.PathLike[str], *, display: str | None = None,
                   codes: Mapping[str, str] | None = None) -> Any:
    """Read and strictly parse one JSON file.

    Args:
        path: the file.
        display: the name used in messages (default: `path`).
        codes: renames of the `JSON_CODES`, as in `loads_strict`.

    Raises:
        CheckpointNotFoundError: the file does not exist, or is a directory.
        CheckpointFormatError: see `loads_strict`, or `SPECIAL_FILE` (a FIFO, socket or device: never opened).
    """
    p = Path(path)
    where = display or str(p)
    try:
        raw = read_regular(p, display=where)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{where}: no such file") from None
    return loads_strict(raw, path=where, codes=codes)


def object_or_raise(doc: Any, *, path: str, codes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`doc` when it is a JSON object.

    Raises:
        CheckpointFormatError: `NOT_OBJECT` (renamed through `codes`).
    """
    if not isinstance(doc, dict):
        raise CheckpointFormatError((codes or {}).get("NOT_OBJECT", "NOT_OBJECT"),
                                    f"is a JSON {json_type(doc)}, not an object", path=path)
    return doc


def load_json_object(path: str | os.PathLike[str], *, display: str | None = None,
                     codes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`load_json_file` for documents that must be one JSON object (configs, manifests).

    Raises:
        CheckpointNotFoundError: the file does not exist.
        CheckpointFormatError: see `loads_strict`, or `NOT_OBJECT` (renamed through `codes`).
    """
    doc = load_json_file(path, display=display, codes=codes)
    return object_or_raise(doc, path=display or str(path), codes=codes)


def read_json_input(path: str | os.PathLike[str], *, what: str = "the file or a folder that holds it",
                    param: str | None = None) -> dict[str, Any]:
    """Read a JSON object from `path`, a file a caller named (a config, a manifest): errors ask for `what`.

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
