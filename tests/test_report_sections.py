"""The report's section types (`report.Sections` and the TypedDicts under it) describe what verify produces.

mypy checks the producers' code against the types; these tests check the produced JSON of real
verify runs against them key by key, so a key added to a producer without its type (or a type that
names a key nobody writes) fails here. The runtimes and against_hub sections are checked on the
`verify --json` output of runs that between them write every key their types declare (the optional
ones included: `test_every_declared_key_is_written_by_some_run`).
"""

from __future__ import annotations

import json
import types
import typing
import uuid
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict, get_args, get_origin, get_type_hints

import pytest
from click.testing import CliRunner

from dspark_hub import report
from dspark_hub.cli.main import cli
from dspark_hub.documents import Document, Of, document_type, json_type
from dspark_hub.format import contract
from dspark_hub.hub.publish import publish
from dspark_hub.verify.checks import verify
from dspark_hub.verify.runtimes import execute_vllm
from dspark_hub.vllm import availability

from .factories import tensors_for, write_checkpoint
from .spec_fixtures import copy_fixture, edit_config
from .test_pairing import make_teacher
from .test_runtimes_vllm import executed_like
from .vllm_matrix import build

Seen = set[tuple[str, str]]


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _shape(tp: Any) -> Any:
    """A result type (a `Document` class, or `Annotated[JSON, Of(path)]`) as the TypedDict its declaration makes
    (`documents.document_type`); any other type as it is."""
    if isinstance(tp, type) and issubclass(tp, Document):
        return document_type(tp)
    if get_origin(tp) is Annotated and isinstance(get_args(tp)[1], Of):
        return json_type(tp)
    return tp


def _hints(tp: Any) -> dict[str, Any]:
    """A TypedDict's keys and types, `Annotated` kept (it names result types), `NotRequired` taken off."""
    return {key: get_args(hint)[0] if get_origin(hint) in (NotRequired, Required) else hint
            for key, hint in get_type_hints(tp, include_extras=True).items()}


def _required(tp: Any) -> frozenset[str]:
    """The keys a TypedDict demands. `__required_keys__` alone counts a `NotRequired` key as required when
    the annotations are strings (`from __future__ import annotations`, Python 3.11)."""
    optional = {key for key, hint in get_type_hints(tp, include_extras=True).items()
                if get_origin(hint) is NotRequired}
    return frozenset(tp.__required_keys__ - optional)


def mismatches(tp: Any, value: Any, where: str = "$", seen: Seen | None = None) -> list[str]:
    """Where `value` (parsed JSON) leaves the shape `tp` describes: missing or unknown keys of a TypedDict,
    a value outside its Literal, a non-null where null is declared. Adds to `seen` (TypedDict name, key)
    for every declared key the value writes (of the union member it fits best)."""
    seen = set() if seen is None else seen
    tp = _shape(tp)
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        hints = _hints(tp)
        out = [f"{where}.{key}: missing" for key in sorted(_required(tp) - value.keys())]
        out += [f"{where}.{key}: not in {tp.__name__}" for key in sorted(value.keys() - hints.keys())]
        for key in sorted(hints.keys() & value.keys()):
            seen.add((tp.__name__, key))
            out += mismatches(hints[key], value[key], f"{where}.{key}", seen)
        return out
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return [] if value is None else [f"{where}: expected null"]
    if origin is Literal:
        return [] if any(type(value) is type(a) and value == a for a in args) else [
            f"{where}: {value!r} is not one of {list(args)}"]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        options = []
        for arg in args:
            if arg is not type(None):
                found: Seen = set()
                options.append((mismatches(arg, value, where, found), found))
        best, found = min(options, key=lambda option: len(option[0])) if options else ([], set())
        seen |= found
        return best
    if origin is list and isinstance(value, list):
        return [m for i, item in enumerate(value) for m in mismatches(args[0], item, f"{where}[{i}]", seen)]
    if origin is dict and isinstance(value, dict):
        return [m for key, item in value.items() for m in [*mismatches(args[0], key, f"{where} key {key!r}"),
                                                           *mismatches(args[1], item, f"{where}.{key}", seen)]]
    return []


def declared(tp: Any, out: Seen | None = None) -> Seen:
    """(TypedDict name, key) for every key of every TypedDict `tp` reaches (through unions, lists, dicts)."""
    out = set() if out is None else out
    tp = _shape(tp)
    if _is_typeddict(tp):
        for key, hint in _hints(tp).items():
            if (tp.__name__, key) not in out:
                out.add((tp.__name__, key))
                declared(hint, out)
        return out
    for arg in get_args(tp):
        declared(arg, out)
    return out


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


@pytest.mark.parametrize("name", ["roster", "deep", "frozen_embed", "family", "runtimes", "pairing"])
def test_the_produced_section_has_exactly_the_typed_keys(sections, name):
    assert sections[name], f"the run produced no {name} section"
    assert mismatches(_hints(report.Sections)[name], sections[name], name) == []


# ----------------------------------------------------------------- runtimes and against_hub, from `verify --json`

