"""Which files a checkpoint folder holds (`format.folder`): links, cycles, special files, nesting, and every
command seeing the same files (issue 20, items 1 and 5).

Each hostile class has several members, and each has a passing twin: a folder whose links stay inside (or
inside a Hugging Face cache snapshot's blobs) lists them and every command accepts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.render import render_card
from dspark_hub.cli.main import cli
from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError
from dspark_hub.format.folder import folder_files, list_folder, open_regular, read_regular
from dspark_hub.format.jsonio import load_json_file
from dspark_hub.format.reader import read_header
from dspark_hub.format.tensorio import locate_tensor

from .cli_errors import assert_one_line_error
from .factories import nested_dirs, remove_nested, write_checkpoint

FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "tags": ["dspark"], "pipeline_tag": "text-generation"}


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("template") / "ckpt")


@pytest.fixture
def ckpt(tmp_path, template) -> Path:
    """A fresh copy of a tiny conforming checkpoint, with a secret folder beside it (outside it)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(template, folder)
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return folder


def carded(folder: Path, tmp_path: Path) -> Path:
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    (folder / "README.md").write_text(render_card(meta, folder))
    return folder


def bind_socket(path: Path) -> socket.socket:
    """A listening Unix socket at `path` (bound from its folder: socket paths are limited to 108 bytes)."""
    sock = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        sock.bind(path.name)
    finally:
        os.chdir(cwd)
    return sock


# ---------------------------------------------------------------- the listing's rules

