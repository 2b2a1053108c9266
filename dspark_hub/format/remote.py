"""Reading a checkpoint on the Hugging Face Hub: names, errors, and `HubSource`.

- `HubSource`: a `checkpoint.Source` over `hf://ORG/NAME[@REV]`; every read is an HTTP range
  request pinned to the commit the revision resolved to, so `verify hf://...` never downloads weights.
- `hub_errors`: every Hub call runs under the network rules of `hub_http` (bounded in time, retries and
  waiting; the token kept to the endpoint; answers checked), and every huggingface_hub or network failure
  becomes a one-line `HubError` naming the endpoint, the route and what was wrong.

`huggingface_hub` is imported inside the functions (header-level commands never pay for it).
The token comes from `token=` or huggingface_hub's usual sources (HF_TOKEN, the login file) and is
never put in a message, nor are the credentials of an endpoint URL: `redaction.redact_tokens` removes
them from any text (the CLI runs every line it prints through it; re-exported here).
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from dspark_hub import __version__
from dspark_hub._text import shortened
from dspark_hub.errors import DsparkError, HubError, MissingDependencyError, UsageError
from dspark_hub.format import hub_bounds, hub_http
from dspark_hub.format.checkpoint import LocalSource, Source
from dspark_hub.format.digests import FileDigest
from dspark_hub.format.urls import check_endpoint, redact_url
from dspark_hub.redaction import REDACTED, hub_tokens, note_endpoint, redact_tokens

if TYPE_CHECKING:
    import httpx2
    from huggingface_hub import HfApi

#: Where these names lived before `redaction` (imported from here by callers).
__all__ = ["REDACTED", "hub_tokens", "redact_tokens"]

HF_SCHEME = "hf://"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
#: Remote files that the Hub or our packaging adds on its own; not reported as extra when absent locally.
HOUSEKEEPING_FILES = (".gitattributes",)
#: A range read slower than this (bytes a second, after `DSPARK_HUB_TIMEOUT` of grace) is given up.
MIN_READ_RATE = 256 * 1024


def require_huggingface_hub() -> None:
    """Raise `MissingDependencyError` unless huggingface_hub imports; callers then import what they use."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:  # pragma: no cover - a declared dependency
        raise MissingDependencyError("Hub access needs huggingface_hub; pip install 'huggingface_hub>=1.0'") from None


# --- names -----------------------------------------------------------------------------------------

def is_hf_url(value: str) -> bool:
    return str(value).startswith(HF_SCHEME)


def _quoted(name: str) -> str:
    return repr(shortened(name, 100))


#: The longest ORG or NAME of a repository id the Hub accepts.
HUB_NAME_MAX = 96


def validate_repo_id(repo_id: str) -> str:
    """Return `repo_id` if it is `ORG/NAME` and passes huggingface_hub's own rules (at most 96 characters a
    part, no `--`, no `.git` ending); raise `UsageError` otherwise."""
    if not _REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise UsageError(f"{_quoted(repo_id)}: not a Hub repository id; write it as ORG/NAME", param="repo_id")
    for label, part in zip(("ORG", "NAME"), repo_id.split("/"), strict=True):
        if len(part) > HUB_NAME_MAX:
            raise UsageError(f"{_quoted(repo_id)}: not a Hub repository id: {label} has {len(part)} characters and "
                             f"the Hub accepts at most "
                             f"{HUB_NAME_MAX}; choose a shorter name", param="repo_id")
    require_huggingface_hub()
    from huggingface_hub.utils import HFValidationError
    from huggingface_hub.utils import validate_repo_id as hub_rules

    try:
        hub_rules(repo_id)
    except HFValidationError:
        raise UsageError(f"{_quoted(repo_id)}: not a Hub repository id ({len(repo_id)} characters); the Hub "
                         "takes letters, digits, '-', '_' and '.', at most 96 characters in each of ORG and NAME, "
                         "no '--' and no '.git' ending", param="repo_id") from None
    return repo_id


