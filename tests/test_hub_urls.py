"""Issue 29 items 3 and 4: credentials in an endpoint URL are never printed or written, and the token goes to the
endpoint's own origin only, however the next URL is learned.

The local Hub server plays an artifact proxy that takes `Authorization: Basic` credentials from
`HF_ENDPOINT=http://user:password@host`, and a second origin (`HubServer.mirror`, on 127.0.0.2 or another port)
that records the `Authorization` header of every request it gets. Each class has several members and a twin.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format.urls import public_url
from dspark_hub.redaction import redact_credentials

from .cli_errors import assert_one_line_error
from .test_publish import carded  # noqa: F401  (the fixture: a tiny checkpoint whose card passes the gate)

USER, PASSWORD = "proxy-user", "pr0xy-Passw0rd-42"
TWIN = {"DSPARK_HUB_TIMEOUT": "60"}


def run(*args, env=None):
    return CliRunner(env={**TWIN, **(env or {})}).invoke(cli, list(map(str, args)))


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def assert_no_credentials(text: str) -> None:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for secret in (PASSWORD, f"{USER}:", basic):
        assert secret not in text, text


# ---------------------------------------------------------------- item 3: credentials in a URL

REDACTED = {
    "user and password": ("see http://u:pw12@h.example/x", "see http://<credentials>@h.example/x"),
    "a token as the user": ("https://hf_abcdef@h.example:8443/api", "https://<credentials>@h.example:8443/api"),
    "an @ inside the password": ("http://u:p@ss@h.example/", "http://<credentials>@h.example/"),
    "percent-encoded": ("http://u%40x:p%3Aw@h.example", "http://<credentials>@h.example"),
    "an upper-case scheme": ("HTTP://u:pw12@h.example", "HTTP://<credentials>@h.example"),
    "inside JSON": ('{"endpoint": "http://u:pw12@h.example"}', '{"endpoint": "http://<credentials>@h.example"}'),
    "two in a line": ("a http://u:1@a.example b https://v:2@b.example",
                      "a http://<credentials>@a.example b https://<credentials>@b.example"),
}
KEPT = ["mail user@example.com", "http://h.example/path@v1", "git@github.com:org/x.git", "http://h.example?a=b@c",
        "hf://org/name@main"]


@pytest.mark.parametrize("member", list(REDACTED))
def test_credentials_in_any_url_of_a_text_are_redacted(member):
    text, shown = REDACTED[member]
    assert redact_credentials(text) == shown


@pytest.mark.parametrize("text", KEPT)
def test_an_at_sign_that_is_not_userinfo_is_kept(text):
    assert redact_credentials(text) == text


def test_a_shared_url_drops_its_credentials():
    assert public_url("https://u:pw@h.example:8443/hf") == "https://h.example:8443/hf"
    assert public_url("https://h.example/hf") == "https://h.example/hf"


@pytest.fixture
def proxy(hub):
    """The local Hub as an artifact proxy: the credentials of the endpoint URL stand for the token."""
    hub.basic_credentials = (USER, PASSWORD)
    return hub


def _fresh(args, endpoint, tmp_path, mode, token=None):
    """A fresh process, as a user runs it: HF_ENDPOINT (read by huggingface_hub at import) holds the credentials
    (publish asks for a token too, though httpx then sends the credentials in its place)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_PATH")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"), COLUMNS="200", NO_COLOR="1", **TWIN)
    if token is not None:
        env["HF_TOKEN"] = token
    head, tail = (["--debug"] if mode == "debug" else []), (["--json"] if mode == "json" else [])
    return subprocess.run([sys.executable, "-m", "dspark_hub", *head, *map(str, args), *tail], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("mode", ["human", "json", "debug"])
def test_an_error_about_an_endpoint_with_credentials_never_shows_them(proxy, tmp_path, mode):
    proxy.misbehave("answer", r"GET /api/models/org/missing", status=404,
                    body={"error": f"no such repo at {with_credentials(proxy.url)}/org/missing"},
                    headers={"X-Error-Code": "RepoNotFound"})
    out = _fresh(["verify", "hf://org/missing"], with_credentials(proxy.url), tmp_path, mode)
    assert out.returncode == (1 if mode == "debug" else 2), out.stderr
    assert_no_credentials(out.stdout + out.stderr)
    assert "repository not found" in out.stderr


@pytest.mark.parametrize("mode", ["human", "json"])
def test_the_publish_plan_and_result_never_show_them(proxy, hub_repo_id, carded, tmp_path, mode):  # noqa: F811
    endpoint = with_credentials(proxy.url)
    plan = _fresh(["publish", carded, hub_repo_id, "--dry-run"], endpoint, tmp_path, mode)
    assert plan.returncode == 0, plan.stderr
    assert_no_credentials(plan.stdout + plan.stderr)
    assert "http://<credentials>@127.0.0.1" in plan.stdout
    done = _fresh(["publish", carded, hub_repo_id, "-q"], endpoint, tmp_path, mode, token=proxy.token)
    assert done.returncode == 0, done.stderr
    assert_no_credentials(done.stdout + done.stderr)
    assert proxy.head_files(hub_repo_id)["config.json"].content == (carded / "config.json").read_bytes()


def test_package_writes_no_credentials_into_what_it_shares(carded, tmp_path):  # noqa: F811
    endpoint = "https://proxy-user:pr0xy-Passw0rd-42@hub.example.com:8443"
    result = run("package", carded, "--repo", "org/tiny", "-o", tmp_path / "pkg", "--endpoint", endpoint, "--json")
    assert result.exit_code == 0, result.output
    assert_no_credentials(result.output)
    for written in (tmp_path / "pkg").iterdir():
        assert_no_credentials(written.read_bytes().decode("latin-1"))
    doc = json.loads(result.stdout)
    assert doc["webseeds"] == ["https://hub.example.com:8443/org/tiny/resolve/"]   # the host stays, usable
    assert "ws=https%3A%2F%2Fhub.example.com%3A8443" in doc["magnet"]


def test_a_server_warning_and_an_echoed_header_are_redacted(proxy, hub_repo_id, carded, tmp_path):  # noqa: F811
    """huggingface_hub logs a server's `X-HF-Warning`; a proxy quotes the `Authorization: Basic` it got."""
    endpoint = with_credentials(proxy.url)
    warning = f"; mirror of {endpoint} in use"
    proxy.misbehave("edit", r"GET /api/models/", headers={"X-HF-Warning": warning})
    proxy.misbehave("answer", r"POST /api/repos/create", status=400,
                    body={"error": f"refused; you sent Authorization: Basic "
                                   f"{base64.b64encode(f'{USER}:{PASSWORD}'.encode()).decode()}"})
    verified = _fresh(["verify", "hf://org/missing"], endpoint, tmp_path, "human")
    assert_no_credentials(verified.stdout + verified.stderr)
    assert "mirror of http://<credentials>@127.0.0.1" in verified.stderr        # the warning came, redacted
    published = _fresh(["publish", carded, hub_repo_id, "-q"], endpoint, tmp_path, "human", token=proxy.token)
    assert published.returncode == 2
    assert_no_credentials(published.stdout + published.stderr)
    assert "you sent Authorization: Basic <token>" in published.stderr


def test_a_python_warning_quoting_the_server_passes_the_gate(proxy, hub_repo_id, carded, tmp_path):  # noqa: F811
    """huggingface_hub turns the warnings of the Hub's metadata check into Python warnings, quoting the server:
    they are printed redacted, their control characters written out."""
    endpoint = with_credentials(proxy.url)
    proxy.misbehave("answer", r"POST /api/validate-yaml", body={"errors": [], "warnings": [
        {"message": f"metadata mirrored at {endpoint}/x \x1b]0;retitled\x07"}]})
    out = _fresh(["publish", carded, hub_repo_id, "-q"], endpoint, tmp_path, "human", token=proxy.token)
    assert out.returncode == 0, out.stderr
    assert_no_credentials(out.stderr)
    assert "\x1b" not in out.stderr and "\\x1b]0;retitled\\x07" in out.stderr
    assert "metadata mirrored at http://<credentials>@127.0.0.1" in out.stderr


def test_an_endpoint_option_with_credentials_is_redacted_in_process(proxy, hub_repo_id, carded):  # noqa: F811
    endpoint = with_credentials(proxy.url)
    result = run("publish", carded, hub_repo_id, "--endpoint", endpoint, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert_no_credentials(result.output)
    assert json.loads(result.stdout)["publish"]["plan"]["endpoint"] == "http://<credentials>@" + proxy.url[7:]
    bad = run("verify", "hf://org/name", "--endpoint", endpoint.replace("http://", "ftp://"))
    assert_one_line_error(bad, "--endpoint", "ftp://<credentials>@127.0.0.1", "not an http(s)://host URL")
    assert_no_credentials(bad.output)


def test_a_card_never_carries_credentials_in_a_url(tmp_path):
    """A card source (or its results) quoting a URL with credentials: the card written shows `<credentials>`;
    a URL without them is kept whole."""
    import yaml

    from .factories import write_checkpoint
    from .test_publish import FRONT

    folder = write_checkpoint(tmp_path / "ckpt")
    meta = tmp_path / "card.yaml"
    summary = (f"Mirrored at https://{USER}:{PASSWORD}@mirror.example/org/tiny and at "
               "https://huggingface.co/org/tiny.")
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2},
                                    "summary": summary}))
    result = run("card", folder, "--meta", meta, "-o", tmp_path / "README.md")
    assert result.exit_code == 0, result.output
    card = (tmp_path / "README.md").read_text()
    assert_no_credentials(card)
    assert "https://<credentials>@mirror.example/org/tiny" in card and "https://huggingface.co/org/tiny" in card


