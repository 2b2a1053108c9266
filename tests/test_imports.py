"""Header-level code never imports torch, transformers or numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "numpy", "huggingface_hub", "jinja2")


def _imported(code: str) -> set[str]:
    probe = code + f"; import sys; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(filter(None, out.stdout.strip().split(",")))


def test_light_imports_stay_light():
    assert _imported("import dspark_hub, dspark_hub.format.contract, dspark_hub.format.reader, "
                     "dspark_hub.format.jsonio, dspark_hub.format.digests, dspark_hub.format.checkpoint, "
                     "dspark_hub.format.remote, dspark_hub.verify.checks, dspark_hub.verify.runtimes, "
                     "dspark_hub.verify.family, dspark_hub.report, dspark_hub.errors, dspark_hub.cli") == set()


def test_verify_run_stays_light(tmp_path):
    from .factories import write_checkpoint
    folder = write_checkpoint(tmp_path / "c")
    code = (f"from click.testing import CliRunner; from dspark_hub.cli import cli; "
            f"r = CliRunner().invoke(cli, ['verify', {str(folder)!r}, '--drop-in', 'kimi-k3'])")
    assert _imported(code) == set()


def test_export_code_copies_files_without_torch(tmp_path):
    from .factories import write_checkpoint
    folder = write_checkpoint(tmp_path / "c")
    code = (f"from click.testing import CliRunner; from dspark_hub.cli import cli; "
            f"r = CliRunner().invoke(cli, ['export-code', {str(folder)!r}]); assert r.exit_code == 0, r.output")
    assert _imported(code) == set()
    assert (folder / "modeling_k3_dspark.py").read_bytes() == (
        Path(__file__).resolve().parent.parent / "dspark_hub" / "modeling" / "modeling_k3_dspark.py").read_bytes()


def test_every_public_name_resolves():
    import dspark_hub
    for name in dspark_hub.__all__:
        assert getattr(dspark_hub, name) is not None
