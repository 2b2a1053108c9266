"""Issue 29 items 7 and 8: a Hub that never answers, answers slowly, asks to wait a day, or answers wrongly.

Every command that talks to the Hub (`verify hf://`, `verify --against-hub`, `verify --target hf://`, `publish`)
runs against the local Hub server made to misbehave (`HubServer.misbehave`), through the real huggingface_hub
client (Xet on, as users have it). The product's bounds are set small (`DSPARK_HUB_TIMEOUT=1`, no retry unless a
test is about retries, 4 s of waiting), and generous (`TWIN`) for the passing twins, which must not depend on the
machine's load; each command runs in a thread the test gives up on after `HANG` seconds, so a hang fails the test
instead of hanging it. Ctrl-C and SIGTERM are sent to real processes, once the server holds their request.
Each class has several members and a passing twin.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager, suppress

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.hub.publish import publish

from .cli_errors import assert_one_line_error
from .test_publish import carded  # noqa: F401  (the fixture: a tiny checkpoint whose card passes the gate)

#: Seconds after which a command counts as hung (the product's own bounds are a few seconds here).
HANG = 120
BOUNDS = {"DSPARK_HUB_TIMEOUT": "1", "DSPARK_HUB_RETRIES": "0", "DSPARK_HUB_MAX_WAIT": "4"}
#: The bounds of a passing twin: whatever the load, a local answer comes within them.
TWIN = {"DSPARK_HUB_TIMEOUT": "60", "DSPARK_HUB_RETRIES": "1", "DSPARK_HUB_MAX_WAIT": "4"}
ONE_RETRY = {"DSPARK_HUB_RETRIES": "1"}


def run(*args, env=None):
    """`dspark-hub ARGS` in this process, in a thread; a command still running after `HANG` seconds fails."""
    box = {}

    def work():
        box["result"] = CliRunner(env={**BOUNDS, **(env or {})}).invoke(cli, list(map(str, args)))

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), f"dspark-hub {' '.join(map(str, args))} hung"
    return box["result"]


@pytest.fixture(scope="module")
def repo(hub_server, tmp_path_factory):
    """A public repository holding a tiny checkpoint, and the folder it came from."""
    from .factories import write_checkpoint

    folder = write_checkpoint(tmp_path_factory.mktemp("net") / "ckpt")
    repo_id = f"{hub_server.user}/network-{id(folder) % 100000}"
    assert publish(folder, repo_id, endpoint=hub_server.url, token=hub_server.token).ok
    return repo_id, folder


def verify_hf(hub, repo, *extra, env=None):
    return run("verify", f"hf://{repo[0]}", "--endpoint", hub.url, *extra, env={"HF_TOKEN": hub.token, **(env or {})})


def info_route(repo):
    return rf"GET /api/models/{repo[0]}(\?|$)"


def tree_route(repo):
    return rf"GET /api/models/{repo[0]}/tree/"


def resolve_route(repo, name="model.safetensors"):
    return rf"GET /{repo[0]}/resolve/[0-9a-f]+/{name}"


@contextmanager
def unaccepting_endpoint():
    """An endpoint that never accepts a connection: a listening socket whose one-deep queue is full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(2):
        filler = socket.socket()
        filler.settimeout(0.3)
        with suppress(OSError):   # the second one times out: the queue is full
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in (*fillers, server):
            s.close()


# ---------------------------------------------------------------- item 7: a Hub that never answers

SILENT_ROUTES = {"model info": info_route, "tree listing": tree_route, "a range read": resolve_route}


def test_an_answer_that_stops_midway_is_given_up(hub, repo):
    """The headers and the first byte of a range read come, then nothing: the silence bound, not a hang."""
    hub.misbehave("trickle", resolve_route(repo), chunk=1, interval=600)
    assert_one_line_error(verify_hf(hub, repo), "the answer stopped: nothing more came within 1 s", "/resolve/")


@pytest.mark.parametrize("route", list(SILENT_ROUTES))
def test_a_silent_hub_stops_verify_at_the_timeout_naming_it(hub, repo, route):
    hub.misbehave("silent", SILENT_ROUTES[route](repo))
    assert_one_line_error(verify_hf(hub, repo), "timed out: no answer came within 1 s (DSPARK_HUB_TIMEOUT=1)", hub.url)


