"""Issue 29 items 2 and 5: another process writes while a command runs; nothing it wrote is lost, and
nothing the publish gate did not judge is committed.

The other process is real (a second Python process), and it acts at a known moment, never after a
sleep: a writer is stopped at its final rename by `tests/paused_cli.py` (a pipe handshake), a publish
is caught by the local Hub when its client sends a given request (`HubServer.before_route`, the
client waiting for the answer meanwhile), or inside the gate by a hook on its hashing step.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dspark_hub.cards.render import render_card
from dspark_hub.errors import ChangedMeanwhileError, RefusedOverwriteError
from dspark_hub.format.writer import atomic_dir, atomic_path, check_writable
from dspark_hub.verify.checks import verify

from .cli_errors import assert_one_line_error
from .factories import tree_digest
from .paused_cli import Paused
from .test_cli_init import rename_kind
from .test_publish import FRONT, carded, run

__all__ = ["carded", "rename_kind"]      # fixtures: a carded checkpoint; both ways the final rename runs

#: Where a writer stops: its final rename (`format.writer`), after everything is built.
AT_RENAME = "dspark_hub.format.writer:_install"

#: The other process: one action on one path, then it exits.
OTHER = r"""
import json, os, pathlib, shutil, sys
action, path = sys.argv[1], pathlib.Path(sys.argv[2])
theirs = b"theirs\n"

def folder(at):
    at.mkdir()
    (at / "theirs.txt").write_bytes(theirs)

if action == "make folder":
    folder(path)
elif action == "make empty folder":
    path.mkdir()
elif action == "make file":
    path.write_bytes(theirs)
elif action == "make dangling link":
    os.symlink(path.parent / "nowhere", path)
elif action == "make link to a folder":
    folder(path.parent / "their-folder")
    os.symlink(path.parent / "their-folder", path)
elif action == "replace folder by rename":
    folder(path.parent / "theirs.new")
    os.rename(path, path.parent / "mine.old")
    os.rename(path.parent / "theirs.new", path)
elif action == "remove":
    shutil.rmtree(path) if path.is_dir() else path.unlink()
elif action == "remove and make again":
    shutil.rmtree(path)
    folder(path)
elif action == "add a file inside":
    (path / "theirs.txt").write_bytes(theirs)
elif action == "replace by a file":
    shutil.rmtree(path)
    path.write_bytes(theirs)
elif action == "replace file by rename":
    (path.parent / "theirs.new").write_bytes(theirs)
    os.replace(path.parent / "theirs.new", path)
elif action == "edit config in place":
    config = json.loads(path.read_text())
    config["rope_interleave"] = True          # what the gate refuses
    with open(path, "r+") as f:
        f.write(json.dumps(config))
        f.truncate()
elif action == "replace config by rename":
    config = json.loads(path.read_text())
    config["rope_interleave"] = True
    (path.parent / "config.new").write_text(json.dumps(config))
    os.replace(path.parent / "config.new", path)
elif action in ("change a digit in place", "change a digit by rename"):
    text = path.read_text()
    at = next(i for i, c in enumerate(text) if c.isdigit() and i > text.index(":"))
    text = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]     # same size: a card's table misses it
    if action.endswith("in place"):
        with open(path, "r+") as f:
            f.write(text)
    else:
        (path.parent / "changed.new").write_text(text)
        os.replace(path.parent / "changed.new", path)
elif action == "overwrite bytes in place":
    with open(path, "r+b") as f:
        f.seek(-16, os.SEEK_END)
        f.write(b"\xff" * 16)                # NaN in bf16, same size, same inode
elif action == "replace weights by rename":
    data = bytearray(path.read_bytes())
    data[-16:] = b"\xff" * 16
    (path.parent / "weights.new").write_bytes(bytes(data))
    os.replace(path.parent / "weights.new", path)
elif action == "truncate":
    os.truncate(path, path.stat().st_size - 1)