def parse_hf_url(url: str) -> tuple[str, str | None]:
    """Split `hf://ORG/NAME[@REV]` into `(repo_id, revision or None)`.

    The revision is everything after the first `@` (so `refs/pr/1` works); a leading
    `models/` is accepted and dropped.

    Raises:
        UsageError: not an `hf://` URL of a model repository.
    """
    if not is_hf_url(url):
        raise UsageError(f"{url!r}: not a Hub URL; write it as hf://ORG/NAME[@REVISION]")
    repo_part, sep, revision = url[len(HF_SCHEME):].partition("@")
    repo_part = repo_part.strip("/").removeprefix("models/")
    if sep and not revision:
        raise UsageError(f"{url!r}: empty revision after '@'; name a branch, tag or commit")
    try:
        return validate_repo_id(repo_part), (revision or None)
    except UsageError:
        raise UsageError(f"{url!r}: not a Hub URL; write it as hf://ORG/NAME[@REVISION]") from None


def hf_location(repo_id: str, revision: str | None = None) -> str:
    return f"{HF_SCHEME}{repo_id}" + (f"@{revision}" if revision else "")


def resolve_endpoint(endpoint: str | None) -> str:
    """The Hub endpoint to use: the argument, else huggingface_hub's (HF_ENDPOINT at its import).

    The credentials its URL may hold are secrets from now on (`redaction.note_endpoint`).

    Raises:
        UsageError: not an http(s)://host URL (`urls.check_endpoint`).
    """
    if not endpoint:
        require_huggingface_hub()
        from huggingface_hub import constants  # a submodule: not an attribute until imported

        endpoint = str(constants.ENDPOINT)
    endpoint = check_endpoint(endpoint.rstrip("/"))
    note_endpoint(endpoint)
    return endpoint


# --- errors ----------------------------------------------------------------------------------------

def _scrub(text: str, token: str | bool | None) -> str:
    """Remove every secret (the token given, huggingface_hub's, endpoint credentials) from a message; one line."""
    return " ".join(redact_tokens(text, token).split())


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "TimeoutException", "NetworkError", "ConnectError"})


def _is_httpx(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("httpx", "httpcore"))


_CHECK_ENDPOINT = "the endpoint does not answer as the Hub does; check `endpoint` (HF_ENDPOINT)"


def _network_problem(exc: BaseException) -> str | None:
    """A bound hit, a wrong answer, or an httpx failure of a known request: `<origin> <route>: <what>; <advice>`."""
    if isinstance(exc, hub_bounds.HubNetworkError):
        advice = f"check the network and the endpoint, or raise {exc.bound}" if exc.bound else _CHECK_ENDPOINT
        return f"{exc.line()}; {advice}"
    try:
        request = exc.request  # type: ignore[attr-defined]  # httpx's RequestError names the request it failed on
        line = hub_bounds.request_line(request.method, str(request.url))
    except Exception:   # not an httpx error, or one made without a request
        return None
    kind = type(exc).__name__
    timeout = hub_bounds.describe_timeout(exc, hub_http.current_bounds())
    if timeout is not None:
        return f"{line}: {timeout}; check the network and the endpoint, or raise {hub_bounds.TIMEOUT_VAR}"
    if kind == "TooManyRedirects":
        return f"{line}: redirected again and again (a redirect loop); {_CHECK_ENDPOINT}"
    answered = hub_http.last_answer()
    if kind == "UnsupportedProtocol" and answered is not None and answered[1] != str(request.url):
        return (f"{hub_bounds.request_line(*answered)}: redirected to {shortened(redact_url(str(request.url)), 80)}, "
                f"not an http(s) URL; {_CHECK_ENDPOINT}")
    if kind in ("RemoteProtocolError", "DecodingError"):
        return f"{line}: the answer is not well-formed HTTP ({shortened(str(exc), 120)}); {_CHECK_ENDPOINT}"
    return None


def _unreadable_answer(exc: BaseException) -> str | None:
    """huggingface_hub could not parse an answer the checks of `hub_answers` do not cover: name the last route."""
    from huggingface_hub.errors import HFValidationError  # deferred (TID253): only a failed Hub call gets here

    answered = hub_http.last_answer()
    if answered is None or isinstance(exc, HFValidationError):
        return None
    inside = any("huggingface_hub" in frame.filename for frame in traceback.extract_tb(exc.__traceback__))
    if not isinstance(exc, json.JSONDecodeError) and not (
            inside and isinstance(exc, (KeyError, TypeError, ValueError, AttributeError, IndexError))):
        return None
    return (f"{hub_bounds.request_line(*answered)}: huggingface_hub could not use the answer "
            f"({type(exc).__name__}: {shortened(str(exc), 160)}); {_CHECK_ENDPOINT}")