TYPED = ("runtimes", "against_hub")
#: vllm_matrix case -> what its `verify --runtime all` run writes that the others do not.
RUNTIME_CASES = {
    "k3_conforming": "every k3_dspark runtime judged, each with a serving command",
    "k3_missing_l0_mlp_gate_proj": "an unfilled parameter row",
    "k3_pruned_vocab": "a refusal at config parse, so serving is withheld",
    "sp_dspark": "a speculators DSpark: vLLM judged (its command names the verifier), the other runtimes unjudged",
}
#: vllm_matrix case, changed executed verdicts -> what its `verify --runtime vllm --execute` run writes (the
#: child process faked as in tests/test_runtimes_vllm.py).
EXECUTED_CASES = {
    ("k3_bias_context_proj", ()): "an execution whose rows agree with the rules",
    ("k3_bias_context_proj", (("context_proj.bias", "fatal"),)): "a disagreement row",
    ("k3_pruned_vocab", ()): "an executed refusal, its rule id adopted from the rules",
}


def verify_json(*args: Any) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["verify", *map(str, args), "--json"])
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.fixture(scope="module")
def documents(tmp_path_factory, hub_server) -> dict[str, dict[str, Any]]:
    """run name -> its `verify --json` document: the runtimes runs above and three against-hub runs (clean,
    then with an extra and a changed file, then with the weights missing)."""
    tmp = tmp_path_factory.mktemp("typed-runs")
    out = {case: verify_json(build(case, tmp / case), "--runtime", "all") for case in RUNTIME_CASES}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(availability, "vllm_importable", lambda: True)
        for i, (case, changed) in enumerate(EXECUTED_CASES):
            folder = build(case, tmp / f"executed-{i}")
            load = executed_like(folder, changed)
            patch.setattr(execute_vllm, "run_isolated", lambda path, load=load: load)
            out[f"executed {case} {dict(changed)}"] = verify_json(folder, "--runtime", "vllm", "--execute")
    folder = write_checkpoint(tmp / "hub")
    repo = f"{hub_server.user}/sections-{uuid.uuid4().hex[:10]}"
    assert publish(folder, repo, token=hub_server.token, endpoint=hub_server.url).ok
    against = ("--against-hub", repo, "--endpoint", hub_server.url)
    out["hub clean"] = verify_json(folder, *against)
    (folder / "extra.txt").write_text("local only")
    (folder / contract.CONFIG_NAME).write_text((folder / contract.CONFIG_NAME).read_text() + " ")
    out["hub extra and changed"] = verify_json(folder, *against)
    (folder / contract.WEIGHTS_NAME).unlink()
    out["hub missing"] = verify_json(folder, *against)
    return out


@pytest.fixture(scope="module")
def runs(documents) -> dict[str, dict[str, Any]]:
    """run name -> the `sections` of its `verify --json`."""
    return {name: doc["sections"] for name, doc in documents.items()}


def test_every_run_is_a_typed_document_with_every_section_name(documents):
    found = {name: problems for name, doc in documents.items() if (problems := mismatches(report.Report, doc))}
    assert found == {}
    assert {name for name, doc in documents.items() if list(doc["sections"]) != list(report.SECTIONS)} == set()
    assert {f["severity"] for doc in documents.values() for f in doc["findings"]} >= {"error", "info"}
    assert any(doc["summary"]["files"] for doc in documents.values())     # the summary's and findings' types too


@pytest.mark.parametrize("name", TYPED)
def test_every_run_writes_exactly_the_typed_keys(runs, name):
    tp = _hints(report.Sections)[name]
    produced = {run: sections[name] for run, sections in runs.items() if sections[name] is not None}
    assert len(produced) >= 3, f"too few runs write {name}"
    found = {run: problems for run, section in produced.items() if (problems := mismatches(tp, section, name))}
    assert found == {}


def test_every_declared_key_is_written_by_some_run(runs):
    types_ = [_hints(report.Sections)[name] for name in TYPED]
    seen: Seen = set()
    for sections in runs.values():
        for name, tp in zip(TYPED, types_, strict=True):
            if sections[name] is not None:
                mismatches(tp, sections[name], name, seen)
    expected: Seen = set()
    for tp in types_:
        declared(tp, expected)
    assert expected - seen == set()


def test_the_runs_cover_both_kinds_of_runtime_entry_and_every_problem_kind(runs):
    entries = [entry for sections in runs.values() for entry in (sections["runtimes"] or {}).values()]
    assert {entry["supported"] for entry in entries} == {True, False}
    problems = [p for sections in runs.values() if sections["against_hub"] for p in sections["against_hub"]["problems"]]
    assert {p["kind"] for p in problems} == set(get_args(report.ProblemKind))


def test_a_runtime_entry_must_fit_the_kind_its_supported_flag_names(runs):
    entries = [entry for sections in runs.values() for entry in (sections["runtimes"] or {}).values()]
    judged = next(entry for entry in entries if entry["supported"])
    unjudged = next(entry for entry in entries if not entry["supported"])
    for entry in (judged, unjudged):
        assert mismatches(report.RuntimeEntry, entry) == []
        assert mismatches(report.RuntimeEntry, {**entry, "supported": not entry["supported"]}) != []
    assert mismatches(report.RuntimeEntry, {**judged, "serving_withheld": "x", "extra": 1}) == [
        "$.extra: not in JudgedRuntime"]
    assert mismatches(report.RuntimeEntry, {**unjudged, "serving": judged["serving"] or {}}) != []