#: name -> (make it inside `folder`, with `private` outside it; the code it gets; the entry reported)
HOSTILE = {
    "dir link out (relative)": (lambda f, p: (f / "extras").symlink_to("../private"), "LINK_OUTSIDE", "extras"),
    "dir link out (absolute)": (lambda f, p: (f / "extras").symlink_to(p), "LINK_OUTSIDE", "extras"),
    "dir link to /": (lambda f, p: (f / "root").symlink_to("/"), "LINK_CYCLE", "root"),
    "dir link to .": (lambda f, p: (f / "loop").symlink_to("."), "LINK_CYCLE", "loop"),
    "dir link to ..": (lambda f, p: (f / "up").symlink_to(".."), "LINK_CYCLE", "up"),
    "nested dir link to the root": (lambda f, p: ((f / "sub").mkdir(), (f / "sub" / "back").symlink_to("..")),
                                    "LINK_CYCLE", "sub/back"),
    "links that point at each other": (lambda f, p: ((f / "a.json").symlink_to("b.json"),
                                                     (f / "b.json").symlink_to("a.json")), "LINK_CYCLE", "a.json"),
    "a link to itself": (lambda f, p: (f / "self.json").symlink_to("self.json"), "LINK_CYCLE", "self.json"),
    "file link out (relative)": (lambda f, p: (f / "key").symlink_to("../private/id_rsa"), "LINK_OUTSIDE", "key"),
    "file link out (absolute)": (lambda f, p: (f / "key").symlink_to(p / "id_rsa"), "LINK_OUTSIDE", "key"),
    "file link out through an inside link": (lambda f, p: ((f / "hop").symlink_to("../private/id_rsa"),
                                                           (f / "key").symlink_to("hop")), "LINK_OUTSIDE", "hop"),
    "dir link inside": (lambda f, p: ((f / "sub").mkdir(), (f / "sub" / "x.txt").write_text("x"),
                                      (f / "alias").symlink_to("sub")), "DIR_LINK", "alias"),
    "fifo": (lambda f, p: os.mkfifo(f / "tokenizer.json"), "SPECIAL_FILE", "tokenizer.json"),
    "fifo in a subfolder": (lambda f, p: ((f / "sub").mkdir(), os.mkfifo(f / "sub" / "pipe")), "SPECIAL_FILE",
                            "sub/pipe"),
    "link to a device": (lambda f, p: (f / "zeros.bin").symlink_to("/dev/zero"), "SPECIAL_FILE", "zeros.bin"),
    "link to a fifo": (lambda f, p: (os.mkfifo(f / "pipe"), (f / "vocab.txt").symlink_to("pipe")), "SPECIAL_FILE",
                       "pipe"),
    "dangling link": (lambda f, p: (f / "tokenizer.json").symlink_to("nowhere.json"), "FILE_UNREADABLE",
                      "tokenizer.json"),
    "name that is not UTF-8": (lambda f, p: (f / os.fsdecode(b"caf\xe9.txt")).write_text("x"), "BAD_FILE_NAME",
                               "caf\\xe9.txt"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_entries_are_reported_and_never_listed(ckpt, tmp_path, name):
    make, code, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    listing = list_folder(ckpt)
    assert (where, code) in {(p.path, p.code) for p in listing.problems}
    assert set(listing.files) <= {"config.json", "model.safetensors", "sub/x.txt"}
    for rel in listing.files:
        assert os.path.realpath(ckpt / rel).startswith(os.path.realpath(ckpt) + os.sep)
    with pytest.raises(CheckpointFormatError) as caught:
        folder_files(ckpt)
    assert caught.value.code == listing.problems[0].code


def test_a_socket_is_a_special_file(ckpt):
    with bind_socket(ckpt / "agent.sock"):
        listing = list_folder(ckpt)
        assert [(p.path, p.code) for p in listing.problems] == [("agent.sock", "SPECIAL_FILE")]
        with pytest.raises(CheckpointFormatError, match="socket"):
            open_regular(ckpt / "agent.sock")


def test_links_that_stay_inside_are_listed_once_under_their_own_names(ckpt):
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "vocab.txt").write_text("a b c")
    (ckpt / "vocab.txt").symlink_to("sub/vocab.txt")
    (ckpt / "sub" / "config-copy.json").symlink_to("../config.json")
    listing = list_folder(ckpt)
    assert listing.problems == ()
    assert list(listing.files) == ["config.json", "model.safetensors", "sub/config-copy.json", "sub/vocab.txt",
                                   "vocab.txt"]
    assert listing.files["vocab.txt"] == 5


def test_package_names_a_link_beside_its_target_instead_of_a_torrent_missing_one(ckpt, tmp_path):
    (ckpt / "config-copy.json").symlink_to("config.json")
    assert_one_line_error(run("package", ckpt, "--repo", "org/draft", "-o", tmp_path / "pkg"),
                          "config-copy.json", "config.json", "are one file")
    assert not (tmp_path / "pkg").exists()


def hf_snapshot(tmp_path: Path, template: Path, repo: str = "models--org--draft") -> Path:
    """The layout `hf download` writes: snapshots/<rev>/<file> -> ../../blobs/<sha256>."""
    cache = tmp_path / "hub" / repo
    snapshot = cache / "snapshots" / ("ab" * 20)
    (cache / "blobs").mkdir(parents=True)
    (snapshot / "sub").mkdir(parents=True)
    for i, name in enumerate(["config.json", "model.safetensors", "sub/tokenizer.json"]):
        blob = cache / "blobs" / f"{i:064x}"
        source = template / name if (template / name).exists() else None
        blob.write_bytes(source.read_bytes() if source else b"{}")
        (snapshot / name).symlink_to(os.path.relpath(blob, (snapshot / name).parent))
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("ab" * 20)
    return snapshot


def test_a_hugging_face_cache_snapshot_is_listed_through_its_blob_links(tmp_path, template):
    snapshot = hf_snapshot(tmp_path, template)
    listing = list_folder(snapshot)
    assert listing.problems == ()
    assert list(listing.files) == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    assert run("verify", snapshot).exit_code == 0
    assert run("package", snapshot, "--repo", "org/draft", "-o", tmp_path / "pkg", "-q").exit_code == 0
    assert run("checksums", snapshot).exit_code == 0


def test_a_snapshot_look_alike_outside_the_cache_layout_gets_no_exception(tmp_path, template):
    snapshot = hf_snapshot(tmp_path, template, repo="unpacked-archive")
    assert {(p.path, p.code) for p in list_folder(snapshot).problems} == {
        (name, "LINK_OUTSIDE") for name in ("config.json", "model.safetensors", "sub/tokenizer.json")}


@pytest.mark.parametrize("target", ["../../refs/main", "../../../models--other--repo/blobs/x"])
def test_a_snapshot_link_outside_its_blobs_is_refused(tmp_path, template, target):
    snapshot = hf_snapshot(tmp_path, template)
    other = tmp_path / "hub" / "models--other--repo" / "blobs"
    other.mkdir(parents=True)
    (other / "x").write_text("another repository's file")
    (snapshot / "stolen").symlink_to(target)
    assert [(p.path, p.code) for p in list_folder(snapshot).problems] == [("stolen", "LINK_OUTSIDE")]


def test_tool_folders_are_skipped_whatever_they_are(ckpt, tmp_path):
    (ckpt / ".git").mkdir()
    (ckpt / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ckpt / ".cache").symlink_to(tmp_path / "private")
    assert list(list_folder(ckpt).files) == ["config.json", "model.safetensors"]


def test_twelve_hundred_levels_of_folders_are_listed(ckpt):
    rel = nested_dirs(ckpt, 1200)
    try:
        listing = list_folder(ckpt)
    finally:
        remove_nested(ckpt / "d")
    assert listing.problems == () and len(listing.files) == 3
    assert rel in listing.files


def test_a_missing_folder_or_a_file_is_not_a_folder(tmp_path, template):
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        list_folder(tmp_path / "absent")
    with pytest.raises(CheckpointNotFoundError, match="not a directory"):
        list_folder(template / "config.json")


# ---------------------------------------------------------------- every command on a hostile folder

COMMAND_CASES = ["dir link out (relative)", "dir link to .", "file link out (relative)", "fifo",
                 "links that point at each other"]


@pytest.mark.parametrize("name", COMMAND_CASES)
def test_verify_reports_the_entry(ckpt, tmp_path, name):
    make, code, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    result = run("verify", ckpt, "--json")
    assert result.exit_code == 1
    findings = {(f["code"], f["where"]) for f in json.loads(result.stdout)["findings"]}
    assert (code, where) in findings


@pytest.mark.parametrize("name", COMMAND_CASES)
def test_checksums_and_package_refuse_the_folder_and_write_nothing(ckpt, tmp_path, name):
    make, _, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    assert_one_line_error(run("checksums", ckpt), where)
    assert not (ckpt / "SHA256SUMS").exists() and not (ckpt / "checksums.json").exists()
    assert_one_line_error(run("package", ckpt, "--repo", "org/draft", "-o", tmp_path / "pkg"), where)
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("name", COMMAND_CASES)
def test_checksums_check_refuses_the_folder(ckpt, tmp_path, name):
    assert run("checksums", ckpt).exit_code == 0
    make, _, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    assert_one_line_error(run("checksums", ckpt, "--check"), where)


@pytest.mark.parametrize("name", COMMAND_CASES)
def test_publish_is_refused_and_plans_no_byte_from_outside(ckpt, tmp_path, name):
    carded(ckpt, tmp_path)
    make, _, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    result = run("publish", ckpt, "org/draft", "--endpoint", "http://127.0.0.1:9", "--dry-run", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "refused" and doc["publish"] is None
    assert any(r.startswith(f"verify: {where}:") for r in doc["gate"]["refusals"])
    assert "BEGIN OPENSSH" not in result.output


@pytest.mark.parametrize("name", COMMAND_CASES)
def test_diff_names_the_entry_as_a_problem(ckpt, template, tmp_path, name):
    make, code, where = HOSTILE[name]
    make(ckpt, tmp_path / "private")
    result = run("diff", template, ckpt, "--json")
    assert result.exit_code == 1
    assert {"side": "b", "code": code, "where": where} in [
        {k: p[k] for k in ("side", "code", "where")} for p in json.loads(result.stdout)["problems"]]


def test_the_publish_plan_is_the_listing_and_verify_passed_it(ckpt, tmp_path):
    """The passing twin: links inside the folder are published under their names, as verify listed them."""
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "vocab.txt").write_text("a b c")
    (ckpt / "vocab.txt").symlink_to("sub/vocab.txt")
    carded(ckpt, tmp_path)
    assert run("verify", ckpt).exit_code == 0
    result = run("publish", ckpt, "org/draft", "--endpoint", "http://127.0.0.1:9", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    planned = sorted(f["path"] for f in json.loads(result.stdout)["publish"]["plan"]["files"])
    assert planned == list(list_folder(ckpt).files) == ["README.md", "config.json", "model.safetensors",
                                                          "sub/vocab.txt", "vocab.txt"]


# ---------------------------------------------------------------- files opened by name (item 5)

class Unblocker:
    """If a regression opens the FIFO, a writer opens and closes it so the reader sees EOF instead of
    hanging the suite (the test then fails on its assertions). Never needed when the code is right."""

    def __init__(self, fifo: Path) -> None:
        self.fifo, self.done = fifo, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(30):
            with contextlib.suppress(OSError):
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))

    def __enter__(self) -> Unblocker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()


