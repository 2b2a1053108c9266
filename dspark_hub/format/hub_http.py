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

import functools
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dspark_hub.errors import UsageError
from dspark_hub.format import hub_answers
from dspark_hub.format.secrets import gate_hub_logs
from dspark_hub.format.urls import origin, redact_url

if TYPE_CHECKING:
    import httpx2

TIMEOUT_VAR, RETRIES_VAR, MAX_WAIT_VAR = "DSPARK_HUB_TIMEOUT", "DSPARK_HUB_RETRIES", "DSPARK_HUB_MAX_WAIT"
#: What huggingface_hub's `http_backoff` retries.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: The largest answer body read (a tree page, a model info, an error); range reads are bounded by their range.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The request extension that marks a range read of `HubSource` (its bytes and time are bounded there).
RANGE_READ = "dspark_hub_range_read"
#: huggingface_hub's backoff between retries without `Retry-After`: 1 s, doubling, at most 8 s.
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 8.0


@dataclass(frozen=True)
class NetworkBounds:
    """How long the toolkit waits for the Hub: `timeout` seconds of silence (connecting, each read and write, an
    answer's body), `retries` retries of one request, `max_wait` seconds of waiting between retries in all."""

    timeout: float = 60.0
    retries: int = 3
    max_wait: float = 120.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> NetworkBounds:
        """The bounds `DSPARK_HUB_TIMEOUT`, `DSPARK_HUB_RETRIES` and `DSPARK_HUB_MAX_WAIT` set, else the defaults.

        Raises:
            UsageError: a value that is not a number in its range, naming the variable.
        """
        env = os.environ if environ is None else environ
        default = cls()
        return cls(timeout=_seconds(env, TIMEOUT_VAR, default.timeout, low=0.001),
                   retries=int(_seconds(env, RETRIES_VAR, default.retries, low=0, high=100, integer=True)),
                   max_wait=_seconds(env, MAX_WAIT_VAR, default.max_wait, low=0))


def _seconds(env: Mapping[str, str], name: str, default: float, *, low: float, high: float = 86400.0,
             integer: bool = False) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:   # NaN and infinities fail too
        what = "a whole number" if integer else "a number of seconds"
        raise UsageError(f"{name}={text[:40]!r}: not {what} from {low:g} to {high:g}; unset it or set e.g. "
                         f"{name}={default:g}")
    return value


def request_line(method: str, url: str) -> str:
    """`http://host:port GET /api/models/org/name/tree/<sha>`: where a request went (credentials redacted, no query)."""
    parts = urlsplit(url)
    path = parts.path or "/"
    path = path if len(path) <= 160 else path[:157] + "..."
    return f"{redact_url(f'{parts.scheme}://{parts.netloc}')} {method} {path}"


class HubNetworkError(Exception):
    """A network bound was hit, or an answer is not what a Hub sends. `bound` names the variable of a bound that
    was hit (None for a wrong answer). Not an httpx error: huggingface_hub's retry loops let it through."""

    def __init__(self, method: str, url: str, problem: str, *, bound: str | None = None) -> None:
        self.method, self.url, self.problem, self.bound = method, url, problem, bound
        super().__init__(self.line())

    def line(self) -> str:
        """`<origin> <METHOD> <path>: <problem>`."""
        return f"{request_line(self.method, self.url)}: {self.problem}"


