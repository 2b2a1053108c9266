"""A result's JSON document, from the one declaration of the result: its dataclass.

A result type is a dataclass that also subclasses `Document`. Its JSON document (`to_dict()`, what
`--json` prints) is its fields in declaration order, each converted by `to_json` (a nested result
becomes its own document, a `Path` its text, a tuple or set a list); `KEYS` says otherwise where the
document is not exactly the fields:

- `"name"`: a field, a property or a method without arguments, under its own name (properties give derived
  values: `ok`, `label`; a method its result: `sorted_findings`);
- `"key=name"`: the field or property `name` under the key `key`;
- `"**name"`: the keys of the mapping (or document) `name` gives, spread in place.

`SCHEMA`, when set, is written first as `"schema"` (a command's `--json` document,
`schemas.command(...)`). The document's type is the declaration too: `document_keys(cls)` lists the
keys and the attribute each comes from, whose annotation is the key's type (what the tests of
`--json` shapes check real documents against, `tests/test_report_sections.py`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Annotated, Any, ClassVar, TypedDict, Union, get_args, get_origin, get_type_hints


class Document:
    """A result dataclass whose JSON document comes from its declaration (see the module docstring)."""

    #: The schema id written first as `"schema"`, or None.
    SCHEMA: ClassVar[str | None] = None
    #: The keys in order (`name`, `key=name`, `**name`), when they are not exactly the fields.
    KEYS: ClassVar[tuple[str, ...] | None] = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (`--json`): see the module docstring."""
        out: dict[str, Any] = {} if self.SCHEMA is None else {"schema": self.SCHEMA}
        for key, name in document_keys(type(self)):
            attribute = getattr(self, name)
            value = to_json(attribute() if inspect.ismethod(attribute) else attribute)
            if key.startswith("**"):
                out.update(value)
            else:
                out[key] = value
        return out


def document_keys(cls: type[Document]) -> list[tuple[str, str]]:
    """(key, attribute) of a document type, in order; a spread is (`**name`, name). `schema` is not listed."""
    entries = cls.KEYS if cls.KEYS is not None else tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]  # a Document is a dataclass
    out = []
    for entry in entries:
        if entry.startswith("**"):
            out.append((entry, entry[2:]))
        else:
            key, _, name = entry.partition("=")
            out.append((key, name or key))
    return out


def to_json(value: Any) -> Any:
    """`value` as JSON data: a `Document` its document, another dataclass its fields, a path its text, a tuple,
    list or set a list (a set sorted), a mapping a dict; anything else as it is."""
    if isinstance(value, Document):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(to_json(item) for item in value)
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, Mapping):
        return {key: to_json(item) for key, item in value.items()}
    return value


#: A JSON object. A key whose value is another result's document is `Annotated[JSON, Of("dspark_hub.module.Class")]`
#: (a dotted path: a lower layer names a higher one's result without importing it); `document_type` reads it.
JSON = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Of:
    """The result type (dotted path) whose document a `JSON` value is."""

    path: str


def document_type(cls: type[Document]) -> Any:
    """The type of `cls`'s document, made from its declaration: a TypedDict `<Class>Document` whose keys are the
    document's, each typed by its attribute's annotation as JSON writes it (a nested result by its own document
    type, a path as text, a tuple or set as a list). An annotation that names a type only a type checker imports
    is `Any`. For the checks of `--json` shapes; the code itself uses the dataclass.
    """
    fields: dict[str, Any] = {} if cls.SCHEMA is None else {"schema": str}
    for key, name in document_keys(cls):
        hint = json_type(attribute_type(cls, name))
        if key.startswith("**"):
            fields.update(typeddict_items(hint))
        else:
            fields[key] = hint
    return TypedDict(f"{cls.__name__}Document", fields)  # type: ignore[operator]  # the functional form, at run time


def attribute_type(cls: type, name: str) -> Any:
    """The annotation of the field, property or method `name` of `cls` (its return type), resolved; `Any` when it
    cannot be (a name imported only for type checkers)."""
    attribute = inspect.getattr_static(cls, name, None)
    if isinstance(attribute, property) and attribute.fget is not None:
        owner, annotation = attribute.fget, attribute.fget.__annotations__.get("return")
    elif callable(attribute) and not isinstance(attribute, type):
        owner, annotation = attribute, getattr(attribute, "__annotations__", {}).get("return")
    else:
        owner = next(c for c in cls.__mro__ if name in getattr(c, "__annotations__", {}))
        annotation = owner.__annotations__[name]
    if not isinstance(annotation, str):
        return Any if annotation is None else annotation
    module = sys.modules[owner.__module__]
    try:
        return eval(annotation, vars(module), {"ClassVar": ClassVar})   # the package's own annotation text
    except NameError:
        return Any


def json_type(hint: Any) -> Any:
    """A Python annotation as the JSON type `to_json` makes of its values."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is ClassVar:
        return json_type(args[0])
    if origin is Annotated and len(args) == 2 and isinstance(args[1], Of):
        module, _, name = args[1].path.rpartition(".")
        return document_type(getattr(importlib.import_module(module), name))
    if isinstance(hint, type) and issubclass(hint, Document):
        return document_type(hint)
    if isinstance(hint, type) and issubclass(hint, PurePath):
        return str
    if origin in (Union, types.UnionType):
        return Union[tuple(json_type(a) for a in args)]  # noqa: UP007 (a Union of computed members)
    if origin in (tuple, list, set, frozenset, Sequence) or (origin is not None and origin.__name__ == "Sequence"):
        return list.__class_getitem__(json_type(args[0]) if args else Any)
    if origin in (dict, Mapping) and len(args) == 2:
        return dict.__class_getitem__((args[0], json_type(args[1])))
    return hint


def typeddict_items(hint: Any) -> dict[str, Any]:
    """The keys and types of a TypedDict (a spread `**name` of one)."""
    return dict(get_type_hints(hint)) if isinstance(hint, type) and hasattr(hint, "__required_keys__") else {}
