"""The rules of every Hub request while dspark-hub talks to the Hub: bounded, kept to the endpoint, checked.

huggingface_hub sends its requests (API calls, pagination, LFS actions, Xet token routes) and ours (range reads)
through one shared httpx client, `get_session()`. `install` wraps its client factory so every client it makes
carries two event hooks. While a `network_scope(endpoint)` is open (`format.remote.hub_errors` opens one around
every Hub call), the hooks:

- **bound time**: connecting, and each read or write of the socket, within `NetworkBounds.timeout` seconds
  (huggingface_hub passes `timeout=None`, no limit, on most calls); an answer's headers, and its body, each
  within that time too (a server that drips them, or sends `100 Continue` forever, is not waited for);
- **bound retries and waiting**: huggingface_hub retries timeouts, connection errors, 408, 429 and 5xx 5 times and
  sleeps what `Retry-After` or a rate-limit header asks (a day, if the server says so). A request is stopped
  after `retries` retries, and as soon as the waits would add up to more than `max_wait` seconds in the scope;
- **keep the token to the endpoint**: a request to any other origin (scheme, host, port) leaves without its
  `Authorization` header, however its URL was learned (a redirect, a `Link: rel="next"` page, an LFS action, a
  Xet refresh route);
- **bound and check answers**: an answer's body is at most `MAX_ANSWER_BYTES`, and the answers of the routes
  dspark-hub uses are checked for their shape (`format.hub_answers`) before huggingface_hub parses them.

A bound that is hit, and an answer that is wrong, raise `HubNetworkError`: not an httpx error, so no retry loop
catches it, and `hub_errors` turns it into one line naming the endpoint, the route and the bound. hf_xet (Rust)
makes its own requests: the same bounds reach it through its environment (`_xet_environment`).
The bounds come from `DSPARK_HUB_TIMEOUT`, `DSPARK_HUB_RETRIES` and `DSPARK_HUB_MAX_WAIT`, read when a scope opens.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from dspark_hub.format import hub_answers
from dspark_hub.format.hub_bounds import (
    HEADERS_DUE,
    MAX_WAIT_VAR,
    RETRIES_VAR,
    TIMEOUT_VAR,
    DeadlineBackend,
    HubNetworkError,
    NetworkBounds,
    bounded_stream,
    describe_timeout,
)
from dspark_hub.format.urls import origin, redact_url
from dspark_hub.redaction import gate_hub_logs

if TYPE_CHECKING:
    import httpx2

#: What huggingface_hub's `http_backoff` retries.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: The most `Link: rel="next"` pages followed in a scope (a tree page holds 1,000 files: a million files).
MAX_PAGES = 1000
#: The request extension that marks a range read of `HubSource` (its bytes and time are bounded there).
RANGE_READ = "dspark_hub_range_read"
#: huggingface_hub's backoff between retries without `Retry-After`: 1 s, doubling, at most 8 s.
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 8.0


# --- the scope -------------------------------------------------------------------------------------------

@dataclass
class _Attempts:
    """One request (thread, method, URL) retried in a row: how often, and its last failure."""

    count: int = 0
    failure: str = ""
    failed_at: float | None = None


@dataclass
class _Scope:
    bounds: NetworkBounds
    origins: set[tuple[str, str, int]] = field(default_factory=set)
    #: The token and endpoint credentials of the scope: an `Authorization` header holding one of them goes to
    #: `origins` only (another credential, such as a CI provider's for its own OIDC route, goes where it is sent).
    secrets: set[str] = field(default_factory=set)
    waited: float = 0.0
    attempts: dict[tuple[int, str, str], _Attempts] = field(default_factory=dict)
    #: The last answer read (method, URL): named when huggingface_hub cannot parse what came.
    last_answer: tuple[str, str] | None = None
    #: Every `rel="next"` page an answer named: huggingface_hub follows them without end.
    pages: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_LOCK = threading.RLock()
_SCOPE: _Scope | None = None
_DEPTH = 0
_INSTALLED = False


@contextmanager
def network_scope(endpoint: str, bounds: NetworkBounds | None = None,
                  secrets: Callable[[], Iterable[str]] | None = None) -> Iterator[NetworkBounds]:
    """Apply the rules to every Hub request in this process until the block ends; the token may go to `endpoint`.

    `secrets`: what the token is (`redaction.hub_tokens`), asked once the scope is open (finding it may take a
    request: an OIDC exchange in CI, an OAuth refresh, bounded then). Scopes nest: the outermost one's bounds
    and waiting budget hold for the inner ones, whose endpoints and secrets count too. Yields the bounds in force.

    Raises:
        UsageError: a bound variable that is not a number in its range.
    """
    global _SCOPE, _DEPTH
    install()
    with _LOCK:
        if _SCOPE is None:
            _SCOPE = _Scope(bounds or NetworkBounds.from_environment())
            _xet_environment(_SCOPE.bounds)
        _SCOPE.origins.add(origin(endpoint))
        _DEPTH += 1
        scope = _SCOPE
    try:
        if secrets is not None:
            found = set(secrets())
            with scope.lock:
                scope.secrets |= found
        yield scope.bounds
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                _SCOPE = None


def scope_open() -> bool:
    """Whether a network scope is open (some thread is talking to the Hub)."""
    return _SCOPE is not None


def current_bounds() -> NetworkBounds:
    """The bounds of the open scope, else those the environment sets."""
    scope = _SCOPE
    return scope.bounds if scope is not None else NetworkBounds.from_environment()


def last_answer() -> tuple[str, str] | None:
    """The (method, URL) of the last answer read in the open scope."""
    scope = _SCOPE
    return scope.last_answer if scope is not None else None


#: hf_xet's own settings for what `NetworkBounds` bounds (humantime durations); a value the user set is kept.
_XET_SET: dict[str, str] = {}


def _xet_environment(bounds: NetworkBounds) -> None:
    wanted = {"HF_XET_CLIENT_CONNECT_TIMEOUT": f"{max(1, math.ceil(bounds.timeout))}s",
              "HF_XET_CLIENT_READ_TIMEOUT": f"{max(1, math.ceil(bounds.timeout))}s",
              "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": str(bounds.retries),
              "HF_XET_CLIENT_RETRY_MAX_DURATION": f"{math.ceil(bounds.max_wait)}s"}
    for name, value in wanted.items():
        if name not in os.environ or os.environ[name] == _XET_SET.get(name):
            os.environ[name] = _XET_SET[name] = value


# --- the hooks -------------------------------------------------------------------------------------------

def install() -> None:
    """Wrap huggingface_hub's client factory (a user's own factory included) so its clients carry the hooks."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        from huggingface_hub import set_client_factory
        from huggingface_hub.utils import _http  # the factory in use, so a user's own one is kept (deferred: heavy)

        previous: Callable[[], httpx2.Client] = getattr(_http, "_GLOBAL_CLIENT_FACTORY", _http.default_client_factory)

        def factory() -> httpx2.Client:
            client = previous()
            hooks = client.event_hooks
            client.event_hooks = {"request": [*hooks.get("request", []), _on_request],
                                  "response": [*hooks.get("response", []), _on_response]}
            # httpcore's connection pool (an attribute of httpx's transport, not an API: absent, the headers of an
            # answer are bounded only by the silence between their bytes)
            pool: Any = getattr(getattr(client, "_transport", None), "_pool", None)
            if hasattr(pool, "_network_backend"):
                pool._network_backend = DeadlineBackend(pool._network_backend)
            return client

        set_client_factory(factory)
        gate_hub_logs()
        for handler in logging.getLogger("huggingface_hub").handlers:
            handler.addFilter(_quiet_retries)
        _INSTALLED = True