elif action == "read":
    path.read_bytes() if path.is_file() else sorted(path.iterdir())
elif action == "write outside":
    (path.parent.parent / "unrelated.txt").write_bytes(theirs)
else:
    raise SystemExit(f"unknown action {action!r}")
"""


def other(action: str, path: Path) -> None:
    """Another process does `action` to `path`; it has exited when this returns."""
    done = subprocess.run([sys.executable, "-c", OTHER, action, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def snapshot(path: Path) -> object:
    """What is at `path`, to compare before and after: a link's target, a file's bytes, a folder's files."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return ("folder", tree_digest(path))
    return ("file", path.read_bytes()) if path.exists() else None


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def one_line_stderr(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), done.stderr
    return lines[0]


# ---------------------------------------------------------------- item 5: the final rename, real processes

def test_two_converts_to_one_destination_the_first_wins_and_the_second_is_refused(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        assert run("init", tmp_path / name, "--seed", seed).exit_code == 0
    dst = tmp_path / "out"
    first = Paused(AT_RENAME, "convert", tmp_path / "a", dst)
    second = Paused(AT_RENAME, "convert", tmp_path / "b", dst)
    first.wait_paused()
    second.wait_paused()                       # both checked DST (free) and built their output
    assert first.go_on().returncode == 0
    won = tree_digest(dst)
    done = second.go_on()
    assert done.returncode == 2
    one_line_stderr(done, str(dst), "appeared while this output was being written", "it was kept", "--force")
    assert tree_digest(dst) == won and won["model.safetensors"] == tree_digest(tmp_path / "a")["model.safetensors"]
    assert leftovers(tmp_path) == []


def race(action: str, dst: Path, *command: object) -> tuple[subprocess.CompletedProcess[str], object]:
    """Run the dspark-hub `command` up to its final rename, let the other process do `action` to `dst` there,
    then let the command finish; returns how it ended and what the other process left at `dst`."""
    writer = Paused(AT_RENAME, *command)
    writer.wait_paused()
    other(action, dst)
    theirs = snapshot(dst)
    return writer.go_on(), theirs


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A checkpoint to `convert` (a conforming one converts as it is): the writer the races below stop."""
    folder = tmp_path_factory.mktemp("source") / "ckpt"
    assert run("init", folder).exit_code == 0
    return folder


WRITTEN_WHEN_FREE = ["make folder", "make empty folder", "make file", "make dangling link", "make link to a folder"]


@pytest.mark.parametrize("action", WRITTEN_WHEN_FREE)
def test_a_writer_keeps_what_appeared_at_its_destination(tmp_path, source, action):
    dst = tmp_path / "out"
    done, theirs = race(action, dst, "convert", source, dst)
    assert done.returncode == 2
    one_line_stderr(done, str(dst), "appeared while this output was being written", "it was kept")
    assert snapshot(dst) == theirs
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_init_keeps_a_folder_that_appeared_at_its_destination(tmp_path):
    """The issue's example: `init` without --force, a folder made at DST while it runs."""
    dst = tmp_path / "out"
    done, _ = race("make folder", dst, "init", dst)
    assert done.returncode == 2
    one_line_stderr(done, str(dst), "appeared while this output was being written", "it was kept")
    assert (dst / "theirs.txt").read_bytes() == b"theirs\n" and leftovers(tmp_path) == []


def test_a_writer_writes_its_destination_when_the_other_process_writes_elsewhere(tmp_path, source):
    dst = tmp_path / "work" / "out"
    dst.parent.mkdir()
    assert race("write outside", dst, "convert", source, dst)[0].returncode == 0
    assert verify(dst).ok and leftovers(dst.parent) == []


def _mine(dst: Path) -> Path:
    dst.mkdir(parents=True)
    (dst / "mine.txt").write_text("mine")
    return dst


@pytest.mark.parametrize("action", ["replace folder by rename", "remove and make again", "add a file inside",
                                    "replace by a file", "remove"])
def test_force_replaces_only_what_it_checked(tmp_path, source, action):
    dst = _mine(tmp_path / "out")
    done, theirs = race(action, dst, "convert", source, dst, "--force")
    assert done.returncode == 2
    one_line_stderr(done, str(dst), "changed since it was checked", "it was kept")
    assert snapshot(dst) == theirs
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("action", ["read", "write outside"])
def test_force_replaces_what_it_checked_when_no_one_changed_it(tmp_path, source, action):
    dst = _mine(tmp_path / "work" / "out")
    assert race(action, dst, "convert", source, dst, "--force")[0].returncode == 0
    assert not (dst / "mine.txt").exists() and verify(dst).ok and leftovers(dst.parent) == []


@pytest.fixture
def card_source(tmp_path):
    assert run("init", tmp_path / "ckpt").exit_code == 0
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    return tmp_path / "ckpt", meta


@pytest.mark.parametrize("force, action, words", [
    (False, "make file", "appeared while this output was being written"),
    (False, "make folder", "appeared while this output was being written"),
    (True, "replace file by rename", "changed since it was checked"),
    (True, "remove", "changed since it was checked"),
])
def test_card_keeps_a_file_another_process_wrote_at_its_output(tmp_path, card_source, force, action, words):
    ckpt, meta = card_source
    out = tmp_path / "README.md"
    if force:
        out.write_text("my card\n")
    done, theirs = race(action, out, "card", ckpt, "--meta", meta, "-o", out, *(["--force"] if force else []))
    assert done.returncode == 2
    one_line_stderr(done, str(out), words)
    assert snapshot(out) == theirs and leftovers(tmp_path) == []


def test_card_force_replaces_the_card_it_checked(tmp_path, card_source):
    ckpt, meta = card_source
    out = tmp_path / "README.md"
    out.write_text("my card\n")
    assert race("read", out, "card", ckpt, "--meta", meta, "-o", out, "--force")[0].returncode == 0
    assert out.read_text().startswith("---\n") and leftovers(tmp_path) == []


# ---------------------------------------------------------------- the same rules in the library, both renames

def test_a_folder_that_appears_is_kept_and_the_write_refused(tmp_path, rename_kind):
    dst = tmp_path / "out"
    with pytest.raises(RefusedOverwriteError, match="appeared while"), atomic_dir(dst) as tmp:
        (tmp / "ours.txt").write_text("ours")
        other("make folder", dst)
    assert tree_digest(dst) == {"theirs.txt": hashlib.sha256(b"theirs\n").hexdigest()}
    assert leftovers(tmp_path) == []


def test_a_file_that_appears_is_kept_and_the_write_refused(tmp_path, rename_kind):
    dst = tmp_path / "out.md"
    with pytest.raises(RefusedOverwriteError, match="appeared while"), atomic_path(dst) as tmp:
        tmp.write_text("ours")
        other("make file", dst)
    assert dst.read_bytes() == b"theirs\n" and leftovers(tmp_path) == []


@pytest.mark.parametrize("action", ["replace folder by rename", "remove and make again", "replace by a file",
                                    "add a file inside"])
def test_force_keeps_a_replaced_destination(tmp_path, rename_kind, action):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "mine.txt").write_text("mine")
    checked = check_writable(dst, force=True)
    theirs = []
    with pytest.raises(ChangedMeanwhileError, match="changed since it was checked"), \
            atomic_dir(dst, force=True, checked=checked) as tmp:
        (tmp / "ours.txt").write_text("ours")
        other(action, dst)
        theirs.append(snapshot(dst))
    assert snapshot(dst) == theirs[0] and leftovers(tmp_path) == []


