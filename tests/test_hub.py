"""dspark_hub.hub against the local Hub server: remote reads, compare, publish, errors."""

from __future__ import annotations

import hashlib
import socket
import traceback

import pytest

from dspark_hub.errors import HubError, UsageError
from dspark_hub.format.remote import HubSource, parse_hf_url
from dspark_hub.hub import checksums
from dspark_hub.hub.publish import publish
from dspark_hub.verify.against_hub import compare_with_hub
from tests.hub_checkpoints import write_tiny_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt", pad_mib=3)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny draft\n")
    return folder


@pytest.fixture
def published(hub, hub_repo_id, hub_token, ckpt):
    result = publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url, private=True, tag="v1")
    assert result.status == "published" and result.ok, result.to_dict()
    return result


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def all_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


# --- names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, expected", [
    ("hf://org/name", ("org/name", None)),
    ("hf://org/name@main", ("org/name", "main")),
    ("hf://org/Kimi-K3-DSpark@cf6b8244620e7ea4b0651d214f28e89eac75bed6",
     ("org/Kimi-K3-DSpark", "cf6b8244620e7ea4b0651d214f28e89eac75bed6")),
    ("hf://org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    ("hf://models/org/name@v1.0", ("org/name", "v1.0")),
])
def test_parse_hf_url(url, expected):
    assert parse_hf_url(url) == expected


@pytest.mark.parametrize("url", ["org/name", "hf://name", "hf://org/name@", "hf://a/b/c", "hf://org/../x"])
def test_parse_hf_url_rejects(url):
    with pytest.raises(UsageError):
        parse_hf_url(url)


# --- reading -------------------------------------------------------------------------------------

def test_source_lists_and_range_reads_without_downloading(hub, published, ckpt, hub_token):
    repo_id = published.plan.repo_id
    source = HubSource.from_url(f"hf://{repo_id}@v1", endpoint=hub.url, token=hub_token)
    assert source.location == f"hf://{repo_id}@v1"
    assert source.commit == published.commit_oid
    files = source.list_files()
    assert files["model.safetensors"] == (ckpt / "model.safetensors").stat().st_size
    assert files["config.json"] == (ckpt / "config.json").stat().st_size
    remote = source.remote_files()
    assert remote["model.safetensors"].sha256 == sha256(ckpt / "model.safetensors")
    assert remote["config.json"].lfs is False
    data = (ckpt / "model.safetensors").read_bytes()
    header_len = int.from_bytes(source.read_bytes("model.safetensors", 0, 8), "little")
    header = source.read_bytes("model.safetensors", 8, header_len)
    assert header == data[8:8 + header_len]
    assert source.read_bytes("model.safetensors", len(data) - 4, 100) == data[-4:]  # short at EOF
    assert source.read_bytes("model.safetensors", len(data) + 10, 5) == b""
    served = hub.bytes_served(repo_id, "model.safetensors")
    assert served == source.bytes_read == 8 + header_len + 4
    assert served * 100 < len(data)
    assert hub_token not in repr(source)


def test_source_stops_reading_when_the_server_ignores_ranges(hub, published, ckpt, hub_token):
    data = (ckpt / "model.safetensors").read_bytes()
    source = HubSource(published.plan.repo_id, endpoint=hub.url, token=hub_token)
    source.remote_files()
    hub.honour_ranges = False
    try:
        assert source.read_bytes("model.safetensors", 8, 16) == data[8:24]
    finally:
        hub.honour_ranges = True
    assert source.bytes_read * 4 < len(data)  # read the first chunks, then hung up


def test_source_pins_the_commit_the_revision_resolved_to(hub, published, ckpt, hub_token, tmp_path):
    repo_id = published.plan.repo_id
    source = HubSource(repo_id, "main", endpoint=hub.url, token=hub_token)
    first = source.read_bytes("README.md", 0, 20)
    other = tmp_path / "other"
    other.mkdir()
    (other / "README.md").write_text("# moved on\n")
    publish(other, repo_id, token=hub_token, endpoint=hub.url)
    assert source.read_bytes("README.md", 0, 20) == first
    assert HubSource(repo_id, "main", endpoint=hub.url, token=hub_token).read_bytes("README.md", 0, 20) != first