#: huggingface_hub's notes on its retries (`_http_backoff_base`).
_RETRY_NOTE = re.compile(r"(HTTP Error \d+ |'.*' )thrown while requesting |Retrying in |Rate limited\. Waiting ")


def _quiet_retries(record: logging.LogRecord) -> bool:
    """Keep huggingface_hub's retry notes ("Retrying in 1s [Retry 1/5]") off stderr inside a scope: the hooks
    count the retries against their own bounds, and a failure is reported once, in one line."""
    return _SCOPE is None or record.levelno > logging.WARNING or not _RETRY_NOTE.match(str(record.msg))


def _at_most(value: float | None, bound: float) -> float:
    return bound if value is None else min(value, bound)


def _on_request(request: httpx2.Request) -> None:
    scope = _SCOPE
    if scope is None:
        return
    bounds = scope.bounds
    timeouts = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {k: _at_most(timeouts.get(k), bounds.timeout)
                                     for k in ("connect", "read", "write", "pool")}
    url = str(request.url)
    credential = request.headers.get("Authorization", "")
    if credential and origin(url) not in scope.origins and any(secret in credential for secret in scope.secrets):
        del request.headers["Authorization"]
    key = (threading.get_ident(), request.method, url)
    now = time.monotonic()
    with scope.lock:
        tries = scope.attempts.setdefault(key, _Attempts())
        if tries.failed_at is not None:
            scope.waited += now - tries.failed_at
            tries.failed_at = None
        tries.count += 1
        count, failure, waited = tries.count, tries.failure, scope.waited
    if count > 1 + bounds.retries:
        raise HubNetworkError(request.method, url, f"failed {count - 1} times ({failure}); gave up after "
                              f"{bounds.retries} retries ({RETRIES_VAR}={bounds.retries})", bound=RETRIES_VAR)
    if waited > bounds.max_wait:
        raise HubNetworkError(request.method, url, f"failed {count - 1} times ({failure}); gave up after waiting "
                              f"{waited:.0f} s in all between retries ({MAX_WAIT_VAR}={bounds.max_wait:g})",
                              bound=MAX_WAIT_VAR)
    if not request.extensions.get(RANGE_READ):
        request.headers["Accept-Encoding"] = "identity"   # a compressed answer could inflate past every bound
    previous = request.extensions.get("trace")
    last = count > bounds.retries
    request.extensions["trace"] = _Tracer(scope, key, getattr(previous, "inner", previous), last=last)


