"""A local Hub-compatible HTTP server for tests (stdlib only), driven by the real `huggingface_hub` client.

Implements what `huggingface_hub` 2.4 uses for (see ../shared/docs/hub-protocol.md): create/delete repo,
validate-yaml, preupload, git-lfs batch + basic PUT upload + verify, NDJSON commit, tree and
paths-info, model info / revision resolution, resolve HEAD/GET with single byte ranges (206/416),
refs, branches, tags and commit listing. State lives in memory.

Xet: the server is an endpoint *without* Xet storage, as a self-hosted or older Hub is. It answers
the Xet token routes (`GET /api/{T}/{repo}/xet-write-token/{rev}`, `.../xet-read-token/{rev}`) with
404, and never advertises Xet on downloads (no `X-Xet-Hash` header on resolve, no `xetHash` in
tree/paths-info), so `huggingface_hub` with `hf_xet` installed downloads over plain HTTP, and its
Xet upload path fails on the write-token 404 exactly as against such an endpoint.

It deliberately does *not* share code with `dspark_hub`: what it reports (LFS sha256, blob ids,
upload modes) is computed independently, so tests compare two implementations.

Test hooks:
- `xet_token_requests`: every Xet token request (kind `write`/`read`, repo id, revision);
- `token` (the one valid token; any other Bearer token gets the Hub's 401), `user`;
- counters: `bytes_served(repo_id, path=None)`, `lfs_puts` (every LFS PUT: repo, oid, size,
  bytes received, ok), `lfs_uploaded_oids(repo_id)`, `requests` (method, path, status);
- `honour_ranges = False`: resolve GETs answer 200 with the whole file (a server ignoring `Range`);
- `before_route`: called with (method, path) once a request's body is read, before it is answered
  (the client waits meanwhile): a test acts at a known point of a client's exchange;
- faults: `fail_lfs_uploads(count, oids=None)` makes the next matching LFS PUTs fail after
  reading the body (400: not retried by the client, so it gives up at once, like an interrupted
  upload), `fail_commits(count)` refuses the next commits (500, not retried by create_commit).
- a misbehaving Hub, `misbehave(kind, route, times=None, **params)`: for requests whose
  `METHOD /path?query` matches the regex `route` (the next `times` ones, or all), the server is
  `silent` (reads the request, never answers, holds the connection until `reset_faults()`),
  `close`s the connection unanswered, answers after a `delay`, `trickle`s its body (`chunk` bytes
  every `interval` s), sends an `endless` body, headers that never end (`interim`: `100 Continue`
  again and again; `drip_headers`: a byte at a time), `answer`s what it is told (`status`, `headers`,
  `body` as bytes or JSON, `content_type`), `edit`s its JSON answer (`edit(doc) -> doc`, extra
  `headers`, where `{base}` and `{path}` stand for the server and the request's path), or
  `redirect`s (`location`, a format string of `base` and `path`: the same path is a loop).
  `Fault.arrived` is set when a request met it (so a test can act once the server holds one);
- `seen`: every request with its `Authorization` header; `mirror(host)`: the same Hub on another host
  (127.0.0.2 is loopback too), as a CDN or another origin, that asks for no token;
- `xet_cas_url`: when set, the Xet token routes answer 200 with that CAS URL and a Xet access token
  of their own (`XET_ACCESS_TOKEN`), as a Hub with Xet storage does;
- `basic_credentials`: (user, password) an artifact proxy accepts in `Authorization: Basic` in place
  of the token (`HF_ENDPOINT=http://user:password@host`).
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
DEFAULT_GITATTRIBUTES = "".join(
    f"{p} filter=lfs diff=lfs merge=lfs -text\n"
    for p in ("*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
              "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
              "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*",
              "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*")
).encode()
REGULAR_LIMIT = 10 * 1024 * 1024
XET_ACCESS_TOKEN = "xet_access_token_minted_by_the_hub"
TREE_PAGE = 1000
TREE_PAGE_EXPAND = 50
SHA_RE = re.compile(r"^[0-9a-f]{5,40}$")


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob " + str(len(data)).encode() + b"\0" + data).hexdigest()


def pointer_text(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


@dataclass
class Entry:
    """A file in a commit's tree: regular content inline or an LFS object reference."""

    path: str
    size: int
    content: bytes | None = None  # regular files
    lfs_oid: str | None = None  # LFS files

    @property
    def blob_id(self) -> str:
        if self.lfs_oid is not None:
            return git_sha1(pointer_text(self.lfs_oid, self.size))
        return git_sha1(self.content or b"")

    @property
    def etag(self) -> str:
        return self.lfs_oid or self.blob_id


