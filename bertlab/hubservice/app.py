"""The class service's HTTP API: the class store's and the training queue's operations, each one
checked against the hub user whose token came with the request.

Who may do what (the hub says who the user is, through JupyterHub's `HubAuth`, and which groups they
are in):
- everyone with access to the service (`access:services!service=bertlab-class`): read the live
  question, answer it as themselves (one guess per hub user), queue their own runs, start, keep
  alive and leave their own entries, read the queue (without its owners' names);
- the teacher (a member of one of `teacher_groups`, or a hub admin when `admins_teach`): push, reveal
  and end questions, read the guesses before the reveal, cancel anyone's run, let a waiting run go first.

A student holds at most `MAX_ENTRIES_PER_USER` live queue entries (429 past that); ids, bodies and
values are checked before they reach the database, so a request curl can send gets a 4xx sentence,
never a server error.

Guesses are anonymous to everyone: the answers come back under numbers, not user names. The model's
answer reaches a student only with the reveal (a student's own server could ask the service directly).

    GET    health                         no token needed: {"ok": true}
    GET    api/me                         {"name", "teacher"}
    GET    api/version                    changes whenever what the caller reads changed
    GET    api/question                   {"question": {...} | null}; a student's without the model's answer
                                          until the reveal
    POST   api/questions                  teacher: {"kind", "text", "text_b", "model"} -> {"question"}
    POST   api/questions/ID/reveal|end    teacher
    GET    api/questions/ID/answers       teacher; a student once revealed -> {"answers": {n: guess}}
    POST   api/questions/ID/answers       {"guess", "student"?: own name} -> {"guess": as counted}
    GET    api/queue                      {"entries": [{"id", "label", "state", "mine", "owner"?}], "slots"}
    POST   api/queue                      {"label", "host", "pid", "started"} -> {"id"}
    POST   api/queue/ID/start|beat        the entry's owner -> {"ahead"} | {"alive"}
    DELETE api/queue/ID                   the entry's owner, or the teacher
    POST   api/queue/ID/cancel|first      teacher
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jupyterhub.services.auth import HubAuth, HubAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from tornado import web

from bertlab.classroom.store import (
    ClassStore,
    GuessError,
    Question,
    QuestionClosedError,
    question_from_json,
    question_json,
)
from bertlab.hubservice import DEFAULT_TEACHER_GROUPS
from bertlab.training.queue import ClassQueue

log = logging.getLogger(__name__)

ADMIN_CACHE_S = 60.0  # how long a looked-up admin flag is trusted
MAX_BODY_BYTES = 64 * 1024  # a question with its top-k answers is a few kB
MAX_ENTRIES_PER_USER = 3  # live queue entries one hub user may hold (a run per training panel)
MAX_ID = 2 ** 63 - 1  # SQLite's largest row id
MAX_PID = 2 ** 22  # Linux's largest process id (pid_max)


class ClassService:
    """The service's state: one SQLite file holding the class store and the queue, who teaches, and
    the version counters that `api/version` reports."""

    def __init__(self, db: str | Path, slots: int, hub_auth: HubAuth,
                 teacher_groups: Iterable[str] = DEFAULT_TEACHER_GROUPS, admins_teach: bool = True) -> None:
        self.store = ClassStore(db)
        self.queue = ClassQueue(db, slots)
        self.hub_auth = hub_auth
        self.teacher_groups, self.admins_teach = frozenset(teacher_groups), admins_teach
        self.boot = secrets.token_hex(4)  # a restarted service never repeats a version
        self.questions_version = 0  # push, reveal, end: what every page shows
        self.answers_version = 0  # a guess: what the teacher's histogram shows
        self._admins: dict[str, tuple[float, bool]] = {}

    def version(self, teacher: bool) -> str:
        answers = f".{self.answers_version}" if teacher else ""
        return f"{self.boot}.{self.questions_version}{answers}"

    async def is_teacher(self, user: dict[str, Any]) -> bool:
        """Whether the hub user `user` (HubAuth's model) teaches: in a teacher group, or an admin."""
        if user.get("kind", "user") != "user":
            return False
        if self.teacher_groups & set(user.get("groups") or ()):
            return True
        return self.admins_teach and await self._is_admin(user)

    async def _is_admin(self, user: dict[str, Any]) -> bool:
        """The admin flag: from the token's own model when it carries one, else asked of the hub with the
        service's token (a server's token may not read its owner's admin flag)."""
        if "admin" in user:
            return bool(user["admin"])
        name = user["name"]
        cached = self._admins.get(name)
        if cached is not None and time.monotonic() - cached[0] < ADMIN_CACHE_S:
            return cached[1]
        url = url_path_join(self.hub_auth.api_url, "users", quote(name, safe=""))
        try:
            model = await self.hub_auth._api_request("GET", url, allow_403=True)
        except web.HTTPError:
            log.warning("class service: could not ask the hub whether %s is an admin", name, exc_info=True)
            model = None
        admin = bool(model and model.get("admin"))
        self._admins[name] = (time.monotonic(), admin)
        return admin


class Refused(web.HTTPError):
    """A request the service turns down: `kind` and `message` go to the client as JSON."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(status, reason=None)
        self.kind, self.message = kind, message


class ServiceHandler(HubAuthenticated, web.RequestHandler):
    """Identifies the hub user of every request before the handler runs (`self.user`, `self.teacher`)."""

    def initialize(self, service: ClassService) -> None:
        self.service = service
        self.hub_auth = service.hub_auth
        self.user: dict[str, Any] = {}
        self.teacher = False

    async def prepare(self) -> None:
        model = await self.hub_auth.get_user(self, sync=False)
        if not model:
            raise Refused(403, "forbidden", "The class service needs a JupyterHub token (Authorization: token …): "
                                            "open the lab from the hub, whose servers carry one.")
        try:
            self.check_hub_user(model)
        except UserNotAllowed:
            raise Refused(403, "forbidden", f"{model.get('name', 'this token')!s} may not use the class service: "
                                            f"the hub grants {', '.join(sorted(self.hub_scopes or ()))} to its users "
                                            "and their servers' tokens (deploy/jupyterhub/bertlab_config.py); "
                                            "log in again, or ask the hub's admin.") from None
        self.user = model
        self.teacher = await self.service.is_teacher(model)

    @property
    def name(self) -> str:
        return str(self.user["name"])

    def require_teacher(self, what: str) -> None:
        if not self.teacher:
            admins = " nor a hub admin" if self.service.admins_teach else ""
            raise Refused(403, "forbidden", f"Only the teacher can {what}: {self.name} is not in the "
                                            f"teachers' group ({', '.join(sorted(self.service.teacher_groups))})"
                                            f"{admins}.")

    @staticmethod
    def row_id(text: str, what: str) -> int:
        """A path's id as a row id; one the database could not hold names nothing there (404)."""
        number = int(text)
        if number > MAX_ID:
            raise Refused(404, "not_found", f"There is no {what} {text[:20]}….")
        return number

    def body(self) -> dict[str, Any]:
        if len(self.request.body or b"") > MAX_BODY_BYTES:  # the HTTP server refuses these first (__main__)
            raise Refused(413, "too_large", f"The request's body is over {MAX_BODY_BYTES // 1024} kB: "
                                            "the class service takes questions, guesses and queue entries only.")
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise Refused(400, "invalid", "The request's body is not JSON.") from None
        if not isinstance(data, dict):
            raise Refused(400, "invalid", "The request's body must be a JSON object.")
        return data

    def reply(self, data: dict[str, Any]) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, Refused):
            kind, message = error.kind, error.message
        else:
            kind, message = "http", self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": kind, "message": message}))

    def check_xsrf_cookie(self) -> None:
        """Token-authenticated only (no cookies are read): nothing a browser could be tricked into sending."""