def test_an_endpoint_without_credentials_is_shown_as_it_is(hub, hub_repo_id, carded):  # noqa: F811
    """The twin: nothing to redact, the endpoint is printed whole."""
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--dry-run", "--json")
    assert json.loads(result.stdout)["publish"]["plan"]["endpoint"] == hub.url


def test_library_views_of_the_endpoint_are_redacted(proxy):
    from dspark_hub.errors import HubError
    from dspark_hub.format.remote import HubSource

    source = HubSource("org/missing", endpoint=with_credentials(proxy.url), token=proxy.token)
    assert_no_credentials(repr(source))
    with pytest.raises(HubError) as caught:
        source.list_files()
    assert_no_credentials(str(caught.value))


# ---------------------------------------------------------------- item 4: where the token goes

@pytest.fixture
def public_repo(hub, hub_repo_id, tmp_path):
    from dspark_hub.hub.publish import publish

    from .factories import write_checkpoint

    folder = write_checkpoint(tmp_path / "ckpt")
    assert publish(folder, hub_repo_id, endpoint=hub.url, token=hub.token).ok
    return hub_repo_id


def _tokens_at(server, token):
    return [(method, path) for method, path, auth in server.seen if token in auth]


OTHER_ORIGINS = {"another host": "127.0.0.2", "another port": "127.0.0.1"}


