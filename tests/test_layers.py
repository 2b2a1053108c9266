"""Layers only point down: every import of every module (module level, function level and
`TYPE_CHECKING`) against one table of allowed edges. docs/architecture.md's table mirrors
`ALLOWED` and the README's drawing names every module; change them together, and write the reason
next to any edge you add.
"""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dspark_hub"

#: The bottom: imported by every area, importing nothing of ours but each other.
BOTTOM = {"errors", "report", "schemas", "_lazy", "_compat", "_text", "progress", "redaction", "_version", "documents"}

#: area -> the areas it may import (besides itself). One row per area; docs/architecture.md shows this table.
ALLOWED: dict[str, set[str]] = {
    # The bottom imports nothing of ours but the bottom, downwards (the table stays a DAG).
    "errors": set(),
    "schemas": set(),
    "report": {"errors", "schemas", "documents"},
    "documents": set(),       # a result's JSON document from its dataclass
    "_lazy": set(),
    "_compat": set(),         # resolves the moved names by string (importlib), never by an import statement
    "_text": set(),
    "progress": set(),
    "redaction": set(),       # no token in any output: the CLI's gate and the Hub client's messages
    "_version": set(),
    "format": BOTTOM,
    "vllm": {"format"} | BOTTOM,                    # vLLM's one home: its pin, install hint, child process
    "modeling": {"format"} | BOTTOM,
    "verify": {"format", "modeling", "vllm"} | BOTTOM,      # modeling: golden vectors run the reference forward
    "ops": {"verify", "format", "modeling"} | BOTTOM,
    "train": {"verify", "ops", "format", "modeling", "vllm"} | BOTTOM,
    "cards": {"verify", "format"} | BOTTOM,
    "hub": {"cards", "verify", "format"} | BOTTOM,   # cards: its public API only (PUBLIC_ONLY)
    "cli": {"verify", "ops", "train", "cards", "hub", "format", "modeling"} | BOTTOM,
    "__main__": {"cli"},
    "__init__": {"format", "ops"} | BOTTOM,          # the root package's lazy public names
}
#: `train`'s wings, lowest first: a wing imports only the wings before it (docs/architecture.md says so).
TRAIN_WINGS = ("target", "data", "evaluation", "finetuning")
#: (importer, area): the importer may use only `dspark_hub.<area>` itself, i.e. the names in its `__all__`.
PUBLIC_ONLY = {("hub", "cards")}
#: `from dspark_hub import <name>` is the root package; these names of it are bottom-level facts.
ROOT_NAMES = {"__version__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _area(module: str) -> str:
    """`dspark_hub.verify.checks` -> `verify`; the root package is `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) for every import statement in the file, at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [alias.name for alias in node.names]
            if target.split(".")[0] == "dspark_hub" and not node.module and node.level:
                found += [(node.lineno, f"{target}.{name}", []) for name in names]   # from . import x
            else:
                found.append((node.lineno, target, names))
    return [item for item in found if item[1].split(".")[0] == "dspark_hub"]


def _exports(area: str) -> set[str]:
    tree = ast.parse((PACKAGE / area / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def edges() -> list[tuple[str, str, str, int, str, list[str]]]:
    """(importer area, imported area, file, line, imported module, names) for every import of ours."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = _module_name(path)
        for line, target, names in imports(path):
            rel = path.relative_to(ROOT).as_posix()
            if target != "dspark_hub":
                out.append((_area(importer), _area(target), rel, line, target, names))
                continue
            for name in names:      # `from dspark_hub import x`: a submodule, or one of the root's names
                if name in ROOT_NAMES:
                    continue
                is_module = (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()
                out.append((_area(importer), name if is_module else "__init__", rel, line, target, [name]))
    return out


def test_the_table_names_every_area():
    areas = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert areas == set(ALLOWED)


def test_the_scan_sees_function_level_and_type_checking_imports():
    seen = {(area, target) for area, target, *_ in edges()}
    assert ("verify", "modeling") in seen       # dspark_hub/verify/golden.py imports it inside a function
    assert ("__init__", "ops") in seen          # under `if TYPE_CHECKING:` in dspark_hub/__init__.py


def test_every_import_follows_the_table():
    wrong = [f"{file}:{line}: {importer} imports {target}" for importer, area, file, line, target, _ in edges()
             if area != importer and area not in ALLOWED[importer]]
    assert wrong == []


@pytest.mark.parametrize(("importer", "area"), sorted(PUBLIC_ONLY))
def test_public_only_edges_use_the_package_api(importer, area):
    public = _exports(area)
    wrong = [f"{file}:{line}: {target} {names}" for imp, ar, file, line, target, names in edges()
             if (imp, ar) == (importer, area) and (target != f"dspark_hub.{area}" or not set(names) <= public)]
    assert public and wrong == []


def test_nothing_imports_the_cli():
    assert [(file, line) for importer, area, file, line, *_ in edges()
            if area == "cli" and importer not in ("cli", "__main__")] == []


def test_no_cycle_between_areas():
    graph: dict[str, set[str]] = {area: set() for area in ALLOWED}
    for importer, area, *_ in edges():
        if importer != area:
            graph[importer].add(area)
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"import cycle between areas: {' -> '.join(e.args[1])}")
    # the table itself is a DAG, so following it can never make a cycle
    list(TopologicalSorter({area: set(allowed) for area, allowed in ALLOWED.items()}).static_order())


def test_the_documented_architecture_table_mirrors_allowed():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[:text.index("## Moved in 0.2")]
    documented: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        allowed = {token for token in re.findall(r"`([\w.]+)`", cells[1]) if token in ALLOWED}
        for area in re.findall(r"`([\w.]+)`", cells[0]):
            documented[area] = allowed - {area}
    expected = {area: allowed - (BOTTOM if area not in BOTTOM | {"__main__"} else set())
                for area, allowed in ALLOWED.items()}
    assert documented == expected



def area_modules(folder: Path) -> set[str]:
    """Every module of an area, its sub-packages' included (`verify/runtimes/execute_vllm/runner.py`), and the
    sub-packages themselves; `__init__` and `__main__` are the packages'."""
    modules = {p.stem for p in folder.rglob("*.py") if p.stem not in ("__init__", "__main__")}
    return modules | {p.parent.name for p in folder.rglob("*/__init__.py")}


def test_area_modules_walks_sub_packages():
    modules = area_modules(PACKAGE / "verify")
    assert {"checks", "runtimes", "loaders", "execute_vllm", "runner"} <= modules
    assert not {"__init__", "__main__", "verify"} & modules


def test_the_readme_drawing_names_every_module_of_every_area():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Architecture"):]
    drawing = section[section.index("```text"):section.index("```", section.index("```text") + 7)]
    blocks = re.split(r"\n  (?=[a-z_]+ {2,})", drawing)
    named = {block.split()[0]: set(re.findall(r"\b\w+\b", block)) for block in blocks[1:]}
    missing = {area: sorted(area_modules(PACKAGE / area) - named[area]) for area in named if (PACKAGE / area).is_dir()}
    assert set(named) >= {"cli", "train", "hub", "ops", "cards", "verify", "modeling", "format"}
    assert {area: m for area, m in missing.items() if m} == {}



def module_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (at any depth); package `__init__` facades left out."""
    def resolve(target: str, names: list[str]) -> list[str]:
        hits = [f"{target}.{n}" for n in names
                if (ROOT / f"{target}.{n}".replace(".", "/")).with_suffix(".py").is_file()]
        return hits or [target]

    packages = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if module in packages:
            continue
        targets = {t for _, target, names in imports(path) for t in resolve(target, names)}
        graph[module] = {t for t in targets if t not in packages and t != module}
    return graph


def test_no_cycle_between_modules():
    """Function-level imports hide a cycle from Python, not from the reader: none, inside an area either."""
    try:
        list(TopologicalSorter(module_graph()).static_order())
    except CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def _wing(module: str) -> str | None:
    """`dspark_hub.train.data.rollouts` -> `data`; None outside a wing (the `train` package itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["dspark_hub", "train"] and parts[2] in TRAIN_WINGS else None


def upward_wing_imports(found: list[tuple[str, str, str, int, str, list[str]]]) -> list[str]:
    """`file:line: wing imports higher-wing` for every import of a higher wing of `train`."""
    wrong = []
    for _importer, _area, file, line, target, _names in found:
        here, there = _wing(_module_name(ROOT / file)), _wing(target)
        if here and there and TRAIN_WINGS.index(there) > TRAIN_WINGS.index(here):
            wrong.append(f"{file}:{line}: {here} imports {there} ({target})")
    return wrong


def test_train_wings_import_only_downward():
    assert {p.name for p in (PACKAGE / "train").iterdir() if (p / "__init__.py").is_file()} == set(TRAIN_WINGS)
    assert upward_wing_imports(edges()) == []


def test_an_upward_wing_import_is_named():
    upward = ("train", "train", "dspark_hub/train/evaluation/evaluate.py", 7, "dspark_hub.train.finetuning.config",
              ["canonical_dtype"])
    downward = ("train", "train", "dspark_hub/train/evaluation/evaluate.py", 8, "dspark_hub.train.target.dtypes",
                ["canonical_dtype"])
    assert upward_wing_imports([upward, downward]) == [
        "dspark_hub/train/evaluation/evaluate.py:7: evaluation imports finetuning (dspark_hub.train.finetuning.config)"]
