"""A Hugging Face-compatible hub on loopback, serving folders in the hub's URL layout, so that the
real huggingface_hub download code runs in the tests (HF_ENDPOINT=http://127.0.0.1:PORT)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class FakeHub:
    """repo id -> folder; `.endpoint` is the URL to put in HF_ENDPOINT; `.requests` lists the paths asked."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = {name: {p.relative_to(folder).as_posix(): p.read_bytes()
                             for p in sorted(Path(folder).rglob("*")) if p.is_file()}
                      for name, folder in repos.items()}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        if path.startswith("/api/models/"):  # model_info: /api/models/{repo}[/revision/{rev}]
            repo = path[len("/api/models/"):].split("/revision/")[0]
            if repo not in self.repos:
                return self._missing(h, body)
            info = {"id": repo, "modelId": repo, "sha": self.commit(repo), "private": False, "siblings": [
                {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                for name, data in self.repos[repo].items()]}
            return self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if "/resolve/" in path:
            repo, rest = path.lstrip("/").split("/resolve/", 1)
            filename = rest.split("/", 1)[1] if "/" in rest else ""
            files = self.repos.get(repo)
            if files is None:
                return self._missing(h, body)
            if filename not in files:
                return self._send(h, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                               "X-Repo-Commit": self.commit(repo)}, body)
            data = files[filename]
            headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": self.commit(repo),
                       "Content-Type": "application/octet-stream"}
            return self._send(h, 200, data, headers, body)
        self._send(h, 404, b"not found", {}, body)

    def _missing(self, h, body: bool) -> None:
        self._send(h, 404, b'{"error": "Repository not found"}',
                   {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, body)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
