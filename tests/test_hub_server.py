"""The real huggingface_hub client against the local Hub server (tests/hub_server.py).

These pin down that the server speaks the protocol the client uses, so the library tests
(test_hub.py, test_package.py) exercise the real client end to end.
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess

import pytest

from tests.hub_checkpoints import write_tiny_checkpoint


@pytest.fixture
def api(hub, hub_token):
    from huggingface_hub import HfApi
    return HfApi(endpoint=hub.url, token=hub_token)


@pytest.fixture
def ckpt(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt", pad_mib=3)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny\n")
    return folder


@contextlib.contextmanager
def through_lfs():
    """The raw client's uploads take the LFS path (these tests pin the server's LFS protocol); Xet stays on
    for everything else, as for a user with hf_xet installed."""
    from huggingface_hub import constants

    before, constants.HF_HUB_DISABLE_XET = constants.HF_HUB_DISABLE_XET, True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


@pytest.fixture
def uploaded(api, hub_repo_id, ckpt):
    api.create_repo(hub_repo_id, private=True, exist_ok=True)
    with through_lfs():
        api.upload_folder(repo_id=hub_repo_id, folder_path=str(ckpt), commit_message="add model")
    return hub_repo_id


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_endpoint_is_set_before_import_and_xet_is_on_as_for_users(hub):
    import importlib.util

    from huggingface_hub import constants
    assert hub.url == constants.ENDPOINT
    assert constants.HF_HUB_DISABLE_XET is False and importlib.util.find_spec("hf_xet") is not None


def test_the_server_is_an_endpoint_without_xet(api, hub, hub_repo_id, ckpt):
    """The raw client with Xet on asks for a Xet write token, gets the 404 of an endpoint without Xet, uploads
    nothing (huggingface_hub has no fallback of its own: dspark-hub's publish chooses LFS itself)."""
    api.create_repo(hub_repo_id, exist_ok=True)
    with pytest.raises(ConnectionError, match=r"404.*xet-write-token"):
        api.upload_folder(repo_id=hub_repo_id, folder_path=str(ckpt))
    assert ("write", hub_repo_id, "main") in hub.xet_token_requests
    assert hub.lfs_uploaded_oids(hub_repo_id) == []
    assert set(hub.head_files(hub_repo_id)) == {".gitattributes"}


def test_downloads_with_xet_on_use_plain_http(hub, uploaded, ckpt, tmp_path, hub_token):
    """No Xet hash is advertised, so downloads never ask for a Xet read token."""
    from huggingface_hub import constants, snapshot_download

    assert constants.HF_HUB_DISABLE_XET is False
    snapshot_download(uploaded, local_dir=tmp_path / "fresh", token=hub_token)
    assert (tmp_path / "fresh" / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    assert not [r for r in hub.xet_token_requests if r[1] == uploaded]


def test_create_repo_exist_ok_and_conflict(api, hub_repo_id):
    from huggingface_hub.errors import HfHubHTTPError

    url = api.create_repo(hub_repo_id, private=True)
    assert url.repo_id == hub_repo_id
    assert api.create_repo(hub_repo_id, exist_ok=True).repo_id == hub_repo_id
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(hub_repo_id)
    assert err.value.response.status_code == 409
    assert api.model_info(hub_repo_id).private is True


def test_upload_folder_sends_weights_through_lfs(hub, uploaded, ckpt):
    weights = ckpt / "model.safetensors"
    assert weights.stat().st_size > 3 * 1024 * 1024
    assert hub.lfs_uploaded_oids(uploaded) == [sha256(weights)]
    assert hub.lfs_bytes_received(uploaded) == weights.stat().st_size
    files = hub.head_files(uploaded)
    assert files["model.safetensors"].lfs_oid == sha256(weights)
    assert files["config.json"].lfs_oid is None and files["README.md"].lfs_oid is None


def test_snapshot_download_is_byte_identical(uploaded, ckpt, tmp_path, hub_token):
    from huggingface_hub import snapshot_download

    out = snapshot_download(uploaded, local_dir=tmp_path / "fresh", token=hub_token)
    for name in ("config.json", "README.md", "model.safetensors"):
        assert (tmp_path / "fresh" / name).read_bytes() == (ckpt / name).read_bytes()
    assert str(out) == str(tmp_path / "fresh")


def test_paths_info_and_tree_give_lfs_sha256_and_git_blob_ids(api, uploaded, ckpt, tmp_path):
    info = {f.path: f for f in api.get_paths_info(uploaded, ["config.json", "model.safetensors", "nope"],
                                                  expand=True)}
    assert set(info) == {"config.json", "model.safetensors"}
    weights = info["model.safetensors"]
    assert weights.lfs.sha256 == sha256(ckpt / "model.safetensors")
    assert weights.size == weights.lfs.size == (ckpt / "model.safetensors").stat().st_size
    assert weights.last_commit.title == "add model"
    config_blob = subprocess.run(["git", "hash-object", str(ckpt / "config.json")], check=True,
                                 capture_output=True, text=True).stdout.strip()
    assert info["config.json"].blob_id == config_blob and info["config.json"].lfs is None
    tree = {f.path: f for f in api.list_repo_tree(uploaded, recursive=True)}
    assert set(tree) == {".gitattributes", "README.md", "config.json", "model.safetensors"}
    assert tree["model.safetensors"].lfs.sha256 == weights.lfs.sha256
    # The LFS file's blob id is git's id of its pointer, as on the Hub.
    pointer = tmp_path / "pointer"
    pointer.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{weights.lfs.sha256}\n"
                       f"size {weights.size}\n")
    pointer_blob = subprocess.run(["git", "hash-object", str(pointer)], check=True, capture_output=True,
                                  text=True).stdout.strip()
    assert tree["model.safetensors"].blob_id == pointer_blob
    assert tree["model.safetensors"].lfs.pointer_size == pointer.stat().st_size


def test_header_read_serves_far_fewer_bytes_than_the_file(api, hub, uploaded, ckpt):
    size = (ckpt / "model.safetensors").stat().st_size
    metadata = api.get_safetensors_metadata(uploaded)
    assert "layers.0.mlp.up_proj.weight" in metadata.files_metadata["model.safetensors"].tensors
    served = hub.bytes_served(uploaded, "model.safetensors")
    assert 0 < served <= 100_001 and served * 30 < size


def test_range_requests(api, hub, uploaded, ckpt, hub_token):
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(uploaded, "model.safetensors", endpoint=hub.url)
    data = (ckpt / "model.safetensors").read_bytes()
    for header, expected in (("bytes=0-7", data[:8]), ("bytes=10-", data[10:]), ("bytes=-5", data[-5:]),
                             (f"bytes={len(data) - 3}-{len(data) + 100}", data[-3:])):
        response = get_session().get(url, headers={**build_hf_headers(token=hub_token), "Range": header})
        assert response.status_code == 206 and response.content == expected, header
        assert response.headers["Content-Range"].endswith(f"/{len(data)}")
    response = get_session().get(url, headers={**build_hf_headers(token=hub_token), "Range": f"bytes={len(data)}-"})
    assert response.status_code == 416


def test_head_gives_commit_and_etags(api, uploaded, ckpt, hub):
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    meta = get_hf_file_metadata(hf_hub_url(uploaded, "model.safetensors", endpoint=hub.url), token=hub.token)
    assert meta.etag == sha256(ckpt / "model.safetensors")
    assert meta.commit_hash == api.model_info(uploaded).sha
    assert meta.size == (ckpt / "model.safetensors").stat().st_size


def test_wrong_token_is_401_and_private_repos_hide_from_anonymous(hub, uploaded):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url, token="hf_wrong").model_info(uploaded)
    assert err.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info(uploaded)


