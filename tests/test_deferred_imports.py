"""Function-level imports (issue 21 item 4) stay only where they defer something, and say so.

An import inside a function outside `train/` is either of a heavy or optional package (`HEAVY`:
importing it costs hundreds of milliseconds or it may be absent; the reason is the package itself),
or it carries a comment giving its reason on its line or the line above (a command's library behind
`--help`, an analysis that loads with its flag, ...). Anything else belongs at module level.
`OWNED_ELSEWHERE` holds files allowed to defer without a reason while being changed (empty: none is).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_hub"
#: Heavy or optional: torch/transformers/numpy/vLLM and the rest take 0.2-30 s to import (torf: 0.2 s,
#: 90 modules), pyarrow/vllm/speculators/matplotlib/triton may be absent; dspark_hub.modeling imports torch.
HEAVY = {"torch", "transformers", "jinja2", "huggingface_hub", "numpy", "pyarrow", "vllm", "yaml", "safetensors",
         "triton", "matplotlib", "speculators", "torf", "dspark_hub.modeling"}
#: Files allowed to defer light imports without a reason while being changed (empty: none is).
OWNED_ELSEWHERE: set[str] = set()


def _heavy(module: str) -> bool:
    return any(module == h or module.startswith(h + ".") for h in HEAVY)


def unexplained_imports(source: str, where: str) -> list[str]:
    """`file:line` of each function-level import of a light module with no comment on its line or the one above."""
    lines = source.splitlines()
    out: list[str] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, True)
            elif isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                modules = ([a.name for a in child.names] if isinstance(child, ast.Import)
                           else [child.module or ""] if child.level == 0 else ["." + (child.module or "")])
                around = lines[max(0, child.lineno - 2):child.end_lineno or child.lineno]
                if not all(_heavy(m) for m in modules) and not any("#" in line for line in around):
                    out.append(f"{where}:{child.lineno}: {ast.unparse(child)} inside a function: move it to "
                               "module level, or say on it what it defers")
            else:
                visit(child, in_function)

    visit(ast.parse(source), False)
    return out


def test_every_function_level_import_defers_something():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if not name.startswith("train/") and name not in OWNED_ELSEWHERE:
            problems += unexplained_imports(path.read_text(), f"dspark_hub/{name}")
    assert not problems, "\n".join(problems)


def test_the_allow_list_holds_only_files_that_still_need_it():
    stale = sorted(name for name in OWNED_ELSEWHERE
                   if not unexplained_imports((PACKAGE / name).read_text(), name))
    assert not stale, f"nothing unexplained left: remove {stale} from OWNED_ELSEWHERE"


@pytest.mark.parametrize("source, line", [
    ("def f():\n    import json\n    return json\n", 2),
    ("def f():\n    from dspark_hub.format import contract\n    return contract\n", 2),
    ("class A:\n    def m(self):\n        from dspark_hub.report import Finding\n        return Finding\n", 3),
    ("def f():\n    def g():\n        import os\n        return os\n    return g\n", 3),
    ("def f():\n    import torch, json\n    return torch, json\n", 2),          # one light module is enough
    ("def f():\n    from .sibling import x\n    return x\n", 2),
])
def test_the_checker_flags_a_light_import_without_a_reason(source, line):
    problems = unexplained_imports(source, "snippet.py")
    assert len(problems) == 1 and problems[0].startswith(f"snippet.py:{line}: ")


@pytest.mark.parametrize("source", [
    "def f():\n    import torch\n    return torch\n",
    "def f():\n    from transformers.utils import logging\n    return logging\n",
    "def f():\n    from dspark_hub.modeling import load_checkpoint\n    return load_checkpoint\n",
    "def f():\n    from dspark_hub.cards.lint import lint_card  # loads when the command runs\n    return lint_card\n",
    "def f():\n    # optional: loads with its flag\n    from dspark_hub.verify import pairing\n    return pairing\n",
    "import json\n\n\ndef f():\n    return json\n",                        # module level
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dspark_hub.report import Report\n",
])
def test_the_checker_passes_heavy_explained_and_module_level_imports(source):
    assert unexplained_imports(source, "snippet.py") == []