def test_a_hub_that_never_accepts_is_a_connect_timeout():
    with unaccepting_endpoint() as endpoint:
        result = run("verify", "hf://org/name", "--endpoint", endpoint)
    assert_one_line_error(result, "could not connect within 1 s (DSPARK_HUB_TIMEOUT=1)", endpoint)


DRIPS = {"its body": (tree_route, "trickle", dict(chunk=4, interval=0.3)),
         "its headers": (tree_route, "drip_headers", dict(interval=0.2)),
         "100 Continue without end": (tree_route, "interim", dict(interval=0.2)),
         "a range read": (lambda repo: resolve_route(repo, "config.json"), "trickle", dict(chunk=4, interval=0.3))}


@pytest.mark.parametrize("member", list(DRIPS))
def test_a_hub_that_drips_its_answer_is_given_up(hub, repo, member):
    """Each byte comes well within the silence bound, the answer never within the bound on the whole."""
    route, kind, params = DRIPS[member]
    hub.misbehave(kind, route(repo), **params)
    line = assert_one_line_error(verify_hf(hub, repo), "timed out", "DSPARK_HUB_TIMEOUT=1", hub.url)
    assert ("/resolve/" if member == "a range read" else "/tree/") in line


def test_a_slow_hub_within_the_bounds_is_waited_for(hub, repo):
    """The passing twin: answers 0.3 s late and trickled at 10 kB a chunk, within the twin's bounds."""
    hub.misbehave("delay", info_route(repo), seconds=0.3)
    hub.misbehave("trickle", tree_route(repo), chunk=10000, interval=0.01)
    result = verify_hf(hub, repo, env=TWIN)
    assert result.exit_code == 0, result.output


RETRIES = {
    "503 every time": dict(kind="answer", status=503, body={"error": "busy"}),
    "the connection closed unanswered": dict(kind="close"),
}


@pytest.mark.parametrize("member", list(RETRIES))
def test_retries_stop_at_the_bound_and_say_so(hub, repo, member):
    params = dict(RETRIES[member])
    fault = hub.misbehave(params.pop("kind"), tree_route(repo), **params)
    result = verify_hf(hub, repo, env=ONE_RETRY)
    assert_one_line_error(result, "gave up after 1 retries (DSPARK_HUB_RETRIES=1)", "/tree/")
    assert fault.hits == 2   # the request and its one retry


def test_a_failure_that_goes_away_is_retried(hub, repo):
    """The passing twin: one 503, then the listing."""
    hub.misbehave("answer", tree_route(repo), times=1, status=503, body={"error": "busy"})
    assert verify_hf(hub, repo, env=TWIN).exit_code == 0


WAITS = {
    "Retry-After a day": {"Retry-After": "86400"},
    "Retry-After beyond the bound": {"Retry-After": "10"},
    "a rate limit reset in a day": {"RateLimit": '"api";r=0;t=86400', "RateLimit-Policy": '"fixed";"api";q=500;w=300'},
}


@pytest.mark.parametrize("member", list(WAITS))
def test_a_hub_asking_to_wait_too_long_is_not_waited_for(hub, repo, member):
    hub.misbehave("answer", tree_route(repo), status=429, headers=WAITS[member], body={"error": "slow down"})
    line = assert_one_line_error(verify_hf(hub, repo, env=ONE_RETRY), "DSPARK_HUB_MAX_WAIT=4", "/tree/")
    assert "asked to wait" in line


def test_a_short_retry_after_is_waited_for(hub, repo):
    """The passing twin: `Retry-After: 1` once, within the 4 s bound."""
    hub.misbehave("answer", tree_route(repo), times=1, status=429, headers={"Retry-After": "1"}, body={})
    assert verify_hf(hub, repo, env=TWIN).exit_code == 0


def test_against_hub_and_target_are_bounded_too(hub, repo):
    hub.misbehave("silent", tree_route(repo))
    against = run("verify", repo[1], "--against-hub", repo[0], "--endpoint", hub.url, env={"HF_TOKEN": hub.token})
    assert_one_line_error(against, "DSPARK_HUB_TIMEOUT", "/tree/")
    hub.reset_faults()
    hub.misbehave("answer", info_route(repo), status=429, headers={"Retry-After": "86400"}, body={})
    target = run("verify", repo[1], "--target", f"hf://{repo[0]}", "--endpoint", hub.url,
                 env={"HF_TOKEN": hub.token, **ONE_RETRY})
    assert_one_line_error(target, "DSPARK_HUB_MAX_WAIT", "--target")