class HealthHandler(web.RequestHandler):
    def get(self) -> None:
        self.finish({"ok": True})


class MeHandler(ServiceHandler):
    def get(self) -> None:
        self.reply({"name": self.name, "teacher": self.teacher})


class VersionHandler(ServiceHandler):
    def get(self) -> None:
        self.reply({"version": self.service.version(self.teacher)})


class QuestionHandler(ServiceHandler):
    def get(self) -> None:
        q = self.service.store.current()
        self.reply({"question": None if q is None else self.shown(q)})

    def shown(self, q: Question) -> dict[str, Any]:
        """The question as this user may see it: a student's has no model probabilities until the reveal
        (a student's server can call the service itself; the answer must not be there to read), only
        the answers' names of a pair question, which are its two choices."""
        data = question_json(q)
        if not (self.teacher or q.revealed):
            data["model"] = [[answer, 0.0] for answer, _ in q.model] if q.kind == "nsp" else []
        return data


class PushHandler(ServiceHandler):
    def post(self) -> None:
        self.require_teacher("push a question")
        try:
            question = question_from_json(self.body())
            pushed = self.service.store.push(question)
        except ValueError as e:
            raise Refused(400, "invalid", str(e)) from None
        self.service.questions_version += 1
        log.info("class service: %s pushed question %s", self.name, pushed.id)
        self.reply({"question": question_json(pushed)})


class QuestionActionHandler(ServiceHandler):
    def post(self, qid: str, action: str) -> None:
        self.require_teacher(f"{action} a question")
        (self.service.store.reveal if action == "reveal" else self.service.store.end)(self.row_id(qid, "question"))
        self.service.questions_version += 1
        self.reply({})


