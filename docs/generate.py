"""Write the parts of docs/ that mirror the code, from the code.

    python docs/generate.py            rewrite every generated block in place
    python docs/generate.py --check    exit 1 naming each stale block, write nothing

A generated block sits between `<!-- generated: NAME -->` and `<!-- end generated -->` in a
Markdown file under docs/; the prose around it is written by hand. `GENERATORS` maps NAME to
the function that renders it: code registries, the error codes of the CLI's error JSON, the
`--json` schema ids, the card source schema, the loader and config rules, and every command's
`--help`. `tests/test_docs_generated.py` runs the check in the test suite, so CI fails on a
stale table and says to run this script.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
if str(ROOT) not in sys.path:            # run as a script from anywhere: import the checkout's package
    sys.path.insert(0, str(ROOT))

BLOCK = re.compile(r"(?P<open><!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- end generated -->)",
                   re.S)
#: The terminal width `--help` is rendered at (click wraps to it).
HELP_COLUMNS = "100"

#: Generated code table -> the module whose registry it shows (`tests/codes.py` names each
#: module's registry; `tests/test_docs_generated.py` checks every registry has a table).
CODE_TABLES: dict[str, str] = {
    "codes-folder": "dspark_hub.format.checkpoint",
    "codes-format": "dspark_hub.format.reader",
    "codes-verify": "dspark_hub.verify.codes",
    "codes-card-lint": "dspark_hub.cards.lint",
    "codes-json": "dspark_hub.format.jsonio",
    "codes-digests": "dspark_hub.format.digests",
    "codes-load": "dspark_hub.format.remote_code",
    "codes-vllm": "dspark_hub.verify.execute_vllm",
}


def cell(text: object) -> str:
    """Text for a Markdown table cell: pipes, angle brackets, stars and dunders escaped."""
    out = " ".join(str(text).split())
    for raw, escaped in (("\\", "\\\\"), ("|", "\\|"), ("<", "\\<"), (">", "\\>"), ("*", "\\*"), ("__", "\\_\\_")):
        out = out.replace(raw, escaped)
    return out


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def registry_name(module: str) -> str:
    from tests.codes import REGISTRIES

    return REGISTRIES[module]


def code_table(module: str) -> str:
    name = registry_name(module)
    codes: dict[str, str] = getattr(importlib.import_module(module), name)
    source = module.replace(".", "/") + ".py"
    return (f"From `{source}:{name}`.\n\n"
            + table(("code", "meaning"), [(f"`{code}`", cell(meaning)) for code, meaning in codes.items()]))


def error_json_codes() -> str:
    """`error.code` of the CLI's error JSON: the `error_code` of each exception class in `dspark_hub.errors`."""
    from dspark_hub import errors

    rows = []
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, errors.DsparkError) and cls.__module__ == errors.__name__:
            doc = (inspect.getdoc(cls) or "").split("\n\n")[0]
            rows.append((f"`{cls.error_code}`", f"`{name}`", cell(doc)))
    return "From the `error_code` of each exception in `dspark_hub/errors.py`.\n\n" + \
        table(("`error.code`", "exception", "meaning"), rows)


def schema_ids() -> str:
    from dspark_hub import schemas

    rows = [(f"`{sid}`", f"`{key}`") for key, sid in schemas.COMMANDS.items()]
    files = [(f"`{getattr(schemas, name)}`", f"`{name}`") for name in ("CHECKSUMS", "ROLLOUTS_DATA", "GOLDEN_FIXTURE")]
    legacy = [(f"`{old}`", f"`{new}`") for old, new in schemas.LEGACY_FILE_IDS.items()]
    return ("`--json` output, from `dspark_hub/schemas.py:COMMANDS` (the key is the command path joined with `-`):\n\n"
            + table(("schema", "command"), rows)
            + "\nFiles written for other tools (`schemas.py` constants):\n\n" + table(("schema", "constant"), files)
            + "\nIds written before 0.2, still read (`schemas.LEGACY_FILE_IDS`):\n\n"
            + table(("old id", "read as"), legacy))


def card_source() -> str:
    from dspark_hub.cards.source import CARD_KEYS

    rows = [(f"`{key}`", cell(kind), cell(meaning)) for key, (kind, meaning) in CARD_KEYS.items()]
    return "From `dspark_hub/cards/source.py:CARD_KEYS`.\n\n" + table(("key", "kind", "meaning"), rows)