PUBLISH_STALLS = {
    "the repository creation": r"POST /api/repos/create",
    "the Xet token": r"GET /api/models/[^/]+/[^/]+/xet-write-token/",
    "the LFS batch": r"POST /[^/]+/[^/]+\.git/info/lfs/objects/batch",
    "the LFS upload": r"PUT /lfs-upload/",
    "the commit": r"POST /api/models/[^/]+/[^/]+/commit/",
}


@pytest.mark.parametrize("stage", list(PUBLISH_STALLS))
def test_publish_stops_at_the_timeout_wherever_the_hub_goes_silent(hub, hub_repo_id, carded, stage):  # noqa: F811
    hub.misbehave("silent", PUBLISH_STALLS[stage])
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub.token})
    assert_one_line_error(result, "DSPARK_HUB_TIMEOUT", hub.url)


def test_publish_does_not_wait_a_day(hub, hub_repo_id, carded):  # noqa: F811
    hub.misbehave("answer", r"POST /[^/]+/[^/]+\.git/info/lfs/objects/batch", status=503,
                  headers={"Retry-After": "86400"}, body={})
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub.token, **ONE_RETRY})
    assert_one_line_error(result, "asked to wait 86400 s (Retry-After)", "DSPARK_HUB_MAX_WAIT", "lfs/objects/batch")


def test_publish_does_not_ask_a_busy_hub_again_without_end(hub, hub_repo_id, carded):  # noqa: F811
    """huggingface_hub's `create_repo` asks again at once, forever, while the Hub answers this 409."""
    fault = hub.misbehave("answer", r"POST /api/repos/create", status=409,
                          body={"error": "Cannot create repo: another conflicting operation is in progress"})
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub.token, **ONE_RETRY})
    assert_one_line_error(result, "answered HTTP 409 2 times", "DSPARK_HUB_RETRIES=1", "/api/repos/create")
    assert fault.hits == 2


def test_publish_never_accepted_is_a_connect_timeout(carded):  # noqa: F811
    with unaccepting_endpoint() as endpoint:
        result = run("publish", carded, "org/name", "--endpoint", endpoint, env={"HF_TOKEN": "hf_x_0123"})
    assert_one_line_error(result, "could not connect within 1 s", endpoint)


XET_STALLS = {"a silent CAS server": dict(kind="silent"),
              "a CAS server asking to wait a day": dict(kind="answer", status=429, headers={"Retry-After": "86400"})}


@pytest.mark.slow
@pytest.mark.parametrize("member", list(XET_STALLS))
def test_the_xet_storage_is_bounded_too(hub, hub_repo_id, carded, member):  # noqa: F811
    """hf_xet reads its settings when its session starts, once a process: a fresh process each."""
    cas = hub.mirror()
    hub.xet_cas_url = cas.url
    params = dict(XET_STALLS[member])
    cas.misbehave(params.pop("kind"), ".", **params)
    out = subprocess.run([sys.executable, "-m", "dspark_hub", "publish", str(carded), hub_repo_id, "--endpoint",
                          hub.url, "-q"], env={**os.environ, "HF_TOKEN": hub.token, **BOUNDS}, capture_output=True,
                         text=True, timeout=HANG)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "the Xet storage upload failed" in out.stderr
    assert cas.url in out.stderr


BAD_BOUNDS = [("DSPARK_HUB_TIMEOUT", "soon"), ("DSPARK_HUB_TIMEOUT", "-1"), ("DSPARK_HUB_TIMEOUT", "nan"),
              ("DSPARK_HUB_TIMEOUT", "inf"), ("DSPARK_HUB_TIMEOUT", "0"), ("DSPARK_HUB_RETRIES", "1.5"),
              ("DSPARK_HUB_RETRIES", "-1"), ("DSPARK_HUB_MAX_WAIT", "a day")]


@pytest.mark.parametrize("name, value", BAD_BOUNDS)
def test_a_bound_that_is_not_a_number_is_refused_by_name(hub, repo, name, value):
    assert_one_line_error(verify_hf(hub, repo, env={name: value}), name, repr(value))


