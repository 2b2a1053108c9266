"""The card source, `cards/<name>/card.yaml`: its keys as data, read and checked key by key.

`CARD_KEYS` is the schema: dotted key -> (kind, meaning). The README's "Card source" table is
checked against it (`tests/test_docs.py`), and `load_card_source` refuses a file that breaks it
with one error naming the key (`card.yaml: training.setup[2]: ...`). Every string outside
`front_matter` is a jinja template rendered with `facts`, `config` and `results`
(`dspark_hub.cards.render`). A mapping whose children are not listed takes any keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import is_int

#: dotted key -> (kind, meaning). Kinds: `string` (required), `markdown`, `integer`, `mapping`,
#: `pairs` (a list of [label, value]), `names` (a mapping of name -> text), `config` (a path, a
#: profile name or a mapping), `files` (a list of {file, size, sha256}).
CARD_KEYS: dict[str, tuple[str, str]] = {
    "name": ("string", "the H1 title (required)"),
    "summary": ("markdown", "paragraphs under the title"),
    "front_matter": ("mapping", "the Hub metadata (license, base_model, base_model_relation, tags, pipeline_tag, "
                                "...), checked as the Hub checks it (required)"),
    "architecture": ("mapping", "the architecture section"),
    "architecture.block_size": ("integer", "draft tokens per step (not a config key; the weights' __metadata__ "
                                           "block_size wins)"),
    "architecture.intro": ("markdown", "before the computed facts"),
    "architecture.component_notes": ("names", "a note per component row, by tensor name or 'decoder layers'"),
    "architecture.specs": ("pairs", "a two-column table of facts only a person knows"),
    "architecture.notes": ("markdown", "after the facts"),
    "architecture.config": ("config", "without a checkpoint: the config.json (or profile) to derive the roster from"),
    "architecture.facts": ("mapping", "without a checkpoint: the facts themselves (parameters, tensors, dtype, "
                                      "target_layer_ids, num_hidden_layers, block_size, markov_rank, ...)"),
    "training": ("mapping", "the training section (a training log adds the run it records)"),
    "training.intro": ("markdown", "before the setup table"),
    "training.setup": ("pairs", "the setup table"),
    "training.notes": ("markdown", "after the setup table"),
    "results": ("mapping", "the results section"),
    "results.intro": ("markdown", "before the tables"),
    "results.eval": ("string", "evaluation JSON, relative to card.yaml (when the command names none)"),
    "results.train_log": ("string", "training log, relative to card.yaml (when the command names none)"),
    "results.harness": ("mapping", "harness metadata the files do not carry (the files win)"),
    "results.by_step": ("mapping", "the acceptance-by-step table"),
    "results.by_step.intro": ("markdown", "before it"),
    "results.by_step.notes": ("markdown", "after it"),
    "results.by_dataset": ("mapping", "the acceptance-by-dataset table"),
    "results.by_dataset.intro": ("markdown", "before it"),
    "results.by_dataset.notes": ("markdown", "after it"),
    "results.by_dataset.rate_decimals": ("integer", "decimals of a rate (default 1)"),
    "results.by_dataset.length_decimals": ("integer", "decimals of an acceptance length (default 2)"),
    "results.long_context": ("mapping", "the long-context table"),
    "results.long_context.intro": ("markdown", "before it"),
    "results.long_context.notes": ("markdown", "after it"),
    "results.long_context.rate_decimals": ("integer", "decimals of a rate (default 1)"),
    "results.long_context.length_decimals": ("integer", "decimals of an acceptance length (default 2)"),
    "results.notes": ("markdown", "after the tables"),
    "usage": ("markdown", "the usage section"),
    "checksums": ("mapping", "the checksum section"),
    "checksums.intro": ("markdown", "before the table"),
    "checksums.files": ("files", "without a checkpoint: the rows ({file, size, sha256})"),
    "license": ("markdown", "the license section"),
}

#: Sections every card has, filled with an empty default when the source leaves them out.
SECTION_DEFAULTS: dict[str, Any] = {
    "summary": None, "architecture": {}, "training": {}, "results": {}, "usage": None, "checksums": {},
    "license": None,
}
_REQUIRED = ("name", "front_matter")


def _is_text(value: Any) -> bool:
    return isinstance(value, str)



def _is_cell(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _pairs_problem(value: Any) -> str | None:
    if not isinstance(value, list):
        return "must be a list of [label, value] pairs"
    for i, row in enumerate(value):
        if not (isinstance(row, list) and len(row) == 2 and all(_is_cell(cell) for cell in row)):
            return f"[{i}] must be a [label, value] pair of strings or numbers, not {row!r}"
    return None


def _files_problem(value: Any) -> str | None:
    if not isinstance(value, list):
        return "must be a list of {file, size, sha256}"
    for i, row in enumerate(value):
        if not (isinstance(row, dict) and _is_text(row.get("file")) and is_int(row.get("size"))
                and (row.get("sha256") is None or _is_text(row.get("sha256")))):
            return f"[{i}] must be {{file: string, size: integer, sha256: string}}, not {row!r}"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "string": lambda v: None if _is_text(v) else "must be a string",
    "markdown": lambda v: None if _is_text(v) else "must be a string (markdown)",
    "integer": lambda v: None if is_int(v) else "must be an integer",
    "mapping": lambda v: None if isinstance(v, dict) else "must be a mapping",
    "names": lambda v: None if isinstance(v, dict) and all(_is_text(k) and _is_cell(x) for k, x in v.items())
    else "must map names to text",
    "pairs": _pairs_problem,
    "config": lambda v: None if _is_text(v) or isinstance(v, dict) else "must be a path, a profile name or a mapping",
    "files": _files_problem,
}


def card_source_problems(doc: Any) -> list[str]:
    """Every way `doc` (a parsed card.yaml) breaks `CARD_KEYS`, as `key: problem` (dotted keys)."""
    if not isinstance(doc, dict):
        return [f"the file is a YAML {type(doc).__name__}, not a mapping"]
    problems = [f"{key}: is required" for key in _REQUIRED if key not in doc]
    problems += _check_mapping(doc, "")
    return problems


def _check_mapping(node: Mapping[str, Any], prefix: str) -> list[str]:
    children = {k[len(prefix):] for k in CARD_KEYS if k.startswith(prefix) and "." not in k[len(prefix):]}
    out: list[str] = []
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if key not in children:
            known = ", ".join(sorted(children))
            out.append(f"{dotted}: not a card key{f' here (known: {known})' if known else ''}")
            continue
        if value is None and dotted not in _REQUIRED:
            continue       # an empty optional section or text
        kind = CARD_KEYS[dotted][0]
        problem = _CHECKS[kind](value)
        if problem:
            out.append(f"{dotted}{'' if problem.startswith('[') else ': '}{problem}")
        elif kind == "mapping" and any(k.startswith(f"{dotted}.") for k in CARD_KEYS):
            out += _check_mapping(value, f"{dotted}.")
    return out


#: The most values a YAML document may stand for, an alias counted again at each use: a card's front matter
#: and card.yaml hold a few hundred; nine nested aliases of nine make 387 million (an "alias bomb").
MAX_YAML_VALUES = 100_000


def _expands_beyond(doc: Any, limit: int) -> bool:
    """Whether walking `doc` (aliases followed at each use, as every reader of it does) visits over `limit` values."""
    stack, seen = [doc], 0
    while stack:
        seen += 1
        if seen > limit:
            return True
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, refusing a document whose aliases expand beyond `MAX_YAML_VALUES` or into themselves.

    The one YAML reader of card sources and card front matter.

    Raises:
        yaml.YAMLError: not YAML, or an alias bomb (a `ConstructorError` whose `problem` says so).
    """
    import yaml

    doc = yaml.safe_load(text)
    if _expands_beyond(doc, MAX_YAML_VALUES):
        raise yaml.constructor.ConstructorError(
            None, None, f"its aliases expand to more than {MAX_YAML_VALUES:,} values (an alias bomb, or an alias "
            "inside itself); write the values out", None)
    return doc


def load_card_source(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read `card.yaml`, check it against `CARD_KEYS`, and fill every optional section with an empty default.

    Raises:
        UsageError: the file is missing or not YAML, or breaks the schema (the message names the key).
    """
    import yaml

    p = Path(path)
    try:
        doc = load_yaml(read_regular(p).decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file; pass the card source, cards/<name>/card.yaml", param="meta") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{p}: not valid YAML ({str(e).splitlines()[0]}); fix the syntax") from None
    problems = card_source_problems(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{p}: {problems[0]}{more}; the keys are listed in the README (Card source) and in "
                         "dspark_hub.cards.source.CARD_KEYS")
    meta = {**SECTION_DEFAULTS, **doc}
    for key in ("architecture", "training", "results", "checksums"):
        meta[key] = dict(meta[key] or {})
    return meta
