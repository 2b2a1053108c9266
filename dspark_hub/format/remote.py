"""Reading a checkpoint on the Hugging Face Hub: names, errors, and `HubSource`.

- `HubSource`: a `checkpoint.Source` over `hf://ORG/NAME[@REV]`; every read is an HTTP range
  request pinned to the commit the revision resolved to, so `verify hf://...` never downloads weights.
- `hub_errors`: every huggingface_hub or network failure becomes a one-line `HubError`.

`huggingface_hub` is imported inside the functions (header-level commands never pay for it).
The token comes from `token=` or huggingface_hub's usual sources (HF_TOKEN, the login file) and is
never put in a message: `hub_tokens` asks huggingface_hub which tokens it would send, and
`redact_tokens` removes them from any text (the CLI runs every line it prints through it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from dspark_hub import __version__
from dspark_hub._text import shortened
from dspark_hub.errors import DsparkError, HubError, MissingDependencyError, UsageError
from dspark_hub.format.checkpoint import LocalSource, Source
from dspark_hub.format.digests import FileDigest
from dspark_hub.redaction import REDACTED, hub_tokens, redact_tokens  # noqa: F401 (their home before 0.3)

if TYPE_CHECKING:
    from huggingface_hub import HfApi

HF_SCHEME = "hf://"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
#: Remote files that the Hub or our packaging adds on its own; not reported as extra when absent locally.
HOUSEKEEPING_FILES = (".gitattributes",)
#: Range reads are small; a GET that ignores `Range` is cut off after this many bytes.
_READ_TIMEOUT = 30.0


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
    """The Hub endpoint to use: the argument, else huggingface_hub's (HF_ENDPOINT at its import)."""
    if endpoint:
        return endpoint.rstrip("/")
    require_huggingface_hub()
    from huggingface_hub import constants  # a submodule: not an attribute until imported

    return str(constants.ENDPOINT).rstrip("/")


# --- errors ----------------------------------------------------------------------------------------

def _scrub(text: str, token: str | bool | None) -> str:
    """Remove every token (the one given, and huggingface_hub's) from a message; keep it on one line."""
    return " ".join(redact_tokens(text, token).split())


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "TimeoutException", "NetworkError", "ConnectError"})


def _describe(exc: BaseException, where: str, endpoint: str, action: str) -> str | None:
    """One line `<where>: <what is wrong>; <what to do>` for a huggingface_hub failure, or None."""
    require_huggingface_hub()
    from huggingface_hub import errors

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
        detail = f" ({server})" if server else ""
        return f"{where}: the Hub answered HTTP {status} while trying to {action}{detail}; run it again later"
    if isinstance(exc, errors.LocalEntryNotFoundError) or _is_transport_error(exc):
        return (f"{where}: cannot reach the Hub at {endpoint} ({type(exc).__name__}); "
                "check the network, or the endpoint (`endpoint`, HF_ENDPOINT)")
    return None


@contextmanager
def hub_errors(where: str, *, endpoint: str, token: str | bool | None, action: str) -> Iterator[None]:
    """Turn huggingface_hub and network failures raised inside the block into `HubError`."""
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
            cause = cause.__cause__
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

    def __repr__(self) -> str:  # never show the token
        return f"HubSource({self.location!r}, endpoint={self.endpoint!r})"

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
            files = {}
            for entry in entries:
                if not isinstance(entry, RepoFile):  # a folder
                    continue
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

        A server that ignores `Range` is read only up to the bytes needed, then the connection
        is dropped: never the whole weight file.
        """
        if length <= 0:
            return b""
        require_huggingface_hub()
        from huggingface_hub import utils as hf_utils

        url = self.url(name)
        headers = hf_utils.build_hf_headers(token=self._token, library_name="dspark-hub",
                                            library_version=__version__)
        headers["Range"] = f"bytes={start}-{start + length - 1}"
        where = f"{self.location}/{name}"
        with (self._errors(f"read {name}", where),
              hf_utils.get_session().stream("GET", url, headers=headers, timeout=_READ_TIMEOUT) as response):
                self.requests += 1
                if response.status_code == 416:  # the range starts at or after the end of the file
                    return b""
                hf_utils.hf_raise_for_status(response)
                skip = start if response.status_code == 200 else 0
                data = bytearray()
                for chunk in response.iter_bytes():
                    self.bytes_read += len(chunk)
                    data += chunk
                    if len(data) >= skip + length:
                        break
        return bytes(data[skip:skip + length])


def source_for(path: str | os.PathLike[str] | Source, *, endpoint: str | None = None) -> Source:
    """A `Source` for a local folder or an `hf://org/name[@rev]` URL (a `Source` is returned as it is)."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    text = os.fspath(path)
    if is_hf_url(text):
        return HubSource.from_url(text, endpoint=endpoint)
    return LocalSource(text)