def test_force_replaces_the_destination_it_checked(tmp_path, rename_kind):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "mine.txt").write_text("mine")
    with atomic_dir(dst, force=True, checked=check_writable(dst, force=True)) as tmp:
        (tmp / "ours.txt").write_text("ours")
        other("read", dst)
    assert sorted(os.listdir(dst)) == ["ours.txt"] and leftovers(tmp_path) == []


# ---------------------------------------------------------------- item 2: publish uploads what was judged, or nothing

def _is_preupload(method: str, path: str) -> bool:
    return method == "POST" and "/preupload/" in path


def _is_lfs_batch(method: str, path: str) -> bool:
    return method == "POST" and path.endswith("/info/lfs/objects/batch")


def _is_repo_creation(method: str, path: str) -> bool:
    return method == "POST" and path.startswith("/api/repos/create")


def _is_commit(method: str, path: str) -> bool:
    return method == "POST" and "/commit/" in path


#: When the other process acts, as the local Hub sees the publishing client.
MOMENTS = {"before the first request of the upload": _is_repo_creation, "at preupload": _is_preupload,
           "while uploading the weights": _is_lfs_batch, "once the commit was sent": _is_commit}


def _publish_while(hub, monkeypatch, folder, repo, token, moment, action, target):
    fired = []

    def act(method, path):
        if not fired and MOMENTS[moment](method, path):
            fired.append(path)
            other(action, folder / target)
    monkeypatch.setattr(hub, "before_route", act)
    result = run("publish", folder, repo, "--endpoint", hub.url, env={"HF_TOKEN": token})
    assert fired, "the publish never reached the moment"
    return result


