"""The version, typed once (pyproject.toml reads it: `[tool.setuptools.dynamic]`), so no import of the
installed metadata is needed to know it."""

__version__ = "0.2.0"