@pytest.mark.parametrize("origin", list(OTHER_ORIGINS))
def test_a_next_page_on_another_origin_gets_no_token(hub, public_repo, origin):
    other = hub.mirror(OTHER_ORIGINS[origin])
    hub.misbehave("edit", rf"GET /api/models/{public_repo}/tree/", times=1, headers={
        "Link": f'<{other.url}/api/models/{public_repo}/tree/main?recursive=true&cursor=9999>; rel="next"'})
    result = run("verify", f"hf://{public_repo}", "--endpoint", hub.url, env={"HF_TOKEN": hub.token})
    assert result.exit_code == 0, result.output
    assert any("cursor=9999" in path for _, path, _ in other.seen)     # the page was fetched ...
    assert _tokens_at(other, hub.token) == []                           # ... without the token


def test_a_next_page_on_the_endpoint_gets_the_token(hub, public_repo):
    """The twin: the endpoint's own pages are read with the token (a private repository needs it)."""
    hub.misbehave("edit", rf"GET /api/models/{public_repo}/tree/", times=1, headers={
        "Link": f'<{hub.url}/api/models/{public_repo}/tree/main?recursive=true&cursor=9999>; rel="next"'})
    assert run("verify", f"hf://{public_repo}", "--endpoint", hub.url, env={"HF_TOKEN": hub.token}).exit_code == 0
    assert [p for _, p in _tokens_at(hub, hub.token) if "cursor=9999" in p]


REDIRECTED = {
    "the model info": lambda repo: rf"GET /api/models/{repo}(\?|$)",
    "the listing": lambda repo: rf"GET /api/models/{repo}/tree/",
    "a range read": lambda repo: rf"GET /{repo}/resolve/",
}


@pytest.mark.parametrize("member", list(REDIRECTED))
def test_a_redirect_to_another_origin_gets_no_token(hub, public_repo, member):
    other = hub.mirror()
    hub.misbehave("redirect", REDIRECTED[member](public_repo), location=other.url + "{path}")
    result = run("verify", f"hf://{public_repo}", "--endpoint", hub.url, env={"HF_TOKEN": hub.token})
    assert result.exit_code == 0, result.output
    assert other.seen and _tokens_at(other, hub.token) == []