def fifo_at(path: Path) -> Unblocker:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return Unblocker(path)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "model.safetensors.index.json"])
def test_a_fifo_named_like_a_checkpoint_file_is_one_finding(ckpt, name):
    with fifo_at(ckpt / name):
        result = run("verify", ckpt, "--json")
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert [(f["code"], f["where"]) for f in findings if f["severity"] == "error"] == [("SPECIAL_FILE", name)]
    assert "truncated" not in result.stdout and "0 bytes" not in result.stdout


def test_a_fifo_config_stops_diff_convert_and_card_without_blocking(ckpt, template, tmp_path):
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    with fifo_at(ckpt / "config.json"):
        diffed = run("diff", template, ckpt, "--json")
        converted = run("convert", ckpt, tmp_path / "out")
        card = run("card", "render", ckpt, "--meta", meta, "-o", tmp_path / "card.md")
    assert diffed.exit_code == 1 and "SPECIAL_FILE" in diffed.stdout
    assert_one_line_error(converted, "config.json", "named pipe")
    assert not (tmp_path / "out").exists()
    assert_one_line_error(card, "config.json", "named pipe")


def test_a_fifo_as_the_targets_config_does_not_block_verify(ckpt, template, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(template, target)
    with fifo_at(target / "config.json"):
        result = run("verify", ckpt, "--target", target)
    assert_one_line_error(result, "--target", "config.json")


@pytest.mark.parametrize("reader", [read_regular, load_json_file, read_header,
                                    lambda p: locate_tensor(p, ["embed_tokens.weight"])])
def test_every_reader_by_name_refuses_a_fifo_unopened(tmp_path, reader):
    with fifo_at(tmp_path / "thing.json"), pytest.raises(CheckpointFormatError) as caught:
        reader(tmp_path / "thing.json")
    assert caught.value.code == "SPECIAL_FILE" and "named pipe" in str(caught.value)


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "sub", "is a directory"),
    (lambda d: Path("/dev/null"), "character device"),
    (lambda d: (d / "link").symlink_to(d / "pipe") or d / "link", "named pipe"),
])
def test_open_regular_refuses_what_is_not_a_file(tmp_path, make, words):
    (tmp_path / "sub").mkdir()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises((CheckpointFormatError, CheckpointNotFoundError), match=words):
        open_regular(make(tmp_path))


