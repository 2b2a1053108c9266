"""Issue 20 items 6 and 7 and the smaller ones: a file that changes under `verify --deep`, deep nesting,
lone surrogate escapes, a killed `convert`'s temporary folder, an over-long repository name.

Each class has several members and a passing twin.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format import contract
from dspark_hub.format.jsonio import MAX_DEPTH, loads_strict
from dspark_hub.format.reader import read_header
from dspark_hub.format.writer import sweep_stale_temps
from dspark_hub.verify import deep, file_scan

from . import test_folder
from .cli_errors import assert_one_line_error
from .factories import nested_dirs, remove_nested, tree_digest
from .test_folder import run

ROOT = Path(__file__).resolve().parent.parent
#: The checkpoint fixtures (`template`, a tiny conforming checkpoint; `ckpt`, a fresh copy) of the listing tests.
template, ckpt = test_folder.template, test_folder.ckpt


# ---------------------------------------------------------------- item 6: a file that changes under --deep

def _header_length(path: Path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


#: name -> the new size of the weights file, given its header length and its size (None: append bytes).
CHANGES = {
    "truncated to 0": lambda header, size: 0,
    "truncated inside the length prefix": lambda header, size: 4,
    "truncated mid-header": lambda header, size: 8 + header // 2,
    "truncated mid-data": lambda header, size: (8 + header + size) // 2,
    "one byte short": lambda header, size: size - 1,
    "grown": lambda header, size: size + 4096,
}


def change(path: Path, name: str) -> None:
    size = path.stat().st_size
    new = CHANGES[name](_header_length(path), size)
    os.truncate(path, new)


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_file_changed_while_scanned_is_file_changed(ckpt, name):
    path = ckpt / contract.WEIGHTS_NAME
    header = read_header(path)
    calls = []

    def truncate_after_the_first_window(n: int) -> None:
        if not calls:
            change(path, name)
        calls.append(n)

    with pytest.raises(CheckpointFormatError) as caught:
        file_scan.scan_file(path, header, chunk_bytes=4096, progress=truncate_after_the_first_window)
    assert caught.value.code == "FILE_CHANGED" and "size changed" in str(caught.value)


def test_an_unchanged_file_scans_whole_in_small_windows(ckpt):
    import hashlib

    path = ckpt / contract.WEIGHTS_NAME
    scan = file_scan.scan_file(path, read_header(path), chunk_bytes=4096, depth=2)
    assert scan.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and scan.size == path.stat().st_size
    assert len(scan.tensors) == len(read_header(path).tensors)


@pytest.mark.parametrize("name", list(CHANGES))
def test_verify_deep_names_a_file_that_changed_after_its_header_was_read(ckpt, monkeypatch, name):
    original = deep.scan_files

    def change_first(files, **kwargs):
        change(ckpt / contract.WEIGHTS_NAME, name)
        return original(files, **kwargs)

    monkeypatch.setattr(deep, "scan_files", change_first)
    assert_one_line_error(run("verify", ckpt, "--deep"), "model.safetensors", "size changed")


def test_verify_deep_passes_an_unchanged_file(ckpt):
    assert run("verify", ckpt, "--deep").exit_code == 0


# ---------------------------------------------------------------- item 7: nesting

@pytest.fixture
def nested(ckpt):
    """A 1,200-level subfolder of the checkpoint (removed afterwards: pytest's clean-up recurses)."""
    rel = nested_dirs(ckpt, 1200)
    yield rel
    remove_nested(ckpt / "d")


def test_a_1200_level_subfolder_is_read_by_every_command(ckpt, tmp_path, nested):
    rel = nested
    assert run("verify", ckpt).exit_code == 0
    checksums = run("checksums", ckpt, "--json")
    assert checksums.exit_code == 0, checksums.output
    assert rel in [f["path"] for f in json.loads(checksums.stdout)["files"]]
    assert run("checksums", ckpt, "--check").exit_code == 0
    package = run("package", ckpt, "--repo", "org/draft", "-o", tmp_path / "pkg", "--json")
    assert package.exit_code == 0 and json.loads(package.stdout)["file_count"] == 3
    converted = run("convert", ckpt, tmp_path / "out", "--json")
    assert converted.exit_code == 0, converted.output
    assert {"kind": "skip_file", "target": rel} in [{k: c[k] for k in ("kind", "target")}
                                                    for c in json.loads(converted.stdout)["changes"]]


def deep_value(levels: int, kind: str) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value] if kind == "array" else {"k": value}
    return value


@pytest.mark.parametrize("levels, kind", [(600, "array"), (600, "object"), (MAX_DEPTH, "array"),
                                          (MAX_DEPTH, "object")])
def test_a_config_nested_too_deeply_is_refused_at_load_and_convert_writes_nothing(ckpt, tmp_path, levels, kind):
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_notes"] = deep_value(levels, kind)   # the key's value sits one level below the root
    (ckpt / "config.json").write_text(json.dumps(config))
    result = run("verify", ckpt, "--json")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert [f["code"] for f in findings if f["severity"] == "error"] == ["CONFIG_INVALID_JSON"]
    assert "nested more than" in findings[0]["message"]
    assert_one_line_error(run("convert", ckpt, tmp_path / "out"), "config.json", "nested more than")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.parametrize("kind", ["array", "object"])
def test_nesting_up_to_the_limit_loads(kind):
    doc = {"key": deep_value(MAX_DEPTH - 1, kind)}
    assert loads_strict(json.dumps(doc), path="config.json") == doc
    with pytest.raises(CheckpointFormatError, match="nested more than"):
        loads_strict(json.dumps({"key": deep_value(MAX_DEPTH, kind)}), path="config.json")


