"""A stand-in Hugging Face hub on 127.0.0.1 for tests: serves local folders as hub repos through the HTTP
endpoints huggingface_hub and `datasets` call (repo info, tree, paths-info, resolve with ranges), so that a
prefetch with `HF_ENDPOINT` at it downloads for real. Every request is logged (method, path)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SHA = "6e346642246bfb4928c560ee08640dc84d074e8c"


class HubServer:
    """`repos`: {("dataset" | "model", "owner/name"): folder}. Use as a context manager; `.url` is the endpoint."""

    def __init__(self, repos: dict[tuple[str, str], Path], sha: str = SHA) -> None:
        self.repos, self.sha, self.log = repos, sha, []
        self.cut: set[str] = set()  # file names served cut short (a connection lost mid-file)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HubServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                      and ".cache" not in p.parts)

    def entry(self, folder: Path, path: Path) -> dict[str, Any]:
        rel = path.relative_to(folder).as_posix()
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
        return {"type": "file", "oid": hashlib.sha1(path.read_bytes()).hexdigest(), "size": path.stat().st_size,
                "path": rel}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, data: Any, status: int = 200) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", hub.sha)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _repo(self, kind: str, repo: str) -> Path | None:
                return hub.repos.get((kind, repo))

            def _route(self) -> None:
                url = urllib.parse.urlparse(self.path)
                path = urllib.parse.unquote(url.path)
                hub.log.append((self.command, path))
                m = re.match(r"^/api/(datasets|models)/([^/]+/[^/]+)/(revision|tree|paths-info)/([^/]+)(?:/(.*))?$", path)
                if m:
                    return self._api(m.group(1)[:-1], m.group(2), m.group(3), m.group(5) or "")
                m = re.match(r"^/(?:(datasets)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    return self._resolve("dataset" if m.group(1) else "model", m.group(2), m.group(4))
                self._json({"error": f"not served: {path}"}, 404)

            def _api(self, kind: str, repo: str, what: str, sub: str) -> None:
                folder = self._repo(kind, repo)
                if folder is None:
                    return self._json({"error": "Repository not found"}, 404)
                if what == "revision":
                    return self._json({"id": repo, "sha": hub.sha, "private": False, "disabled": False, "gated": False,
                                       "downloads": 0, "likes": 0, "tags": [], "lastModified": "2026-01-01T00:00:00.000Z",
                                       "siblings": [{"rfilename": p.relative_to(folder).as_posix()}
                                                    for p in hub.files(folder)]})
                if what == "tree":
                    base = folder / sub
                    query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                    deep = query.get("recursive", ["false"])[0].lower() == "true"
                    items = [p for p in (base.rglob("*") if deep else base.iterdir())
                             if not p.name.startswith(".") and ".cache" not in p.parts] if base.is_dir() else []
                    return self._json([hub.entry(folder, p) for p in sorted(items)])
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                form = json.loads(raw) if raw.startswith("{") else urllib.parse.parse_qs(raw)
                paths = form.get("paths") or []
                paths = paths if isinstance(paths, list) else [paths]
                return self._json([hub.entry(folder, folder / p) for p in paths if (folder / p).exists()])

            def _resolve(self, kind: str, repo: str, rel: str) -> None:
                folder = self._repo(kind, repo)
                file = folder / rel if folder is not None else None
                if file is None or not file.is_file():
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = file.read_bytes()
                start, end = 0, len(data) - 1
                rng = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if rng:
                    start, end = int(rng.group(1)), int(rng.group(2) or end)
                self.send_response(206 if rng else 200)
                self.send_header("X-Repo-Commit", hub.sha)
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
