"""JSON over HTTP to the class service on JupyterHub (bertlab.hubservice), with the hub's token.

The one place that speaks to the service: the class store's remote backend
(bertlab.classroom.remote) and the training queue's (bertlab.training.queue.RemoteQueue) call it.
Standard library only, so a student's kernel needs nothing more.

    client = ServiceClient(url, token, user)     # settings.class_service() gives the three
    client.call("GET", "api/question")           # -> the JSON answer, a dict
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

TIMEOUT_S = 10.0


class ClassServiceError(OSError):
    """The class service refused a request or could not be reached. `kind` is the service's word for
    why ("forbidden", "closed", "guess", "invalid", "not_found"; "unreachable" when there was no answer),
    `status` the HTTP status (0 without an answer); the message says what to do."""

    def __init__(self, message: str, kind: str = "unreachable", status: int = 0) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status

    def __str__(self) -> str:
        return str(self.args[0])


class ServiceClient:
    """Requests to the class service at `url` (ending in /) as the owner of `token`."""

    def __init__(self, url: str, token: str, user: str = "", timeout_s: float = TIMEOUT_S) -> None:
        self.url, self.user, self.timeout_s = url if url.endswith("/") else url + "/", user, timeout_s
        self._headers = {"Authorization": f"token {token}", "Content-Type": "application/json",
                         "Accept": "application/json"}

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """The service's JSON answer to `method path` (relative to the service's URL). Raises
        ClassServiceError with the service's message when it refuses, or when it cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raise _refusal(e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ClassServiceError(f"The class service at {self.url} does not answer ({reason}). Reload the page "
                                    "in a minute; if it goes on, tell the teacher (the hub's bertlab-class "
                                    "service may be stopped).") from None
        return json.loads(raw) if raw else {}


def _refusal(e: urllib.error.HTTPError) -> ClassServiceError:
    """The service's own message for an HTTP error (its JSON body), or one made from the status."""
    try:
        body = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    kind = str(body.get("error") or ("forbidden" if e.code in (401, 403) else "http"))
    message = str(body.get("message") or "")
    if not message:
        message = (f"The class service refused this ({e.code} {e.reason}): log in to the hub again, or ask the "
                   "teacher to give your account access to the bertlab-class service."
                   if e.code in (401, 403) else f"The class service answered {e.code} {e.reason}.")
    return ClassServiceError(message, kind, e.code)
