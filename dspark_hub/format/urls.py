"""URLs of Hub endpoints: their form, their origin, and the credentials they may hold (never shown).

Some artifact proxies are reached as `HF_ENDPOINT=https://user:password@host`. Those credentials are a
secret like a token: `redact_url` shows them as `<credentials>` (`redaction.redact_credentials` does so for every
URL in a text: an error line, a log record, a JSON document), and `public_url` drops them from a URL that is
written to be shared (a torrent's web seeds). `origin` is what the token is kept to (`format.hub_http`).

Stdlib only.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from dspark_hub.errors import UsageError
from dspark_hub.redaction import redact_credentials

_DEFAULT_PORTS = {"http": 80, "https": 443}


def redact_url(url: str) -> str:
    """`url` as it may be shown: its userinfo, if any, reads `<credentials>`."""
    return redact_credentials(url)


def public_url(url: str) -> str:
    """`url` without its userinfo (a URL written into a file meant to be shared)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def origin(url: str) -> tuple[str, str, int]:
    """`(scheme, host, port)` of a URL, the port defaulted by scheme: what a browser calls its origin."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme, 0)


def check_endpoint(endpoint: str) -> str:
    """`endpoint` if it is `http(s)://[userinfo@]host[:port][/path]`, without query, fragment or whitespace.

    Raises:
        UsageError: naming the endpoint (its credentials redacted).
    """
    parts = urlsplit(endpoint)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if (parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query or parts.fragment
            or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in endpoint)):
        raise UsageError(f"{redact_url(endpoint)!r} is not an http(s)://host URL; pass e.g. https://huggingface.co",
                         param="endpoint")
    return endpoint
