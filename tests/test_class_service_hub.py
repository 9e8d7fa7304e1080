"""The class service through a real JupyterHub on loopback (the repository's deploy/jupyterhub config,
as tests/test_jupyterhub.py starts it): the hub starts the service, two students' servers and the
teacher's are spawned, and each one's kernel-side client talks to the service with that server's own
token and the address the hub gave it. The teacher pushes; both students' clients receive it; both
guesses reach the teacher's histogram; a student's push is refused by the hub's identity; two
students' training runs share one queue (order, places). Then in Chromium the teacher's view and both
students' dashboards, each from its own server: the teacher's push appears on both pages, the guesses
typed there reach the teacher's histogram, and the reveal comes back to both.

Needs JupyterHub and configurable-http-proxy (skipped without them, except in CI); the browser test
also Chromium and Playwright. Fast unit tests of the same service without a hub: tests/test_class_service.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_jupyterhub import CHROMIUM_ARGS, HUB_START_S, PAGE_S, Hub, _environ, _missing, _stop, need_hub, start_hub

from bertlab import settings
from bertlab.classroom.questions import tally
from bertlab.classroom.remote import RemoteClassStore
from bertlab.classroom.store import Question
from bertlab.service_client import ClassServiceError, ServiceClient
from bertlab.training.queue import RemoteQueue

STUDENTS = ("alice", "bob")
TEACHER = "tess"
SERVER_S = 180  # a student's Jupyter server with Voila's extension, on 2 busy cores
TEACHERS = f'\nc.JupyterHub.load_groups = {{"teachers": {{"users": [{TEACHER!r}]}}}}\n'
QUESTION = Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.4), ("floor", 0.2)])
# A student's kernel, as a separate process with the server's environment: the store the settings pick.
KERNEL = """
import json, sys
from bertlab.classroom.remote import open_store
store = open_store()
q = store.current()
print(json.dumps({"store": type(store).__name__, "question": None if q is None else [q.id, q.text]}))
if q is not None:
    store.answer(q.id, "page", sys.argv[1])
"""


@pytest.fixture(scope="module")
def class_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    need_hub()
    tmp = tmp_path_factory.mktemp("class-hub")
    h = start_hub(tmp, users=(*STUDENTS, TEACHER), extra_config=TEACHERS, env_extra={"BERTLAB_QUEUE_SLOTS": "1"})
    try:
        _wait_for_service(h)
        yield h
    finally:
        _stop(h, tmp / "proxy.pid")


def _wait_for_service(h: Hub) -> None:
    import requests

    deadline = time.monotonic() + HUB_START_S
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{h.class_service}health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"the class service did not answer within {HUB_START_S} s:\n{h.log.read_text()[-3000:]}")


def _spawn(h: Hub, name: str) -> dict[str, str]:
    """Start `name`'s server through the hub's API; its environment, which its kernels inherit."""
    import requests

    if h.api(f"users/{name}")["servers"].get("", {}).get("ready"):  # started by an earlier test
        return _environ(h.server_pid(name))
    headers = {"Authorization": f"token {h.token}"}
    r = requests.post(f"{h.url}hub/api/users/{name}/server", headers=headers, timeout=30)
    assert r.status_code in (201, 202), f"{name}: HTTP {r.status_code} {r.text[:300]}"
    deadline = time.monotonic() + SERVER_S
    while not h.api(f"users/{name}")["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"{name}'s server did not start:\n{h.log.read_text()[-3000:]}"
        time.sleep(1)
    pid = h.server_pid(name)
    h.pids.add(pid)
    return _environ(pid)


@pytest.mark.slow
def test_the_teacher_pushes_both_students_answer_and_their_runs_share_one_queue(class_hub: Hub):
    envs = {name: _spawn(class_hub, name) for name in (*STUDENTS, TEACHER)}
    for name, env in envs.items():
        assert env["BERTLAB_CLASS_SERVICE_URL"] == class_hub.class_service and env["JUPYTERHUB_USER"] == name
        assert (class_hub.home / name / "teacher.ipynb").is_symlink() == (name == TEACHER)  # the teacher's view
    clients = {name: ServiceClient(*settings.class_service(env)) for name, env in envs.items()}
    assert {name: c.call("GET", "api/me")["teacher"] for name, c in clients.items()} == \
        {"alice": False, "bob": False, "tess": True}  # the hub's group, through the servers' own tokens

    teacher = RemoteClassStore(clients[TEACHER])
    with pytest.raises(ClassServiceError) as refused:
        RemoteClassStore(clients["alice"]).push(QUESTION)
    assert refused.value.status == 403
    q = teacher.push(QUESTION)
    assert teacher.changed()

    for name, guess in zip(STUDENTS, ("mat", "floor")):  # each student's kernel: a process with its server's env
        out = subprocess.run([sys.executable, "-c", KERNEL, guess], env=_kernel_env(envs[name]),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen == {"store": "RemoteClassStore", "question": [q.id, QUESTION.text]}
    assert teacher.changed()
    assert tally(teacher.answers(q.id)) == [("floor", 1), ("mat", 1)]  # the teacher's histogram
    with pytest.raises(ClassServiceError):  # a student's token cannot answer as the other student
        clients["alice"].call("POST", f"api/questions/{q.id}/answers", {"guess": "rug", "student": "bob"})
    teacher.reveal(q.id)
    assert RemoteClassStore(clients["bob"]).current().revealed
    teacher.end(q.id)
    assert RemoteClassStore(clients["bob"]).current() is None

    queues = {name: RemoteQueue(clients[name], poll_s=0.1) for name in STUDENTS}
    first, second = queues["alice"].join("alice: SST-2"), queues["bob"].join("bob: SST-2")
    assert first.wait()
    places: list[int] = []
    waiting = threading.Thread(target=lambda: second.wait(on_place=places.append), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    while places != [1]:
        assert time.monotonic() < deadline, f"bob's places: {places}"
        time.sleep(0.05)
    assert queues["bob"].entries() == [(first.id, "alice: SST-2", "running"), (second.id, "bob: SST-2", "waiting")]
    first.leave()
    waiting.join(30)
    assert not waiting.is_alive() and queues["alice"].entries() == [(second.id, "bob: SST-2", "running")]
    second.leave()
    assert Path(class_hub.home.parent / "state" / "bertlab-class.sqlite").is_file()  # the service's own file


def _kernel_env(server_env: dict[str, str]) -> dict[str, str]:
    """The server's environment with this checkout importable (the kernel imports bertlab)."""
    import bertlab

    env = dict(server_env)
    env["PYTHONPATH"] = str(Path(bertlab.__file__).resolve().parents[1])
    return env