def _nothing_committed(hub, repo) -> bool:
    return set(hub.head_files(repo)) == {".gitattributes"}


CHANGES = [
    ("at preupload", "edit config in place", "config.json"),
    ("at preupload", "replace config by rename", "config.json"),
    ("at preupload", "overwrite bytes in place", "model.safetensors"),
    ("at preupload", "replace weights by rename", "model.safetensors"),
    ("at preupload", "truncate", "model.safetensors"),
    ("at preupload", "overwrite bytes in place", "README.md"),
    ("at preupload", "remove", "README.md"),
    ("before the first request of the upload", "edit config in place", "config.json"),
    ("before the first request of the upload", "overwrite bytes in place", "model.safetensors"),
    ("while uploading the weights", "edit config in place", "config.json"),
    ("while uploading the weights", "overwrite bytes in place", "model.safetensors"),
    ("while uploading the weights", "replace weights by rename", "model.safetensors"),
]


@pytest.mark.parametrize("moment, action, target", CHANGES)
def test_a_file_changed_after_the_gate_is_refused_before_the_commit(hub, monkeypatch, hub_repo_id, hub_token, carded,
                                                                    moment, action, target):
    result = _publish_while(hub, monkeypatch, carded, hub_repo_id, hub_token, moment, action, target)
    assert_one_line_error(result, target, "changed after the publish gate judged it", "nothing was committed")
    assert _nothing_committed(hub, hub_repo_id)
    assert all(hashlib.sha256(hub.repo(hub_repo_id).lfs[oid]).hexdigest() == oid for oid in hub.repo(hub_repo_id).lfs)


@pytest.mark.parametrize("moment", ["at preupload", "while uploading the weights"])
def test_a_writer_elsewhere_does_not_stop_the_publish(hub, monkeypatch, hub_repo_id, hub_token, carded, moment):
    judged = tree_digest(carded)
    result = _publish_while(hub, monkeypatch, carded, hub_repo_id, hub_token, moment, "write outside", "config.json")
    assert result.exit_code == 0, result.output
    assert {p: hashlib.sha256(hub.file_content(hub_repo_id, p)).hexdigest() for p in judged} == judged


@pytest.mark.parametrize("action, target", [("overwrite bytes in place", "model.safetensors"),
                                            ("edit config in place", "config.json")])
def test_a_change_after_the_commit_was_sent_leaves_the_judged_bytes_on_the_hub(hub, monkeypatch, hub_repo_id,
                                                                              hub_token, carded, action, target):
    judged = tree_digest(carded)
    result = _publish_while(hub, monkeypatch, carded, hub_repo_id, hub_token, "once the commit was sent", action,
                            target)
    assert result.exit_code == 0, result.output
    assert {p: hashlib.sha256(hub.file_content(hub_repo_id, p)).hexdigest() for p in judged} == judged
    assert tree_digest(carded)[target] != judged[target]          # the other process did write