def test_missing_repo_file_and_revision_are_hub_errors(hub, published, hub_token):
    repo_id = published.plan.repo_id
    with pytest.raises(HubError, match=r"hf://testuser/does-not-exist: repository not found"):
        HubSource("testuser/does-not-exist", endpoint=hub.url, token=hub_token).list_files()
    with pytest.raises(HubError, match="revision not found"):
        HubSource(repo_id, "nope", endpoint=hub.url, token=hub_token).list_files()
    with pytest.raises(HubError, match="file not found"):
        HubSource(repo_id, endpoint=hub.url, token=hub_token).read_bytes("absent.bin", 0, 8)


def test_private_repo_without_token_reads_as_not_found(hub, published):
    with pytest.raises(HubError, match="private repositories need a token"):
        HubSource(published.plan.repo_id, endpoint=hub.url, token=False).list_files()  # type: ignore[arg-type]


def test_unreachable_endpoint_is_a_hub_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(HubError, match=f"cannot reach the Hub at http://127.0.0.1:{port}"):
        HubSource("org/name", endpoint=f"http://127.0.0.1:{port}", token="x").list_files()


# --- comparing -----------------------------------------------------------------------------------

def test_compare_clean_after_publish(hub, published, ckpt, hub_token):
    result = compare_with_hub(ckpt, published.plan.repo_id, "v1", endpoint=hub.url, token=hub_token)
    assert result.ok and result.problems == []
    assert result.files_compared == 3 and result.commit == published.commit_oid


def test_compare_names_every_mismatching_missing_and_extra_file(hub, published, ckpt, hub_token):
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))                     # same size, other content (LFS sha256)
    (ckpt / "config.json").write_text("{}\n")            # regular file (git blob id + size)
    (ckpt / "README.md").unlink()                        # on the Hub only
    (ckpt / "notes.txt").write_text("local only\n")      # here only
    result = compare_with_hub(ckpt, published.plan.repo_id, "v1", endpoint=hub.url, token=hub_token)
    kinds = {(p.path, p.kind) for p in result.problems}
    assert kinds == {("model.safetensors", "mismatch"), ("config.json", "mismatch"),
                     ("README.md", "missing"), ("notes.txt", "extra")}
    weights_problem = next(p for p in result.problems if p.path == "model.safetensors")
    assert weights_problem.expected == published.plan.files[0].sha256 and "SHA-256" in weights_problem.message
    assert result.to_dict()["ok"] is False


def test_compare_checks_regular_files_by_git_blob_id(hub, published, ckpt, hub_token):
    readme = ckpt / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("tiny", "tinY"))  # same size, other bytes
    [problem] = compare_with_hub(ckpt, published.plan.repo_id, endpoint=hub.url, token=hub_token).problems
    assert (problem.path, problem.kind) == ("README.md", "mismatch") and "git blob" in problem.message


# --- publishing ----------------------------------------------------------------------------------

def test_publish_uploads_weights_through_lfs_and_reports_the_commit(hub, published, ckpt, tmp_path, hub_token):
    from huggingface_hub import snapshot_download

    repo_id = published.plan.repo_id
    assert published.commit_url == f"{hub.url}/{repo_id}/commit/{published.commit_oid}"
    assert hub.lfs_uploaded_oids(repo_id) == [sha256(ckpt / "model.safetensors")]
    assert [f.path for f in published.plan.files] == ["model.safetensors", "README.md", "config.json"]
    assert hub.repo(repo_id).private is True
    assert hub.repo(repo_id).tags == {"v1": published.commit_oid}
    snapshot_download(repo_id, local_dir=tmp_path / "fresh", token=hub_token, endpoint=hub.url)
    for name in ("config.json", "README.md", "model.safetensors"):
        assert (tmp_path / "fresh" / name).read_bytes() == (ckpt / name).read_bytes()


def test_publish_again_sends_nothing_and_says_unchanged(hub, published, ckpt, hub_token):
    repo_id = published.plan.repo_id
    puts = len(hub.lfs_puts)
    again = publish(ckpt, repo_id, token=hub_token, endpoint=hub.url, tag="v1")
    assert again.status == "unchanged" and again.ok
    assert again.commit_oid == published.commit_oid
    assert len(hub.lfs_puts) == puts


def test_publish_refuses_a_tag_on_another_commit(hub, published, ckpt, hub_token):
    (ckpt / "README.md").write_text("# v2\n")
    with pytest.raises(HubError, match="tag already exists"):
        publish(ckpt, published.plan.repo_id, token=hub_token, endpoint=hub.url, tag="v1")