def _describe(exc: BaseException, where: str, endpoint: str, action: str) -> str | None:
    """One line `<where>: <what is wrong>; <what to do>` for a huggingface_hub failure, or None."""
    require_huggingface_hub()
    from huggingface_hub import errors

    network = _network_problem(exc)
    if network is not None:
        return f"{where}: {network}"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return f"{where}: HF_HUB_OFFLINE is set, so the Hub cannot be reached; unset it to {action}"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{where}: revision not found; name an existing branch, tag or commit"
    if isinstance(exc, errors.GatedRepoError):
        return f"{where}: the repository is gated; accept its conditions on the Hub with this account"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (f"{where}: repository not found or not readable with this token; check the name, "
                "or log in with 'hf auth login' (private repositories need a token)")
    if isinstance(exc, errors.EntryNotFoundError) and not isinstance(exc, errors.LocalEntryNotFoundError):
        return f"{where}: file not found in the repository at this revision; check the path and revision"
    status = _status(exc)
    if status == 401:
        return (f"{where}: the Hub rejected the token (401 Unauthorized); log in again with "
                "'hf auth login' or set HF_TOKEN to a valid token")
    if status == 403:
        return (f"{where}: permission denied (403 Forbidden) to {action}; use a token with write access "
                "to this namespace")
    if status == 412:
        return f"{where}: the branch moved while committing (412); run the command again"
    if isinstance(exc, errors.HfHubHTTPError):
        server = getattr(exc, "server_message", "") or ""
        detail = f" ({shortened(server, 300)})" if server else ""
        request = getattr(getattr(exc, "response", None), "request", None)
        route = f"{hub_bounds.request_line(request.method, str(request.url))}: " if request is not None else ""
        return f"{where}: {route}the Hub answered HTTP {status} while trying to {action}{detail}; run it again later"
    if any(frame.name == "_upload_xet_files" for frame in traceback.extract_tb(exc.__traceback__)):
        return (f"{where}: the Xet storage upload failed ({type(exc).__name__}: {shortened(str(exc), 240)}); hf_xet "
                f"is bounded by {hub_bounds.TIMEOUT_VAR}, {hub_bounds.RETRIES_VAR} and {hub_bounds.MAX_WAIT_VAR} too; "
                "run it again, or upload through LFS (`transfer` lfs)")
    if isinstance(exc, errors.LocalEntryNotFoundError) or _is_transport_error(exc):
        said = f": {shortened(str(exc), 200)}" if str(exc) and not _is_httpx(exc) else ""
        return (f"{where}: cannot reach the Hub at {redact_url(endpoint)} ({type(exc).__name__}{said}); "
                "check the network, or the endpoint (`endpoint`, HF_ENDPOINT)")
    unreadable = _unreadable_answer(exc)
    return f"{where}: {unreadable}" if unreadable is not None else None


@contextmanager
def hub_errors(where: str, *, endpoint: str, token: str | bool | None, action: str) -> Iterator[None]:
    """Run Hub calls under the network rules (`hub_http.network_scope`: bounded, the token kept to `endpoint`,
    answers checked) and turn huggingface_hub and network failures raised inside the block into `HubError`."""
    with hub_http.network_scope(endpoint, secrets=lambda: hub_tokens(token)):
        try:
            yield
        except DsparkError:
            raise
        except Exception as exc:
            cause: BaseException | None = exc
            while cause is not None:  # the LFS uploader wraps the real failure in a RuntimeError
                message = _describe(cause, where, endpoint, action)
                if message is not None:
                    if cause is not exc and isinstance(exc, RuntimeError):
                        message = f"{message} [{_scrub(str(exc), token)}]"
                    raise HubError(_scrub(message, token)) from exc
                cause = cause.__cause__ or cause.__context__
            if isinstance(exc, RuntimeError):
                raise HubError(_scrub(f"{where}: {action} failed: {exc}; run it again (finished uploads are "
                                      "not sent twice)", token)) from exc
            raise