class AnswersHandler(ServiceHandler):
    def get(self, qid: str) -> None:
        qid = self.row_id(qid, "question")
        if not self.teacher:
            q = self.service.store.current()
            if q is None or q.id != qid or not q.revealed:
                raise Refused(403, "forbidden", "The class's guesses are shown once the teacher reveals the answer.")
        guesses = self.service.store.answers(qid).values()
        self.reply({"answers": {str(n): guess for n, guess in enumerate(guesses, start=1)}})  # anonymous

    def post(self, qid: str) -> None:
        qid = self.row_id(qid, "question")
        data = self.body()
        student = data.get("student", self.name)
        if student != self.name:
            raise Refused(403, "forbidden", f"{self.name} can only answer as themselves, not as {str(student)[:40]!r}.")
        try:
            guess = self.service.store.answer(qid, self.name, str(data.get("guess", "")))
        except QuestionClosedError as e:
            raise Refused(409, "closed", str(e)) from None
        except GuessError as e:
            raise Refused(400, "guess", str(e)) from None
        self.service.answers_version += 1
        self.reply({"guess": guess})


class QueueHandler(ServiceHandler):
    def get(self) -> None:
        owners = self.service.queue.owners()
        entries = []
        for rid, label, state in self.service.queue.entries():
            entry = {"id": rid, "label": label, "state": state, "mine": owners.get(rid) == self.name}
            if self.teacher:
                entry["owner"] = owners.get(rid, "")
            entries.append(entry)
        self.reply({"entries": entries, "slots": self.service.queue.slots})

    def post(self) -> None:
        data = self.body()
        owner = data.get("owner", self.name)
        if owner != self.name:
            raise Refused(403, "forbidden", f"{self.name} can only queue runs of their own, not {str(owner)[:40]!r}'s.")
        pid, host, started = data.get("pid", 0), data.get("host", ""), data.get("started", "")
        label = data.get("label") or "a training run"
        if type(pid) is not int or not 0 <= pid <= MAX_PID:
            raise Refused(400, "invalid", f"pid must be a process id, a whole number from 0 to {MAX_PID}.")
        if not all(isinstance(v, str) for v in (label, host, started)):
            raise Refused(400, "invalid", "label, host and started must be text.")
        queue = self.service.queue
        owners = queue.owners()
        if sum(1 for rid, _, _ in queue.entries() if owners.get(rid) == self.name) >= MAX_ENTRIES_PER_USER:
            raise Refused(429, "busy", f"{self.name} already has {MAX_ENTRIES_PER_USER} runs in the class queue: "
                                       "let one finish, or cancel one, before starting another.")
        rid = queue.enter(label, owner=self.name, host=host or "?", pid=pid, started=started)
        self.reply({"id": rid})


class EntryHandler(ServiceHandler):
    def _entry(self, rid: str, teacher_may: bool = False) -> int:
        owner = self.service.queue.owner(self.row_id(rid, "run"))
        if owner is None:
            raise Refused(404, "not_found", f"There is no run {rid} in the class queue (it ended, or was dropped).")
        if owner != self.name and not (teacher_may and self.teacher):
            raise Refused(403, "forbidden", f"Run {rid} in the class queue is not {self.name}'s.")
        return int(rid)

    def post(self, rid: str, action: str | None = None) -> None:
        queue = self.service.queue
        if action is None:
            raise Refused(405, "method", "POST start, beat, cancel or first to a run; DELETE it to leave the queue.")
        if action in ("cancel", "first"):
            self.require_teacher("cancel or move another's run" if action == "cancel" else "move a run to the front")
            done = (queue.cancel if action == "cancel" else queue.first)(self._entry(rid, teacher_may=True))
            self.reply({"done": done})
        elif action == "start":
            if queue.owner(self.row_id(rid, "run")) is None:  # gone (expired): the place joins again, as on one machine
                self.reply({"ahead": -1})
                return
            self.reply({"ahead": queue.try_start(self._entry(rid))})
        else:
            if queue.owner(self.row_id(rid, "run")) is None:
                self.reply({"alive": False})
                return
            self.reply({"alive": queue.beat(self._entry(rid))})

    def delete(self, rid: str, action: str | None = None) -> None:
        if action is not None:
            raise Refused(405, "method", f"DELETE the run itself (api/queue/{rid[:20]}), not its {action}.")
        if self.service.queue.owner(self.row_id(rid, "run")) is not None:
            self.service.queue.leave(self._entry(rid, teacher_may=True))
        self.reply({})


def make_app(service: ClassService, base_url: str = "/") -> web.Application:
    """The tornado application serving `service` under `base_url` (the hub's /services/<name>/)."""
    base = base_url if base_url.endswith("/") else base_url + "/"

    def route(pattern: str, handler: type[web.RequestHandler]) -> tuple:
        return (url_path_join(base, pattern), handler, {} if handler is HealthHandler else {"service": service})

    return web.Application([
        route("", HealthHandler),  # the hub looks at the service's root when it routes the proxy to it
        route("health", HealthHandler),
        route("api/me", MeHandler),
        route("api/version", VersionHandler),
        route("api/question", QuestionHandler),
        route("api/questions", PushHandler),
        route(r"api/questions/(\d+)/(reveal|end)", QuestionActionHandler),
        route(r"api/questions/(\d+)/answers", AnswersHandler),
        route("api/queue", QueueHandler),
        route(r"api/queue/(\d+)/(start|beat|cancel|first)", EntryHandler),
        route(r"api/queue/(\d+)", EntryHandler),
    ])
