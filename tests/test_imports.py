"""Header-level code never imports torch, transformers or numpy."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "numpy", "huggingface_hub", "jinja2")


def _imported(code: str) -> set[str]:
    probe = code + f"; import sys; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(filter(None, out.stdout.strip().split(",")))


def test_light_imports_stay_light():
    assert _imported("import dspark_hub, dspark_hub.format.contract, dspark_hub.format.reader, "
                     "dspark_hub.format.jsonio, dspark_hub.format.digests, dspark_hub.format.checkpoint, "
                     "dspark_hub.format.remote, dspark_hub.verify.checks, dspark_hub.verify.runtimes.report, "
                     "dspark_hub.verify.family, dspark_hub.report, dspark_hub.errors, dspark_hub.cli") == set()


@pytest.mark.parametrize("drop_in, exit_code, shown", [
    ("kimi-k3", 1, "DROPIN_SHAPE"),          # the tiny draft is no drop-in for the full-size reference: findings
    ("itself", 0, "OK"),                     # ... and is one for itself
])
def test_verify_run_stays_light(tmp_path, drop_in, exit_code, shown):
    """A whole `verify --drop-in` run, to its verdict (the exit code says it finished), imports nothing heavy."""
    from .factories import write_checkpoint
    folder = write_checkpoint(tmp_path / "c")
    reference = str(folder) if drop_in == "itself" else drop_in
    code = (f"from click.testing import CliRunner; from dspark_hub.cli import cli; "
            f"r = CliRunner().invoke(cli, ['verify', {str(folder)!r}, '--drop-in', {reference!r}]); "
            f"assert r.exit_code == {exit_code} and {shown!r} in r.output, (r.exit_code, r.output)")
    assert _imported(code) == set()


def test_export_code_copies_files_without_torch(tmp_path):
    from .factories import write_checkpoint
    folder = write_checkpoint(tmp_path / "c")
    code = (f"from click.testing import CliRunner; from dspark_hub.cli import cli; "
            f"r = CliRunner().invoke(cli, ['export-code', {str(folder)!r}]); assert r.exit_code == 0, r.output")
    assert _imported(code) == set()
    assert (folder / "modeling_k3_dspark.py").read_bytes() == (
        Path(__file__).resolve().parent.parent / "dspark_hub" / "modeling" / "modeling_k3_dspark.py").read_bytes()


def test_every_public_name_resolves_to_its_definition():
    """Each lazy name of the root is the object of the same name in the module its table names; a name the table
    lacks is an AttributeError."""
    import dspark_hub

    names = _root_exports()
    assert set(names) == set(dspark_hub.__all__)
    for name, module in names.items():
        assert getattr(dspark_hub, name) is getattr(importlib.import_module(f"dspark_hub.{module}"), name), name
    with pytest.raises(AttributeError, match="has no attribute 'roster_of'"):
        _ = dspark_hub.roster_of


def _root_exports() -> dict[str, str]:
    """The root package's lazy table (`lazy_exports(__name__, {...})`), read from its source."""
    import dspark_hub

    tree = ast.parse(Path(dspark_hub.__file__).read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "lazy_exports"]
    return ast.literal_eval(calls[0].args[1])


PACKAGES = ["dspark_hub", "dspark_hub.verify", "dspark_hub.ops", "dspark_hub.train", "dspark_hub.cards",
            "dspark_hub.hub", "dspark_hub.modeling", "dspark_hub.cli"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_a_definition_not_a_submodule(package):
    """A lazy name equal to a submodule's would become that module once anything imports it."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    tree = ast.parse(Path(module.__file__).read_text())
    eager = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}             # bound when the package is imported (cli's `main`): stable
    lazy = set(module.__all__) - eager
    assert module.__all__ and sorted(lazy & submodules) == []
    for name in module.__all__:
        value = getattr(module, name)
        assert not isinstance(value, types.ModuleType), name
        # a definition of this package, or of a lower layer it re-exports (modeling's torch-free export_code)
        assert getattr(value, "__module__", package).startswith("dspark_hub"), (name, value)


def test_the_version_is_typed_once_and_is_the_installed_one():
    """pyproject.toml reads the version from `dspark_hub/_version.py`, so start-up needs no metadata import."""
    import importlib.metadata
    import tomllib

    import dspark_hub

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dspark_hub._version.__version__"}
    assert dspark_hub.__version__ == importlib.metadata.version("dspark-hub")