class _Tracer:
    """httpcore's `trace` extension: notes a failed attempt (a timeout, a refused connection) for the retry count."""

    def __init__(self, scope: _Scope, key: tuple[int, str, str], inner: Callable[[str, dict[str, Any]], Any] | None,
                 *, last: bool) -> None:
        self.scope, self.key, self.inner, self.last = scope, key, inner, last

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner(name, info)
        if name == "http11.receive_response_headers.started":
            HEADERS_DUE.at = time.monotonic() + self.scope.bounds.timeout
        elif name.startswith("http11.receive_response_headers."):
            HEADERS_DUE.at = None
        if name.endswith(".failed"):
            exc: BaseException = info["exception"]
            timeout = describe_timeout(exc, self.scope.bounds, in_body="receive_response_body" in name)
            self._failed(timeout or type(exc).__name__)
            if timeout is not None and self.last:   # no retry left: say so now, not after a backoff sleep
                _, method, url = self.key
                raise HubNetworkError(method, url, timeout, bound=TIMEOUT_VAR)

    def _failed(self, failure: str) -> None:
        with self.scope.lock:
            tries = self.scope.attempts.get(self.key)
            if tries is not None:
                tries.failure, tries.failed_at = failure, time.monotonic()


def _requested_wait(response: httpx2.Response) -> tuple[float, str] | None:
    """What the answer asks to wait before a retry, as huggingface_hub reads it: (seconds, the header)."""
    if response.status_code == 429:
        from huggingface_hub.utils import parse_ratelimit_headers  # deferred (TID253): hooks run after its import

        info = parse_ratelimit_headers(response.headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds), "RateLimit"
    value = response.headers.get("Retry-After", "").strip()
    return (float(value), "Retry-After") if value.isdigit() else None


