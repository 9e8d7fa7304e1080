"""The class store of the class service on JupyterHub (bertlab.hubservice), for student servers that
share no disk: the methods of `ClassStore`, each one request; the store's logic stays in the service.

    store = RemoteClassStore(ServiceClient(url, token, user))    # open_store() picks it from the settings

On the hub every guess is the hub user's (one per student, however many pages they open): the
service records it under the user its token belongs to, and refuses a guess sent in another's name.
"""

from __future__ import annotations

from bertlab import settings
from bertlab.classroom.store import (
    ClassStore,
    GuessError,
    Question,
    QuestionClosedError,
    QuestionStore,
    question_from_json,
    question_json,
)
from bertlab.service_client import ClassServiceError, ServiceClient


def open_store() -> QuestionStore | None:
    """This kernel's class store: the class service's when the hub set `BERTLAB_CLASS_SERVICE_URL`, else
    the SQLite file of `BERTLAB_CLASS_STORE` (`bertlab serve --class`), else None (no class)."""
    service = settings.class_service()
    if service is not None:
        return RemoteClassStore(ServiceClient(*service))
    path = settings.class_store_path()
    return None if path is None else ClassStore(path)


class RemoteClassStore:
    """`ClassStore`'s interface (`QuestionStore`) over HTTP to the class service."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client
        self._seen_version: str | None = None

    # -- the teacher (the service refuses anyone else) ----------------------------------------------
    def push(self, question: Question) -> Question:
        return question_from_json(self._call("POST", "api/questions", question_json(question))["question"])

    def reveal(self, question_id: int) -> None:
        self._call("POST", f"api/questions/{int(question_id)}/reveal")

    def end(self, question_id: int) -> None:
        self._call("POST", f"api/questions/{int(question_id)}/end")

    def answers(self, question_id: int) -> dict[str, str]:
        """{anonymous id: guess}: the teacher's at any time, a student's once the question is revealed."""
        return dict(self._call("GET", f"api/questions/{int(question_id)}/answers")["answers"])

    # -- everyone ------------------------------------------------------------------------------------
    def current(self) -> Question | None:
        q = self._call("GET", "api/question")["question"]
        return None if q is None else question_from_json(q)

    def changed(self) -> bool:
        """Whether the service's store changed since the last call (True on the first): one small request."""
        version = str(self._call("GET", "api/version")["version"])
        changed, self._seen_version = version != self._seen_version, version
        return changed

    def answer(self, question_id: int, student: str, guess: str) -> str:
        """Send the guess as this server's hub user (`student`, the page's id, stands for them on one
        server only); returns it as counted. GuessError / QuestionClosedError as `ClassStore.answer`."""
        body = {"guess": guess}
        if self.client.user:
            body["student"] = self.client.user
        return str(self._call("POST", f"api/questions/{int(question_id)}/answers", body)["guess"])

    def close(self) -> None:
        """Nothing to close: each call is its own request."""

    def another(self) -> RemoteClassStore:
        """A second handle on the service, whose `changed()` is its own."""
        return RemoteClassStore(self.client)

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            return self.client.call(method, path, body)
        except ClassServiceError as e:  # the store's own errors, as ClassStore raises them
            if e.kind == "closed":
                raise QuestionClosedError(str(e)) from None
            if e.kind == "guess":
                raise GuessError(str(e)) from None
            if e.kind == "invalid":
                raise ValueError(str(e)) from None
            raise