def describe_timeout(exc: BaseException, bounds: NetworkBounds) -> str | None:
    """What an httpx timeout means in words, with the bound it hit; None for another exception."""
    kind = type(exc).__name__
    phrases = {"ConnectTimeout": "could not connect", "ReadTimeout": "no answer came",
               "WriteTimeout": "the server took no data", "PoolTimeout": "no free connection"}
    if kind not in phrases:
        return None
    return f"{phrases[kind]} within {bounds.timeout:g} s ({TIMEOUT_VAR}={bounds.timeout:g})"


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
    waited: float = 0.0
    attempts: dict[tuple[int, str, str], _Attempts] = field(default_factory=dict)
    #: The last answer read (method, URL): named when huggingface_hub cannot parse what came.
    last_answer: tuple[str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_LOCK = threading.RLock()
_SCOPE: _Scope | None = None
_DEPTH = 0
_INSTALLED = False


@contextmanager
def network_scope(endpoint: str, bounds: NetworkBounds | None = None) -> Iterator[NetworkBounds]:
    """Apply the rules to every Hub request in this process until the block ends; the token may go to `endpoint`.

    Scopes nest: the outermost one's bounds and waiting budget hold for the inner ones, whose endpoints are
    trusted too. Yields the bounds in force.

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
                pool._network_backend = _DeadlineBackend(pool._network_backend)
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
    if origin(url) not in scope.origins:
        request.headers.pop("Authorization", None)
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
            _HEADERS_DUE.at = time.monotonic() + self.scope.bounds.timeout
        elif name.startswith("http11.receive_response_headers."):
            _HEADERS_DUE.at = None
        if name.endswith(".failed"):
            exc: BaseException = info["exception"]
            timeout = describe_timeout(exc, self.scope.bounds)
            self._failed(timeout or type(exc).__name__)
            if timeout is not None and self.last:   # no retry left: say so now, not after a backoff sleep
                _, method, url = self.key
                raise HubNetworkError(method, url, timeout, bound=TIMEOUT_VAR)

    def _failed(self, failure: str) -> None:
        with self.scope.lock:
            tries = self.scope.attempts.get(self.key)
            if tries is not None:
                tries.failure, tries.failed_at = failure, time.monotonic()


#: When the headers being read in this thread are due (`time.monotonic()`), or None.
_HEADERS_DUE = threading.local()


class _DeadlineStream:
    """A connection's stream whose reads end when the headers being read are due: a server that drips them,
    or sends `100 Continue` forever, resets the silence timeout at every byte but not this deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        due = getattr(_HEADERS_DUE, "at", None)
        if due is not None:   # at least 1 ms: a timeout of 0 would make the socket non-blocking, not time out
            left = max(0.001, due - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        return bytes(self._inner.read(max_bytes, timeout))

    def start_tls(self, *args: Any, **kwargs: Any) -> _DeadlineStream:
        return _DeadlineStream(self._inner.start_tls(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _DeadlineBackend:
    """httpcore's network backend, its streams wrapped in `_DeadlineStream`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_unix_socket(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


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
    key = (threading.get_ident(), request.method, url)
    if response.status_code in RETRYABLE_STATUS:
        _retryable(scope, key, response)
    else:
        with scope.lock:
            scope.attempts.pop(key, None)
    if request.extensions.get(RANGE_READ):
        return   # `HubSource.read_bytes` bounds its bytes and its time
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise HubNetworkError(request.method, url, f"sent its answer compressed ({encoding[:20]}) though asked for "
                              "identity; a compressed answer is not read (it could inflate without bound)")
    response.stream = _bounded_stream(response.stream, request.method, url, bounds.timeout)
    with scope.lock:
        scope.last_answer = (request.method, url)
    _check_answer(response)


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


def _bounded_stream(inner: Any, method: str, url: str, timeout: float) -> Any:
    """An answer's body: at most `MAX_ANSWER_BYTES`, all of it within `timeout` seconds of its headers."""
    return _stream_class()(inner, method, url, timeout)


@functools.cache
def _stream_class() -> type:
    import httpx2  # what huggingface_hub's client reads a body from (deferred: only a request pays for it)

    class BoundedStream(httpx2.SyncByteStream):
        def __init__(self, inner: Any, method: str, url: str, timeout: float) -> None:
            self.inner, self.method, self.url = inner, method, url
            self.timeout, self.deadline = timeout, time.monotonic() + timeout

        def __iter__(self) -> Iterator[bytes]:
            received = 0
            for chunk in self.inner:
                received += len(chunk)
                if received > MAX_ANSWER_BYTES:
                    raise HubNetworkError(self.method, self.url, f"sent an answer of more than {MAX_ANSWER_BYTES:,} "
                                          "bytes; no Hub answer is that large")
                if time.monotonic() > self.deadline:
                    raise HubNetworkError(self.method, self.url, "sent its answer too slowly: not complete within "
                                          f"{self.timeout:g} s ({TIMEOUT_VAR}={self.timeout:g})", bound=TIMEOUT_VAR)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    return BoundedStream
