"""Installing as a teacher would: the wheel built from this checkout, `pip install --user` into a
fresh user base, then `bertlab serve` from an empty folder with no repository on sys.path.

The lab's dependencies come from the environment running the tests (its site-packages on the
path as a plain folder, so its editable install of bertlab is not activated); bertlab itself must
come from the user base, which the test checks before serving.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.slow

PAGE_TIMEOUT_S = 300  # the page answers once the pre-heated kernel has run the dashboard notebook


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def user_install(tmp_path_factory, wheel) -> dict[str, str]:
    """The environment of a user who ran `pip install --user bert-classroom-lab`."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a virtual environment: its dependencies are lent to the base interpreter")
    tmp = tmp_path_factory.mktemp("install")
    base_python = getattr(sys, "_base_executable", sys.executable)
    userbase = tmp / "userbase"
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        PYTHONUSERBASE=str(userbase),
        PYTHONPATH=os.pathsep.join(sorted(deps)),
        JUPYTER_PATH=str(Path(sys.prefix) / "share" / "jupyter"),  # Voila's page templates
        PATH=os.pathsep.join([str(userbase / "bin"), "/usr/bin", "/bin"]),
        OMP_NUM_THREADS="1",
        PIP_BREAK_SYSTEM_PACKAGES="1",  # a Debian-style base interpreter refuses --user installs without it
    )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", base_python, "install", "--user", "--no-deps", "-q",
         "--no-warn-script-location", str(wheel)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (userbase / "bin" / "bertlab").is_file()
    return env


def test_the_user_install_is_the_one_imported(user_install, tmp_path):
    out = subprocess.run(["bertlab", "--version"], env=user_install, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["bertlab", "0.1.0"], out.stderr
    userbase = user_install["PYTHONUSERBASE"]
    python = (Path(userbase) / "bin" / "bertlab").read_text().splitlines()[0].removeprefix("#!")
    probe = "import bertlab, bertlab.cli as c; print(bertlab.__file__); print(c.find_app())"
    out = subprocess.run([python, "-c", probe], env=user_install, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    package, app = out.stdout.split()
    assert package.startswith(userbase) and app.startswith(userbase) and app.endswith("bertlab/apps/bertlab.ipynb")


def test_notebooks_come_out_of_the_user_install(user_install, tmp_path):
    out = subprocess.run(["bertlab", "notebooks", "lessons"], env=user_install, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    copied = sorted((tmp_path / "lessons").glob("*.ipynb"))
    assert len(copied) == len(out.stdout.splitlines()) >= 5
    assert all(json.loads(p.read_text())["cells"] for p in copied)


def test_serve_from_an_empty_folder_shows_the_dashboard(user_install, tmp_path):
    """The page answers 200 with the dashboard's widget, built by a kernel that ran the installed notebook."""
    port = _free_port()
    log = tmp_path / "serve.log"
    folder = tmp_path / "empty"
    folder.mkdir()
    env = {**user_install, "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(["bertlab", "serve", "--no-browser", "--port", str(port)], env=env, cwd=folder,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        page, deadline = None, time.monotonic() + PAGE_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                page = requests.get(f"http://127.0.0.1:{port}/", timeout=PAGE_TIMEOUT_S)
                break
            except requests.ConnectionError:
                time.sleep(1)
        assert page is not None, f"no page: {log.read_text()[-3000:]}"
        assert page.status_code == 200, log.read_text()[-3000:]
        assert "application/vnd.jupyter.widget-view+json" in page.text, log.read_text()[-3000:]
        assert '"output_type": "error"' not in page.text
        assert "site-packages/bertlab/apps/bertlab.ipynb" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
