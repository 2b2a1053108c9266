"""pyproject.toml lists the packages a wheel ships by hand: every package under dspark_hub/ must be on it.

A sub-package left off (`dspark_hub.vllm` and `verify/execute_vllm` once were) installs fine in an
editable checkout and is missing from the wheel, so `verify --execute` fails only after a release.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def unlisted(listed: set[str], package_root: Path) -> list[str]:
    """Packages under `package_root` (a folder with `__init__.py`) that `listed` leaves out."""
    found = {".".join(p.parent.relative_to(package_root.parent).parts) for p in package_root.rglob("__init__.py")}
    return sorted(found - listed)


def test_every_package_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert unlisted(listed, ROOT / "dspark_hub") == []


def test_a_sub_package_left_off_the_list_is_named(tmp_path):
    for folder in ("pkg", "pkg/area", "pkg/area/sub", "pkg/other"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg" / "notes").mkdir()                     # a folder without __init__.py is no package
    assert unlisted({"pkg", "pkg.area", "pkg.other"}, tmp_path / "pkg") == ["pkg.area.sub"]
    assert unlisted({"pkg", "pkg.area"}, tmp_path / "pkg") == ["pkg.area.sub", "pkg.other"]
    assert unlisted({"pkg", "pkg.area", "pkg.area.sub", "pkg.other"}, tmp_path / "pkg") == []
