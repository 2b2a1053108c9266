"""The jinja2 side of a card: the template environment, the sandbox card.yaml strings render in, and what
`{{ value }}` prints (`reader_text`: never a Python repr).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from dspark_hub.cards.card_text import code_span, line_text
from dspark_hub.cards.facts import Component, FileChecksum
from dspark_hub.errors import UsageError
from dspark_hub.format import contract

TEMPLATE = "model_card.md.j2"


def templates_dir() -> Path:
    """The templates folder: `templates/` of a source checkout, else the installed `dspark_hub.templates`."""
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if (checkout / TEMPLATE).is_file():
        return checkout
    return Path(str(files("dspark_hub.templates")))


def _num(value: Any) -> str:
    if value is None:
        return "—"
    return repr(float(value)) if isinstance(value, float) else str(value)


#: Line breaks a table cell of card-source text may not hold (the row would end there).
_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")


def _cell(value: Any) -> str:
    """Card-source text in a table cell: line breaks become spaces, `|` is escaped."""
    return _BREAKS.sub(" ", str(value)).replace("|", "\\|")


def _thousands(value: Any) -> str:
    """`1,234`; a value from a file that is no integer is shown as text (`line_text`), never a crash."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else line_text(value)


class NotReaderText(ValueError):
    """`{{ expression }}` named an object that has no text a reader expects (it would print as Python)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        super().__init__(f"it prints a {type(value).__name__} as Python text ({_clip(repr(value))}); "
                         f"print {_what_to_print(value)} instead")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _what_to_print(value: Any) -> str:
    if isinstance(value, Mapping):
        return "one of its keys (" + ", ".join(f"`.{k}`" for k in list(value)[:6]) + ")"
    if dataclasses.is_dataclass(value):
        return "one of its fields (" + ", ".join(f"`.{f.name}`" for f in dataclasses.fields(value)) + ")"
    return "one of its fields"


def reader_text(value: Any) -> Any:
    """What `{{ value }}` prints in a card: scalars as they are; `facts.parameters` as the total with
    separators (`136,753`; its fields `.total`, `.trained`, `.frozen`, `.maps` are numbers); a component
    by its name, a checksum row by its file; a list of numbers as `[2, 23, 47]`, any other list as its
    items' texts joined by ", ". Anything else (a mapping, another object) raises `NotReaderText`."""
    import jinja2  # heavy (TID253): loads when a card renders

    if isinstance(value, jinja2.Undefined):
        return value                            # strict: printing it raises, naming what is undefined
    if isinstance(value, contract.ParameterCounts):
        return f"{value.total:,}"
    if isinstance(value, Component):
        return value.name
    if isinstance(value, FileChecksum):
        return value.file
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return value
        return ", ".join(str(reader_text(v)) for v in value)
    raise NotReaderText(value)


def environment() -> Any:
    """The jinja2 environment cards render with (strict undefined, trailing newline kept; every
    `{{ }}` goes through `reader_text`, so no Python repr reaches a card)."""
    import jinja2  # heavy (TID253): loads when a card renders

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                             finalize=reader_text)
    env.filters.update(
        thousands=_thousands,
        shape=lambda s: " x ".join(map(str, s)) if s else "—",
        num=_num,
        pct=lambda x, d=1: f"{100 * x:.{d}f}%",
        fixed=lambda x, d=2: f"{x:.{d}f}",
        cell=_cell,
        code=lambda value, cell=False: code_span(value, cell=cell),
        text=lambda value, cell=False: line_text(value, cell=cell),
        harness=lambda pairs: " · ".join(f"{label}: {line_text(value)}" for label, value in pairs),
    )
    return env


#: The largest string or list a card source may build with `*`, and the largest exponent of `**`.
MAX_SOURCE_PRODUCT = 100_000
MAX_SOURCE_EXPONENT = 64


def source_environment() -> Any:
    """The sandbox card.yaml strings render in: `environment()`'s settings and filters, but no loader, no
    globals, no `_` attribute, no mutation, and bounded `*` and `**`.

    A card source is someone else's text that runs where the token is; it sees only the context it is
    given (`facts`, `config`, `results`) and the card filters.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError  # heavy: loads when a card renders

    class CardSourceSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int) and abs(right) > MAX_SOURCE_EXPONENT:
                raise SecurityError(f"an exponent above {MAX_SOURCE_EXPONENT} is not allowed")
            if operator == "*":
                size = next((len(x) * y for x, y in ((left, right), (right, left))
                             if isinstance(x, (str, list, tuple)) and isinstance(y, int)), 0)
                if size > MAX_SOURCE_PRODUCT:
                    raise SecurityError(f"a product longer than {MAX_SOURCE_PRODUCT:,} is not allowed")
            return super().call_binop(context, operator, left, right)

    ours = environment()
    env = CardSourceSandbox(undefined=ours.undefined, finalize=ours.finalize, autoescape=False,
                            keep_trailing_newline=ours.keep_trailing_newline, trim_blocks=ours.trim_blocks,
                            lstrip_blocks=ours.lstrip_blocks)
    env.filters.update(ours.filters)
    env.globals.clear()        # range, lipsum, cycler, joiner, namespace, dict: a card source needs none
    return env


def render_strings(value: Any, env: Any, context: Mapping[str, Any], where: str) -> Any:
    """Render every string of the card source as a sandboxed template (facts in prose are computed)."""
    import jinja2  # heavy (TID253): loads when a card renders
    from jinja2.sandbox import SecurityError

    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            return env.from_string(value).render(**context)
        except (TypeError, ArithmeticError, AttributeError, LookupError) as e:    # Python under the expression
            raise UsageError(f"card.yaml:{where}: the expression fails ({type(e).__name__}: {e}); "
                             "fix the expression") from None
        except SecurityError as e:
            reason = str(e).rstrip(".")
            raise UsageError(f"card.yaml:{where}: refused by the card-source sandbox ({reason}); a card source may "
                             "use only the documented facts, config and results") from None
        except jinja2.TemplateError as e:
            raise UsageError(f"card.yaml:{where}: {e}; the fact is not known for this card (no checkpoint?) "
                             "or the expression is wrong") from None
        except NotReaderText as e:
            raise UsageError(f"card.yaml:{where}: {e}") from None
    if isinstance(value, dict):
        return {k: render_strings(v, env, context, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [render_strings(v, env, context, f"{where}[{i}]") for i, v in enumerate(value)]
    return value
