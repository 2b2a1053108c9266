"""package: a deterministic torrent that torf verifies, Hub web seeds, .gitattributes that git agrees with."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest

from dspark_hub import schemas
from dspark_hub.errors import RefusedOverwriteError, UsageError
from dspark_hub.hub.package import package
from tests.hub_checkpoints import write_tiny_checkpoint

REPO = "testorg/tiny-draft"
ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture
def ckpt(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt", pad_mib=1)
    (folder / "README.md").write_text("# tiny draft\n")
    (folder / "extra").mkdir()
    (folder / "extra" / "blob.dat").write_bytes(bytes(range(256)) * 64)  # binary, no LFS pattern
    return folder


def listing(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def read_torrent(path: Path):
    import torf
    return torf.Torrent.read(str(path))


def test_writes_every_artifact_and_leaves_the_checkpoint_alone(ckpt, tmp_path):
    before = listing(ckpt)
    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", revision="main", endpoint=ENDPOINT)
    assert listing(ckpt) == before
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == sorted(
        [".gitattributes", "SHA256SUMS", "checksums.json", "tiny-draft.torrent", "tiny-draft.magnet"])
    assert set(result.files) == {".gitattributes", "SHA256SUMS", "checksums.json", "tiny-draft.torrent",
                                 "tiny-draft.magnet"}
    manifest = json.loads(result.files["checksums.json"].read_text())
    assert manifest["schema"] == schemas.CHECKSUMS and manifest["file_count"] == 4
    assert json.dumps(result.to_dict())


def test_sums_verify_with_sha256sum_from_the_checkpoint(ckpt, tmp_path):
    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", endpoint=ENDPOINT)
    check = subprocess.run(["sha256sum", "-c", "--strict", str(result.files["SHA256SUMS"])], cwd=ckpt,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_torrent_verifies_against_the_files_with_torf(ckpt, tmp_path):
    import torf

    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", endpoint=ENDPOINT)
    torrent = read_torrent(result.files["tiny-draft.torrent"])
    assert torrent.infohash == result.infohash
    assert sorted(Path(*f.parts[1:]).as_posix() for f in torrent.files) == sorted(listing(ckpt))
    assert torrent.verify(str(ckpt)) is True
    # ... and torf notices one flipped byte (the check is real).
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(torf.VerifyContentError):
        torrent.verify(str(ckpt))


def test_same_checkpoint_same_infohash(ckpt, tmp_path):
    first = package(ckpt, REPO, out_dir=tmp_path / "a", endpoint=ENDPOINT)
    second = package(ckpt, REPO, out_dir=tmp_path / "b", endpoint=ENDPOINT)
    assert first.infohash == second.infohash
    assert first.files["tiny-draft.torrent"].read_bytes() == second.files["tiny-draft.torrent"].read_bytes()
    metainfo = read_torrent(first.files["tiny-draft.torrent"]).metainfo
    assert "creation date" not in metainfo and "created by" not in metainfo
    assert "private" not in metainfo["info"]


def test_different_content_different_infohash(ckpt, tmp_path):
    first = package(ckpt, REPO, out_dir=tmp_path / "a", endpoint=ENDPOINT)
    (ckpt / "README.md").write_text("# tiny draft, v2\n")
    second = package(ckpt, REPO, out_dir=tmp_path / "b", endpoint=ENDPOINT)
    assert first.infohash != second.infohash


def test_webseeds_resolve_to_the_hub_download_urls(ckpt, tmp_path):
    from huggingface_hub import hf_hub_url

    revision = "0123456789abcdef0123456789abcdef01234567"
    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", revision=revision, endpoint=ENDPOINT)
    torrent = read_torrent(result.files["tiny-draft.torrent"])
    assert torrent.webseeds == [f"{ENDPOINT}/{REPO}/resolve/"] == result.webseeds
    assert torrent.name == revision
    assert {Path(*file.parts[1:]).as_posix() for file in torrent.files} >= {"config.json", "model.safetensors",
                                                                           "README.md", "extra/blob.dat"}
    for file in torrent.files:
        path = Path(*file.parts[1:]).as_posix()
        # BEP 19, multi-file: <url-list entry> + <name> + "/" + <path>, each URL-escaped.
        bep19 = torrent.webseeds[0] + "/".join(quote(part) for part in file.parts)
        assert bep19 == hf_hub_url(REPO, path, revision=revision, endpoint=ENDPOINT)
    assert f"xt=urn:btih:{result.infohash}" in result.magnet and "ws=" in result.magnet
    assert result.files["tiny-draft.magnet"].read_text().strip() == result.magnet


def test_webseed_urls_serve_the_files_from_the_hub(ckpt, tmp_path, hub, hub_repo_id, hub_token):
    """End to end: publish to the local Hub, package for that commit, fetch every file the BEP 19 way."""
    from huggingface_hub.utils import build_hf_headers, get_session

    from dspark_hub.hub.publish import publish

    published = publish(ckpt, hub_repo_id, token=hub_token, endpoint=hub.url)
    result = package(ckpt, hub_repo_id, out_dir=tmp_path / "pkg", revision=published.commit_oid, endpoint=hub.url)
    torrent = read_torrent(result.files[f"{hub_repo_id.split('/')[1]}.torrent"])
    assert len(torrent.files) >= 4
    for file in torrent.files:
        url = torrent.webseeds[0] + "/".join(quote(part) for part in file.parts)
        response = get_session().get(url, headers=build_hf_headers(token=hub_token))
        assert response.status_code == 200, url
        assert response.content == (ckpt / Path(*file.parts[1:])).read_bytes()


def test_gitattributes_agrees_with_git_and_the_manifest(ckpt, tmp_path):
    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", endpoint=ENDPOINT)
    repo = tmp_path / "gitrepo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitattributes").write_text(result.files[".gitattributes"].read_text())
    paths = [f.path for f in result.manifest.files]
    out = subprocess.run(["git", "check-attr", "filter", "--", *paths], cwd=repo, check=True,
                         capture_output=True, text=True).stdout
    git_lfs = {line.split(": ")[0] for line in out.splitlines() if line.endswith(": filter: lfs")}
    assert git_lfs == {f.path for f in result.manifest.files if f.lfs}
    assert {"model.safetensors", "extra/blob.dat"} <= git_lfs and "config.json" not in git_lfs


def test_refuses_existing_output_without_force(ckpt, tmp_path):
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(RefusedOverwriteError):
        package(ckpt, REPO, out_dir=out, endpoint=ENDPOINT)
    assert listing(out) == {"keep.txt": b"mine"}
    package(ckpt, REPO, out_dir=out, endpoint=ENDPOINT, force=True)
    assert "keep.txt" not in listing(out) and "tiny-draft.torrent" in listing(out)


def test_refuses_an_output_inside_the_checkpoint(ckpt):
    with pytest.raises(UsageError):
        package(ckpt, REPO, out_dir=ckpt / "pkg", endpoint=ENDPOINT)
    with pytest.raises(UsageError):
        package(ckpt, REPO, out_dir=ckpt, endpoint=ENDPOINT, force=True)
    assert not (ckpt / "pkg").exists()


@pytest.mark.parametrize("revision", ["refs/pr/1", ""])
def test_refuses_revisions_a_torrent_cannot_name(ckpt, tmp_path, revision):
    with pytest.raises(UsageError):
        package(ckpt, REPO, out_dir=tmp_path / "pkg", revision=revision, endpoint=ENDPOINT)


def test_progress_reports_both_passes(ckpt, tmp_path):
    calls = []
    result = package(ckpt, REPO, out_dir=tmp_path / "pkg", endpoint=ENDPOINT,
                     progress=lambda stage, done, total: calls.append((stage, done, total)))
    total = result.manifest.total_bytes
    assert calls[-1] == ("pieces", total, total)
    assert ("checksums", total, total) in calls
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # all checksums, then all pieces
