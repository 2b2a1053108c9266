"""The format registry (`dspark_hub.format.registry`) is the only place that dispatches on a draft format.

Code outside `dspark_hub/format/` asks a `DraftFormat` field (`trainable`, `repairable`,
`remote_code`, `attention_modules`, ...) instead of naming a format. This test parses every
other module with `ast` and fails, naming file:line, on:

- a comparison (`==`, `!=`, `is`, `in`, ...) with a registered format name (`"k3_dspark"`,
  `"speculators_dspark"`, `"speculators"`), with a registry entry (`K3`, `SPECULATORS`, `K3.name`)
  or with a registry constant that holds a name (`K3_DSPARK`);
- such a name literal as a dict key, a subscript, a `.get(...)` key or a `match` case.

Tables keyed by `K3.name` (verify's config rules and loader rules, which the format core
cannot hold) are extensions of the registry, not comparisons: they are allowed, and
`test_every_extension_table_covers_every_format` keeps them complete.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dspark_hub.format import registry
from dspark_hub.format.registry import FORMATS, DraftFormat

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dspark_hub"

#: Every name a registered format goes by: its family name and its command-line name.
FORMAT_NAMES = frozenset({f.name for f in FORMATS.values()} | {f.cli_name for f in FORMATS.values()})
#: The registry's module-level names that stand for one particular format: its entries (`K3`,
#: `SPECULATORS`) and the constants that hold a format's name (`K3_DSPARK`). `DEFAULT_FORMAT` is
#: left out: comparing with it asks the registry which format is the default, it names none.
FORMAT_SYMBOLS = frozenset(
    name for name, value in vars(registry).items()
    if not name.startswith("_") and name != "DEFAULT_FORMAT"
    and (isinstance(value, DraftFormat) or (isinstance(value, str) and value in FORMAT_NAMES)))
_LOOKUPS = {"get", "pop", "setdefault"}

#: Comparisons still to switch: (file, the flagged source text) -> the field that replaces it. Empty: every
#: branch asks the registry; `test_the_allow_list_has_no_stale_entry` keeps it honest if one is ever added.
REMAINING: dict[tuple[str, str], str] = {}

#: Literals that spell a format's name but mean something else (checked here so each is a decision).
NOT_A_DRAFT_FORMAT: dict[tuple[str, str], str] = {
    ("dspark_hub/train/data/hidden_state_files.py", 'self.format == "speculators"'):
        "the hidden-state DATA layout speculators' data pipeline writes (`DataFormat`), not the draft format",
}


def _names_a_format(node: ast.AST) -> bool:
    """The expression is a format's name or entry: `"k3_dspark"`, `K3`, `registry.K3.name`, `("speculators", x)`."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in FORMAT_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_format(e) for e in node.elts)
    if isinstance(node, ast.Name):
        return node.id in FORMAT_SYMBOLS
    if isinstance(node, ast.Attribute):
        return node.attr in FORMAT_SYMBOLS or _names_a_format(node.value)
    return False


def _is_name_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FORMAT_NAMES


def _is_lookup(node: ast.AST) -> bool:
    """`table["k3_dspark"]` or `table.get("k3_dspark")`."""
    if isinstance(node, ast.Subscript):
        return _is_name_literal(node.slice)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOOKUPS
            and bool(node.args) and _is_name_literal(node.args[0]))


def _flagged_nodes(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, what it does) for every place the tree dispatches on a format name."""
    out: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_a_format(n) for n in (node.left, *node.comparators)):
            out.append((node, "compares a format"))
        elif isinstance(node, ast.Dict):
            out += [(key, "keys a dict by a format name") for key in node.keys if _is_name_literal(key)]
        elif _is_lookup(node):
            out.append((node, "looks a format name up"))
        elif isinstance(node, ast.match_case):
            values = [p.value for p in ast.walk(node.pattern) if isinstance(p, ast.MatchValue)]
            if any(_names_a_format(v) for v in values):
                out.append((node.pattern, "matches a format name"))
    return out


def dispatch_sites(source: str, filename: str = "<snippet>") -> list[tuple[int, str, str]]:
    """(line, flagged source text, what it does) for every format dispatch in `source`, in line order."""
    tree = ast.parse(source, filename)
    return sorted((node.lineno, ast.get_source_segment(source, node) or "", why)  # type: ignore[attr-defined]
                  for node, why in _flagged_nodes(tree))


def _package_sites() -> list[tuple[str, int, str, str]]:
    """(file, line, text, why) for every dispatch in a module outside `dspark_hub/format/`."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("dspark_hub/format/"):
            continue
        out += [(rel, line, text, why) for line, text, why in dispatch_sites(path.read_text(), rel)]
    return out


# ---------------------------------------------------------------- the checker itself