def test_bounds_in_range_are_taken():
    """The passing twin of the settings."""
    from dspark_hub.format.hub_bounds import NetworkBounds

    env = {"DSPARK_HUB_TIMEOUT": "2.5", "DSPARK_HUB_RETRIES": "0", "DSPARK_HUB_MAX_WAIT": "0"}
    assert NetworkBounds.from_environment(env) == NetworkBounds(timeout=2.5, retries=0, max_wait=0.0)
    assert NetworkBounds.from_environment({}) == NetworkBounds()


# ---------------------------------------------------------------- item 8: a Hub that answers wrongly

def _entries(edit):
    def apply(doc):
        return [edit(dict(entry)) if entry.get("path") == "config.json" else entry for entry in doc]
    return apply


def _weights(edit):
    def apply(doc):
        return [edit(dict(entry)) if entry.get("path") == contract.WEIGHTS_NAME else entry for entry in doc]
    return apply


def _resized(change):
    def edit(entry):
        entry["size"] += change
        entry["lfs"] = {**entry["lfs"], "size": entry["size"]}
        return entry
    return edit


def _without(key):
    def edit(entry):
        entry.pop(key)
        return entry
    return edit


#: member -> (route of `repo`, fault kind, fault params, words of the error line)
WRONG = {
    "HTML for the model info": (info_route, "answer", dict(body=b"<!doctype html><p>sign in", content_type="text/html"),
                                "HTML where the Hub sends JSON"),
    "an array for the model info": (info_route, "answer", dict(body=[1, 2]), "an array where the Hub sends an object"),
    "null for the model info": (info_route, "answer", dict(body=None), "null where the Hub sends an object"),
    "a model info without a sha": (info_route, "edit", dict(edit=lambda d: {k: v for k, v in d.items() if k != "sha"}),
                                   "not a 40-hex commit"),
    "a body that is not JSON": (info_route, "answer", dict(body=b"{'id': oops"), "not strict JSON"),
    "a repeated key": (info_route, "answer", dict(body=b'{"id": "a/b", "sha": "%s", "sha": "%s"}' % (
        b"0" * 40, b"1" * 40)), "appears twice"),
    "HTML for the listing": (tree_route, "answer", dict(body=b"<html>portal</html>", content_type="text/html"),
                             "HTML where the Hub sends JSON"),
    "an object for the listing": (tree_route, "answer", dict(body={"files": []}),
                                  "an object where the Hub sends an array"),
    "an entry without a path": (tree_route, "edit", dict(edit=_entries(_without("path"))), "has no path"),
    "a null size": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "size": None})), "size null"),
    "a negative size": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "size": -5})), "size -5"),
    "a size as text": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "size": "1189"})), "is not a byte count"),
    "an empty lfs object": (tree_route, "edit", dict(edit=_weights(lambda e: {**e, "lfs": {}})), "has no SHA-256 oid"),
    "an lfs size that is not the size": (tree_route, "edit", dict(edit=_weights(
        lambda e: {**e, "lfs": {**e["lfs"], "size": 1}})), "is not its size"),
    "a path out of the repository": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "path": "../config.json"})),
                                     "not a relative path"),
    "an absolute path": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "path": "/etc/passwd"})),
                         "not a relative path"),
    "an entry listed twice": (tree_route, "edit", dict(edit=lambda d: d + d[-1:]), "listed twice"),
    "an entry of no known type": (tree_route, "edit", dict(edit=_entries(lambda e: {**e, "type": "symlink"})),
                                  "neither 'file' nor 'directory'"),
    "an answer without end": (tree_route, "endless", {}, "more than 67,108,864 bytes"),
    "a compressed answer": (tree_route, "answer", dict(body=gzip.compress(b"[]"), headers={"Content-Encoding": "gzip"}),
                            "compressed"),
    "a redirect loop on the listing": (tree_route, "redirect", {}, "redirect loop"),
    "a pagination loop": (tree_route, "edit", dict(headers={"Link": '<{base}{path}>; rel="next"'}),
                          "a pagination loop"),
    "a redirect loop on the model info": (info_route, "redirect", {}, "redirect loop"),
    "a redirect to ftp": (info_route, "redirect", dict(location="ftp://127.0.0.1/x"), "not an http(s) URL"),
    "a redirect without a Location": (info_route, "answer", dict(status=302, body=b""),
                                      "huggingface_hub could not use the answer"),
}


