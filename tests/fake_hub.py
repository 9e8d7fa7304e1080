"""A Hugging Face-compatible hub on loopback, serving folders in the hub's URL layout, so that the
real huggingface_hub download code runs in the tests (HF_ENDPOINT=http://127.0.0.1:PORT)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
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


def download_then_next_word_logits(tmp_path: Path, name: str, folder: Path, text: str = "the quick fox"):
    """`bertlab download NAME` from a FakeHub serving `folder` under `name`, then, offline in a fresh process,
    `bertlab.load(NAME)`: (its family's name, the first 5 next-word logits after `text`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", HF_HUB_DISABLE_TELEMETRY="1")
    code = "import sys; from bertlab.cli import main; sys.exit(main(sys.argv[1:]))"
    with FakeHub({name: folder}) as hub:
        done = subprocess.run([sys.executable, "-c", code, "download", name],
                              env={**env, "HF_ENDPOINT": hub.endpoint}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
    assert any("/resolve/" in r for r in hub.requests)
    probe = ("import json, sys, torch, bertlab; m, t = bertlab.load(sys.argv[1]); e = t.encode(sys.argv[2]);"
             "print(json.dumps([m.family.name, m(torch.tensor([e.ids])).lm_logits[0, -1, :5].tolist()]))")
    run = subprocess.run([sys.executable, "-c", probe, name, text], env={**env, "HF_HUB_OFFLINE": "1"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-800:]
    return json.loads(run.stdout.strip().splitlines()[-1])