def test_dry_run_plans_every_file_and_sends_nothing(hub, hub_repo_id, ckpt):
    requests = len(hub.requests)
    result = publish(ckpt, hub_repo_id, dry_run=True, endpoint=hub.url, token="never-used")
    assert len(hub.requests) == requests
    plan = result.plan.to_dict()
    assert result.status == "dry_run" and result.commit_url is None
    assert [(f["path"], f["lfs"]) for f in plan["files"]] == [
        ("model.safetensors", True), ("README.md", False), ("config.json", False)]
    assert plan["total_bytes"] == sum((ckpt / f["path"]).stat().st_size for f in plan["files"])
    assert plan["lfs_bytes"] == (ckpt / "model.safetensors").stat().st_size


def test_preflight_refusal_sends_nothing(hub, hub_repo_id, ckpt, hub_token):
    requests = len(hub.requests)
    result = publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url,
                     preflight=lambda: ["verify: 2 errors", "card lint: parameter count is wrong"])
    assert result.status == "refused" and not result.ok
    assert result.refusals == ["verify: 2 errors", "card lint: parameter count is wrong"]
    assert len(hub.requests) == requests


def test_wrong_token_is_a_clear_hub_error_without_the_token(hub, hub_repo_id, ckpt):
    secret = "hf_THIS_IS_A_SECRET_TOKEN_123"
    with pytest.raises(HubError) as err:
        publish(ckpt, hub_repo_id, token=secret, endpoint=hub.url)
    message = str(err.value)
    assert message.startswith(f"hf://{hub_repo_id}@main: the Hub rejected the token (401")
    assert "\n" not in message and "hf auth login" in message
    assert secret not in all_text(err.value)
    assert hub_repo_id not in {key[1] for key in hub.repos}


def test_token_from_the_environment(hub, hub_repo_id, ckpt, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", hub.token)
    result = publish(ckpt, hub_repo_id, endpoint=hub.url)
    assert result.status == "published"


def test_interrupted_publish_resumes_without_resending(hub, hub_repo_id, hub_token, tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "sharded", pad_mib=2, shards=3)
    shards = sorted(folder.glob("*.safetensors"))
    failing = sha256(shards[2])
    hub.fail_lfs_uploads(1, oids={failing})
    with pytest.raises(HubError, match=f"hf://{hub_repo_id}@main: .*run"):
        publish(folder, hub_repo_id, token=hub_token, endpoint=hub.url)
    done = set(hub.lfs_uploaded_oids(hub_repo_id))
    assert done == {sha256(p) for p in shards} - {failing}
    before = len(hub.lfs_puts)
    result = publish(folder, hub_repo_id, token=hub_token, endpoint=hub.url)
    assert result.status == "published" and result.ok
    assert [put.oid for put in hub.lfs_puts[before:]] == [failing]


def test_failed_commit_resumes_with_zero_lfs_bytes(hub, hub_repo_id, hub_token, ckpt):
    hub.fail_commits(1)
    with pytest.raises(HubError, match="HTTP 500"):
        publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url)
    received = hub.lfs_bytes_received(hub_repo_id)
    assert received == (ckpt / "model.safetensors").stat().st_size
    result = publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url)
    assert result.status == "published" and hub.lfs_bytes_received(hub_repo_id) == received


def test_extra_files_and_branch_revision(hub, hub_repo_id, hub_token, ckpt, tmp_path):
    sidecars = checksums.write_checksums(ckpt, out_dir=tmp_path / "pkg")
    result = publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url, revision="dev",
                     extra_files={"SHA256SUMS": sidecars.sums_path})
    assert result.ok and result.status == "published"
    files = hub.head_files(hub_repo_id, "dev")
    assert "SHA256SUMS" in files and "model.safetensors" in files
    assert "model.safetensors" not in hub.head_files(hub_repo_id, "main")


def test_remote_verify_matches_local_verify_and_reads_only_headers(hub, published, ckpt, hub_token):
    from dspark_hub.verify.checks import verify

    repo_id = published.plan.repo_id
    source = HubSource.from_url(f"hf://{repo_id}@v1", endpoint=hub.url, token=hub_token)
    remote = verify(source)
    local = verify(ckpt)
    assert [f.to_dict() for f in remote.findings] == [f.to_dict() for f in local.findings]
    assert remote.findings  # the padding tensor is not in the contract: a finding on both sides
    weights = (ckpt / "model.safetensors").stat().st_size
    assert hub.bytes_served(repo_id, "model.safetensors") * 100 < weights