@pytest.mark.parametrize("member", list(WRONG))
def test_a_wrong_answer_is_one_line_naming_the_endpoint_and_the_route(hub, repo, member):
    route, kind, params, words = WRONG[member]
    hub.misbehave(kind, route(repo), **params)
    line = assert_one_line_error(verify_hf(hub, repo), words, hub.url)
    assert f"GET /api/models/{repo[0]}" in line


def test_a_well_formed_hub_passes_the_same_checks(hub, repo):
    """The passing twin: the same routes, answered as the Hub answers them (an `edit` that changes nothing)."""
    hub.misbehave("edit", info_route(repo), edit=lambda d: d)
    hub.misbehave("edit", tree_route(repo), edit=lambda d: d)
    result = verify_hf(hub, repo, "--json", env=TWIN)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"]


SIZES = {
    "a config.json the listing calls 10^12 bytes": (_entries(lambda e: {**e, "size": 10**12}), "config.json",
                                                    "the listing says config.json has 1,000,000,000,000 bytes"),
    "weights the listing calls larger": (_weights(_resized(1000)), "model.safetensors",
                                         "the listing says model.safetensors has"),
    "weights the listing calls smaller": (_weights(_resized(-1000)), "model.safetensors",
                                          "the listing says model.safetensors has"),
}


@pytest.mark.parametrize("member", list(SIZES))
def test_a_listed_size_that_is_not_the_served_size_is_a_wrong_answer(hub, repo, member):
    edit, name, words = SIZES[member]
    hub.misbehave("edit", tree_route(repo), edit=edit)
    served = hub.bytes_served(repo[0], "config.json")
    assert_one_line_error(verify_hf(hub, repo), words, "/resolve/", name, hub.url)
    assert hub.bytes_served(repo[0], "config.json") - served <= (repo[1] / "config.json").stat().st_size


def test_a_range_answer_cut_short_is_a_wrong_answer(hub, repo):
    size = (repo[1] / "config.json").stat().st_size
    hub.misbehave("answer", resolve_route(repo, "config.json"), status=206, body=b"{}",
                  headers={"Content-Range": f"bytes 0-{size - 1}/{size}"}, content_type="application/octet-stream")
    assert_one_line_error(verify_hf(hub, repo), "config.json", "the listing says config.json has")


def test_a_range_answer_for_other_bytes_is_a_wrong_answer(hub, repo):
    hub.misbehave("answer", resolve_route(repo), status=206, body=b"\0" * 8,
                  headers={"Content-Range": "bytes 100-107/276658"}, content_type="application/octet-stream")
    assert_one_line_error(verify_hf(hub, repo), "Content-Range", "not the range from byte 0")


def test_html_for_a_file_is_a_wrong_answer(hub, repo):
    hub.misbehave("answer", resolve_route(repo, "config.json"), body=b"<html>sign in</html>" * 3,
                  content_type="text/html")
    assert_one_line_error(verify_hf(hub, repo), "config.json", "the listing says config.json has")


def test_a_config_larger_than_any_is_read_only_that_far(hub, hub_repo_id, tmp_path):
    """A Hub that serves a 5 MiB config.json, as listed: at most 4 MiB + 1 byte is read; a finding, not a crash."""
    from .factories import write_checkpoint

    folder = write_checkpoint(tmp_path / "big")
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[:-2] + " " * (5 * 1024 * 1024) + text[-2:])
    assert publish(folder, hub_repo_id, endpoint=hub.url, token=hub.token).ok
    result = run("verify", f"hf://{hub_repo_id}", "--endpoint", hub.url, "--json", env={"HF_TOKEN": hub.token, **TWIN})
    assert result.exit_code == 1, result.output
    assert ("FILE_TOO_LARGE", "config.json") in {(f["code"], f["where"]) for f in json.loads(result.stdout)["findings"]}
    assert hub.bytes_served(hub_repo_id, "config.json") <= contract.MAX_CONFIG_BYTES + 1
    local = run("verify", folder, "--json")
    assert local.exit_code == 1 and "FILE_TOO_LARGE" in local.stdout
    # the twin: a config just under the limit is read whole
    (folder / "config.json").write_text(text[:-2] + " " * (contract.MAX_CONFIG_BYTES - len(text) - 1) + text[-2:])
    assert (folder / "config.json").stat().st_size <= contract.MAX_CONFIG_BYTES
    assert run("verify", folder, "--json").exit_code == 0


