"""checksums: SHA256SUMS that coreutils accepts, git blob ids that git agrees with, and --check findings."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from dspark_hub.errors import CheckpointFormatError, CheckpointNotFoundError, RefusedOverwriteError
from dspark_hub.format import digests
from dspark_hub.hub import checksums
from tests.cli_errors import assert_one_line_error
from tests.hub_checkpoints import write_tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    (folder / "README.md").write_text("# tiny draft\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("nested file\n")
    return folder


@pytest.fixture
def written(ckpt):
    checksums.write_checksums(ckpt)
    return ckpt


def git_hash_object(path) -> str:
    return subprocess.run(["git", "hash-object", "--no-filters", str(path)], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_sha256sum_accepts_the_sums_file(written):
    result = subprocess.run(["sha256sum", "-c", "--strict", digests.SUMS_NAME], cwd=written,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    checked = {line.rsplit(": ", 1)[0] for line in result.stdout.splitlines()}
    assert checked == {"README.md", "config.json", "model.safetensors", "sub/notes.txt"}


def test_sha256sum_rejects_a_changed_file(written):
    (written / "README.md").write_text("# changed\n")
    result = subprocess.run(["sha256sum", "-c", digests.SUMS_NAME], cwd=written, capture_output=True, text=True)
    assert result.returncode != 0 and "README.md: FAILED" in result.stdout


def test_manifest_digests_match_hashlib_and_git(ckpt):
    manifest = digests.compute_manifest(ckpt, workers=3)
    by_path = manifest.by_path()
    assert sorted(by_path) == ["README.md", "config.json", "model.safetensors", "sub/notes.txt"]
    for digest in manifest.files:
        content = (ckpt / digest.path).read_bytes()
        assert digest.size == len(content)
        assert digest.sha256 == hashlib.sha256(content).hexdigest()
    assert by_path["model.safetensors"].lfs and not by_path["config.json"].lfs
    # Regular files: the git blob id of the content, as `git hash-object` computes it.
    for name in ("config.json", "README.md", "sub/notes.txt"):
        assert by_path[name].blob_id == git_hash_object(ckpt / name)


def test_lfs_blob_id_is_the_git_id_of_the_pointer(ckpt, tmp_path):
    weights = digests.compute_manifest(ckpt).by_path()["model.safetensors"]
    pointer = tmp_path / "pointer"
    pointer.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{weights.sha256}\n"
                       f"size {weights.size}\n")
    assert weights.blob_id == git_hash_object(pointer)


def test_manifest_json_schema(written):
    data = json.loads((written / digests.MANIFEST_NAME).read_text())
    assert data["schema"] == "dspark-hub/checksums-manifest/1" and data["algorithm"] == "sha256"
    assert data["file_count"] == len(data["files"]) == 4
    assert data["total_bytes"] == sum(f["size"] for f in data["files"])
    assert [f["path"] for f in data["files"]] == sorted(f["path"] for f in data["files"])
    assert all(set(f) == {"path", "size", "sha256", "blob_id", "lfs"} for f in data["files"])
    assert digests.read_manifest(written / digests.MANIFEST_NAME) == digests.compute_manifest(written)


def test_sidecars_and_tool_folders_are_not_listed(written):
    (written / ".git").mkdir()
    (written / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (written / ".cache" / "huggingface").mkdir(parents=True)
    (written / ".cache" / "huggingface" / "x.metadata").write_text("x")
    assert digests.SUMS_NAME not in digests.checkpoint_files(written)
    assert digests.MANIFEST_NAME not in digests.checkpoint_files(written)
    assert checksums.check_checksums(written).problems == []


def test_progress_counts_every_byte(ckpt):
    seen = []
    manifest = digests.compute_manifest(ckpt, progress=seen.append)
    assert sum(seen) == manifest.total_bytes


def test_refuses_to_overwrite_without_force(written):
    before = (written / digests.SUMS_NAME).read_text()
    (written / "README.md").write_text("# new card\n")
    with pytest.raises(RefusedOverwriteError):
        checksums.write_checksums(written)
    assert (written / digests.SUMS_NAME).read_text() == before
    checksums.write_checksums(written, force=True)
    assert checksums.check_checksums(written).problems == []


def test_check_without_sidecars_says_what_to_run(ckpt):
    with pytest.raises(CheckpointNotFoundError, match="checksums"):
        checksums.check_checksums(ckpt)


# --- --check findings: one fixture per kind -------------------------------------------------------

@pytest.fixture
def mismatched(written):
    path = written / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    path.write_bytes(bytes(data))
    return written


@pytest.fixture
def truncated(written):
    path = written / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    return written


@pytest.fixture
def missing(written):
    (written / "sub" / "notes.txt").unlink()
    return written


@pytest.fixture
def extra(written):
    (written / "stray.bin").write_bytes(b"\0" * 10)
    return written


def test_clean_folder_checks_clean(written):
    assert checksums.check_checksums(written).problems == []


def test_check_names_a_changed_file(mismatched):
    [problem] = checksums.check_checksums(mismatched).problems
    assert (problem.path, problem.kind) == ("model.safetensors", "mismatch")
    assert problem.actual == hashlib.sha256((mismatched / "model.safetensors").read_bytes()).hexdigest()
    assert problem.message.startswith("model.safetensors: SHA-256")


def test_check_names_a_truncated_file_by_size(truncated):
    [problem] = checksums.check_checksums(truncated).problems
    assert (problem.path, problem.kind) == ("model.safetensors", "mismatch")
    assert "bytes" in problem.message and int(problem.expected) - int(problem.actual) == 10


def test_check_names_a_missing_file(missing):
    [problem] = checksums.check_checksums(missing).problems
    assert (problem.path, problem.kind) == ("sub/notes.txt", "missing")


def test_check_names_an_extra_file(extra):
    [problem] = checksums.check_checksums(extra).problems
    assert (problem.path, problem.kind) == ("stray.bin", "extra")


def test_check_falls_back_to_sha256sums(mismatched, missing):
    (mismatched / digests.MANIFEST_NAME).unlink()
    problems = checksums.check_checksums(mismatched).problems
    assert {(p.path, p.kind) for p in problems} == {("model.safetensors", "mismatch"), ("sub/notes.txt", "missing")}
    # every verdict comes from SHA256SUMS, the only sidecar left
    assert all(digests.SUMS_NAME in p.message and digests.MANIFEST_NAME not in p.message for p in problems)
    listed = {line.split()[-1]: line.split()[0] for line in (mismatched / digests.SUMS_NAME).read_text().splitlines()}
    mismatch, missing = problems
    actual = hashlib.sha256((mismatched / "model.safetensors").read_bytes()).hexdigest()
    assert (mismatch.expected, mismatch.actual) == (listed["model.safetensors"], actual)
    assert (missing.expected, missing.actual) == (listed["sub/notes.txt"], None)


def test_awkward_names_round_trip_through_sha256sum(tmp_path):
    if shutil.which("sha256sum") is None:
        pytest.skip("coreutils sha256sum not installed")
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "back\\slash.txt").write_text("a")
    (folder / "two  spaces.txt").write_text("b")
    checksums.write_checksums(folder)
    result = subprocess.run(["sha256sum", "-c", "--strict", digests.SUMS_NAME], cwd=folder,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (folder / digests.MANIFEST_NAME).unlink()
    assert checksums.check_checksums(folder).problems == []


# --- malformed sidecars: one line, exit 2, never a traceback ---------------------------------------

def run_check(folder):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli
    return CliRunner().invoke(cli, ["checksums", str(folder), "--check"])


@pytest.mark.parametrize("document, words", [
    ("[1]", ("checksums.json", "array", "--force")),
    ('{"schema": "dspark-hub/checksums/1"}', ("checksums.json", "'files'")),
    ('{"schema": "dspark-hub/checksums/1", "files": 5}', ("checksums.json", "'files'", "number")),
    ('{"schema": "dspark-hub/checksums/1", "files": [{"path": "config.json"}]}', ("files[0]", "'size'")),
    ('{"schema": "dspark-hub/checksums/1", "files": [7]}', ("files[0]", "number")),
    ('{"schema": "dspark-hub/checksums/1", "files": [{"path": "a", "size": "9", "sha256": "x", '
     '"blob_id": "", "lfs": false}]}', ("files[0]", "'size'", "integer")),
    ("not json {", ("checksums.json", "not valid JSON")),
    ("[" * 100_000 + "]" * 100_000, ("checksums.json", "not valid JSON")),
])
def test_malformed_manifest_is_one_line_exit_2(written, document, words):
    (written / digests.MANIFEST_NAME).write_text(document)
    with pytest.raises(CheckpointFormatError):
        checksums.check_checksums(written)
    assert_one_line_error(run_check(written), *words)


def test_manifest_entry_with_a_bad_digest_is_refused(written):
    data = json.loads((written / digests.MANIFEST_NAME).read_text())
    data["files"][0]["sha256"] = "not hex"
    (written / digests.MANIFEST_NAME).write_text(json.dumps(data))
    assert_one_line_error(run_check(written), "files[0]", "'sha256'", "64 hex")


def test_sums_that_are_not_utf8_are_one_line_exit_2(written):
    (written / digests.MANIFEST_NAME).unlink()
    (written / digests.SUMS_NAME).write_bytes(b"\xff\xfe" + "a".encode("utf-16-le"))
    assert_one_line_error(run_check(written), "SHA256SUMS", "0xff", "UTF-8")


def test_a_wrong_sums_file_beside_a_right_manifest_fails(written):
    sums = written / digests.SUMS_NAME
    wrong = "0" * 64
    sums.write_text(sums.read_text().replace(hashlib.sha256((written / "README.md").read_bytes()).hexdigest(), wrong))
    [problem] = checksums.check_checksums(written).problems
    assert (problem.path, problem.kind, problem.expected) == ("README.md", "mismatch", wrong)
    assert "SHA256SUMS says" in problem.message
    result = run_check(written)
    assert result.exit_code == 1 and "OK" not in result.stdout


def test_a_file_missing_from_one_sidecar_is_named(written):
    sums = written / digests.SUMS_NAME
    sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines() if "README.md" not in line))
    [problem] = checksums.check_checksums(written).problems
    assert (problem.path, problem.kind) == ("README.md", "extra") and "not in SHA256SUMS" in problem.message


def test_duplicate_sums_lines_with_different_digests_fail(written):
    (written / digests.MANIFEST_NAME).unlink()
    sums = written / digests.SUMS_NAME
    sums.write_text(f"{'1' * 64}  config.json\n" + sums.read_text())   # the right line comes last
    assert subprocess.run(["sha256sum", "-c", digests.SUMS_NAME], cwd=written,
                          capture_output=True).returncode != 0   # coreutils fails it too
    [problem] = checksums.check_checksums(written).problems
    assert (problem.path, problem.kind, problem.expected) == ("config.json", "mismatch", "1" * 64)


def test_one_sums_parser_serves_check_and_cards(tmp_path):
    text = f"# a comment\n{'AB' * 32}  plain.txt\r\n \\{'cd' * 32}  back\\\\slash\\nnewline\n"
    pairs = [(d.path, d.sha256) for d in digests.parse_sums(text, path="SUMS")]
    assert pairs == [("plain.txt", "ab" * 32), ("back\\slash\nnewline", "cd" * 32)]
    path = tmp_path / "SUMS"
    path.write_text(text)
    loaded = digests.read_digest_file(path)
    assert [(d.path, d.sha256) for d in loaded] == pairs
    with pytest.raises(CheckpointFormatError, match="line 2"):
        digests.parse_sums(f"{'ab' * 32}  ok\nnonsense\n", path="SUMS")