def _cited_rows(rules: object) -> list[tuple[str, ...]]:
    values = rules.values() if isinstance(rules, dict) else rules
    return [(f"`{r.id}`" if r.id else "", cell(r.rule), cell(r.source), r.evidence or "read") for r in values]


def speculators_config_rules() -> str:
    from dspark_hub.verify.speculators import RULES

    rows = [(f"`{r.id}`", cell(r.rule), cell(r.source), r.evidence) for r in RULES.values()]
    return ("From `dspark_hub/verify/speculators.py:RULES`.\n\n"
            + table(("rule", "what it demands", "source", "evidence"), rows))


def vllm_k3_rules() -> str:
    from dspark_hub.verify.runtimes_vllm import RULES

    return ("From `dspark_hub/verify/runtimes_vllm.py:RULES`.\n\n"
            + table(("rule", "what vLLM does", "source", "evidence"), _cited_rows(RULES)))


def vllm_speculators_rules() -> str:
    from dspark_hub.verify.runtimes_speculators import RULES

    return ("From `dspark_hub/verify/runtimes_speculators.py:RULES`.\n\n"
            + table(("rule", "what vLLM does", "source", "evidence"), _cited_rows(RULES)))


def other_runtime_rules() -> str:
    from dspark_hub.verify.runtimes import RUNTIMES, RuntimeSpec

    parts = ["From `dspark_hub/verify/runtimes.py:RUNTIMES` (each runtime's `rules`).\n"]
    for name, loader in RUNTIMES.items():
        if isinstance(loader, RuntimeSpec) and name != "vllm":
            rows = [row[1:] for row in _cited_rows(loader.rules)]
            parts.append(f"\n`{name}` ({cell(loader.title)}):\n\n"
                         + table(("what it does", "source", "evidence"), rows))
    return "".join(parts)


def _commands() -> Iterator[tuple[list[str], object]]:
    """(path, command) of every command, groups first, in name order."""
    import click

    from dspark_hub.cli.main import cli

    def walk(path: list[str], command: click.Command) -> Iterator[tuple[list[str], click.Command]]:
        yield path, command
        if isinstance(command, click.Group):
            for name in sorted(command.commands):
                yield from walk([*path, name], command.commands[name])

    yield from walk([], cli)


def cli_reference() -> str:
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    parts = []
    for path, _ in _commands():
        result = CliRunner(env={"COLUMNS": HELP_COLUMNS}).invoke(cli, [*path, "--help"], prog_name="dspark-hub")
        if result.exit_code != 0:
            raise SystemExit(f"dspark-hub {' '.join(path)} --help exited {result.exit_code}: {result.output}")
        title = " ".join(["dspark-hub", *path])
        parts.append(f"### `{title}`\n\n```text\n{result.stdout.rstrip()}\n```\n")
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    **{name: (lambda module=module: code_table(module)) for name, module in CODE_TABLES.items()},
    "error-json-codes": error_json_codes,
    "schema-ids": schema_ids,
    "card-source": card_source,
    "rules-speculators-config": speculators_config_rules,
    "rules-vllm-k3": vllm_k3_rules,
    "rules-vllm-speculators": vllm_speculators_rules,
    "rules-other-runtimes": other_runtime_rules,
    "cli-reference": cli_reference,
}


def regenerate(text: str, where: str) -> str:
    """`text` with every generated block rendered afresh."""
    def render(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise SystemExit(f"{where}: no generator named {name!r} (known: {', '.join(sorted(GENERATORS))})")
        return match["open"] + GENERATORS[name]() + match["close"]

    return BLOCK.sub(render, text)


def stale_files() -> dict[Path, str]:
    """docs file -> its text regenerated, for each file whose generated blocks are out of date."""
    out = {}
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        fresh = regenerate(text, path.relative_to(ROOT).as_posix())
        if fresh != text:
            out[path] = fresh
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale; write nothing")
    args = parser.parse_args(argv)
    stale = stale_files()
    for path, fresh in stale.items():
        rel = path.relative_to(ROOT).as_posix()
        if args.check:
            print(f"{rel}: generated tables are stale; run python docs/generate.py", file=sys.stderr)
        else:
            tmp = path.with_suffix(".md.tmp")
            tmp.write_text(fresh)
            tmp.replace(path)
            print(f"wrote {rel}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
