"""Follow one parameter through the package's calls, as the code is written, and count how often the walk comes
back to a module it had left.

    python bench/walk.py dspark_hub/cli/train.py:eval_command:draft

Nothing is run: the walk reads the source (Python's `ast`). Inside a function it follows the parameter and every
name assigned from an expression that mentions it (`config = read_json(path)`, `for r in rollouts`), unless the
expression puts it down in a call of something not ours (`folder = Path(path)`); a call that
hands one of them on (as an argument, or as the object whose method is called) is followed into the function it
calls, when that function is ours and can be named from the code: a function of the module or one it imports, a
method of `self`'s class, or the one method of that name in the package. Every branch is walked, in source order;
a function already walked is not walked again.

A *stop* is a function the walk enters; consecutive stops in one module are one *stay*; a stay in a module that
had a stay before is a *return to a module already left*. `tests/test_walk.py` holds `eval`'s walk to at most
four returns.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Function:
    module: str                 # dotted, e.g. dspark_hub.train.evaluation.evaluate
    qualname: str               # e.g. evaluate, EvalInputs.stop_ids
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def params(self) -> list[str]:
        args = self.node.args
        return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


@dataclass
class Module:
    name: str
    path: Path
    functions: dict[str, Function] = field(default_factory=dict)      # qualname -> function
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)   # local name -> (module, attribute)


class Package:
    """Every module of a package: its functions, methods and imports."""

    def __init__(self, root: Path, package: str = "dspark_hub") -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.modules[name] = self._read(name, path, is_package=parts[-1] == "__init__")

    def _read(self, name: str, path: Path, *, is_package: bool) -> Module:
        module = Module(name, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        base = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    parts = base.split(".")
                    source = ".".join(parts[:len(parts) - node.level + 1] + ([source] if source else []))
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    module.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.functions[node.name] = Function(name, node.name, node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        qualname = f"{node.name}.{item.name}"
                        module.functions[qualname] = Function(name, qualname, item)
                module.functions.setdefault(node.name, None)  # type: ignore[arg-type]  # a class: its __init__
        return module

    def lookup(self, module: str, name: str) -> Function | None:
        """`name` (a function, or a class: its `__init__`) as defined in `module`, following re-exports."""
        found = self.modules.get(module)
        if found is None:
            return None
        if name in found.functions:
            function = found.functions[name]
            return function if function is not None else found.functions.get(f"{name}.__init__")
        if name in found.imports:
            source, attribute = found.imports[name]
            return self.lookup(source, attribute) if attribute else None
        return None

    def methods(self, name: str) -> list[Function]:
        return [f for m in self.modules.values() for q, f in m.functions.items()
                if f is not None and q.rpartition(".")[2] == name and "." in q]


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _targets(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            yield f"self.{n.attr}"


def _in_order(function: ast.AST) -> list[ast.AST]:
    nodes = [n for n in ast.walk(function) if hasattr(n, "lineno") and n is not function]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


@dataclass
class Walk:
    package: Package
    stops: list[tuple[str, str]] = field(default_factory=list)

    def enter(self, function: Function, names: set[str]) -> None:
        key = (function.module, function.qualname)
        if key in self.stops:
            return
        self.stops.append(key)
        tracked = set(names)
        for node in _in_order(function.node):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None \
                    and self._carries(function, node.value, tracked):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tracked.update(name for t in targets for name in _targets(t))
            elif isinstance(node, (ast.For, ast.comprehension)) and _mentions(node.iter, tracked):
                tracked.update(_targets(node.target))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None \
                    and _mentions(node.context_expr, tracked):
                tracked.update(_targets(node.optional_vars))
            elif isinstance(node, ast.Call):
                self._call(function, node, tracked)

    def _carries(self, function: Function, value: ast.AST, tracked: set[str]) -> bool:
        """Whether a value assigned from `value` is the parameter in another form: an expression that mentions it,
        unless it is put down in a call of something not ours (`Path(path)`, `torch.cat(states)`)."""
        if not _mentions(value, tracked):
            return False
        return not (isinstance(value, ast.Call) and not self._resolve(function, value))

    def _call(self, caller: Function, call: ast.Call, tracked: set[str]) -> None:
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        carried = [i for i, arg in enumerate(call.args) if _mentions(arg, tracked)]
        keywords = [k.arg for k in call.keywords if k.arg and _mentions(k.value, tracked)]
        on_receiver = receiver is not None and _mentions(receiver, tracked)
        if not (carried or keywords or on_receiver):
            return
        for callee, is_method in self._resolve(caller, call):
            params = callee.params
            offset = 1 if is_method and params[:1] in (["self"], ["cls"]) else 0
            names = {params[i + offset] for i in carried if i + offset < len(params)}
            names |= {k for k in keywords if k in params}
            if on_receiver and offset:
                names.add(params[0])
            if names:
                self.enter(callee, names)

    def _resolve(self, caller: Function, call: ast.Call) -> list[tuple[Function, bool]]:
        package, func = self.package, call.func
        if isinstance(func, ast.Name):
            found = package.lookup(caller.module, func.id)
            return [(found, found.qualname.endswith(".__init__"))] if found else []
        if not isinstance(func, ast.Attribute):
            return []
        base = func.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls") and "." in caller.qualname:
            found = package.modules[caller.module].functions.get(f"{caller.qualname.split('.')[0]}.{func.attr}")
            return [(found, True)] if found else []
        if isinstance(base, ast.Name):
            imported = package.modules[caller.module].imports.get(base.id)
            if imported is not None:                    # a module, or a class, named in an import
                source, attribute = imported
                target = f"{source}.{attribute}" if attribute else source
                if target in package.modules:
                    found = package.lookup(target, func.attr)
                    return [(found, False)] if found else []
                owner = package.lookup(source, attribute) if attribute else None
                if owner is not None:
                    found = package.modules[owner.module].functions.get(f"{owner.qualname.split('.')[0]}.{func.attr}")
                    return [(found, True)] if found else []
        candidates = package.methods(func.attr)
        return [(candidates[0], True)] if len(candidates) == 1 else []


def stays(stops: list[tuple[str, str]]) -> list[str]:
    """Consecutive stops in one module as one stay."""
    out: list[str] = []
    for module, _ in stops:
        if not out or out[-1] != module:
            out.append(module)
    return out


def returns(sequence: list[str]) -> int:
    """Stays in a module that had a stay before."""
    return sum(1 for i, module in enumerate(sequence) if module in sequence[:i])


def walk(entry: str, root: Path = ROOT, package: str = "dspark_hub") -> list[tuple[str, str]]:
    """The stops of `FILE:FUNCTION:PARAM` (FUNCTION may be `Class.method`), in the order the walk enters them."""
    file, function, param = entry.split(":")
    parts = list(Path(file).with_suffix("").parts)
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    tree = Package(root, package)
    start = tree.modules[module].functions[function]
    if param not in start.params:
        raise SystemExit(f"{entry}: {function} has no parameter {param!r}")
    walker = Walk(tree)
    walker.enter(start, {param})
    return walker.stops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", help="FILE:FUNCTION:PARAM, e.g. dspark_hub/cli/train.py:eval_command:draft")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--within", default="dspark_hub.",
                        help="count stays only in modules under this dotted prefix (the walk goes everywhere)")
    args = parser.parse_args(argv)
    stops = walk(args.entry, args.root)
    for module, function in stops:
        print(f"  {module}.{function}")
    sequence = stays([(m, f) for m, f in stops if m.startswith(args.within)])
    print(" -> ".join(sequence))
    print(f"{len(stops)} stops; {len(sequence)} stays in {len(set(sequence))} modules; "
          f"{returns(sequence)} returns to a module already left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
