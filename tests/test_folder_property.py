"""Property: on any folder (nested folders, file links in and out, directory links in, out and in cycles,
FIFOs, dangling links, in or out of a Hugging Face cache snapshot) every command sees the same files, all
inside the folder (or its snapshot's blobs), and finitely many; an entry one command leaves out, every
command names (issue 20, item 1)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_hub.cards.render import card_facts
from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.folder import list_folder
from dspark_hub.hub.checksums import write_checksums
from dspark_hub.hub.package import package
from dspark_hub.hub.publish import plan_publish
from dspark_hub.ops.diff import diff

from .factories import write_checkpoint

NAMES = st.sampled_from(["a", "b", "sub", "x.json", "w.safetensors", "notes.txt"])
PATHS = st.lists(NAMES, min_size=1, max_size=4).map("/".join)
KINDS = st.sampled_from(["dir", "file", "link_file_in", "link_file_out", "link_dir_in", "link_dir_out",
                         "link_dir_cycle", "link_dir_root", "link_loop", "fifo", "dangling", "link_blob"])
ENTRIES = st.lists(st.tuples(KINDS, PATHS, st.integers(0, 40)), max_size=12)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("template") / "ckpt")


def _make(root: Path, outside: Path, blobs: Path | None, kind: str, rel: str, n: int,
          existing: list[Path]) -> bool:
    """Create one entry at `rel` (False when its place is taken or its parent is not a real folder).
    `existing`: the regular files made so far (link targets), extended here."""
    path = root / rel
    parent = path.parent
    if os.path.lexists(path) or any(os.path.islink(root / p) or not os.path.isdir(root / p)
                                    for p in Path(rel).parents if str(p) != "."):
        return False
    if kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_bytes(b"x" * n)
        existing.append(path)
    elif kind == "link_file_in" and existing:
        path.symlink_to(os.path.relpath(existing[n % len(existing)], parent))
    elif kind == "link_file_out":
        path.symlink_to(outside / "id_rsa")
    elif kind == "link_dir_in":
        path.symlink_to(os.path.relpath(root, parent) if n % 2 else root / "sub")
    elif kind == "link_dir_out":
        path.symlink_to(outside)
    elif kind == "link_dir_cycle":
        path.symlink_to(".")
    elif kind == "link_dir_root":
        path.symlink_to(os.path.relpath(root.parent, parent))
    elif kind == "link_loop":
        path.symlink_to(path.name)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to("nowhere")
    elif kind == "link_blob" and blobs is not None:
        blob = blobs / f"{n:064x}"
        blob.write_bytes(b"b" * n)
        path.symlink_to(os.path.relpath(blob, parent))
    else:
        return False
    return True


def _inside(path: Path, root: Path, blobs: Path | None) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real.startswith(top + os.sep) or (blobs is not None and real.startswith(os.path.realpath(blobs) + os.sep))


def _files_or_code(call) -> tuple[str, list[str] | str]:
    """("files", the paths a command saw) or ("refused", the error code it raised)."""
    try:
        return "files", sorted(call())
    except CheckpointFormatError as e:
        return "refused", e.code
    except UsageError as e:
        return "refused", "one file twice" if "are one file" in str(e) else str(e)


@settings(max_examples=40, deadline=None)
@given(entries=ENTRIES, in_cache=st.booleans())
def test_every_command_sees_the_same_finite_set_of_files_inside_the_folder(template, entries, in_cache):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside = base / "private"
        outside.mkdir()
        (outside / "id_rsa").write_text("secret")
        blobs = None
        if in_cache:
            blobs = base / "models--org--draft" / "blobs"
            blobs.mkdir(parents=True)
            root = base / "models--org--draft" / "snapshots" / ("ab" * 20)
        else:
            root = base / "ckpt"
        shutil.copytree(template, root)
        regular = [root / "config.json", root / "model.safetensors"]
        made = sum(_make(root, outside, blobs, kind, rel, n, regular) for kind, rel, n in entries)

        listing = list_folder(root)
        files = list(listing.files)
        # finite and inside: no more files than were made (plus the two of the checkpoint), each inside
        assert len(files) <= made + 2
        assert all(_inside(root / f, root, blobs) for f in files)

        # verify, card and diff open the folder through the same listing and name every entry left out
        view = open_checkpoint(LocalSource(root))
        assert list(view.files) == files
        reported = {(f.code, f.where) for f in view.findings}
        assert {(p.code, p.path) for p in listing.problems} <= reported
        if view.config is not None and view.tensors:
            card = [row.file for row in card_facts(view, hash_files=False).checksums]
            assert set(card) <= set(files)
        problems = {(f.code, f.where) for side, f in diff(root, template).problems if side == "a"}
        assert {(p.code, p.path) for p in listing.problems} <= problems

        # checksums, package and the publish plan hash exactly the listing, or refuse the same first entry
        expected = ("refused", listing.problems[0].code) if listing.problems else ("files", files)
        out = base / "out"
        got_sums = _files_or_code(lambda: [d.path for d in write_checksums(root, out_dir=out).manifest.files])
        got_plan = _files_or_code(lambda: [d.path for d in plan_publish(root, "org/draft")[0].files])
        got_package = _files_or_code(lambda: [d.path for d in package(root, "org/draft",
                                                                      out_dir=base / "pkg").manifest.files])
        assert got_sums == got_plan == expected
        # a torrent lists each file once: a link beside its target is refused by name, nothing else differs
        aliased = len({os.path.realpath(root / f) for f in files}) < len(files)
        assert got_package == (("refused", "one file twice") if aliased and not listing.problems else expected)