@pytest.mark.slow
@pytest.mark.browser
def test_the_teachers_page_pushes_to_both_students_pages_and_their_guesses_come_back(class_hub: Hub):
    """All in Chromium, each from its own server: the teacher's view (teacher.ipynb, linked into the
    teacher's home) pushes, both students' dashboards show the question, the guesses typed there reach
    the teacher's histogram, and the teacher's reveal reaches both."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    envs = {name: _spawn(class_hub, name) for name in (*STUDENTS, TEACHER)}
    service = RemoteClassStore(ServiceClient(*settings.class_service(envs[TEACHER])))
    guesses = dict(zip(STUDENTS, ("store", "<b>shop</b>")))

    def drive() -> None:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            try:
                teacher = _open_page(browser, class_hub, TEACHER, "teacher.ipynb", ".bertlab-teacher")
                assert teacher.locator(".bertlab-class-queue").is_visible()  # the class queue under the view
                pages = {name: _open_page(browser, class_hub, name) for name in STUDENTS}
                teacher.get_by_role("button", name="Push to the class").click()
                teacher.wait_for_selector(".bertlab-answer-count")
                for name, page in pages.items():
                    box = page.locator(".bertlab-class-question")
                    box.get_by_text("to keep it cold").wait_for(timeout=60_000)  # the page's kernel polls
                    assert page.locator(".bertlab-mask-guesses").is_hidden()  # predict first
                    box.locator("input[type=text]").fill(guesses[name])
                    box.get_by_role("button", name="Send").click()
                    page.get_by_text("You can change it until the teacher reveals").wait_for(timeout=60_000)
                teacher.wait_for_function(  # the teacher's histogram counts both
                    "() => document.querySelector('.bertlab-answer-count')?.textContent === '2'", timeout=60_000)
                q = service.current()
                assert tally(service.answers(q.id)) == [("<b>shop</b>", 1), ("store", 1)]
                teacher.get_by_role("button", name="Reveal to all").click()
                for name, page in pages.items():  # the reveal reaches both pages; a typed tag stays text
                    box = page.locator(".bertlab-class-question")
                    box.get_by_text(f"You guessed '{guesses[name]}'").wait_for(timeout=60_000)
                    page.wait_for_function("() => document.querySelector('.bertlab-class-question .js-plotly-plot')")
            finally:
                browser.close()

    # In a thread of its own, as tests/test_jupyterhub.py does (the browser tests' sync_playwright).
    with ThreadPoolExecutor(1) as pool:
        pool.submit(drive).result()


def _open_page(browser, h: Hub, name: str, notebook: str = "bertlab.ipynb", ready: str = ".bertlab-tabs"):
    """Log in with the hub's form in a context of its own (its own cookies), straight to `notebook` in
    the user's server, and wait for its `ready` element."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(PAGE_S * 1000)
    page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/])"), lambda route: route.abort())  # nothing leaves loopback
    target = f"/user/{name}/voila/render/{notebook}"
    page.goto(f"{h.url}hub/login?next={target}")
    page.fill("#username_input", name)
    page.fill("#password_input", h.password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(re.escape(target)))
    page.locator(ready).first.wait_for(state="visible")
    return page
