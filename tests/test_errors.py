"""The library never names a flag of our CLI; the CLI adds flags to what the library says.

The rule (also in `dspark_hub/errors.py`): a string in the library (every module outside
`dspark_hub/cli/`) may name one of our `--flags` only inside a whole command a reader can run,
quoted as `'dspark-hub <command> ...'` (e.g. a finding's hint "regenerate it with
'dspark-hub checksums --force'"): that is advice, true whoever called the library. A bare
"pass --force" assumes the caller is the CLI; the library says `param="force"`, or names the
argument in backticks, and the CLI turns it into the flag. Docstrings and comments document
the CLI for developers and are not checked; serving commands of other tools
(`vllm serve --speculative-config ...`) do not name *our* flags.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from dspark_hub.cli.main import cli

PACKAGE = Path(__file__).resolve().parent.parent / "dspark_hub"
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
RUNNABLE = re.compile(r"'dspark-hub [^']*'")


def _flags(command: click.Command) -> set[str]:
    found = {opt for param in command.params for opt in getattr(param, "opts", []) if opt.startswith("--")}
    for sub in getattr(command, "commands", {}).values():
        found |= _flags(sub)
    return found


OUR_FLAGS = frozenset(_flags(cli))


def flags_named(text: str) -> set[str]:
    """Our flags a library string names outside a quoted, runnable `'dspark-hub ...'` command."""
    return {flag for flag in FLAG.findall(RUNNABLE.sub("", text)) if flag in OUR_FLAGS}


def library_strings() -> list[tuple[str, int, str]]:
    """(file, line, text) of every string constant of the library outside `cli/`; f-strings joined, `{}` per field."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip: set[int] = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
                skip.add(id(body[0].value))   # a docstring
            if isinstance(node, ast.JoinedStr):
                skip.update(id(v) for v in node.values)
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                out.append((str(path.relative_to(PACKAGE)), node.lineno, text))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                out.append((str(path.relative_to(PACKAGE)), node.lineno, node.value))
    return out


@pytest.mark.parametrize("text, named", [
    ("out/: already exists; pass --force to replace it", {"--force"}),
    ("--drop-in: 'kimi-k4' is neither a bundled reference", {"--drop-in"}),
    ("finetune: pass --steps (or --epochs with --data)", {"--steps", "--epochs", "--data"}),
    ("regenerate it with 'dspark-hub checksums --force'", set()),           # a whole command: allowed
    ("vllm serve {} --speculative-config {}", set()),                        # another tool's flags
    ("python -m atom.entrypoints.openai_server --model {} --draft-model {}", set()),
    ("pass `teacher` (its lm_head gives the target distributions)", set()),  # library terms
])
def test_the_rule(text, named):
    assert flags_named(text) == named


def test_the_scan_sees_strings_fstrings_and_skips_docstrings():
    texts = {text for _, _, text in library_strings()}
    assert "regenerate it with 'dspark-hub checksums --force'" in texts
    assert any(t.startswith("{}: is the current folder or a parent of it") for t in texts)   # an f-string, joined
    assert not any(t.startswith("Verify a checkpoint folder (or `hf://` repo)") for t in texts)   # verify's docstring


def test_no_library_string_names_a_flag_of_our_cli():
    offenders = [f"{path}:{line}: {sorted(flags_named(text))} in {text[:80]!r}"
                 for path, line, text in library_strings() if flags_named(text)]
    assert offenders == []


@pytest.mark.parametrize("name", ["k3", "K3_DSPARK", "speculators_dspark", "", "eagle3"])
def test_by_cli_name_raises_the_keyerror_it_documents(name):
    from dspark_hub.format.registry import by_cli_name

    with pytest.raises(KeyError, match=repr(name)):
        by_cli_name(name)


def test_by_cli_name_finds_every_format_by_its_cli_name():
    from dspark_hub.format.registry import FORMATS, by_cli_name

    assert [by_cli_name(f.cli_name) for f in FORMATS.values()] == list(FORMATS.values())
