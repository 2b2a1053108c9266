"""The report's section types (`report.Sections` and the TypedDicts under it) describe what verify produces.

mypy checks the producers' code against the types; these tests check the produced JSON of a real
verify run against them key by key, so a key added to a producer without its type (or a type that
names a key nobody writes) fails here.
"""

from __future__ import annotations

import types
import typing
from typing import Any, TypedDict, get_args, get_origin, get_type_hints

import pytest

from dspark_hub import report
from dspark_hub.format import contract
from dspark_hub.verify.checks import verify

from .factories import tensors_for, write_checkpoint
from .test_pairing import make_teacher


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def mismatches(tp: Any, value: Any, where: str = "$") -> list[str]:
    """Where `value` (parsed JSON) leaves the shape `tp` describes: missing or unknown keys of a TypedDict."""
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        hints = get_type_hints(tp)
        out = [f"{where}.{key}: missing" for key in sorted(tp.__required_keys__ - value.keys())]
        out += [f"{where}.{key}: not in {tp.__name__}" for key in sorted(value.keys() - hints.keys())]
        for key in sorted(hints.keys() & value.keys()):
            out += mismatches(hints[key], value[key], f"{where}.{key}")
        return out
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        options = [mismatches(arg, value, where) for arg in args if arg is not type(None)]
        return min(options, key=len) if options else []
    if origin is list and isinstance(value, list):
        return [m for i, item in enumerate(value) for m in mismatches(args[0], item, f"{where}[{i}]")]
    if origin is dict and isinstance(value, dict):
        return [m for key, item in value.items() for m in mismatches(args[1], item, f"{where}.{key}")]
    return []


def test_every_section_name_has_a_type_and_every_type_a_name():
    assert set(get_type_hints(report.Sections)) == set(report.SECTIONS)


@pytest.fixture(scope="module")
def sections(tmp_path_factory) -> dict[str, Any]:
    """The JSON sections of one verify run that fills roster, deep, frozen_embed, family and pairing."""
    tmp = tmp_path_factory.mktemp("sections")
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp / "draft", tensors=state)
    teacher = make_teacher(tmp / "teacher", state["embed_tokens.weight"])
    result = verify(draft, deep=True, frozen_embed=teacher, runtime="vllm", target=teacher)
    assert result.ok, result.errors
    produced: dict[str, Any] = result.to_dict()["sections"]
    return produced


@pytest.mark.parametrize("name", ["roster", "deep", "frozen_embed", "family", "pairing"])
def test_the_produced_section_has_exactly_the_typed_keys(sections, name):
    assert sections[name], f"the run produced no {name} section"
    assert mismatches(get_type_hints(report.Sections)[name], sections[name], name) == []


class _Inner(TypedDict):
    a: int


class _Outer(TypedDict):
    inner: _Inner
    items: list[_Inner]
    by_name: dict[str, _Inner]
    maybe: _Inner | None


GOOD = {"inner": {"a": 1}, "items": [{"a": 2}], "by_name": {"x": {"a": 3}}, "maybe": None}


@pytest.mark.parametrize("value, expected", [
    ({**GOOD, "extra": 1}, ["$.extra: not in _Outer"]),
    ({k: v for k, v in GOOD.items() if k != "inner"}, ["$.inner: missing"]),
    ({**GOOD, "inner": {"a": 1, "b": 2}}, ["$.inner.b: not in _Inner"]),
    ({**GOOD, "items": [{"a": 1}, {}]}, ["$.items[1].a: missing"]),
    ({**GOOD, "by_name": {"x": {"a": 1, "z": 0}}}, ["$.by_name.x.z: not in _Inner"]),
    ({**GOOD, "maybe": {}}, ["$.maybe.a: missing"]),
    ({**GOOD, "inner": [1]}, ["$.inner: expected an object"]),
])
def test_the_checker_names_each_key_out_of_shape(value, expected):
    assert mismatches(_Outer, value) == expected


@pytest.mark.parametrize("value", [GOOD, {**GOOD, "maybe": {"a": 4}}, {**GOOD, "items": [], "by_name": {}}])
def test_the_checker_passes_values_in_shape(value):
    assert mismatches(_Outer, value) == []