def test_a_redirect_on_the_endpoint_keeps_the_token(hub, public_repo):
    hub.misbehave("redirect", rf"GET /api/models/{public_repo}(\?|$)", times=1)
    assert run("verify", f"hf://{public_repo}", "--endpoint", hub.url, env={"HF_TOKEN": hub.token}).exit_code == 0
    assert len([p for _, p in _tokens_at(hub, hub.token) if p.startswith(f"/api/models/{public_repo}")]) >= 2


def _hrefs_to(base):
    def edit(doc):
        for obj in doc["objects"]:
            for action in (obj.get("actions") or {}).values():
                action["href"] = base + action["href"].split("/", 3)[3].join(["/", ""])
        return doc
    return edit


def test_lfs_actions_on_another_origin_get_no_token(hub, hub_repo_id, carded):  # noqa: F811
    other = hub.mirror()
    hub.misbehave("edit", r"info/lfs/objects/batch", edit=_hrefs_to(other.url))
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "lfs",
                 env={"HF_TOKEN": hub.token})
    assert result.exit_code == 0, result.output
    assert {m for m, _, _ in other.seen} == {"PUT", "POST"}      # the upload and its verification went there
    assert _tokens_at(other, hub.token) == []


def test_lfs_actions_on_the_endpoint_get_the_token(hub, hub_repo_id, carded):  # noqa: F811
    """The twin: the endpoint's own verify action is sent with the token, as the Hub requires."""
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "lfs",
                 env={"HF_TOKEN": hub.token})
    assert result.exit_code == 0, result.output
    assert [p for m, p in _tokens_at(hub, hub.token) if m == "POST" and p.startswith("/lfs-verify/")]


def test_xet_storage_gets_its_own_token_never_the_hubs(hub, hub_repo_id, carded):  # noqa: F811
    """A Hub with Xet storage: hf_xet sends the Hub-minted Xet token to the CAS server, never the user's token."""
    from tests.hub_server import XET_ACCESS_TOKEN

    cas = hub.mirror()
    hub.xet_cas_url = cas.url
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub.token})
    assert_one_line_error(result, "Xet storage upload failed", "404")    # the mirror speaks no CAS
    assert cas.seen and _tokens_at(cas, hub.token) == []
    assert all(auth == f"Bearer {XET_ACCESS_TOKEN}" for _, _, auth in cas.seen)
    assert ("write", hub_repo_id, "main") in hub.xet_token_requests      # the token route is the endpoint's


@pytest.mark.parametrize("where", ["another origin", "the endpoint"])
def test_a_xet_refresh_route_from_an_answer_gets_the_token_only_on_the_endpoint(hub, public_repo, where):
    """huggingface_hub refreshes a Xet token at a route a download answer names (`X-Xet-Refresh-Route`)."""
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._xet import XetFileData, refresh_xet_connection_info

    from dspark_hub.format.hub_http import network_scope

    server = hub.mirror() if where == "another origin" else hub
    server.xet_cas_url = "http://127.0.0.1:1"
    route = f"{server.url}/api/models/{public_repo}/xet-read-token/main"
    with network_scope(hub.url, secrets=lambda: [hub.token]):
        refresh_xet_connection_info(file_data=XetFileData(file_hash="0" * 64, refresh_route=route),
                                    headers=build_hf_headers(token=hub.token))
    sent = [auth for _, path, auth in server.seen if "xet-read-token" in path]
    assert sent == ([f"Bearer {hub.token}"] if where == "the endpoint" else [""])


def test_a_credential_that_is_not_the_hubs_goes_where_it_is_sent(hub, public_repo, monkeypatch):
    """The twin of the rule: in CI, huggingface_hub asks the CI provider (another origin) for an OIDC id token
    with the provider's own credential, then trades it at the endpoint for a Hub token (Trusted Publishers)."""
    import uuid

    provider = hub.mirror()
    provider.misbehave("answer", r"GET /oidc-token", body={"value": "ci-id-token"})
    hub.misbehave("answer", r"POST /oauth/token", body={"access_token": hub.token, "token_type": "bearer",
                                                          "expires_in": 3600})
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = {"HF_OIDC_RESOURCE": f"{public_repo}-{uuid.uuid4().hex[:6]}", "GITHUB_ACTIONS": "true",
           "ACTIONS_ID_TOKEN_REQUEST_URL": f"{provider.url}/oidc-token",
           "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "ci-provider-credential"}
    result = run("verify", f"hf://{public_repo}", "--endpoint", hub.url, env=env)
    assert result.exit_code == 0, result.output
    assert [auth for _, path, auth in provider.seen if path.startswith("/oidc-token")] == [
        "Bearer ci-provider-credential"]
    assert _tokens_at(hub, hub.token)                                   # the traded token went to the endpoint