PUBLISH_WRONG = {
    "HTML for the repository creation": (r"POST /api/repos/create", "answer",
                                         dict(body=b"<html>", content_type="text/html"), "HTML"),
    "a creation answer without url": (r"POST /api/repos/create", "answer", dict(body={}), "no repository url"),
    "an array for the preupload": (r"/preupload/", "answer", dict(body=[]), "an array where the Hub sends an object"),
    "a preupload without uploadMode": (r"/preupload/", "edit", dict(
        edit=lambda d: {"files": [{"path": f["path"]} for f in d["files"]]}), "uploadMode"),
    "an LFS batch without objects": (r"info/lfs/objects/batch", "answer", dict(body={"transfer": "basic"}),
                                     "without an objects list"),
    "an LFS href that is not http": (r"info/lfs/objects/batch", "edit", dict(edit=lambda d: {**d, "objects": [
        {**o, "actions": {"upload": {"href": "file:///etc/passwd"}}} for o in d["objects"]]}), "not http(s) hrefs"),
    "a commit answer without a commit": (r"/commit/", "answer", dict(body={"success": True}), "commitOid"),
}


@pytest.mark.parametrize("member", list(PUBLISH_WRONG))
def test_publish_names_a_wrong_answer(hub, hub_repo_id, carded, member):  # noqa: F811
    route, kind, params, words = PUBLISH_WRONG[member]
    hub.misbehave(kind, route, **params)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "lfs",
                 env={"HF_TOKEN": hub.token})
    assert_one_line_error(result, words, hub.url)


def test_publish_passes_the_same_checks_on_a_well_formed_hub(hub, hub_repo_id, carded):  # noqa: F811
    for route in (r"POST /api/repos/create", r"/preupload/", r"info/lfs/objects/batch", r"/commit/"):
        hub.misbehave("edit", route, edit=lambda d: d)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "lfs", "--json",
                 env={"HF_TOKEN": hub.token, **TWIN})
    assert result.exit_code == 0, result.output
    assert all(f.hits for f in hub.faults)


# ---------------------------------------------------------------- item 7: Ctrl-C still works at once

SIGNALS = {"Ctrl-C": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143)}


def _held(hub, fault, args):
    """A real `dspark-hub ARGS` process, once the silent server holds its request; its bounds would wait 10 min."""
    env = {**os.environ, "HF_TOKEN": hub.token, "DSPARK_HUB_TIMEOUT": "600", "DSPARK_HUB_RETRIES": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "dspark_hub", *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not fault.arrived.wait(HANG):
        proc.kill()
        pytest.fail(f"the request never reached the server: {proc.communicate()}")
    return proc


@pytest.mark.parametrize("sig", list(SIGNALS))
def test_a_signal_ends_verify_held_by_a_silent_hub(hub, repo, sig):
    signum, code = SIGNALS[sig]
    proc = _held(hub, hub.misbehave("silent", tree_route(repo)), ["verify", f"hf://{repo[0]}", "--endpoint", hub.url])
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == code, err
    assert "Traceback" not in err and (sig != "Ctrl-C" or err.strip().splitlines()[-1] == "interrupted")


@pytest.mark.slow
@pytest.mark.parametrize("transfer", ["lfs", "xet"])
def test_ctrl_c_ends_a_publish_whose_upload_waits_on_a_silent_hub(hub, hub_repo_id, tmp_path, transfer):
    """Three weight files: through LFS they upload in huggingface_hub's threads (the interpreter would wait for
    them at exit); through Xet, in hf_xet's Rust runtime, to a CAS server that never answers."""
    import yaml

    from dspark_hub.cards.render import render_card

    from .factories import write_checkpoint
    from .test_publish import FRONT

    folder = write_checkpoint(tmp_path / "sharded", shards=3)
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    (folder / "README.md").write_text(render_card(meta, folder))
    if transfer == "xet":
        cas = hub.mirror()
        hub.xet_cas_url = cas.url
        fault = cas.misbehave("silent", ".")
    else:
        fault = hub.misbehave("silent", r"PUT /lfs-upload/")
    proc = _held(hub, fault, ["publish", folder, hub_repo_id, "--endpoint", hub.url, "--transfer", transfer])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