@dataclass
class Commit:
    oid: str
    parent: str | None
    files: dict[str, Entry]
    title: str
    message: str
    date: str


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content (per repo, like the Hub)

    def resolve(self, rev: str) -> Commit | None:
        for name in (rev, rev.removeprefix("refs/heads/")):
            if name in self.branches:
                return self.commits[self.branches[name]]
        for name in (rev, rev.removeprefix("refs/tags/")):
            if name in self.tags:
                return self.commits[self.tags[name]]
        if SHA_RE.match(rev):
            found = [c for oid, c in self.commits.items() if oid.startswith(rev)]
            if len(found) == 1:
                return found[0]
        return None


@dataclass
class LfsPut:
    repo_id: str
    oid: str
    size: int
    received: int
    ok: bool


@dataclass
class Fault:
    """A misbehaviour for the requests whose `METHOD /path?query` matches `route` (see the module doc)."""

    kind: str
    route: str
    times: int | None
    params: dict[str, Any]
    hits: int = 0
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)


class HttpError(Exception):
    def __init__(self, status: int, message: str, *, code: str | None = None,
                 headers: dict[str, str] | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}
        self.body = body


class HubServer:
    """The server and its state. `start()` serves from a daemon thread; `url` is the endpoint."""

    def __init__(self, *, token: str = "hf_test_valid_token", user: str = "testuser",
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.token, self.user = token, user
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.RLock()
        self.secret = secrets.token_hex(16)
        self.requests: list[tuple[str, str, int]] = []
        self.served: Counter[tuple[str, str]] = Counter()
        self.lfs_puts: list[LfsPut] = []
        self.xet_token_requests: list[tuple[str, str, str]] = []
        self._fail_puts = 0
        self._fail_oids: set[str] | None = None
        self._fail_commits = 0
        self._counter = 0
        #: False makes resolve GETs ignore `Range` (answer 200 with the whole file), like a naive mirror.
        self.honour_ranges = True
        self.faults: list[Fault] = []
        self.mirrors: list[HubServer] = []
        #: (method, path, Authorization header) of every request.
        self.seen: list[tuple[str, str, str]] = []
        self.open_door = False
        self.xet_cas_url: str | None = None
        self.basic_credentials: tuple[str, str] | None = None
        self.before_route: Callable[[str, str], None] | None = None
        handler = type("BoundHubHandler", (_Handler,), {"hub": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.httpd.server_address[0]}:{self.port}"

    def start(self) -> HubServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self.httpd.serve_forever, name="hub-server", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self.reset_faults()
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self.httpd.server_close()

    # --- test hooks ------------------------------------------------------------------------------
    def bytes_served(self, repo_id: str, path: str | None = None) -> int:
        """Body bytes sent by resolve GETs for a repo (one file, or all files)."""
        with self.lock:
            return sum(n for (r, p), n in self.served.items() if r == repo_id and (path is None or p == path))

    def lfs_uploaded_oids(self, repo_id: str) -> list[str]:
        """Oids of LFS PUTs that completed, in order."""
        with self.lock:
            return [p.oid for p in self.lfs_puts if p.repo_id == repo_id and p.ok]

    def lfs_bytes_received(self, repo_id: str) -> int:
        with self.lock:
            return sum(p.received for p in self.lfs_puts if p.repo_id == repo_id)

    def fail_lfs_uploads(self, count: int = 1, oids: set[str] | None = None) -> None:
        """Make the next `count` LFS PUTs (of `oids`, if given) fail after their body was received."""
        with self.lock:
            self._fail_puts, self._fail_oids = count, set(oids) if oids else None

    def fail_commits(self, count: int = 1) -> None:
        with self.lock:
            self._fail_commits = count

    def misbehave(self, kind: str, route: str = ".", times: int | None = None, **params: Any) -> Fault:
        """Misbehave on the requests whose `METHOD /path?query` matches `route` (see the module doc)."""
        fault = Fault(kind, route, times, params)
        with self.lock:
            self.faults.append(fault)
        return fault

    def reset_faults(self) -> None:
        """Behave again: every held (silent) connection is let go, the mirrors stop."""
        with self.lock:
            faults, self.faults = self.faults, []
            mirrors, self.mirrors = self.mirrors, []
            self.xet_cas_url, self.basic_credentials = None, None
        for fault in faults:
            fault.released.set()
        for mirror in mirrors:
            mirror.stop()

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if (fault.times is None or fault.hits < fault.times) and re.search(fault.route, f"{method} {path}"):
                    fault.hits += 1
                    fault.arrived.set()
                    return fault
        return None

    def mirror(self, host: str = "127.0.0.2") -> HubServer:
        """This Hub on another host: same state, no token asked, every request recorded in `seen`."""
        other = HubServer(token=self.token, user=self.user, host=host)
        other.repos, other.lock, other.secret = self.repos, self.lock, self.secret
        other.open_door = True
        self.mirrors.append(other)
        return other.start()

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def head_files(self, repo_id: str, revision: str = "main") -> dict[str, Entry]:
        with self.lock:
            commit = self.repo(repo_id).resolve(revision)
            assert commit is not None
            return dict(commit.files)

    def file_content(self, repo_id: str, path: str, revision: str = "main") -> bytes:
        with self.lock:
            repo = self.repo(repo_id)
            entry = self.head_files(repo_id, revision)[path]
            return repo.lfs[entry.lfs_oid] if entry.lfs_oid else (entry.content or b"")

    # --- internals -------------------------------------------------------------------------------
    def new_commit(self, repo: Repo, parent: str | None, files: dict[str, Entry], title: str, message: str) -> Commit:
        self._counter += 1
        seed = f"{repo.repo_id}\n{parent}\n{title}\n{self._counter}\n{time.time_ns()}".encode()
        commit = Commit(oid=hashlib.sha1(seed).hexdigest(), parent=parent, files=files, title=title,
                        message=message, date=iso_now())
        repo.commits[commit.oid] = commit
        return commit

    def sign(self, repo: Repo, oid: str) -> str:
        return hmac.new(self.secret.encode(), f"{repo.repo_type}/{repo.repo_id}/{oid}".encode(),
                        hashlib.sha256).hexdigest()[:32]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # a client hanging up mid-response is normal
            super().handle()

    # --- plumbing --------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self, method: str) -> None:
        self.method = method
        split = urlsplit(self.path)
        self.query = parse_qs(split.query)
        self.segments = [unquote(s) for s in split.path.split("/")[1:]]
        self.raw_segments = split.path.split("/")[1:]
        self.body = b"" if method in ("GET", "HEAD") and "Content-Length" not in self.headers else self._read_body()
        with self.hub.lock:
            self.hub.seen.append((method, self.path, self.headers.get("Authorization", "")))
        self.fault = self.hub.take_fault(method, self.path)
        status = 500
        try:
            if self.hub.before_route is not None:
                self.hub.before_route(method, self.path)
            status = self._misbehave() if self.fault is not None else None
            if status is None:
                status = self._route()
        except HttpError as err:
            status = err.status
            headers = dict(err.headers)
            if err.code:
                headers["X-Error-Code"] = err.code
            headers["X-Error-Message"] = err.message
            body = err.body if err.body is not None else {"error": err.message}
            self._send_json(body, status=err.status, headers=headers)
        except Exception as exc:  # a server bug must show up in the test, not hang it
            status = 500
            self._send_json({"error": f"server error: {exc!r}"}, status=500)
            raise
        finally:
            with self.hub.lock:
                self.hub.requests.append((method, self.path, status))

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> int:
        fault = self.fault
        headers = dict(headers or {})
        if fault is not None and fault.kind == "edit":
            if fault.params.get("edit") is not None and content_type == "application/json":
                body = json.dumps(fault.params["edit"](json.loads(body))).encode()
            headers.update({key: value.replace("{base}", self.base).replace("{path}", self.path)
                            for key, value in fault.params.get("headers", {}).items()})
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.method != "HEAD":
            try:
                if fault is not None and fault.kind == "trickle":
                    self._trickle(body, fault)
                else:
                    self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client had enough bytes and hung up
                self.close_connection = True
        return status

    # --- misbehaving -----------------------------------------------------------------------------
    def _misbehave(self) -> int | None:
        """Act out `self.fault`; None when the request is then routed as usual."""
        fault = self.fault
        assert fault is not None
        params = fault.params
        if fault.kind == "silent":
            fault.released.wait(params.get("seconds", 600))
            self.close_connection = True
            return 0
        if fault.kind == "close":
            self.close_connection = True
            return 0
        if fault.kind == "delay":
            fault.released.wait(params["seconds"])
            return None
        if fault.kind == "answer":
            body = params.get("body", b"")
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.fault = None
            return self._send(params.get("status", 200), data, params.get("headers"),
                              content_type=params.get("content_type", "application/json"))
        if fault.kind == "redirect":
            location = params.get("location", "{base}{path}").format(base=self.base, path=self.path)
            self.fault = None
            return self._send(params.get("status", 302), b"", {"Location": location})
        if fault.kind == "endless":
            return self._endless(fault)
        if fault.kind in ("interim", "drip_headers"):
            return self._never_done_headers(fault)
        return None

    def _never_done_headers(self, fault: Fault) -> int:
        """Headers that never end: `100 Continue` again and again (`interim`), or one header byte at a time."""
        step = b"HTTP/1.1 100 Continue\r\n\r\n" if fault.kind == "interim" else b"x"
        if fault.kind == "drip_headers":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        try:
            while not fault.released.wait(fault.params.get("interval", 0.2)):
                self.wfile.write(step)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True
        return 0

    def _trickle(self, body: bytes, fault: Fault) -> None:
        step = fault.params.get("chunk", 1)
        for i in range(0, len(body), step):
            self.wfile.write(body[i:i + step])
            self.wfile.flush()
            if fault.released.wait(fault.params.get("interval", 0.5)):
                break

    def _endless(self, fault: Fault) -> int:
        """A 200 whose body never ends (JSON whitespace, chunked), until the client hangs up or faults reset."""
        self.send_response(200)
        self.send_header("Content-Type", fault.params.get("content_type", "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b" " * 65536
        try:
            while not fault.released.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True
        return 200

    def _send_json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> int:
        return self._send(status, json.dumps(obj).encode(), headers)

    def _json(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except ValueError:
            raise HttpError(400, "request body is not JSON") from None

    @property
    def base(self) -> str:
        return f"http://{self.headers.get('Host') or f'127.0.0.1:{self.hub.port}'}"

    # --- auth ------------------------------------------------------------------------------------
    def _auth(self, *, required: bool) -> bool:
        """True when the request carries the valid token; 401 like the Hub for a wrong one."""
        header = self.headers.get("Authorization", "")
        if self.hub.open_door:   # a CDN or another origin: signed URLs, no token asked
            return True
        if header.startswith("Basic ") and self.hub.basic_credentials is not None:
            given = base64.b64decode(header.removeprefix("Basic ").strip()).decode("utf-8", "replace")
            if not hmac.compare_digest(given, ":".join(self.hub.basic_credentials)):
                raise HttpError(401, "Invalid credentials in Authorization header")
            return True   # an artifact proxy holds its own Hub token
        if header:
            token = header.removeprefix("Bearer ").strip()
            if not hmac.compare_digest(token, self.hub.token):
                raise HttpError(401, "Invalid credentials in Authorization header")
            return True
        if required:
            raise HttpError(401, "You must be authenticated to access this endpoint", code="RepoNotFound")
        return False

    def _repo(self, repo_type: str, repo_id: str, *, write: bool = False) -> Repo:
        authed = self._auth(required=write)
        with self.hub.lock:
            repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not authed):
            status = 401 if not authed else 404
            raise HttpError(status, "Repository not found", code="RepoNotFound")
        return repo

    def _commit(self, repo: Repo, rev: str) -> Commit:
        with self.hub.lock:
            commit = repo.resolve(rev)
        if commit is None:
            raise HttpError(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        return commit

    # --- routing ---------------------------------------------------------------------------------
    def _route(self) -> int:
        seg, method = self.segments, self.method
        if seg[:1] == ["api"]:
            return self._route_api(seg[1:], method)
        if seg[:1] == ["lfs-upload"] and method == "PUT":
            return self._lfs_put(seg[1:])
        if seg[:1] == ["lfs-verify"] and method == "POST":
            return self._lfs_verify(seg[1:])
        repo_type = "model"
        rest = seg
        if rest and rest[0] in REPO_TYPES and len(rest) > 3:
            repo_type, rest = REPO_TYPES[rest[0]], rest[1:]
        if len(rest) >= 5 and rest[1].endswith(".git") and rest[2:5] == ["info", "lfs", "objects"] and method == "POST":
            return self._lfs_batch(repo_type, f"{rest[0]}/{rest[1][:-4]}")
        if len(rest) >= 5 and rest[2] == "resolve" and method in ("GET", "HEAD"):
            raw = self.raw_segments[len(self.raw_segments) - len(rest):]
            return self._resolve(repo_type, f"{rest[0]}/{rest[1]}", unquote(raw[3]),
                                 unquote("/".join(raw[4:])))
        raise HttpError(404, f"no route for {method} {self.path}")

    def _route_api(self, seg: list[str], method: str) -> int:
        if seg == ["agent-harnesses"]:
            return self._send_json({"standardEnvVars": [], "harnesses": {}})
        if seg == ["whoami-v2"]:
            self._auth(required=True)
            return self._send_json({"type": "user", "name": self.hub.user, "orgs": [],
                                    "auth": {"accessToken": {"role": "write"}}})
        if seg == ["validate-yaml"]:
            return self._send_json({"errors": [], "warnings": []})
        if seg == ["repos", "create"] and method == "POST":
            return self._create_repo()
        if seg == ["repos", "delete"] and method == "DELETE":
            return self._delete_repo()
        if len(seg) >= 3 and seg[0] in REPO_TYPES:
            repo_type, repo_id = REPO_TYPES[seg[0]], f"{seg[1]}/{seg[2]}"
            action = seg[3] if len(seg) > 3 else None
            raw_args = self.raw_segments[5:]
            arg = unquote(raw_args[0]) if raw_args else None
            routes = {
                (None, "GET"): lambda: self._info(repo_type, repo_id, None),
                ("revision", "GET"): lambda: self._info(repo_type, repo_id, arg),
                ("preupload", "POST"): lambda: self._preupload(repo_type, repo_id, arg),
                ("commit", "POST"): lambda: self._create_commit(repo_type, repo_id, arg),
                ("paths-info", "POST"): lambda: self._paths_info(repo_type, repo_id, arg),
                ("tree", "GET"): lambda: self._tree(repo_type, repo_id, arg,
                                                    "/".join(unquote(a) for a in raw_args[1:])),
                ("refs", "GET"): lambda: self._refs(repo_type, repo_id),
                ("tag", "POST"): lambda: self._create_ref(repo_type, repo_id, "tag", arg),
                ("tag", "DELETE"): lambda: self._delete_ref(repo_type, repo_id, "tag", arg),
                ("branch", "POST"): lambda: self._create_ref(repo_type, repo_id, "branch", arg),
                ("branch", "DELETE"): lambda: self._delete_ref(repo_type, repo_id, "branch", arg),
                ("commits", "GET"): lambda: self._commits(repo_type, repo_id, arg),
                ("xet-write-token", "GET"): lambda: self._no_xet("write", repo_type, repo_id, arg),
                ("xet-read-token", "GET"): lambda: self._no_xet("read", repo_type, repo_id, arg),
            }
            handler = routes.get((action, method))
            if handler is not None and (action is None or arg is not None or action in ("refs",)):
                return handler()
        raise HttpError(404, f"no route for {method} {self.path}")

    # --- repositories ----------------------------------------------------------------------------
    def _repo_url(self, repo: Repo) -> str:
        return f"{self.base}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    def _create_repo(self) -> int:
        self._auth(required=True)
        body = self._json()
        repo_type = body.get("type") or "model"
        repo_id = f"{body.get('organization') or self.hub.user}/{body['name']}"
        with self.hub.lock:
            existing = self.hub.repos.get((repo_type, repo_id))
            if existing is not None:
                raise HttpError(409, "You already created this model repo",
                                body={"error": "You already created this model repo", "url": self._repo_url(existing)})
            repo = Repo(repo_type, repo_id, private=body.get("visibility") == "private")
            attributes = Entry(".gitattributes", len(DEFAULT_GITATTRIBUTES), content=DEFAULT_GITATTRIBUTES)
            init = self.hub.new_commit(repo, None, {".gitattributes": attributes}, "initial commit", "")
            repo.branches["main"] = init.oid
            self.hub.repos[(repo_type, repo_id)] = repo
        return self._send_json({"url": self._repo_url(repo), "name": repo_id, "id": repo_id})

    def _delete_repo(self) -> int:
        self._auth(required=True)
        body = self._json()
        key = (body.get("type") or "model", f"{body.get('organization') or self.hub.user}/{body['name']}")
        with self.hub.lock:
            if self.hub.repos.pop(key, None) is None:
                raise HttpError(404, "Repository not found", code="RepoNotFound")
        return self._send_json({})

    def _info(self, repo_type: str, repo_id: str, rev: str | None) -> int:
        repo = self._repo(repo_type, repo_id)
        commit = self._commit(repo, rev or "main")
        blobs = self.query.get("blobs") == ["true"]
        siblings = []
        for entry in sorted(commit.files.values(), key=lambda e: e.path):
            sibling: dict[str, Any] = {"rfilename": entry.path}
            if blobs:
                sibling.update(size=entry.size, blobId=entry.blob_id)
                if entry.lfs_oid:
                    sibling["lfs"] = {"sha256": entry.lfs_oid, "size": entry.size,
                                      "pointerSize": len(pointer_text(entry.lfs_oid, entry.size))}
            siblings.append(sibling)
        return self._send_json({
            "id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": commit.oid,
            "private": repo.private, "lastModified": commit.date, "createdAt": commit.date,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
            "siblings": siblings,
        })

    # --- upload ----------------------------------------------------------------------------------
    def _lfs_rules(self, commit: Commit) -> list[str]:
        attributes = commit.files.get(".gitattributes")
        text = (attributes.content or b"").decode("utf-8", "replace") if attributes else ""
        return [line.split()[0] for line in text.splitlines()
                if len(line.split()) > 1 and "filter=lfs" in line.split()[1:]]

    @staticmethod
    def _binary(sample: bytes) -> bool:
        if b"\0" in sample:
            return True
        try:
            sample.decode("utf-8")
        except UnicodeDecodeError as err:
            return err.start < len(sample) - 3  # a cut multi-byte character at the end is fine
        return False

    def _upload_mode(self, rules: list[str], path: str, size: int, sample: bytes) -> str:
        name = path.rsplit("/", 1)[-1]
        for rule in rules:
            if fnmatch.fnmatchcase(name if "/" not in rule else path, rule):
                return "lfs"
        return "lfs" if size > REGULAR_LIMIT or self._binary(sample) else "regular"

    def _preupload(self, repo_type: str, repo_id: str, rev: str) -> int:
        repo = self._repo(repo_type, repo_id, write=True)
        commit = self._commit(repo, rev)
        rules = self._lfs_rules(commit)
        files = []
        for item in self._json().get("files", []):
            sample = base64.b64decode(item.get("sample") or "")
            mode = self._upload_mode(rules, item["path"], int(item["size"]), sample)
            current = commit.files.get(item["path"])
            oid = None if current is None else (current.lfs_oid or current.blob_id)
            files.append({"path": item["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return self._send_json({"files": files})

    def _no_xet(self, kind: str, repo_type: str, repo_id: str, rev: str) -> int:
        """An endpoint without Xet storage: the token route does not exist (404, no error code); with
        `xet_cas_url` set, a Xet token for that CAS server, as a Hub with Xet storage answers."""
        self._repo(repo_type, repo_id, write=kind == "write")
        with self.hub.lock:
            self.hub.xet_token_requests.append((kind, repo_id, rev))
            cas = self.hub.xet_cas_url
        if cas is None:
            raise HttpError(404, "Not Found: this endpoint has no Xet storage")
        expires = int(time.time()) + 3600
        return self._send_json({"accessToken": XET_ACCESS_TOKEN, "exp": expires, "casUrl": cas},
                               headers={"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": XET_ACCESS_TOKEN,
                                        "X-Xet-Token-Expiration": str(expires)})

    def _lfs_batch(self, repo_type: str, repo_id: str) -> int:
        repo = self._repo(repo_type, repo_id, write=True)
        body = self._json()
        if body.get("operation") != "upload":
            raise HttpError(400, "only uploads are supported")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            reply: dict[str, Any] = {"oid": oid, "size": size}
            with self.hub.lock:
                stored = oid in repo.lfs
            if not stored:  # no "actions": the client skips objects the Hub already holds
                path = f"{repo.repo_type}/{repo.repo_id}/{oid}"
                reply["actions"] = {
                    "upload": {"href": f"{self.base}/lfs-upload/{path}?size={size}&sig={self.hub.sign(repo, oid)}"},
                    "verify": {"href": f"{self.base}/lfs-verify/{path}"},
                }
            objects.append(reply)
        return self._send_json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_target(self, seg: list[str]) -> tuple[Repo, str]:
        if len(seg) != 4 or seg[0] not in URL_PREFIX:
            raise HttpError(404, "bad LFS path")
        with self.hub.lock:
            repo = self.hub.repos.get((seg[0], f"{seg[1]}/{seg[2]}"))
        if repo is None:
            raise HttpError(404, "Repository not found", code="RepoNotFound")
        return repo, seg[3]

    def _lfs_put(self, seg: list[str]) -> int:
        repo, oid = self._lfs_target(seg)
        if not hmac.compare_digest(self.query.get("sig", [""])[0], self.hub.sign(repo, oid)):
            raise HttpError(403, "bad upload signature")
        size = int(self.query.get("size", ["-1"])[0])
        data = self.body
        with self.hub.lock:
            fail = self.hub._fail_puts > 0 and (self.hub._fail_oids is None or oid in self.hub._fail_oids)
            if fail:
                self.hub._fail_puts -= 1
            ok = not fail and len(data) == size and hashlib.sha256(data).hexdigest() == oid
            self.hub.lfs_puts.append(LfsPut(repo.repo_id, oid, size, len(data), ok))
            if ok:
                repo.lfs[oid] = data
        if fail:
            raise HttpError(400, "simulated upload failure (test server told to fail this upload)")
        if not ok:
            raise HttpError(400, f"uploaded content does not match oid {oid} / size {size}")
        return self._send(200, b"", content_type="text/plain")

    def _lfs_verify(self, seg: list[str]) -> int:
        self._auth(required=True)
        repo, oid = self._lfs_target(seg)
        with self.hub.lock:
            stored = repo.lfs.get(oid)
        size = int(self._json().get("size", -1))
        if stored is None or len(stored) != size:
            raise HttpError(404, f"object {oid} not found", code="EntryNotFound")
        return self._send_json({"success": True})

    def _create_commit(self, repo_type: str, repo_id: str, rev: str) -> int:
        repo = self._repo(repo_type, repo_id, write=True)
        with self.hub.lock:
            if self.hub._fail_commits > 0:
                self.hub._fail_commits -= 1
                raise HttpError(500, "simulated commit failure")
        if rev not in repo.branches:
            raise HttpError(404, f"Invalid rev id: {rev}", code="RevisionNotFound")
        lines = [json.loads(line) for line in self.body.decode("utf-8").splitlines() if line.strip()]
        header = next((item["value"] for item in lines if item["key"] == "header"), {})
        with self.hub.lock:
            head = repo.branches[rev]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HttpError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(repo.commits[head].files)
            for item in lines:
                key, value = item["key"], item["value"]
                if key == "file":
                    content = base64.b64decode(value["content"])
                    if len(content) > REGULAR_LIMIT:
                        raise HttpError(400, f"{value['path']}: regular files are limited to 10 MiB; use LFS")
                    files[value["path"]] = Entry(value["path"], len(content), content=content)
                elif key == "lfsFile":
                    oid = value["oid"]
                    if oid not in repo.lfs:
                        raise HttpError(400, f"{value['path']}: LFS object {oid} was never uploaded")
                    files[value["path"]] = Entry(value["path"], len(repo.lfs[oid]), lfs_oid=oid)
                elif key == "deletedFile":
                    if files.pop(value["path"], None) is None:
                        raise HttpError(404, f"{value['path']} not found", code="EntryNotFound")
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    files = {p: e for p, e in files.items() if not p.startswith(prefix)}
            commit = self.hub.new_commit(repo, head, files, header.get("summary", ""), header.get("description", ""))
            repo.branches[rev] = commit.oid
        return self._send_json({"success": True, "commitOid": commit.oid,
                                "commitUrl": f"{self._repo_url(repo)}/commit/{commit.oid}", "hookOutput": ""})

    # --- listing ---------------------------------------------------------------------------------
    @staticmethod
    def _file_json(entry: Entry, commit: Commit | None) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "file", "oid": entry.blob_id, "size": entry.size, "path": entry.path}
        if entry.lfs_oid:
            item["lfs"] = {"oid": entry.lfs_oid, "size": entry.size,
                           "pointerSize": len(pointer_text(entry.lfs_oid, entry.size))}
        if commit is not None:
            item["lastCommit"] = {"id": commit.oid, "title": commit.title, "date": commit.date}
        return item

    @staticmethod
    def _dir_json(path: str, commit: Commit, expand: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "directory", "path": path,
                                "oid": hashlib.sha1(f"tree {commit.oid} {path}".encode()).hexdigest()}
        if expand:
            item["lastCommit"] = {"id": commit.oid, "title": commit.title, "date": commit.date}
        return item

    def _listing(self, commit: Commit, base: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
        prefix = base.strip("/") + "/" if base.strip("/") else ""
        dirs: set[str] = set()
        files: list[Entry] = []
        for path, entry in commit.files.items():
            if not path.startswith(prefix):
                continue
            rel_parts = path[len(prefix):].split("/")
            if recursive:
                files.append(entry)
                dirs.update(prefix + "/".join(rel_parts[:i]) for i in range(1, len(rel_parts)))
            elif len(rel_parts) == 1:
                files.append(entry)
            else:
                dirs.add(prefix + rel_parts[0])
        if prefix and not files and not dirs:
            raise HttpError(404, f"{base} not found", code="EntryNotFound")
        items = [self._dir_json(d, commit, expand) for d in dirs]
        items += [self._file_json(e, commit if expand else None) for e in files]
        return sorted(items, key=lambda item: item["path"])

    def _tree(self, repo_type: str, repo_id: str, rev: str, sub: str) -> int:
        repo = self._repo(repo_type, repo_id)
        commit = self._commit(repo, rev)
        expand = self.query.get("expand") == ["true"]
        items = self._listing(commit, sub, self.query.get("recursive") == ["true"], expand)
        start = int(self.query.get("cursor", ["0"])[0])
        page = TREE_PAGE_EXPAND if expand else TREE_PAGE
        headers = {}
        if start + page < len(items):
            params = "&".join(f"{k}={quote(v[0])}" for k, v in self.query.items() if k != "cursor")
            headers["Link"] = f'<{self.base}{urlsplit(self.path).path}?{params}&cursor={start + page}>; rel="next"'
        return self._send_json(items[start:start + page], headers=headers)

    def _paths_info(self, repo_type: str, repo_id: str, rev: str) -> int:
        repo = self._repo(repo_type, repo_id)
        commit = self._commit(repo, rev)
        form = parse_qs(self.body.decode("utf-8"))
        expand = form.get("expand") == ["true"]
        items = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in commit.files:
                items.append(self._file_json(commit.files[path], commit if expand else None))
            elif any(p.startswith(path + "/") for p in commit.files):
                items.append(self._dir_json(path, commit, expand))
        return self._send_json(items)

    # --- refs ------------------------------------------------------------------------------------
    def _refs(self, repo_type: str, repo_id: str) -> int:
        repo = self._repo(repo_type, repo_id)
        with self.hub.lock:
            reply: dict[str, Any] = {
                "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                             for n, c in repo.branches.items()],
                "converts": [],
                "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in repo.tags.items()],
            }
        if "include_prs" in self.query:
            reply["pullRequests"] = []
        return self._send_json(reply)

    def _create_ref(self, repo_type: str, repo_id: str, kind: str, arg: str) -> int:
        repo = self._repo(repo_type, repo_id, write=True)
        body = self._json()
        if kind == "tag":
            name, target = body["tag"], self._commit(repo, arg)
            refs = repo.tags
        else:
            name, target = arg, self._commit(repo, body.get("startingPoint") or "main")
            refs = repo.branches
        with self.hub.lock:
            if name in refs:
                raise HttpError(409, f"{kind} {name} already exists")
            refs[name] = target.oid
        return self._send_json({})

    def _delete_ref(self, repo_type: str, repo_id: str, kind: str, name: str) -> int:
        repo = self._repo(repo_type, repo_id, write=True)
        refs = repo.tags if kind == "tag" else repo.branches
        with self.hub.lock:
            if refs.pop(name, None) is None:
                raise HttpError(404, f"{kind} {name} not found", code="RevisionNotFound")
        return self._send_json({})

    def _commits(self, repo_type: str, repo_id: str, rev: str) -> int:
        repo = self._repo(repo_type, repo_id)
        commit: Commit | None = self._commit(repo, rev)
        history = []
        while commit is not None:
            history.append({"id": commit.oid, "title": commit.title, "message": commit.message,
                            "authors": [{"user": self.hub.user}], "date": commit.date})
            commit = repo.commits.get(commit.parent) if commit.parent else None
        return self._send_json(history)

    # --- downloads -------------------------------------------------------------------------------
    def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> int:
        repo = self._repo(repo_type, repo_id)
        commit = self._commit(repo, rev)
        entry = commit.files.get(path)
        if entry is None:
            raise HttpError(404, f"{path} not found", code="EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        with self.hub.lock:
            data = repo.lfs[entry.lfs_oid] if entry.lfs_oid else (entry.content or b"")
        headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes", "ETag": f'"{entry.blob_id}"'}
        if entry.lfs_oid:
            headers.update({"X-Linked-Etag": f'"{entry.lfs_oid}"', "X-Linked-Size": str(entry.size)})
        status, body = 200, data
        wanted = self.headers.get("Range") if self.hub.honour_ranges else None
        if wanted:
            span = self._byte_range(wanted, len(data))
            if span is None:
                raise HttpError(416, f"range {wanted} not satisfiable",
                                headers={**headers, "Content-Range": f"bytes */{len(data)}"})
            first, last = span
            status, body = 206, data[first:last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
        if self.method == "GET":
            with self.hub.lock:
                self.hub.served[(repo.repo_id, path)] += len(body)
        return self._send(status, body, headers, content_type="application/octet-stream")

    @staticmethod
    def _byte_range(header: str, total: int) -> tuple[int, int] | None:
        match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
        if match is None or "," in header:
            raise HttpError(400, f"unsupported Range {header!r}")
        first_s, last_s = match.groups()
        if not first_s:  # suffix range: the last N bytes
            if not last_s or int(last_s) == 0:
                return None
            return max(0, total - int(last_s)), total - 1
        first = int(first_s)
        last = min(int(last_s), total - 1) if last_s else total - 1
        if first >= total or last < first:
            return None
        return first, last
