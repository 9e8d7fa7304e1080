"""A lesson on a real BERT, as the picker's card and docs/models.md tell a teacher: `bertlab download
bert-base-uncased` once while online, then `bertlab serve --class N --model bert-base-uncased` offline.
Tried end to end on the loopback hub (tests/fake_hub.py), a tiny BERT served as `bert-base-uncased`:
no real checkpoint is here, so the steps and the panel's code are tested, not the real model's figure."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from fake_hub import FakeHub
from tiny_models import family_folder

REPO = Path(__file__).resolve().parents[1]
NAME = "bert-base-uncased"
pytestmark = pytest.mark.slow


def _env(home: Path, endpoint: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "BERTLAB_"))}
    env.update(HF_HOME=str(home), OMP_NUM_THREADS="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(REPO))
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    else:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/bertlab/api/status", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def test_download_once_online_then_serve_the_class_on_it_offline(tmp_path):
    home = tmp_path / "hf"
    with FakeHub({NAME: family_folder(tmp_path, "bert")}) as hub:
        done = subprocess.run([sys.executable, "-m", "bertlab.cli", "download", NAME], cwd=REPO,
                              env=_env(home, hub.endpoint), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{NAME}:" in done.stdout

    # Offline from here (HF_HUB_OFFLINE=1, the hub gone): the panel's figure for the model, from the cache.
    out = tmp_path / "classic_panel.json"
    scored = subprocess.run([sys.executable, "bench/bench_panel.py", "--model", NAME, "--out", str(out)], cwd=REPO,
                            env=_env(home), capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-2000:]
    (row,) = [r for r in json.loads(out.read_text())["rows"] if r["model"] == NAME]
    assert row["measured"] and row["total"] == 12 and 0 <= row["hits"] <= 12 and len(row["sentences"]) == 12

    # The dashboard a student's kernel builds on it, offline: its card says how it guesses the examples.
    code = ("from bertlab.panels.app import build_app; app = build_app('bert-base-uncased'); "
            "print(app.picker.card.value)")
    built = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(home), capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    assert f"<b>{NAME}</b>" in built.stdout and f"examples: {row['hits']} of 12 in its top 5" in built.stdout

    # The class server on it, offline: the kernels' warm parent loads it (it says so when it cannot).
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--class", "1", "--model", NAME, "--no-browser",
             "--port", str(port), "--class-dir", str(tmp_path / "class")],
            cwd=REPO, env=_env(home), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            st = _status(port)
            if st is not None and st["pool"]["ready"] >= 1:
                break
            time.sleep(2)
        else:
            pytest.fail(f"no kernel ready within 300 s:\n{log.read_text()[-3000:]}")
        text = log.read_text()
        assert "was not preloaded" not in text and "Traceback" not in text, text[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not re.search(r"huggingface\.co", log.read_text())  # nothing asked of the real hub
