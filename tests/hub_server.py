"""A stand-in Hugging Face hub on 127.0.0.1 for tests: serves local folders as hub repos through the HTTP
endpoints huggingface_hub and `datasets` call (repo info, tree, paths-info, resolve with ranges), so that
the download (`python -m lmk.download`) with `HF_ENDPOINT` at it fetches for real; and takes uploads the way huggingface_hub sends them
(create a repo, public or private, create a branch, validate a card's YAML, preupload, commit as NDJSON with the
files inline), so that a push with `HF_TOKEN` lands and a later download reads it back. Every request is logged
(method, path)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

SHA = "6e346642246bfb4928c560ee08640dc84d074e8c"
MAIN = "main"


class HubServer:
    """`repos`: {("dataset" | "model", "owner/name"): folder}, served read-only at any revision. Repos created
    through the API live under `root` (a temporary folder by default), one folder per branch; every commit gets a
    new sha. Writes need an `Authorization: Bearer` header (any token, or exactly `token` when given); a private
    repo is read only with one. Use as a context manager; `.url` is the endpoint."""

    def __init__(self, repos: dict[tuple[str, str], Path] | None = None, sha: str = SHA, root: Path | None = None,
                 token: str | None = None) -> None:
        self.repos, self.sha, self.log = dict(repos or {}), sha, []
        self.cut: set[str] = set()  # file names served cut short (a connection lost mid-file)
        self.root, self.token = root, token
        self.heads: dict[tuple[str, str], dict[str, str]] = {}  # created repos: branch -> sha of its last commit
        self.private: set[tuple[str, str]] = set()
        self.commits: list[dict[str, Any]] = []  # (repo, branch, sha, summary, paths) of every commit taken
        self.unserved: list[tuple[str, str]] = []  # requests for an endpoint this stand-in does not have
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HubServer:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="hub-server-"))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------------------------------- storage
    def branch_dir(self, kind: str, repo: str, branch: str) -> Path:
        return self.root / f"{kind}s" / repo / branch

    def folder(self, kind: str, repo: str, rev: str) -> Path | None:
        """The files of `repo` at `rev` (a branch name or a commit sha); None when there is no such repo or rev."""
        if (kind, repo) in self.repos:
            return self.repos[(kind, repo)]
        heads = self.heads.get((kind, repo))
        if heads is None:
            return None
        for branch, sha in heads.items():
            if rev in (branch, sha):
                return self.branch_dir(kind, repo, branch)
        return None

    def head(self, kind: str, repo: str, rev: str) -> str:
        heads = self.heads.get((kind, repo))
        return self.sha if heads is None else heads.get(rev, rev)

    def files(self, folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                      and ".cache" not in p.parts)

    def entry(self, folder: Path, path: Path) -> dict[str, Any]:
        rel = path.relative_to(folder).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
        return {"type": "file", "oid": hashlib.sha1(path.read_bytes()).hexdigest(), "size": path.stat().st_size,
                "path": rel}

    def create(self, kind: str, repo: str, private: bool) -> bool:
        if (kind, repo) in self.heads or (kind, repo) in self.repos:
            return False
        self.branch_dir(kind, repo, MAIN).mkdir(parents=True)
        self.heads[(kind, repo)] = {MAIN: hashlib.sha1(f"{repo}@init".encode()).hexdigest()}
        if private:
            self.private.add((kind, repo))
        return True

    def commit(self, kind: str, repo: str, branch: str, lines: list[dict[str, Any]]) -> str:
        """Apply an NDJSON commit (header, file, deletedFile, deletedFolder lines) to the branch; its new sha."""
        folder = self.branch_dir(kind, repo, branch)
        paths = []
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                target = folder / value["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(value["content"]))
                paths.append(value["path"])
            elif key in ("deletedFile", "deletedFolder"):
                target = folder / value["path"]
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            elif key != "header":
                raise ValueError(f"commit line {key!r} is not served (LFS and copies are not supported)")
        summary = lines[0]["value"]["summary"] if lines and lines[0]["key"] == "header" else ""
        sha = hashlib.sha1(f"{repo}@{branch}@{len(self.commits)}@{summary}".encode()).hexdigest()
        self.heads[(kind, repo)][branch] = sha
        self.commits.append({"repo": repo, "branch": branch, "sha": sha, "summary": summary, "paths": paths})
        return sha

    # -------------------------------------------------------------------------------------- HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, data: Any, status: int = 200, sha: str | None = None, error: str | None = None) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", sha or hub.sha)
                if error:
                    self.send_header("X-Error-Code", error)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _authorized(self) -> bool:
                auth = self.headers.get("Authorization") or ""
                return auth.startswith("Bearer ") and (hub.token is None or auth == f"Bearer {hub.token}")

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _readable(self, kind: str, repo: str) -> bool:
                return (kind, repo) not in hub.private or self._authorized()

            def _route(self) -> None:
                url = urllib.parse.urlparse(self.path)
                path = urllib.parse.unquote(url.path)
                hub.log.append((self.command, path))
                if path == "/api/whoami-v2":  # who a token is (HfApi.whoami): 401 for a token the hub does not know
                    if not self._authorized():
                        return self._json({"error": "Invalid credentials in Authorization header"}, 401)
                    return self._json({"type": "user", "name": "lmk-test", "orgs": [],
                                       "auth": {"type": "access_token", "accessToken": {"role": "write"}}})
                if self.command == "POST" and path in ("/api/repos/create", "/api/validate-yaml"):
                    return self._create() if path.endswith("create") else self._validate_yaml()
                m = re.match(r"^/api/(datasets|models)/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)$", path)
                if m and self.command == "POST":
                    return self._write(m.group(1)[:-1], m.group(2), m.group(3), m.group(4))
                m = re.match(r"^/api/(datasets|models)/([^/]+/[^/]+)/(revision|tree|paths-info)/([^/]+)(?:/(.*))?$", path)
                if m:
                    return self._api(m.group(1)[:-1], m.group(2), m.group(3), m.group(4), m.group(5) or "")
                m = re.match(r"^/api/(datasets|models)/([^/]+/[^/]+)$", path)  # repo info: its main revision
                if m and self.command == "GET":
                    return self._api(m.group(1)[:-1], m.group(2), "revision", MAIN, "")
                m = re.match(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    return self._resolve("dataset" if m.group(1) else "model", m.group(2), m.group(3), m.group(4))
                hub.unserved.append((self.command, path))
                self._json({"error": f"not served: {path}"}, 404)

            # ---------------------------------------------------------------------------- writes
            def _create(self) -> None:
                if not self._authorized():
                    return self._json({"error": "Invalid username or password."}, 401)
                form = json.loads(self._body() or b"{}")
                repo = f"{form.get('organization')}/{form['name']}"
                private = form.get("private") or form.get("visibility") == "private"
                if not hub.create(form.get("type") or "model", repo, bool(private)):
                    return self._json({"error": "You already created this model repo", "url": f"{hub.url}/{repo}"}, 409)
                self._json({"url": f"{hub.url}/{repo}", "name": repo, "id": repo})

            def _validate_yaml(self) -> None:
                content = json.loads(self._body() or b"{}").get("content", "")
                m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
                try:
                    meta = yaml.safe_load(m.group(1)) if m else {}
                except yaml.YAMLError as err:
                    return self._json({"error": f"Invalid YAML in README.md: {err}"}, 400)
                if not isinstance(meta, dict):
                    return self._json({"error": "README.md metadata must be a YAML mapping"}, 400)
                self._json({"errors": [], "warnings": []})

            def _write(self, kind: str, repo: str, what: str, rev: str) -> None:
                if not self._authorized():
                    return self._json({"error": "Invalid credentials in Authorization header"}, 401)
                if (kind, repo) not in hub.heads:
                    return self._json({"error": "Repository not found"}, 404, error="RepoNotFound")
                body = self._body()
                if what == "branch":
                    if rev in hub.heads[(kind, repo)]:
                        return self._json({"error": f"Reference already exists: {rev}"}, 409)
                    start = (json.loads(body or b"{}").get("startingPoint")) or MAIN
                    source = hub.folder(kind, repo, start)
                    shutil.copytree(source, hub.branch_dir(kind, repo, rev))
                    hub.heads[(kind, repo)][rev] = hub.head(kind, repo, start)
                    return self._json({})
                if rev not in hub.heads[(kind, repo)]:
                    return self._json({"error": f"Invalid rev id: {rev}"}, 404, error="RevisionNotFound")
                if what == "preupload":  # every file inline in the commit: no LFS, no Xet
                    files = json.loads(body)["files"]
                    return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                 for f in files]})
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                sha = hub.commit(kind, repo, rev, lines)
                self._json({"commitUrl": f"{hub.url}/{repo}/commit/{sha}", "commitOid": sha,
                            "pullRequestUrl": None}, sha=sha)

            # ----------------------------------------------------------------------------- reads
            def _api(self, kind: str, repo: str, what: str, rev: str, sub: str) -> None:
                folder = hub.folder(kind, repo, rev)
                if folder is None or not self._readable(kind, repo):
                    status = 404 if (kind, repo) not in hub.private else 401
                    return self._json({"error": "Repository not found"}, status, error="RepoNotFound")
                sha = hub.head(kind, repo, rev)
                if what == "revision":
                    return self._json({"id": repo, "sha": sha, "private": (kind, repo) in hub.private,
                                       "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [],
                                       "lastModified": "2026-01-01T00:00:00.000Z",
                                       "siblings": [{"rfilename": p.relative_to(folder).as_posix()}
                                                    for p in hub.files(folder)]}, sha=sha)
                if what == "tree":
                    base = folder / sub
                    query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                    deep = query.get("recursive", ["false"])[0].lower() == "true"
                    items = [p for p in (base.rglob("*") if deep else base.iterdir())
                             if not p.name.startswith(".") and ".cache" not in p.parts] if base.is_dir() else []
                    return self._json([hub.entry(folder, p) for p in sorted(items)], sha=sha)
                raw = self._body().decode()
                form = json.loads(raw) if raw.startswith("{") else urllib.parse.parse_qs(raw)
                paths = form.get("paths") or []
                paths = paths if isinstance(paths, list) else [paths]
                return self._json([hub.entry(folder, folder / p) for p in paths if (folder / p).exists()], sha=sha)

            def _resolve(self, kind: str, repo: str, rev: str, rel: str) -> None:
                folder = hub.folder(kind, repo, rev)
                hidden = folder is not None and not self._readable(kind, repo)  # private, no token: as the hub
                file = folder / rel if folder is not None and not hidden else None
                if file is None or not file.is_file():
                    self.send_response(401 if hidden else 404)
                    self.send_header("X-Error-Code", "RepoNotFound" if hidden else "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = file.read_bytes()
                start, end = 0, len(data) - 1
                rng = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if rng:
                    start, end = int(rng.group(1)), int(rng.group(2) or end)
                self.send_response(206 if rng else 200)
                self.send_header("X-Repo-Commit", hub.head(kind, repo, rev))
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(end - start + 1))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                if self.command == "GET":
                    body = data[start:end + 1]
                    self.wfile.write(body[: len(body) // 2] if file.name in hub.cut else body)

            do_GET = do_HEAD = do_POST = _route

        return Handler