def test_open_regular_reads_a_file_and_a_link_to_one(tmp_path):
    (tmp_path / "a.json").write_text('{"a": 1}')
    (tmp_path / "b.json").symlink_to("a.json")
    assert read_regular(tmp_path / "b.json") == b'{"a": 1}'
    assert load_json_file(tmp_path / "a.json") == {"a": 1}


@pytest.mark.parametrize("name", ["tokenizer.json", "README.md", "sub/notes.txt"])
def test_checksums_and_package_name_a_fifo_instead_of_skipping_it(ckpt, tmp_path, name):
    (ckpt / "sub").mkdir()
    with fifo_at(ckpt / name):
        checksums = run("checksums", ckpt)
        package = run("package", ckpt, "--repo", "org/draft", "-o", tmp_path / "pkg")
    assert_one_line_error(checksums, name, "named pipe")
    assert_one_line_error(package, name, "named pipe")


def _card_source(tmp_path: Path) -> Path:
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    return meta


#: name -> the command line reading the FIFO at `pipe` (with a conforming checkpoint `ckpt`)
FIFO_ARGUMENTS = {
    "card lint's card": lambda ckpt, pipe, tmp: ["card", "lint", pipe],
    "card render's source": lambda ckpt, pipe, tmp: ["card", "render", ckpt, "--meta", pipe, "-o", tmp / "c.md"],
    "card render's training log": lambda ckpt, pipe, tmp: ["card", "render", ckpt, "--meta", _card_source(tmp),
                                                           "--train-log", pipe, "-o", tmp / "c.md"],
    "card render's checksum manifest": lambda ckpt, pipe, tmp: ["card", "render", ckpt, "--meta", _card_source(tmp),
                                                                "--checksums-from", pipe, "-o", tmp / "c.md"],
    "golden check's fixture": lambda ckpt, pipe, tmp: ["golden", "check", ckpt, pipe],
    "verify --frozen-embed's teacher file": lambda ckpt, pipe, tmp: ["verify", ckpt, "--frozen-embed", pipe],
}


@pytest.mark.parametrize("name", list(FIFO_ARGUMENTS))
def test_a_fifo_given_as_an_argument_is_refused_unopened(ckpt, tmp_path, name):
    pipe = tmp_path / "pipe"
    with fifo_at(pipe):
        result = run(*FIFO_ARGUMENTS[name](ckpt, pipe, tmp_path))
    assert_one_line_error(result, "pipe", "named pipe (FIFO)")
    assert not (tmp_path / "c.md").exists()
