"""`bertlab serve` answers odd routes without a traceback and starts without noise in the teacher's
terminal: a template path that is not `<template>/static/<file>` is a 404, `/logout` goes back to the
page, the command line uses no deprecated option form, and the shipped dashboard is trusted."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertlab.serving.plan import make_plan

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "apps" / "bertlab.ipynb"
ODD_TEMPLATE_PATHS = ["/voila/templates/..%2f..", "/voila/templates/..%2f..%2fetc%2fpasswd",
                      "/voila/templates/bertlab/static/..%2f..%2f..%2f..%2fx", "/voila/templates/nope/static/x.js",
                      "/voila/templates/bertlab/index.html.j2"]


def test_list_options_are_given_once_per_item():
    argv = make_plan(app=APP, port=9000, host="0.0.0.0", open_browser=False, class_size=None, preheat=True,
                     pool_size=None, max_kernels=None, cull_idle=40, token="t", password_hash=None,
                     allow_hosts=("lab.example.org", "pc.example.org")).argv()
    assert not [a for a in argv if "=[" in a]  # traitlets warns about "--X.y=['a']" at every start
    assert "--VoilaConfiguration.extension_denylist=jupyterlab-plotly" in argv
    assert [a for a in argv if a.startswith("--BertlabVoila.allowed_hosts=")] == [
        "--BertlabVoila.allowed_hosts=lab.example.org", "--BertlabVoila.allowed_hosts=pc.example.org"]


def test_the_shipped_dashboard_is_trusted_a_teachers_own_notebook_is_checked(tmp_path, caplog):
    from bertlab.serving.app import ShippedNotebooksTrusted

    shipped = ShippedNotebooksTrusted(root_dir=str(APP.parent))
    with caplog.at_level(logging.WARNING):
        nb = shipped.get(APP.name)["content"]
    assert "not trusted" not in caplog.text
    assert all(c.metadata.get("trusted") for c in nb.cells if c.cell_type == "code")
    own = tmp_path / "mine.ipynb"
    shutil.copy(APP, own)
    with caplog.at_level(logging.WARNING):
        ShippedNotebooksTrusted(root_dir=str(tmp_path)).get(own.name)
    assert "mine.ipynb is not trusted" in caplog.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_odd_routes_answer_404_or_a_redirect_and_the_log_stays_clean(tmp_path):
    import requests

    port, log = _free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bertlab.cli", "serve", "--no-browser", "--no-preheat",
                                 "--port", str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        for path in ODD_TEMPLATE_PATHS:
            assert requests.get(base + path, timeout=30).status_code == 404, path
        assert requests.get(base + "/voila/templates/lab/static/voila.js", timeout=30).status_code == 200
        r = requests.get(base + "/logout", allow_redirects=False, timeout=30)
        assert r.status_code == 302 and r.headers["Location"] == "/"
        assert requests.get(base + "/", timeout=240).status_code == 200  # the dashboard page (a kernel runs it)
        time.sleep(2)
        text = log.read_text()
        for noise in ("Traceback", "Uncaught exception", "DeprecationWarning", "is not trusted", " 500 "):
            assert noise not in text, f"{noise!r} in the server log:\n{text[-3000:]}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