# ---------------------------------------------------------------- item 7: lone surrogate escapes

def rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    n = _header_length(path)
    header = json.loads(data[8:8 + n])
    edit(header)
    raw = json.dumps(header).encode()            # ensure_ascii: a lone surrogate is written as \ud800
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def _rename_first(header: dict) -> None:
    name = sorted(k for k in header if k != "__metadata__")[0]
    header["x\ud800" + name] = header.pop(name)


#: name -> (damage the checkpoint, the error code verify reports)
SURROGATES = {
    "tensor name": (lambda f: rewrite_header(f / contract.WEIGHTS_NAME, _rename_first), "HEADER_NOT_UTF8"),
    "metadata key": (lambda f: rewrite_header(f / contract.WEIGHTS_NAME,
                                              lambda h: h["__metadata__"].update({"\udc80note": "x"})),
                     "HEADER_NOT_UTF8"),
    "metadata value": (lambda f: rewrite_header(f / contract.WEIGHTS_NAME,
                                                lambda h: h["__metadata__"].update({"note": "a\ud800b"})),
                       "HEADER_NOT_UTF8"),
    "config key": (lambda f: (f / "config.json").write_text(
        json.dumps({**json.loads((f / "config.json").read_text()), "\ud800extra": 1})), "CONFIG_INVALID_JSON"),
    "config value": (lambda f: (f / "config.json").write_text(
        json.dumps({**json.loads((f / "config.json").read_text()), "architectures": ["K3\udfff"]})),
        "CONFIG_INVALID_JSON"),
}


@pytest.mark.parametrize("name", list(SURROGATES))
def test_a_lone_surrogate_is_a_finding_that_prints(ckpt, template, name):
    damage, code = SURROGATES[name]
    damage(ckpt)
    human = run("verify", ckpt)
    assert human.exit_code == 1 and isinstance(human.exception, (SystemExit, type(None))), human.output
    assert code in human.stdout and "lone surrogate" in human.stdout
    human.stdout.encode("utf-8")
    as_json = run("verify", ckpt, "--json")
    assert code in [f["code"] for f in json.loads(as_json.stdout)["findings"]]
    diffed = run("diff", template, ckpt)
    assert diffed.exit_code == 1 and isinstance(diffed.exception, SystemExit), diffed.output
    assert "lone surrogate" in diffed.stdout


@pytest.mark.parametrize("name", list(SURROGATES))
def test_convert_refuses_a_lone_surrogate_before_writing(ckpt, tmp_path, name):
    SURROGATES[name][0](ckpt)
    assert_one_line_error(run("convert", ckpt, tmp_path / "out"), "lone surrogate")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_a_surrogate_pair_is_a_character_not_a_problem():
    assert loads_strict('{"name": "\\ud83d\\ude00"}', path="config.json") == {"name": "\U0001F600"}


# ---------------------------------------------------------------- a killed convert's temporary folder

HANG_IN_CONVERT = """
import sys, time
from pathlib import Path
from dspark_hub.ops.convert import convert
def progress(n):
    Path(sys.argv[3]).write_text("writing")
    time.sleep(3600)
convert(sys.argv[1], sys.argv[2], progress=progress)
"""


def test_the_next_convert_removes_the_temporary_folder_of_a_killed_one(ckpt, tmp_path):
    marker, dst = tmp_path / "marker", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HANG_IN_CONVERT, str(ckpt), str(dst), str(marker)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE)
    for _ in range(6000):            # wait (a bounded number of polls) until it is inside the write
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = list(tmp_path.glob(".out.tmp-*"))
    assert [p.name.split("-")[1] for p in left] == [str(proc.pid)], proc.stderr.read() if proc.stderr else ""
    assert run("convert", ckpt, dst).exit_code == 0
    assert not list(tmp_path.glob(".out.tmp-*")) and (dst / contract.WEIGHTS_NAME).is_file()


def test_a_live_writers_temporary_folder_and_other_outputs_are_left_alone(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        mine = tmp_path / f".out.tmp-{live.pid}-abcd1234"
        ours = tmp_path / f".out.tmp-{os.getpid()}-abcd1234"
        other = tmp_path / ".outer.tmp-999999999-abcd1234"
        odd = tmp_path / ".out.tmp-notapid"
        for p in (mine, ours, other, odd):
            p.mkdir()
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        stale = tmp_path / f".out.tmp-{dead.pid}-abcd1234"
        stale.mkdir()
        assert sweep_stale_temps(tmp_path / "out") == [stale]
        assert all(p.exists() for p in (mine, ours, other, odd)) and not stale.exists()
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------- package --repo: the Hub's 96 characters

@pytest.mark.parametrize("length", [97, 120, 200])
def test_package_refuses_a_repository_name_the_hub_refuses(ckpt, tmp_path, length):
    before = tree_digest(ckpt)
    result = run("package", ckpt, "--repo", "org/" + "n" * length, "-o", tmp_path / "pkg")
    assert_one_line_error(result, "--repo", f"{length} characters", "96")
    assert not (tmp_path / "pkg").exists() and tree_digest(ckpt) == before


@pytest.mark.parametrize("length", [1, 96])
def test_package_accepts_names_up_to_96_characters(ckpt, tmp_path, length):
    assert run("package", ckpt, "--repo", "org/" + "n" * length, "-o", tmp_path / "pkg", "-q").exit_code == 0
