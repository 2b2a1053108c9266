"""What `verify --against-hub` says (issue 24, 8 and 9): on success, how many files were compared against which
revision and commit; on a size difference, which way it goes. Against the local Hub, with Xet on in the client."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.hub.publish import publish

from .factories import write_checkpoint


def run(*args, env=None):
    return CliRunner(env=env).invoke(cli, list(map(str, args)))


@pytest.fixture
def published(hub, hub_repo_id, hub_token, tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt")
    result = publish(folder, hub_repo_id, token=hub_token, endpoint=hub.url, tag="v1")
    assert result.ok
    return folder, result


def test_success_names_the_files_compared_and_the_revision(hub, hub_repo_id, hub_token, published):
    folder, result = published
    for ref, shown in ((hub_repo_id, f"hf://{hub_repo_id}@main"), (f"{hub_repo_id}@v1", f"hf://{hub_repo_id}@v1")):
        out = run("verify", folder, "--against-hub", ref, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
        assert out.exit_code == 0, out.output
        files = len(result.plan.files)
        assert (f"against {shown} (commit {result.commit_oid[:12]}): {files} files compared; every one matches"
                in out.stdout)


def test_a_difference_is_counted_in_the_summary_line(hub, hub_repo_id, hub_token, published):
    folder, _ = published
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    out = run("verify", folder, "--against-hub", hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert out.exit_code == 1
    assert "files compared; 1 difference (see the findings)" in out.stdout


@pytest.mark.parametrize(("change", "said", "not_said"), [
    (lambda data: data + b"  ", "the local file is larger", "truncated"),            # grew
    (lambda data: data + b"\n" * 1000, "the local file is larger", "truncated"),     # grew a lot
    (lambda data: data[:-2], "the local file is smaller: truncated", "larger"),      # cut short
    (lambda data: data[: len(data) // 2], "the local file is smaller: truncated", "larger"),
])
def test_a_size_mismatch_says_which_way_it_goes(hub, hub_repo_id, hub_token, published, change, said, not_said):
    folder, _ = published
    config = folder / "config.json"
    config.write_bytes(change(config.read_bytes()))
    out = run("verify", folder, "--against-hub", hub_repo_id, "--endpoint", hub.url, "--json",
              env={"HF_TOKEN": hub_token})
    finding = next(f for f in json.loads(out.stdout)["findings"] if f["code"] == "HUB_FILE_MISMATCH")
    assert finding["where"] == "config.json" and said in finding["message"] and not_said not in finding["message"]