class _Inner(TypedDict):
    a: int


class _Outer(TypedDict):
    inner: _Inner
    items: list[_Inner]
    by_name: dict[str, _Inner]
    maybe: _Inner | None
    tag: Literal["x", "y"]
    counts: dict[Literal["k"], int]
    nothing: None
    optional: NotRequired[_Inner]


GOOD = {"inner": {"a": 1}, "items": [{"a": 2}], "by_name": {"x": {"a": 3}}, "maybe": None, "tag": "x",
        "counts": {"k": 1}, "nothing": None}


@pytest.mark.parametrize("value, expected", [
    ({**GOOD, "extra": 1}, ["$.extra: not in _Outer"]),
    ({k: v for k, v in GOOD.items() if k != "inner"}, ["$.inner: missing"]),
    ({**GOOD, "inner": {"a": 1, "b": 2}}, ["$.inner.b: not in _Inner"]),
    ({**GOOD, "items": [{"a": 1}, {}]}, ["$.items[1].a: missing"]),
    ({**GOOD, "by_name": {"x": {"a": 1, "z": 0}}}, ["$.by_name.x.z: not in _Inner"]),
    ({**GOOD, "maybe": {}}, ["$.maybe.a: missing"]),
    ({**GOOD, "inner": [1]}, ["$.inner: expected an object"]),
    ({**GOOD, "tag": "z"}, ["$.tag: 'z' is not one of ['x', 'y']"]),
    ({**GOOD, "tag": 1}, ["$.tag: 1 is not one of ['x', 'y']"]),
    ({**GOOD, "counts": {"j": 1}}, ["$.counts key 'j': 'j' is not one of ['k']"]),
    ({**GOOD, "nothing": {}}, ["$.nothing: expected null"]),
    ({**GOOD, "optional": {"b": 1}}, ["$.optional.a: missing", "$.optional.b: not in _Inner"]),
])
def test_the_checker_names_each_key_out_of_shape(value, expected):
    assert mismatches(_Outer, value) == expected


@pytest.mark.parametrize("value", [GOOD, {**GOOD, "maybe": {"a": 4}}, {**GOOD, "items": [], "by_name": {}},
                                   {**GOOD, "tag": "y", "optional": {"a": 5}}])
def test_the_checker_passes_values_in_shape(value):
    assert mismatches(_Outer, value) == []


def test_the_keys_no_value_writes_are_named():
    expected = declared(_Outer)
    assert expected == {("_Outer", key) for key in get_type_hints(_Outer)} | {("_Inner", "a")}

    def unwritten(*values: Any) -> Seen:
        seen: Seen = set()
        for value in values:
            mismatches(_Outer, value, seen=seen)
        return expected - seen

    assert unwritten(GOOD) == {("_Outer", "optional")}
    assert unwritten({**GOOD, "inner": {}, "items": [], "by_name": {}}) == {("_Outer", "optional"), ("_Inner", "a")}
    assert unwritten(GOOD, {**GOOD, "optional": {"a": 1}}) == set()


# ----------------------------------------------------------------- the human view of a typed null

#: Speculators configs that give no draft-token count: `serving.num_speculative_tokens` is null.
NO_TOKEN_COUNT = {
    "block_size not a number": {"block_size": "x"},
    "block_size 0": {"block_size": 0},
    "block_size negative, speculative_tokens 0": {"block_size": -2, "speculative_tokens": 0},
}


def _without_token_count(folder, changes):
    def change(config):
        method = config["speculators_config"]["proposal_methods"][0]
        method.pop("speculative_tokens", None)
        if "speculative_tokens" in changes:
            method["speculative_tokens"] = changes["speculative_tokens"]
        config["block_size"] = changes["block_size"]
    return edit_config(folder, change)


@pytest.mark.parametrize("changes", NO_TOKEN_COUNT.values(), ids=NO_TOKEN_COUNT.keys())
def test_a_serving_command_without_a_token_count_renders_without_a_traceback(tmp_path, changes):
    folder = _without_token_count(copy_fixture(tmp_path, "dspark"), changes)
    assert verify_json(folder, "--runtime", "vllm")["sections"]["runtimes"]["vllm"]["serving"][
        "num_speculative_tokens"] is None
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm"])
    assert result.exit_code in (0, 1) and not isinstance(result.exception, TypeError), result.output
    assert "serve with vLLM" in result.stdout and "draft tokens unknown" in result.stdout


def test_a_serving_command_with_a_token_count_renders_it(tmp_path):
    folder = _without_token_count(copy_fixture(tmp_path, "dspark"), NO_TOKEN_COUNT["block_size 0"])
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--block-size", "3"])
    assert "serve with vLLM (3 draft tokens;" in result.stdout and "unknown" not in result.stdout