@pytest.mark.parametrize("snippet", [
    'if fmt.name == "k3_dspark":\n    pass\n',
    'ok = name != "speculators_dspark"\n',
    'ok = "speculators" == cli\n',
    'ok = fmt.cli_name in ("k3_dspark", "other")\n',
    'ok = family not in {"speculators_dspark"}\n',
    "ok = fmt is K3\n",
    "ok = fmt is not SPECULATORS\n",
    "ok = fmt.name != K3.name\n",
    "ok = fmt is registry.SPECULATORS\n",
    "ok = found.family == K3_DSPARK\n",
    'ARCH = {"k3_dspark": "K3DSparkForCausalLM"}\n',
    'cls = ARCH["speculators_dspark"]\n',
    'cls = ARCH.get("k3_dspark")\n',
    'match fmt.name:\n    case "speculators_dspark":\n        pass\n',
    'match fmt.name:\n    case "x" | "k3_dspark":\n        pass\n',
    "match fmt.name:\n    case K3.name:\n        pass\n",
])
def test_the_checker_flags_a_format_dispatch(snippet):
    sites = dispatch_sites(snippet)
    assert len(sites) == 1, sites
    assert sites[0][0] >= 1 and sites[0][1]


@pytest.mark.parametrize("snippet", [
    "if fmt.trainable:\n    pass\n",
    "ok = fmt is not target\n",
    "ok = fmt is None or fmt.vllm_model_class is None\n",
    "ok = family == DEFAULT_FORMAT.name\n",
    "target = by_cli_name(to) if to else DEFAULT_FORMAT\n",
    "RULES = {K3.name: k3_rules, SPECULATORS.name: spec_rules}\n",
    'title = "a k3_dspark draft"\n',
    'ok = found.family == "unknown"\n',
    'model_type = "k3_dspark"\n',
    'ok = name.startswith("speculators_")\n',
    "match fmt.trainable:\n    case True:\n        pass\n",
])
def test_the_checker_passes_code_that_asks_the_format(snippet):
    assert dispatch_sites(snippet) == []


def test_the_checker_names_the_line():
    source = 'x = 1\n\nif fmt.name == "k3_dspark":\n    y = ARCH["speculators"]\n'
    assert dispatch_sites(source) == [(3, 'fmt.name == "k3_dspark"', "compares a format"),
                                      (4, 'ARCH["speculators"]', "looks a format name up")]


def test_the_symbols_come_from_the_registry():
    assert {"k3_dspark", "speculators_dspark", "speculators"} == FORMAT_NAMES
    assert {"K3", "SPECULATORS", "K3_DSPARK", "SPECULATORS_DSPARK"} <= FORMAT_SYMBOLS
    assert "DEFAULT_FORMAT" not in FORMAT_SYMBOLS


# ---------------------------------------------------------------- the package

def test_no_module_outside_the_format_core_dispatches_on_a_format():
    found = [f"{file}:{line}: {why}: {text}" for file, line, text, why in _package_sites()
             if (file, text) not in REMAINING and (file, text) not in NOT_A_DRAFT_FORMAT]
    assert found == [], "ask a DraftFormat field (format/registry.py) instead:\n" + "\n".join(found)


def test_the_allow_list_has_no_stale_entry():
    seen = {(file, text) for file, _, text, _ in _package_sites()}
    assert [entry for entry in (*REMAINING, *NOT_A_DRAFT_FORMAT) if entry not in seen] == []


def test_every_extension_table_covers_every_format():
    from dspark_hub.verify.checks import CONFIG_RULES
    from dspark_hub.verify.runtimes.loaders import loaders_for

    assert set(CONFIG_RULES) == set(FORMATS)
    assert all(loaders_for(fmt) for fmt in FORMATS.values())


# ---------------------------------------------------------------- the replacements the owners switch to

def _sample_configs() -> list[tuple[DraftFormat, dict]]:
    from dspark_hub.format import contract

    from .spec_fixtures import fixture, read_config

    k3, spec = FORMATS["k3_dspark"], FORMATS["speculators_dspark"]
    dspark = read_config(fixture("dspark"))
    body = dict(dspark["transformer_layer_config"])
    return [(k3, dict(contract.TINY_CONFIG)), (k3, dict(contract.REFERENCE_CONFIG)),
            (k3, {**contract.TINY_CONFIG, "target_hidden_size": None}),
            (spec, dspark), (spec, {**dspark, "aux_hidden_state_layer_ids": [3, 9]}),
            (spec, {**dspark, "aux_hidden_state_layer_ids": None}),
            (spec, {**dspark, "target_hidden_size": 96, "transformer_layer_config": {**body, "vocab_size": 640}})]


def test_the_vllm_stub_target_is_sized_from_the_formats_pairing_keys(tmp_path):
    """verify --execute's stand-in target takes the draft's tap width, vocabulary and enough layers for its taps."""
    from dspark_hub.verify.runtimes.execute_vllm.stubs import stub_target_config

    for fmt, config in _sample_configs():
        _, stub = stub_target_config(config, fmt.name, tmp_path)
        keys = fmt.pairing_keys(config)
        assert stub["hidden_size"] == (keys.tap_width or config.get("hidden_size") or 64), fmt.name
        assert stub["vocab_size"] == (keys.vocab_size or 512), fmt.name
        assert stub["num_hidden_layers"] > max(keys.taps or [0]), (fmt.name, keys.taps)