@pytest.mark.parametrize("action, target", [("change a digit in place", "config.json"),
                                            ("change a digit by rename", "config.json"),
                                            ("overwrite bytes in place", "model.safetensors")])
def test_a_file_changed_between_verify_and_the_hash_is_refused(hub, monkeypatch, hub_repo_id, hub_token, carded,
                                                               action, target):
    """Inside the gate: verify read the old bytes, the hash covers the new ones. A card's checksum table
    would catch it too; this card has none (rendered without hashing), so only the stamps can."""
    from dspark_hub.hub import release

    _without_digests(carded)
    hashing = release.local_digests

    def changed_then_hashed(folder, **kwargs):
        other(action, Path(folder) / target)
        return hashing(folder, **kwargs)
    monkeypatch.setattr(release, "local_digests", changed_then_hashed)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert_one_line_error(result, target, "changed after the publish gate judged it")
    assert not hub.repo(hub_repo_id).lfs and _nothing_committed(hub, hub_repo_id)


def test_the_gate_hook_alone_publishes(hub, monkeypatch, hub_repo_id, hub_token, carded):
    from dspark_hub.hub import release

    _without_digests(carded)
    hashing = release.local_digests

    def read_then_hashed(folder, **kwargs):
        other("read", Path(folder) / "config.json")
        return hashing(folder, **kwargs)
    monkeypatch.setattr(release, "local_digests", read_then_hashed)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output


def _without_digests(folder: Path) -> None:
    meta = folder.parent / "card.yaml"
    (folder / "README.md").write_text(render_card(meta, folder, hash_files=False))
    assert "| — |" in (folder / "README.md").read_text()


def _plan(folder: Path):
    from dspark_hub.hub.publish import plan_publish

    return plan_publish(folder, "org/name")


@pytest.mark.parametrize("xet", [True, False])
def test_small_files_go_as_their_judged_bytes_and_weights_by_path(carded, xet):
    from dspark_hub.hub.publish import _operations

    plan, manifest = _plan(carded)
    operations = {op.path_in_repo: op for op in _operations(plan, manifest, xet=xet)}
    assert operations["config.json"].path_or_fileobj == (carded / "config.json").read_bytes()
    weights = operations["model.safetensors"]
    assert weights.path_or_fileobj == str(carded / "model.safetensors")
    # LFS: the judged digest goes to the server, which checks the bytes; Xet: hf_xet computes it while sending
    assert weights.upload_info.is_hashed is (not xet)


@pytest.mark.parametrize("sent, refused", [("the judged bytes", False), ("other bytes", True)])
def test_xet_bytes_sent_under_another_digest_are_refused_before_the_commit(carded, sent, refused):
    """hf_xet computes the SHA-256 of the bytes it sends and hands it back (`upload_info.sha256`) for the
    commit; it must be the digest the gate judged (the local Hub has no Xet, so the hand-back is set here)."""
    from dspark_hub.format.folder import stamp_files
    from dspark_hub.hub.publish import _operations, _refuse_changes

    plan, manifest = _plan(carded)
    stamps = stamp_files(plan.sources.values())
    operations = _operations(plan, manifest, xet=True)
    weights = next(op for op in operations if op.path_in_repo == "model.safetensors")
    data = (carded / "model.safetensors").read_bytes()
    weights.upload_info.sha256 = hashlib.sha256(data if not refused else data + b"x").digest()
    if refused:
        with pytest.raises(ChangedMeanwhileError, match=r"model\.safetensors: changed after the publish gate"):
            _refuse_changes(plan, manifest, operations, stamps)
    else:
        _refuse_changes(plan, manifest, operations, stamps)
