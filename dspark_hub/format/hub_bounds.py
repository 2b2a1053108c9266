"""How long dspark-hub waits for a Hub, and the error that says a bound was hit or an answer was wrong.

- `NetworkBounds`: `DSPARK_HUB_TIMEOUT` (seconds of silence, and of an answer's headers and of its body),
  `DSPARK_HUB_RETRIES` (retries of one request), `DSPARK_HUB_MAX_WAIT` (seconds of waiting between retries).
- `HubNetworkError`: a bound hit, or an answer that is not a Hub's, with the request it came from.
- the streams that hold an answer to its bounds: `bounded_stream` (its body) and `DeadlineBackend` (httpcore's
  connections, whose reads end when the headers being read are due: `HEADERS_DUE`).

`format.hub_http` applies them to every Hub request. Stdlib only; httpx is imported where a body is bounded.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dspark_hub.errors import UsageError
from dspark_hub.format.urls import redact_url

TIMEOUT_VAR, RETRIES_VAR, MAX_WAIT_VAR = "DSPARK_HUB_TIMEOUT", "DSPARK_HUB_RETRIES", "DSPARK_HUB_MAX_WAIT"
#: The largest answer body read (a tree page, a model info, an error); range reads are bounded by their range.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class NetworkBounds:
    """How long the toolkit waits for the Hub: `timeout` seconds of silence (connecting, each read and write, an
    answer's body), `retries` retries of one request, `max_wait` seconds of waiting between retries in all."""

    timeout: float = 30.0
    retries: int = 2
    max_wait: float = 60.0

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


def describe_timeout(exc: BaseException, bounds: NetworkBounds, *, in_body: bool = False) -> str | None:
    """What an httpx timeout means in words, with the bound it hit; None for another exception.
    `in_body`: it struck while an answer's body was being read (the answer stopped)."""
    kind = type(exc).__name__
    phrases = {"ConnectTimeout": "could not connect", "ReadTimeout": "the answer stopped: nothing more came"
               if in_body else "no answer came", "WriteTimeout": "the server took no data",
               "PoolTimeout": "no free connection"}
    if kind not in phrases:
        return None
    return f"timed out: {phrases[kind]} within {bounds.timeout:g} s ({TIMEOUT_VAR}={bounds.timeout:g})"


#: When the headers being read in this thread are due (`time.monotonic()`), or None.
HEADERS_DUE = threading.local()


class DeadlineStream:
    """A connection's stream whose reads end when the headers being read are due: a server that drips them,
    or sends `100 Continue` forever, resets the silence timeout at every byte but not this deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        due = getattr(HEADERS_DUE, "at", None)
        if due is not None:   # at least 1 ms: a timeout of 0 would make the socket non-blocking, not time out
            left = max(0.001, due - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        return bytes(self._inner.read(max_bytes, timeout))

    def start_tls(self, *args: Any, **kwargs: Any) -> DeadlineStream:
        return DeadlineStream(self._inner.start_tls(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DeadlineBackend:
    """httpcore's network backend, its streams wrapped in `DeadlineStream`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> DeadlineStream:
        return DeadlineStream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> DeadlineStream:
        return DeadlineStream(self._inner.connect_unix_socket(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def bounded_stream(inner: Any, method: str, url: str, timeout: float) -> Any:
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
                    raise HubNetworkError(self.method, self.url, "timed out: the answer was not complete within "
                                          f"{self.timeout:g} s ({TIMEOUT_VAR}={self.timeout:g})", bound=TIMEOUT_VAR)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    return BoundedStream