def _on_response(response: httpx2.Response) -> None:
    scope = _SCOPE
    if scope is None:
        return
    request = response.request
    url, bounds = str(request.url), scope.bounds
    if not request.extensions.get(RANGE_READ):   # a range read: `HubSource.read_bytes` bounds its bytes and time
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise HubNetworkError(request.method, url, f"sent its answer compressed ({encoding[:20]}) though asked "
                                  "for identity; a compressed answer is not read (it could inflate without bound)")
        response.stream = bounded_stream(response.stream, request.method, url, bounds.timeout)
        with scope.lock:
            scope.last_answer = (request.method, url)
    key = (threading.get_ident(), request.method, url)
    busy = _busy(response)
    if response.status_code in RETRYABLE_STATUS or busy:
        _retryable(scope, key, response)
    else:
        with scope.lock:
            scope.attempts.pop(key, None)
    if not request.extensions.get(RANGE_READ) and not busy:
        _check_answer(response)
        _next_page(scope, response)


def _next_page(scope: _Scope, response: httpx2.Response) -> None:
    """A `Link: rel="next"` page is new, and there are at most `MAX_PAGES` of them."""
    named = response.links.get("next", {}).get("url")
    if not named:
        return
    page = urljoin(str(response.request.url), named)
    with scope.lock:
        again, scope.pages = page in scope.pages, scope.pages | {page}
        count = len(scope.pages)
    if again:
        raise HubNetworkError(response.request.method, str(response.request.url), 'names as its next page '
                              f'({shortened_url(page)}) a page already read: a pagination loop')
    if count > MAX_PAGES:
        raise HubNetworkError(response.request.method, str(response.request.url), f"names more than {MAX_PAGES:,} "
                              "next pages; no repository listing is that long")


def shortened_url(url: str) -> str:
    text = redact_url(url)
    return text if len(text) <= 120 else text[:117] + "..."


def _busy(response: httpx2.Response) -> bool:
    """huggingface_hub's `create_repo` asks again at once, without end, while the Hub answers this 409."""
    if response.status_code != 409 or not response.request.url.path.endswith("/api/repos/create"):
        return False
    response.read()
    return "another conflicting operation is in progress" in response.text


def _retryable(scope: _Scope, key: tuple[int, str, str], response: httpx2.Response) -> None:
    """A 408, 429 or 5xx: stop when the retries are spent or the wait asked for would pass the bound."""
    bounds, request = scope.bounds, response.request
    failure = f"HTTP {response.status_code}"
    with scope.lock:
        tries = scope.attempts.setdefault(key, _Attempts(count=1))
        tries.failure, tries.failed_at = failure, time.monotonic()
        count, waited = tries.count, scope.waited
    if count > bounds.retries:
        raise HubNetworkError(request.method, key[2], f"answered {failure} {count} times; gave up after "
                              f"{bounds.retries} retries ({RETRIES_VAR}={bounds.retries})", bound=RETRIES_VAR)
    asked = _requested_wait(response)
    wait = asked[0] + 1 if asked is not None else min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (count - 1))
    if waited + wait > bounds.max_wait:
        said = f"asked to wait {asked[0]:g} s ({asked[1]})" if asked is not None else f"a retry would wait {wait:g} s"
        raise HubNetworkError(request.method, key[2], f"answered {failure} and {said}; the toolkit waits at most "
                              f"{bounds.max_wait:g} s in all between retries ({MAX_WAIT_VAR}={bounds.max_wait:g})",
                              bound=MAX_WAIT_VAR)


def _check_answer(response: httpx2.Response) -> None:
    """Read a JSON route's answer (bounded) and check its shape before huggingface_hub parses it."""
    request = response.request
    check = hub_answers.checker(request.method, request.url.path, response.status_code)
    if check is None:
        return
    response.read()
    problem = check(response.content, response.headers.get("Content-Type", ""))
    if problem is not None:
        raise HubNetworkError(request.method, str(request.url), problem)


