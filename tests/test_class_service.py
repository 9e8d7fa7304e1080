"""The class service for JupyterHub (bertlab.hubservice) without a hub: its handlers on a tornado server
on loopback, with JupyterHub's own HubAuth asking a stand-in for the hub's /api/user who owns each
token; the clients (bertlab.classroom.remote.RemoteClassStore, bertlab.training.queue.RemoteQueue)
talk to it over HTTP as students' kernels do.

The teacher pushes, both students see it and answer, the histogram counts both; a student cannot
push, reveal, end, read the guesses before the reveal, answer in another's name, or touch another's
run; the teacher cancels and reorders runs; guesses come back anonymous. The panels work unchanged on
the remote store. tests/test_class_service_hub.py does the same through a real hub.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hub_stub import ACCESS, SERVICE_TOKEN, serving, user
from jupyterhub.services.auth import HubAuth
from tornado.netutil import bind_sockets

from bertlab import settings
from bertlab.classroom.questions import tally
from bertlab.classroom.remote import RemoteClassStore, open_store
from bertlab.classroom.store import ClassStore, GuessError, Question, QuestionClosedError
from bertlab.hubservice import SERVICE_NAME
from bertlab.hubservice.app import ClassService, make_app
from bertlab.service_client import ClassServiceError, ServiceClient
from bertlab.training.queue import ClassQueue, RemoteQueue

PREFIX = f"/services/{SERVICE_NAME}/"
USERS = {  # token -> the model the hub's /api/user gives for it
    "t-tess": user("tess", groups=("teachers",)),
    "t-alice": user("alice", groups=("class-a",)),
    "t-bob": user("bob"),
    "t-ada": user("ada"),  # a hub admin (the service asks the hub)
    "t-eve": user("eve", scopes=("access:servers!user=eve",)),  # a hub user without access to the service
}
ADMINS = {"ada"}
MASK_Q = Question("mask", "The cat sat on the [MASK].", model=[("mat", 0.5), ("floor", 0.2)])


@dataclass
class Loopback:
    url: str  # the service's, as BERTLAB_CLASS_SERVICE_URL
    service: ClassService

    def client(self, user: str, token: str | None = None) -> ServiceClient:
        return ServiceClient(self.url, token or f"t-{user}", user)

    def store(self, user: str) -> RemoteClassStore:
        return RemoteClassStore(self.client(user))

    def queue(self, user: str) -> RemoteQueue:
        return RemoteQueue(self.client(user), poll_s=0.05)


def _serve(tmp_path, slots: int = 1, admins_teach: bool = True) -> Iterator[Loopback]:
    """The stand-in hub and the service, each on a free loopback port, in an event loop of their own."""
    made = {}

    def service_app(api_url: str) -> list:
        socks = bind_sockets(0, "127.0.0.1")
        auth = HubAuth(api_url=api_url, api_token=SERVICE_TOKEN, access_scopes={ACCESS}, base_url=PREFIX)
        service = ClassService(tmp_path / "class-service.sqlite", slots, auth, admins_teach=admins_teach)
        made["loopback"] = Loopback(f"http://127.0.0.1:{socks[0].getsockname()[1]}{PREFIX}", service)
        return [(make_app(service, PREFIX), socks)]

    with serving(service_app, USERS, ADMINS):
        yield made["loopback"]


@pytest.fixture
def loopback(tmp_path) -> Iterator[Loopback]:
    yield from _serve(tmp_path)


def _refused(call, status: int = 403, kind: str = "forbidden") -> ClassServiceError:
    with pytest.raises(ClassServiceError) as e:
        call()
    assert (e.value.status, e.value.kind) == (status, kind), str(e.value)
    assert str(e.value)  # a message to act on
    return e.value


# -- the class store ---------------------------------------------------------------------------------
def test_the_teacher_pushes_both_students_see_it_and_both_guesses_reach_the_histogram(loopback):
    teacher, alice, bob = loopback.store("tess"), loopback.store("alice"), loopback.store("bob")
    assert alice.current() is None and alice.changed() and not alice.changed()
    q = teacher.push(MASK_Q)
    assert q.id is not None and q.live and not q.revealed
    for student in (alice, bob):
        assert student.changed()
        seen = student.current()
        assert (seen.id, seen.kind, seen.text, seen.model) == (q.id, "mask", MASK_Q.text, [])  # no answer yet

    assert teacher.changed() and not teacher.changed()
    assert alice.answer(q.id, "page-id", "  Mat ") == "mat"  # counted as ClassStore counts it
    assert teacher.changed()  # the teacher's histogram hears of each guess
    assert not bob.changed()  # a student's page only of what it shows: the question
    bob.answer(q.id, "page-id", "floor")
    assert tally(teacher.answers(q.id)) == [("floor", 1), ("mat", 1)]
    assert set(loopback.service.store.answers(q.id)) == {"alice", "bob"}  # one guess per hub user

    alice.answer(q.id, "another-page", "rug")  # a second page of alice's replaces her guess
    assert tally(teacher.answers(q.id)) == [("floor", 1), ("rug", 1)]

    teacher.reveal(q.id)
    assert alice.changed() and alice.current().revealed
    with pytest.raises(QuestionClosedError):  # the store's own error, through HTTP
        bob.answer(q.id, "page-id", "mat")
    answers = bob.answers(q.id)  # a student sees the class's guesses after the reveal, anonymous
    assert sorted(answers.values()) == ["floor", "rug"] and not {"alice", "bob"} & set(answers)
    teacher.end(q.id)
    assert bob.changed() and bob.current() is None


def test_a_student_cannot_push_reveal_end_or_peek(loopback):
    teacher, alice = loopback.store("tess"), loopback.store("alice")
    message = _refused(lambda: alice.push(MASK_Q))
    assert "teacher" in str(message)
    q = teacher.push(MASK_Q)
    _refused(lambda: alice.reveal(q.id))
    _refused(lambda: alice.end(q.id))
    alice.answer(q.id, "page", "mat")
    _refused(lambda: alice.answers(q.id))  # the class's guesses before the reveal: teacher only
    assert not loopback.service.store.current().revealed and loopback.service.store.current().id == q.id


def test_the_models_answer_reaches_a_student_only_with_the_reveal(loopback):
    """A student's server can call the service itself: before the reveal the question it gets carries
    no model answer (a pair question: its two choices, no probabilities)."""
    teacher, alice = loopback.store("tess"), loopback.store("alice")
    q = teacher.push(MASK_Q)
    raw = loopback.client("alice").call("GET", "api/question")["question"]
    assert raw["model"] == [] and "mat" not in json.dumps(raw)
    assert teacher.current().model == MASK_Q.model  # the teacher's screen has it (for "peek")
    teacher.reveal(q.id)
    assert alice.current().model == MASK_Q.model

    pair = Question("nsp", "A man walks in.", "He sits down.", model=[("B follows A", 0.9), ("B is random", 0.1)])
    teacher.push(pair)
    assert alice.current().model == [("B follows A", 0.0), ("B is random", 0.0)]  # the choices, no verdict


def test_a_student_cannot_answer_as_someone_else(loopback):
    q = loopback.store("tess").push(MASK_Q)
    alice = loopback.client("alice")
    message = _refused(lambda: alice.call("POST", f"api/questions/{q.id}/answers", {"guess": "mat", "student": "bob"}))
    assert "alice" in str(message)
    assert loopback.service.store.answers(q.id) == {}


def test_a_bad_guess_and_a_bad_question_say_what_to_do(loopback):
    teacher, alice = loopback.store("tess"), loopback.store("alice")
    q = teacher.push(MASK_Q)
    with pytest.raises(GuessError, match="Type a guess"):
        alice.answer(q.id, "page", "   ")
    with pytest.raises(ValueError, match="kind"):
        teacher.push(Question("essay", "Write one."))  # type: ignore[arg-type]


def test_tokens_without_access_are_refused(loopback):
    refused = _refused(lambda: loopback.client("eve").call("GET", "api/question"))  # a user without the scope
    assert ACCESS in str(refused)  # what the hub's admin has to grant
    _refused(lambda: loopback.client("mallory", token="not-a-hub-token").call("GET", "api/question"))
    _refused(lambda: ServiceClient(loopback.url, "", "").call("GET", "api/question"))


def test_teachers_are_the_teacher_group_and_the_hub_admins(loopback):
    me = {name: loopback.client(name).call("GET", "api/me") for name in ("tess", "alice", "ada")}
    assert {name: m["teacher"] for name, m in me.items()} == {"tess": True, "alice": False, "ada": True}
    loopback.store("ada").push(MASK_Q)  # an admin, found by asking the hub with the service's token


def test_admins_teach_only_when_allowed(tmp_path):
    for lb in _serve(tmp_path, admins_teach=False):
        assert not lb.client("ada").call("GET", "api/me")["teacher"]
        _refused(lambda: lb.store("ada").push(MASK_Q))


def test_an_unreachable_service_says_so(tmp_path):
    store = RemoteClassStore(ServiceClient("http://127.0.0.1:9/", "t", "alice", timeout_s=2))
    with pytest.raises(ClassServiceError, match="does not answer") as e:
        store.current()
    assert e.value.kind == "unreachable"


# -- the training queue --------------------------------------------------------------------------------
def test_two_students_runs_share_one_queue_in_order(loopback):
    alice, bob = loopback.queue("alice"), loopback.queue("bob")
    first, second = alice.join("alice's run"), bob.join("bob's run")
    places: list[int] = []
    assert first.wait()  # one slot: alice's, who came first
    waiting = threading.Thread(target=lambda: second.wait(on_place=places.append), daemon=True)
    waiting.start()
    _until(lambda: places == [1])  # bob hears he is behind one run
    assert alice.entries() == [(first.id, "alice's run", "running"), (second.id, "bob's run", "waiting")]
    listed = loopback.client("bob").call("GET", "api/queue")["entries"]
    assert [e["mine"] for e in listed] == [False, True] and all("owner" not in e for e in listed)
    owners = [e["owner"] for e in loopback.client("tess").call("GET", "api/queue")["entries"]]
    assert owners == ["alice", "bob"]  # the teacher sees whose run is whose

    _refused(lambda: bob.leave(first.id))  # bob cannot end alice's run, nor start or beat it
    _refused(lambda: bob.try_start(first.id))
    _refused(lambda: bob.beat(first.id))
    first.leave()
    waiting.join(10)
    assert not waiting.is_alive() and bob.entries() == [(second.id, "bob's run", "running")]
    second.leave()
    assert alice.entries() == []


def test_a_student_cannot_queue_as_another(loopback):
    client = loopback.client("alice")
    _refused(lambda: client.call("POST", "api/queue", {"label": "x", "pid": 1, "owner": "bob"}))
    assert loopback.service.queue.entries() == []


def test_the_teacher_cancels_and_reorders_runs_and_a_student_cannot(loopback):
    alice, bob, teacher = loopback.queue("alice"), loopback.queue("bob"), loopback.queue("tess")
    running, a2, b1 = alice.join("a1"), alice.join("a2"), bob.join("b1")
    assert running.wait()
    _refused(lambda: alice.first(b1.id))
    _refused(lambda: alice.cancel(b1.id))
    teacher.first(b1.id)  # bob's run goes before alice's second
    assert [label for _, label, _ in teacher.entries()] == ["a1", "b1", "a2"]
    assert alice.try_start(a2.id) == 2 and bob.try_start(b1.id) == 1

    teacher.cancel(a2.id)  # a waiting run: its place leaves the queue at its next look
    assert a2.wait() is False and a2.cancelled_by_teacher
    cancel = threading.Event()
    running._cancel = cancel
    teacher.cancel(running.id)  # a running run: its heartbeat hears of it and asks the run to stop
    assert not alice.beat(running.id)
    assert b1.wait()  # the cancelled run's slot is free at once
    running.leave()
    b1.leave()
    assert teacher.entries() == []


def test_the_sqlite_queue_keeps_owners_and_reads_a_file_made_before_them(tmp_path):
    import sqlite3

    path = tmp_path / "queue.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL, host TEXT NOT NULL, "
               "pid INTEGER NOT NULL, started TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'waiting', "
               "heartbeat REAL NOT NULL)")
    db.commit()
    db.close()
    q = ClassQueue(path, slots=1)
    rid = q.enter("run", owner="alice")
    assert q.owner(rid) == "alice" and q.owners() == {rid: "alice"} and q.owner(rid + 1) is None
    assert q.try_start(rid) == 0


# -- choosing the backend, and the panels on it ----------------------------------------------------------
def test_the_service_url_chooses_the_remote_backends_and_sqlite_stays_the_default(loopback, tmp_path, monkeypatch):
    for name in ("BERTLAB_CLASS_SERVICE_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BERTLAB_CLASS_STORE", str(tmp_path / "class.sqlite"))
    monkeypatch.setenv("BERTLAB_QUEUE", str(tmp_path / "queue.sqlite"))
    monkeypatch.setenv("BERTLAB_QUEUE_SLOTS", "1")
    assert isinstance(open_store(), ClassStore) and isinstance(ClassQueue.from_env(), ClassQueue)

    monkeypatch.setenv("BERTLAB_CLASS_SERVICE_URL", loopback.url)
    with pytest.raises(ValueError, match="JUPYTERHUB_API_TOKEN"):
        settings.class_service()
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t-alice")
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    store, queue = open_store(), ClassQueue.from_env()
    assert isinstance(store, RemoteClassStore) and isinstance(queue, RemoteQueue)
    q = loopback.store("tess").push(MASK_Q)
    assert store.current().id == q.id
    place = queue.join("alice's run")
    assert place.wait() and loopback.service.queue.owner(place.id) == "alice"
    place.leave()


def test_the_panels_work_on_the_remote_store(loopback, default_model):
    """The teacher's panel and two students' Mask tabs, each on its own connection to the service."""
    from bertlab.panels.mask import MaskPanel
    from bertlab.panels.teacher import TeacherPanel

    teacher = TeacherPanel(*default_model, loopback.store("tess"), poll_s=None)
    students = {name: MaskPanel(*default_model, classroom=loopback.store(name), class_poll_s=None)
                for name in ("alice", "bob")}
    teacher.text.value = "The man went to the [MASK] to buy a gallon of milk."
    teacher.push_button.click()
    assert teacher.question is not None and teacher.question.id is not None
    for guess, panel in zip(("store", "<b>shop</b>"), students.values()):
        panel.class_box.poll()
        assert panel.class_box.question is not None and panel.class_box.question.id == teacher.question.id
        assert panel.answer_hold.note(teacher.question.text, "[MASK]") is not None  # held back until the reveal
        panel.class_box.input.value = guess
        panel.class_box.send()
        assert panel.class_box.guess == guess, panel.class_box.status.value
    teacher.refresh()
    assert sorted(teacher.counts) == [("<b>shop</b>", 1), ("store", 1)]
    teacher.reveal()
    for panel in students.values():
        panel.class_box.poll()
        assert panel.class_box.question.revealed and panel.class_box.figure_box.children
        assert "<b>shop</b>" not in json.dumps(panel.class_box.figure_box.children[0].to_dict())  # drawn escaped


def test_a_student_whose_run_the_teacher_cancels_is_told_why(loopback, monkeypatch):
    """A waiting run in a student's background job: the teacher cancels it, and the job ends with the
    message, not as if the student had pressed Cancel."""
    from bertlab.panels.runs import BackgroundRun

    monkeypatch.setenv("BERTLAB_CLASS_SERVICE_URL", loopback.url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t-bob")
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    ahead = loopback.queue("alice").join("alice's run")
    assert ahead.wait()
    places, errors, ran = [], [], []
    job = BackgroundRun("bertlab-test-run")
    job.start(lambda: ran.append(1), queue="bob's run", on_place=places.append, on_error=errors.append)
    _until(lambda: job.pump() or places == [1])  # callbacks run on this thread: pump them
    bob_entry = next(rid for rid, label, _ in loopback.queue("tess").entries() if label == "bob's run")
    loopback.queue("tess").cancel(bob_entry)
    assert job.wait(10)
    assert job.state == "error" and not ran and "teacher" in str(errors[0])
    ahead.leave()


def test_a_guess_the_service_cannot_take_says_so_in_the_box(loopback):
    from bertlab.panels.classroom import ClassQuestionBox

    loopback.store("tess").push(MASK_Q)
    box = ClassQuestionBox(loopback.store("alice"), "mask", poll_s=None, mask_token="[MASK]")
    box.poll()
    box.store.client.url = "http://127.0.0.1:9/"  # the service went away
    box.store.client.timeout_s = 2
    box.input.value = "mat"
    box.send()
    assert box.guess is None and "does not answer" in box.status.value


def test_the_teachers_queue_view_moves_and_cancels_runs_on_the_service(loopback):
    from bertlab.panels.class_queue import ClassQueueView

    alice, bob = loopback.queue("alice"), loopback.queue("bob")
    running, waiting, other = alice.join("a1"), alice.join("<b>a2</b>"), bob.join("b1")
    assert running.wait()
    view = ClassQueueView(loopback.queue("tess"), poll_s=None)
    assert [(label, owner) for _, label, _, owner in view.rows] == [("a1", "alice"), ("<b>a2</b>", "alice"),
                                                                    ("b1", "bob")]
    assert "&lt;b&gt;a2&lt;/b&gt;" in view.table.value and "<b>a2</b>" not in view.table.value  # drawn as text
    view.pick.value = other.id
    view.first_button.click()
    assert [label for _, label, _, _ in view.rows] == ["a1", "b1", "<b>a2</b>"]
    view.pick.value = waiting.id
    view.cancel_button.click()
    assert "Cancelled" in view.status.value and waiting.wait() is False and waiting.cancelled_by_teacher

    student_view = ClassQueueView(loopback.queue("alice"), poll_s=None)  # a student's token: no names, no buttons
    assert {owner for *_, owner in student_view.rows} == {""}
    student_view.pick.value = other.id
    student_view.cancel_button.click()
    assert "Only the teacher" in student_view.status.value and other.id in {e[0] for e in bob.entries()}
    for place in (running, other):
        place.leave()


def test_the_teachers_queue_view_on_one_servers_sqlite_queue(tmp_path):
    from bertlab.panels.class_queue import ClassQueueView

    q = ClassQueue(tmp_path / "queue.sqlite", slots=1)
    running, waiting = q.join("first"), q.join("second")
    assert running.wait()
    view = ClassQueueView(q, poll_s=None)
    view.pick.value = running.id
    view.first_button.click()
    assert "Only a waiting run" in view.status.value
    view.pick.value = waiting.id
    view.cancel_button.click()
    assert waiting.wait() is False and waiting.cancelled_by_teacher
    view.refresh()
    assert [label for _, label, _, _ in view.rows] == ["first"]
    running.leave()


def test_the_teachers_page_on_a_hub_has_the_service_store_and_the_queue(loopback, monkeypatch):
    import functools

    from bertlab.panels import teacher
    from bertlab.panels.class_queue import ClassQueueView

    made = {}

    def record(cls, *args, **kwargs):  # no polling threads left behind
        made[cls.__name__] = obj = cls(*args, **{**kwargs, "poll_s": None})
        return obj

    monkeypatch.setattr(teacher, "TeacherPanel", functools.partial(record, teacher.TeacherPanel))
    monkeypatch.setattr(teacher, "ClassQueueView", functools.partial(record, ClassQueueView))
    monkeypatch.delenv("BERTLAB_CLASS_STORE", raising=False)
    monkeypatch.setenv("BERTLAB_CLASS_SERVICE_URL", loopback.url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t-tess")
    monkeypatch.setenv("JUPYTERHUB_USER", "tess")
    page = teacher.teacher_view()
    assert isinstance(made["TeacherPanel"].store, RemoteClassStore)
    assert isinstance(made["ClassQueueView"].queue, RemoteQueue) and made["ClassQueueView"].widget in page.children


def test_a_page_opened_while_a_question_is_live_shows_it_at_once(loopback, default_model):
    from bertlab.panels.mask import MaskPanel

    loopback.store("tess").push(Question("mask", "The man went to the [MASK] to buy milk.", model=[("store", 0.5)]))
    panel = MaskPanel(*default_model, classroom=loopback.store("alice"), class_poll_s=None)
    box = panel.class_box
    assert box.question is not None and box.widget.layout.display != "none" and "buy milk" in box.prompt.value
    assert panel.fill_box.layout.display == "none"  # its own guesses wait for the student's
    assert "went wrong" not in panel.message.value  # no error from setting up while a question is live


def test_the_service_does_not_import_torch():
    code = "import sys, bertlab.hubservice.app, bertlab.hubservice.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- a hostile student, with their own server's token and curl ------------------------------------------
def _raw(loopback: Loopback, method: str, path: str, body: bytes | None = None,
         token: str = "t-bob") -> tuple[int, dict]:
    """One request as curl would send it: any path, any body; (status, the JSON reply)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(loopback.url + path, data=body, method=method,
                                 headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.parametrize("path", [
    "api/questions/99999999999999999999999999/answers",
    "api/queue/99999999999999999999999999",
    "api/queue/99999999999999999999999999/start",
    "api/queue/99999999999999999999999999/beat",
])
def test_an_id_too_large_for_the_database_is_not_found_not_a_server_error(loopback, path):
    for method, body in (("GET", None), ("POST", b"{}"), ("DELETE", None)):
        status, reply = _raw(loopback, method, path, body)
        assert status in (404, 405), (method, status, reply)
        if status == 404:
            assert reply.get("message"), reply


@pytest.mark.parametrize("body", [
    {"pid": 10 ** 30}, {"pid": [1]}, {"label": {"a": 1}}, {"host": ["x"] * 3}, {"started": 10 ** 400},
])
def test_a_queue_entry_with_values_of_the_wrong_kind_is_refused_in_a_sentence(loopback, body):
    status, reply = _raw(loopback, "POST", "api/queue", json.dumps(body).encode())
    assert status == 400 and reply["error"] == "invalid" and len(reply["message"]) < 200, (status, reply)


@pytest.mark.parametrize("body", [
    {"kind": 5, "text": "x"}, {"kind": "mask", "text": ["a"]}, {"kind": "mask", "text": "The [MASK].", "model": "mat"},
    {"kind": "mask", "text": "The [MASK].", "model": [[1, 2, 3]]}, {"kind": "mask", "text": "x" * 100_000},
])
def test_a_malformed_question_from_the_teacher_is_refused_not_a_server_error(loopback, body):
    status, reply = _raw(loopback, "POST", "api/questions", json.dumps(body).encode(), token="t-tess")
    assert status in (400, 413) and reply.get("message"), (status, reply)


def test_a_body_larger_than_the_service_takes_is_refused(loopback):
    status, reply = _raw(loopback, "POST", "api/queue", b'{"label": "' + b"x" * (1 << 20) + b'"}')
    assert status == 413 and reply.get("message"), (status, reply)


def test_one_student_cannot_fill_the_queue_ahead_of_the_class(loopback):
    """Entries are the student's own, but a loop of POSTs would put every later run behind theirs:
    a student holds a few entries at most, and the others still join."""
    from bertlab.hubservice.app import MAX_ENTRIES_PER_USER

    taken = [_raw(loopback, "POST", "api/queue", json.dumps({"label": f"run {i}"}).encode()) for i in range(12)]
    assert [s for s, _ in taken].count(200) == MAX_ENTRIES_PER_USER
    status, reply = taken[-1]
    assert status == 429 and reply["error"] == "busy" and "queue" in reply["message"], reply
    assert _raw(loopback, "POST", "api/queue", b'{"label": "alice run"}', token="t-alice")[0] == 200
    first = taken[0][1]["id"]  # leaving one makes room for another
    assert _raw(loopback, "DELETE", f"api/queue/{first}")[0] == 200
    assert _raw(loopback, "POST", "api/queue", b'{"label": "again"}')[0] == 200


@pytest.mark.parametrize("backend", ["service", "sqlite"])
def test_two_students_pressing_start_in_the_same_instant_get_one_slot_between_them(loopback, tmp_path, backend):
    """One slot, two students whose Start reaches the queue at the same moment (released together by a
    barrier, many times over): exactly one run starts, the other is told it is behind one."""
    if backend == "service":
        queues = [loopback.queue("alice"), loopback.queue("bob")]
    else:
        queues = [ClassQueue(tmp_path / "queue.sqlite", slots=1), ClassQueue(tmp_path / "queue.sqlite", slots=1)]
    for _ in range(15):
        ids = [q.enter(f"run {i}") for i, q in enumerate(queues)]
        barrier, answers = threading.Barrier(2), [None, None]

        def press(i: int) -> None:
            barrier.wait()
            answers[i] = queues[i].try_start(ids[i])

        threads = [threading.Thread(target=press, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(answers) == [0, 1], answers  # one runs, one waits behind it
        states = sorted(state for _, _, state in queues[0].entries())
        assert states == ["running", "waiting"]
        for q, rid in zip(queues, ids):
            q.leave(rid)
        assert queues[0].entries() == []
