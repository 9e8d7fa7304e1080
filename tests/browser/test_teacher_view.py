"""The teacher's view in real browsers: `bertlab serve --class 2` serves the students'
dashboard and, at its own address and secret, the teacher's; the teacher pushes a [MASK] sentence,
two students (two browser contexts: separate cookies, separate kernels) answer, the teacher's
histogram counts them, and the reveal reaches both."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertlab.classroom.questions import same_sentence

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
START_S = 240  # two pre-heated student kernels and a server on 2 busy cores
GUESSES = ("store", "house")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def class_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(students' URL, teacher's URL with its secret) of `bertlab serve --class 2`."""
    port, teacher_port = _free_port(), _free_port()
    folder = tmp_path_factory.mktemp("class")
    log = folder / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTLAB_") or k == "BERTLAB_DATA"}
    env["HF_HUB_OFFLINE"] = "1"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--class", "2", "--no-browser", "--port", str(port),
             "--teacher-port", str(teacher_port), "--class-dir", str(folder / "class")],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_S
        teacher = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"bertlab serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            found = re.search(rf"http://\S+:{teacher_port}/\?token=\S+", log.read_text())
            teacher = found.group(0) if found else None
            if teacher and _listening(port) and _listening(teacher_port):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the class servers did not start within {START_S} s:\n{log.read_text()[-3000:]}")
        assert f":{port}/" not in teacher and "token=" in teacher
        yield f"http://127.0.0.1:{port}/", teacher
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _page(browser, url: str, ready: str, height: int = 1000):
    context = browser.new_context(viewport={"width": 1200, "height": height})
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(ready)
    return page


def _bars(page, scope: str, trace: int) -> dict[str, float]:
    """{label: value} of one bar trace of the first plotly figure under `scope`, as the browser draws it."""
    data = page.evaluate(f"""() => {{
        const gd = document.querySelector('{scope} .js-plotly-plot');
        return gd ? gd.data[{trace}] : null; }}""")
    return dict(zip(data["y"], data["x"])) if data and data.get("y") else {}


def test_teacher_pushes_students_answer_and_the_reveal_reaches_both(class_server, chromium_browser, screenshot_dirs):
    students_url, teacher_url = class_server
    # The students' token does not open the teacher's view: without the teacher's secret it is refused.
    bare = teacher_url.split("?")[0]
    anonymous = chromium_browser.new_context().new_page()
    anonymous.goto(bare, wait_until="domcontentloaded")
    assert "/login" in anonymous.url and anonymous.locator(".bertlab-teacher").count() == 0
    anonymous.context.close()

    teacher = _page(chromium_browser, teacher_url, ".bertlab-teacher", height=1100)
    students = [_page(chromium_browser, students_url, ".bertlab-tabs") for _ in range(2)]
    asked = teacher.locator(".bertlab-teacher textarea").first.input_value()
    for s in students:  # no question yet: no class box; the Mask tab shows its own sentence's guesses
        assert s.locator(".bertlab-class-question").is_hidden()
        s.wait_for_selector(".bertlab-mask-guesses .js-plotly-plot")
        shown = s.locator(".bertlab-tabs textarea").first.input_value()
        assert not same_sentence(shown, asked, "[MASK]"), shown  # the page-load default is not the question

    teacher.get_by_role("button", name="Push to the class").click()
    teacher.wait_for_selector(".bertlab-answer-count")
    for s in students:
        box = s.locator(".bertlab-class-question")
        box.wait_for(state="visible", timeout=60_000)  # the students' kernels poll the store
        # the sentence is its own widget message: it may reach the page a moment after the box shows
        s.wait_for_function("() => document.querySelector('.bertlab-class-question').innerText.includes('[MASK]')",
                            timeout=30_000)
        assert "[MASK]" in box.inner_text()
        # Predict first: the tab's own guesses and any model answer stay hidden until the student answers.
        assert s.locator(".bertlab-mask-guesses").is_hidden()
        assert box.locator(".js-plotly-plot").count() == 0

    for s, guess in zip(students, GUESSES):
        box = s.locator(".bertlab-class-question")
        box.locator("input[type=text]").fill(guess)
        if guess == GUESSES[0]:
            for d in screenshot_dirs:
                s.screenshot(path=str(d / "student-guess.png"), full_page=False)
        box.get_by_role("button", name="Send").click()
        s.get_by_text(f"Sent: '{guess}'").wait_for()

    # After the guess, the question's sentence typed into the Mask tab still shows no guess before the reveal.
    tab = students[0].locator(".bertlab-tabs textarea").first
    tab.fill(asked)
    students[0].get_by_role("button", name="Predict").click()
    students[0].get_by_text("held back until the teacher reveals it").wait_for(timeout=60_000)
    assert students[0].locator(".bertlab-mask-guesses .js-plotly-plot .ytick").count() == 0

    teacher.wait_for_function(
        "() => document.querySelector('.bertlab-answer-count')?.textContent === '2'", timeout=60_000)
    teacher.wait_for_function("""() => {
        const gd = document.querySelector('.bertlab-teacher .js-plotly-plot');
        return gd && gd.data[0].x && gd.data[0].x.length === 2; }""", timeout=60_000)
    assert _bars(teacher, ".bertlab-teacher", 0) == {g: 1 for g in GUESSES}  # the histogram counts both
    assert _bars(teacher, ".bertlab-teacher", 1) == {}  # the model's side stays hidden until the reveal

    teacher.get_by_role("button", name="Reveal to all").click()
    teacher.wait_for_function(
        "() => { const gd = document.querySelector('.bertlab-teacher .js-plotly-plot');"
        " return gd && gd.data[1].x && gd.data[1].x.length > 0; }")
    model = _bars(teacher, ".bertlab-teacher", 1)
    assert len(model) == 10 and abs(sum(model.values())) <= 1.0
    for s, guess in zip(students, GUESSES):
        box = s.locator(".bertlab-class-question")
        box.get_by_text(f"You guessed '{guess}'").wait_for(timeout=60_000)
        s.wait_for_function("() => document.querySelector('.bertlab-class-question .js-plotly-plot')")
        assert _bars(s, ".bertlab-class-question", 0) == {g: 1 for g in GUESSES}  # the class's guesses
        assert _bars(s, ".bertlab-class-question", 1) == model  # the model's answer, as the teacher's
        assert box.get_by_role("button", name="Change").is_disabled()  # answers closed
        assert s.locator(".bertlab-mask-guesses").is_visible()
    for d in screenshot_dirs:
        teacher.screenshot(path=str(d / "teacher-view.png"), full_page=True)
        students[1].screenshot(path=str(d / "student-reveal.png"), full_page=False)

    # Projector mode on the teacher's page: the histogram follows the theme (text x1.5, the page's width).
    font = ("() => parseFloat(getComputedStyle("
            "document.querySelector('.bertlab-teacher .js-plotly-plot .ytick text')).fontSize)")
    normal = teacher.evaluate(font)
    teacher.get_by_role("button", name="Projector mode").click()
    teacher.wait_for_function(f"() => ({font})() >= 1.4 * {normal}", timeout=60_000)
    assert _bars(teacher, ".bertlab-teacher", 0) == {g: 1 for g in GUESSES}  # the same answers, drawn larger
    for d in screenshot_dirs:
        teacher.screenshot(path=str(d / "teacher-view-projector.png"), full_page=True)
    for p in [teacher, *students]:
        p.context.close()
