"""No secret in any output: every secret this process could send to a Hub, and the one function that removes them
from text.

A secret is a token huggingface_hub would send (`hub_tokens`) or the credentials in an endpoint URL
(`HF_ENDPOINT=https://user:password@proxy`, and every endpoint `note_endpoint` was told of). `redact_tokens`
replaces each token with `<token>` and the userinfo of every URL with `<credentials>`; the CLI runs every line it
prints through it, Hub errors are made with it, and huggingface_hub's log records pass it (`gate_hub_logs`).
An output concern with no dependency of ours (stdlib only; the bottom layer): the CLI's gate (`cli/_gate.py`), the
Hub client (`format/remote.py`, `format/hub_http.py`) and cards use it. huggingface_hub is not imported here: before
it is imported no token has been read or sent.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import sys
import threading
from urllib.parse import unquote, urlsplit

#: What a redacted token reads as.
REDACTED = "<token>"
#: Shorter strings are not treated as secrets (replacing them would garble ordinary text).
_MIN_TOKEN = 4
#: What credentials in a URL read as.
CREDENTIALS = "<credentials>"
#: `scheme://userinfo@`: the userinfo runs to the last `@` before the host ends (`/`, `?`, `#`, a space, a quote).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#\"'<>\\]*@")
_ENDPOINTS: set[str] = set()
_ENDPOINTS_LOCK = threading.Lock()


def redact_credentials(text: str) -> str:
    """`text` with the userinfo of every `scheme://user:password@host` in it replaced by `<credentials>`."""
    return _USERINFO.sub(lambda m: f"{m[1]}{CREDENTIALS}@", text)


def credential_strings(url: str) -> list[str]:
    """The secrets a URL's userinfo makes: the userinfo as written and decoded, the password, and the
    `Authorization: Basic` value httpx builds from them (a server may quote it back). Empty without userinfo."""
    netloc = urlsplit(url).netloc
    if "@" not in netloc:
        return []
    userinfo = netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    plain = f"{unquote(user)}:{unquote(password)}"
    secrets = {userinfo, unquote(userinfo), plain, base64.b64encode(plain.encode()).decode()}
    if password:
        secrets.update({password, unquote(password)})
    return sorted(secrets)


def note_endpoint(endpoint: str) -> None:
    """Remember an endpoint this process talks to: the credentials in its URL are secrets from now on."""
    with _ENDPOINTS_LOCK:
        _ENDPOINTS.add(endpoint)


def _endpoint_secrets() -> set[str]:
    with _ENDPOINTS_LOCK:
        endpoints = set(_ENDPOINTS)
    endpoints.add(os.environ.get("HF_ENDPOINT", ""))
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        endpoints.add(str(getattr(constants, "ENDPOINT", "")))
    return {secret for endpoint in endpoints for secret in credential_strings(endpoint)}


def hub_tokens(*given: object) -> list[str]:
    """Every token huggingface_hub would send from this process, by its own resolution, the `given` ones, and the
    credentials of every endpoint URL known (`note_endpoint`, HF_ENDPOINT).

    `huggingface_hub.get_token()` (HF_TOKEN, the token file at HF_TOKEN_PATH or $HF_HOME/token, OIDC,
    Colab) and `get_stored_tokens()` (every token `hf auth login` saved). Before huggingface_hub is
    imported nothing could have sent a token, so it is not imported here (header-level commands stay light).
    Longest first, so a token that contains another is replaced whole.
    """
    found = {t for t in given if isinstance(t, str)} | _endpoint_secrets()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import get_token
        from huggingface_hub.utils import get_stored_tokens

        with contextlib.suppress(Exception):   # an OIDC exchange that fails has sent nothing to leak
            found.add(get_token() or "")
        with contextlib.suppress(Exception):   # an unreadable stored_tokens file holds nothing to print
            found.update(get_stored_tokens().values())
    return sorted((t for t in found if len(t.strip()) >= _MIN_TOKEN), key=len, reverse=True)


def redact_tokens(text: str, *given: object) -> str:
    """`text` with the credentials of every URL in it shown as `<credentials>`, and every secret of
    `hub_tokens(*given)` replaced by `<token>`."""
    text = redact_credentials(text)
    for secret in hub_tokens(*given):
        text = text.replace(secret, REDACTED)
    return text


class _RedactingFilter(logging.Filter):
    """Renders a record's message and redacts it (huggingface_hub logs the URLs it retries)."""

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):   # a record that cannot be rendered is left to logging's own error
            record.msg, record.args = redact_tokens(record.getMessage()), None
        return True


_FILTER = _RedactingFilter()


def gate_hub_logs() -> None:
    """Put every handler of huggingface_hub's logger (its stderr handler) behind `redact_tokens`."""
    for handler in logging.getLogger("huggingface_hub").handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