# --- reading a repository ------------------------------------------------------------------------

class HubSource:
    """A checkpoint on the Hub, read file by file with HTTP range requests.

    The revision is resolved to a commit once (on first use); every later call reads that
    commit, so a branch moving mid-verify cannot mix two versions. `token`: a token, `False`
    for anonymous access, `None` for huggingface_hub's usual sources (HF_TOKEN, login file).

    Example:
        >>> src = HubSource.from_url("hf://Inferact/Kimi-K3-DSpark@main")
        >>> src.read_bytes("model.safetensors", 0, 8)   # the header length, one range request
    """

    def __init__(self, repo_id: str, revision: str | None = None, *, endpoint: str | None = None,
                 token: str | bool | None = None) -> None:
        self.repo_id = validate_repo_id(repo_id)
        self.revision = revision
        self.endpoint = resolve_endpoint(endpoint)
        self._token = token
        self._commit: str | None = None
        self._files: dict[str, FileDigest] | None = None
        #: Body bytes received by `read_bytes` so far.
        self.bytes_read = 0
        self.requests = 0

    @classmethod
    def from_url(cls, url: str, *, endpoint: str | None = None, token: str | bool | None = None) -> HubSource:
        repo_id, revision = parse_hf_url(url)
        return cls(repo_id, revision, endpoint=endpoint, token=token)

    @property
    def location(self) -> str:
        return hf_location(self.repo_id, self.revision)

    def __repr__(self) -> str:  # never show the token, nor the endpoint's credentials
        return f"HubSource({self.location!r}, endpoint={redact_url(self.endpoint)!r})"

    def _errors(self, action: str, where: str | None = None) -> AbstractContextManager[None]:
        return hub_errors(where or self.location, endpoint=self.endpoint, token=self._token, action=action)

    def _api(self) -> HfApi:
        require_huggingface_hub()
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self._token, library_name="dspark-hub",
                     library_version=__version__)

    @property
    def commit(self) -> str:
        """The 40-hex commit the revision resolved to."""
        if self._commit is None:
            with self._errors("read the repository"):
                info = self._api().model_info(self.repo_id, revision=self.revision)
            self._commit = str(info.sha)
        return self._commit

    def remote_files(self) -> dict[str, FileDigest]:
        """Every file at the resolved commit: size, git blob id, and for LFS files the SHA-256."""
        if self._files is None:
            commit = self.commit
            from huggingface_hub.hf_api import RepoFile

            with self._errors("list the repository files"):
                entries = list(self._api().list_repo_tree(self.repo_id, revision=commit, recursive=True))
            files: dict[str, FileDigest] = {}
            for entry in entries:
                if not isinstance(entry, RepoFile):  # a folder
                    continue
                if entry.path in files:
                    raise HubError(f"{self.location}: the Hub's tree listing at {redact_url(self.endpoint)} names "
                                   f"{shortened(entry.path, 100)!r} twice (across its pages); {_CHECK_ENDPOINT}")
                lfs = entry.lfs
                files[entry.path] = FileDigest(path=entry.path, size=int(entry.size), blob_id=str(entry.blob_id),
                                               sha256=str(lfs.sha256) if lfs is not None else None,
                                               lfs=lfs is not None, origin=self.location)
            self._files = dict(sorted(files.items()))
        return self._files

    def list_files(self) -> dict[str, int]:
        """Relative path -> size, for every file of the repository at the resolved commit."""
        # The Hub's listing gives every file's size.
        return {path: f.size for path, f in self.remote_files().items() if f.size is not None}

    def url(self, name: str) -> str:
        """The resolve URL of a file at the resolved commit."""
        require_huggingface_hub()
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.repo_id, name, revision=self.commit, endpoint=self.endpoint)

    def read_bytes(self, name: str, start: int, length: int) -> bytes:
        """`length` bytes of `name` from `start` (fewer at end of file), with one HTTP range request.

        The answer must be the file the listing names: its size (`Content-Range`, or `Content-Length` of a
        server that ignores `Range`) and every byte asked for, within `DSPARK_HUB_TIMEOUT` plus a second
        per `MIN_READ_RATE` bytes. A server that ignores `Range` is read only up to the bytes needed, then
        the connection is dropped: never the whole weight file.

        Raises:
            HubError: the read failed, or its answer is not the listed file (naming the route).
        """
        listed = self.remote_files().get(name) if length > 0 else None
        size = listed.size if listed is not None else None
        if size is not None:
            length = min(length, size - start)
        if length <= 0:
            return b""
        require_huggingface_hub()
        from huggingface_hub import utils as hf_utils

        url = self.url(name)
        headers = hf_utils.build_hf_headers(token=self._token, library_name="dspark-hub",
                                            library_version=__version__)
        headers.update({"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"})
        with (self._errors(f"read {name}", f"{self.location}/{name}"),
              hf_utils.get_session().stream("GET", url, headers=headers,
                                            extensions={hub_http.RANGE_READ: True}) as response):
            self.requests += 1
            return self._range_answer(response, name, start, length, size)

    def _range_answer(self, response: httpx2.Response, name: str, start: int, length: int,
                      size: int | None) -> bytes:
        from huggingface_hub import utils as hf_utils  # deferred (TID253): read_bytes imported it already

        def wrong(problem: str, bound: str | None = None) -> hub_bounds.HubNetworkError:
            return hub_bounds.HubNetworkError("GET", str(response.request.url), problem, bound=bound)

        listed = f"the listing says {name} has {size:,} bytes" if size is not None else ""
        if response.status_code == 416:  # the range starts at or after the end of the file
            if size is not None:
                raise wrong(f"refused bytes {start:,}- as out of range; {listed}")
            return b""
        hf_utils.hf_raise_for_status(response)
        if response.status_code not in (200, 206):
            raise wrong(f"answered HTTP {response.status_code} to a range read")
        total = _content_range_total(response, start) if response.status_code == 206 else \
            _whole_length(response)
        if size is not None and total is not None and total != size:
            raise wrong(f"says {name} has {total:,} bytes; {listed}")
        skip = start if response.status_code == 200 else 0
        bounds = hub_http.current_bounds()
        allowed = bounds.timeout + (skip + length) / MIN_READ_RATE
        deadline = time.monotonic() + allowed
        data = bytearray()
        for chunk in response.iter_bytes():
            self.bytes_read += len(chunk)
            data += chunk
            if len(data) >= skip + length:
                break
            if time.monotonic() > deadline:
                raise wrong(f"timed out: {len(data):,} of {skip + length:,} bytes came within {allowed:.3g} s "
                            f"({hub_bounds.TIMEOUT_VAR}={bounds.timeout:g}, and a second per {MIN_READ_RATE:,} bytes)",
                            bound=hub_bounds.TIMEOUT_VAR)
        if size is not None and len(data) < skip + length:
            raise wrong(f"sent {max(0, len(data) - skip):,} of the {length:,} bytes asked from offset {start:,}; "
                        f"{listed}")
        return bytes(data[skip:skip + length])


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*")


def _content_range_total(response: httpx2.Response, start: int) -> int | None:
    """The file size a 206 answer states (None for `*`); its range must start where asked."""
    header = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(header)
    if match is None or int(match[1]) != start:
        raise hub_bounds.HubNetworkError("GET", str(response.request.url), f"answered 206 with Content-Range "
                                       f"{shortened(header, 60)!r}, not the range from byte {start:,}")
    return None if match[3] == "*" else int(match[3])


def _whole_length(response: httpx2.Response) -> int | None:
    """The file size a 200 answer (a server that ignores `Range`) states in Content-Length, if any."""
    value = response.headers.get("Content-Length", "").strip()
    return int(value) if value.isdigit() else None


def source_for(path: str | os.PathLike[str] | Source, *, endpoint: str | None = None) -> Source:
    """A `Source` for a local folder or an `hf://org/name[@rev]` URL (a `Source` is returned as it is)."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    text = os.fspath(path)
    if is_hf_url(text):
        return HubSource.from_url(text, endpoint=endpoint)
    return LocalSource(text)
