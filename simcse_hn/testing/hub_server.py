"""A stand-in for the Hugging Face Hub on 127.0.0.1, for offline tests of simcse_hn.export.hub.

It serves just what huggingface_hub 2.4 calls for `create_repo`, `upload_folder` (preupload + commit), `create_commit`,
`hf_hub_download` and `whoami`:

    POST /api/repos/create                         {name, organization} -> {url}; 409 when it exists
    POST /api/validate-yaml                        the README's YAML block must parse to a mapping
    POST /api/models/{repo}/preupload/{revision}   every file "regular" (no LFS/Xet), with the git oid if present
    POST /api/models/{repo}/commit/{revision}      NDJSON: a header line, then files inline as base64
    POST /api/models/{repo}/branch/{branch}        create a branch (recorded; a commit names its revision)
    HEAD|GET /{repo}/resolve/{revision}/{path}     the committed bytes, with the headers hf_hub_download checks
    GET  /api/models/{repo}                        id, sha and the file list (model_info)
    GET  /api/whoami-v2

and, read-only, a dataset repo's files (`datasets`, dict of {path: bytes} by repo id) for `datasets.load_dataset`:

    GET  /api/datasets/{repo}[/revision/{revision}]    id, sha (of the files) and the file list
    GET  /api/datasets/{repo}/tree/{revision}[/{path}] the files and folders below path (recursive=true: all)
    POST /api/datasets/{repo}/paths-info/{revision}    the entries of the paths asked for
    HEAD|GET /datasets/{repo}/resolve/{revision}/{path}  the bytes (every revision is the same files)

Writes need `Authorization: Bearer <token>`. The server records every request and every repo's files, answers at
most `max_requests` requests (then 503) and runs in a daemon thread for the `with` block only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

_YAML_BLOCK = re.compile(r"^\s*---\r?\n(.*?)\r?\n---", re.DOTALL)
_REPO_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)$")
_REPO_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<action>preupload|commit)/(?P<revision>[^/]+)$")
_BRANCH = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/branch/(?P<branch>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)$")
_DATASET_INFO = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<revision>[^/]+))?$")
_DATASET_TREE = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<revision>[^/]+)(?:/(?P<path>.*))?$")
_DATASET_PATHS = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/paths-info/(?P<revision>[^/]+)$")
_DATASET_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)$")


def git_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubStandIn:
    def __init__(self, token: str = "hf_test_token", user: str = "tester", max_requests: int = 200):
        self.token, self.user, self.max_requests = token, user, max_requests
        self.repos: dict[str, dict[str, bytes]] = {}  # repo id -> {path: content}
        self.private: dict[str, bool | None] = {}
        self.commits: list[dict] = []  # {"repo", "revision", "summary", "paths"}
        self.heads: dict[str, str] = {}  # repo id -> last commit oid
        self.branches: dict[str, set[str]] = {}  # repo id -> branches created besides main
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.datasets: dict[str, dict[str, bytes]] = {}  # dataset repo id -> {path: content}, read-only
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-stand-in", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    """The stand-in's requests; `hub` (the HubStandIn whose state it serves) is set by `_handler`'s subclass."""

    hub: HubStandIn
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds per connection: a stuck client cannot hold the test

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # --- plumbing ---

    def _reply(self, status: int, body: bytes | dict | list = b"", headers: dict | None = None) -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None, headers: dict | None = None) -> None:
        headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}), **(headers or {})}
        self._reply(status, {"error": message}, headers)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.hub.token}":
            return True
        self._error(401, "Invalid username or password.")
        return False

    def _handle(self) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub._lock:
            self.hub.requests.append((self.command, path))
            over_budget = len(self.hub.requests) > self.hub.max_requests
        if over_budget:
            return self._error(503, "stand-in request budget exhausted")
        if self.command == "GET" and path == "/api/whoami-v2":
            return self._whoami()
        if self.command == "GET" and (m := _REPO_INFO.match(path)):
            return self._repo_info(m["repo"])
        if self.command == "POST" and path == "/api/repos/create":
            return self._create_repo()
        if self.command == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml()
        if self.command == "POST" and (m := _BRANCH.match(path)):
            return self._create_branch(m["repo"], m["branch"])
        if self.command == "POST" and (m := _REPO_API.match(path)):
            if m["action"] == "preupload":
                return self._preupload(m["repo"])
            return self._commit(m["repo"], m["revision"])
        if self.command in ("GET", "HEAD") and (m := _DATASET_RESOLVE.match(path)):
            return self._dataset_file(m["repo"], m["path"])
        if self.command == "GET" and (m := _DATASET_INFO.match(path)):
            return self._dataset_info(m["repo"])
        if self.command == "GET" and (m := _DATASET_TREE.match(path)):
            return self._dataset_tree(m["repo"], m["path"] or "")
        if self.command == "POST" and (m := _DATASET_PATHS.match(path)):
            return self._dataset_paths(m["repo"])
        if self.command in ("GET", "HEAD") and (m := _RESOLVE.match(path)):
            return self._resolve(m["repo"], m["path"])
        self._error(404, f"stand-in: no route for {self.command} {path}")

    do_GET = do_HEAD = do_POST = _handle

    # --- endpoints ---

    def _whoami(self) -> None:
        if self._authorised():
            self._reply(200, {"type": "user", "name": self.hub.user, "auth": {"accessToken": {"role": "write"}}})

    def _create_repo(self) -> None:
        if not self._authorised():
            return
        payload = json.loads(self._body())
        repo_id = f"{payload.get('organization') or self.hub.user}/{payload['name']}"
        url = f"{self.hub.url}/{repo_id}"
        with self.hub._lock:
            if repo_id in self.hub.repos:  # the Hub names the existing repo in its 409 answer
                message = "You already created this model repo"
                headers = {"X-Error-Message": message, "X-Error-Code": "RepoAlreadyExists"}
                return self._reply(409, {"error": message, "url": url}, headers)
            self.hub.repos[repo_id] = {}
            self.hub.private[repo_id] = payload.get("visibility")
        self._reply(200, {"url": url, "name": repo_id})

    def _create_branch(self, repo_id: str, branch: str) -> None:
        if not self._authorised():
            return
        if repo_id not in self.hub.repos:
            return self._error(404, "Repository not found", "RepoNotFound")
        self._body()
        with self.hub._lock:
            if branch in self.hub.branches.setdefault(repo_id, set()):
                return self._error(409, "Reference already exists", "RefAlreadyExists")
            self.hub.branches[repo_id].add(branch)
        self._reply(200, {})

    def _repo_info(self, repo_id: str) -> None:
        if repo_id not in self.hub.repos:
            return self._error(404, "Repository not found", "RepoNotFound")
        siblings = [{"rfilename": path} for path in sorted(self.hub.repos[repo_id])]
        sha = self.hub.heads.get(repo_id, "0" * 40)
        self._reply(200, {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings})

    def _validate_yaml(self) -> None:
        content = json.loads(self._body())["content"]
        match = _YAML_BLOCK.match(content)
        try:
            data = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as e:
            return self._reply(400, {"errors": [{"message": str(e).splitlines()[0]}], "warnings": []})
        if not isinstance(data, dict):
            return self._reply(400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []})
        self._reply(200, {"errors": [], "warnings": []})

    def _preupload(self, repo_id: str) -> None:
        if not self._authorised():
            return
        if repo_id not in self.hub.repos:
            return self._error(404, "Repository not found", "RepoNotFound")
        files = json.loads(self._body())["files"]
        stored = self.hub.repos[repo_id]
        answer = [
            {
                "path": f["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                "oid": git_oid(stored[f["path"]]) if f["path"] in stored else None,
            }
            for f in files
        ]
        self._reply(200, {"files": answer, "commitOid": "0" * 40})

    def _commit(self, repo_id: str, revision: str) -> None:
        if not self._authorised():
            return
        if repo_id not in self.hub.repos:
            return self._error(404, "Repository not found", "RepoNotFound")
        if revision != "main" and revision not in self.hub.branches.get(repo_id, set()):
            return self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        lines = [json.loads(line) for line in self._body().decode().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        changes: dict[str, bytes | None] = {}
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                changes[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                changes[value["path"]] = None
            elif key != "header":
                return self._error(400, f"stand-in: unsupported commit operation {key!r}")
        with self.hub._lock:
            files = self.hub.repos[repo_id]
            for path, content in changes.items():
                if content is None:
                    files.pop(path, None)
                else:
                    files[path] = content
            oid = hashlib.sha1(f"{repo_id}:{len(self.hub.commits)}".encode()).hexdigest()
            self.hub.heads[repo_id] = oid
            self.hub.commits.append(
                {"repo": repo_id, "revision": revision, "summary": header["summary"], "paths": sorted(changes)}
            )
        self._reply(200, {"success": True, "commitOid": oid, "commitUrl": f"{self.hub.url}/{repo_id}/commit/{oid}"})

    # --- datasets, read-only: what datasets.load_dataset asks of a repo of data files ---

    def _dataset_sha(self, repo_id: str) -> str:
        files = self.hub.datasets[repo_id]
        return hashlib.sha1("".join(f"{p}:{git_oid(files[p])}" for p in sorted(files)).encode()).hexdigest()

    def _dataset_info(self, repo_id: str) -> None:
        if repo_id not in self.hub.datasets:
            return self._error(404, "Repository not found", "RepoNotFound")
        siblings = [{"rfilename": path} for path in sorted(self.hub.datasets[repo_id])]
        sha = self._dataset_sha(repo_id)
        info = {"id": repo_id, "sha": sha, "private": False, "disabled": False, "gated": False, "tags": []}
        self._reply(200, info | {"siblings": siblings, "cardData": {}})

    def _dataset_entries(self, repo_id: str, paths) -> list[dict]:
        files = self.hub.datasets[repo_id]
        folders = {"/".join(p.split("/")[:k]) for p in files for k in range(1, p.count("/") + 1)}
        entries = []
        for path in paths:
            if path in files:
                content = files[path]
                entries.append({"type": "file", "path": path, "size": len(content), "oid": git_oid(content)})
            elif path in folders:
                entries.append({"type": "directory", "path": path, "oid": "0" * 40})
        return entries

    def _dataset_tree(self, repo_id: str, folder: str) -> None:
        if repo_id not in self.hub.datasets:
            return self._error(404, "Repository not found", "RepoNotFound")
        recursive = "recursive=true" in urlsplit(self.path).query.lower()
        prefix = f"{folder.rstrip('/')}/" if folder else ""
        below = {p for p in self.hub.datasets[repo_id] if p.startswith(prefix)}
        if not below:
            return self._error(404, f"{folder} does not exist on main", "EntryNotFound")
        names = set()
        for path in below:
            parts = path[len(prefix):].split("/")
            depth = len(parts) if recursive else 1
            names |= {prefix + "/".join(parts[:k]) for k in range(1, depth + 1)}
        self._reply(200, self._dataset_entries(repo_id, sorted(names)))

    def _dataset_paths(self, repo_id: str) -> None:
        if repo_id not in self.hub.datasets:
            return self._error(404, "Repository not found", "RepoNotFound")
        body = self._body().decode()
        try:
            paths = json.loads(body)["paths"]
        except ValueError:  # a form body
            paths = parse_qs(body).get("paths", [])
        self._reply(200, self._dataset_entries(repo_id, paths))

    def _dataset_file(self, repo_id: str, path: str) -> None:
        files = self.hub.datasets.get(repo_id)
        if files is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        commit = self._dataset_sha(repo_id)
        if path not in files:
            return self._error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        self._reply(200, files[path], {"X-Repo-Commit": commit, "ETag": f'"{git_oid(files[path])}"'})

    def _resolve(self, repo_id: str, path: str) -> None:
        files = self.hub.repos.get(repo_id)
        if files is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        commit = self.hub.heads.get(repo_id, "0" * 40)
        if path not in files:
            return self._error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        self._reply(200, files[path], {"X-Repo-Commit": commit, "ETag": f'"{git_oid(files[path])}"'})



def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    """The request handler class of `hub`."""
    return type("Handler", (_Handler,), {"hub": hub})