def test_tags_refs_and_revisions(api, uploaded, hub_token, tmp_path):
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RevisionNotFoundError

    head = api.model_info(uploaded).sha
    api.create_tag(uploaded, tag="v1", revision=head)
    api.create_tag(uploaded, tag="v1", exist_ok=True)
    refs = api.list_repo_refs(uploaded)
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", head)]
    assert api.model_info(uploaded, revision="v1").sha == head
    assert api.model_info(uploaded, revision=head[:7]).sha == head
    path = hf_hub_download(uploaded, "config.json", revision="v1", cache_dir=tmp_path / "cache", token=hub_token)
    assert head in path
    with pytest.raises(RevisionNotFoundError):
        api.model_info(uploaded, revision="no-such-branch")


def test_interrupted_upload_resumes_without_resending_finished_objects(api, hub, hub_repo_id, tmp_path):
    from huggingface_hub.errors import HfHubHTTPError

    folder = write_tiny_checkpoint(tmp_path / "sharded", pad_mib=2, shards=3)
    shards = sorted(folder.glob("*.safetensors"))
    oids = {sha256(p) for p in shards}
    failing = sha256(shards[1])
    api.create_repo(hub_repo_id)
    hub.fail_lfs_uploads(1, oids={failing})
    with pytest.raises(RuntimeError) as err, through_lfs():
        api.upload_folder(repo_id=hub_repo_id, folder_path=str(folder))
    assert isinstance(err.value.__cause__, HfHubHTTPError)
    finished = set(hub.lfs_uploaded_oids(hub_repo_id))
    # Uploads run in parallel: each other object may or may not have finished before the failure surfaced.
    assert failing not in finished and finished <= oids - {failing}
    assert "model-00001-of-00003.safetensors" not in hub.head_files(hub_repo_id)  # nothing committed
    before = len(hub.lfs_puts)

    with through_lfs():
        api.upload_folder(repo_id=hub_repo_id, folder_path=str(folder))
    resent = [put.oid for put in hub.lfs_puts[before:]]
    assert sorted(resent) == sorted(oids - finished)  # only what had not finished, each once
    assert {e.lfs_oid for e in hub.head_files(hub_repo_id).values() if e.lfs_oid} == oids
