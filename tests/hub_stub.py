"""A stand-in for the two JupyterHub API calls the class service makes (bertlab.hubservice), so that
JupyterHub's own HubAuth runs against it on loopback: GET /hub/api/user (who owns this token, with
its groups and scopes) and GET /hub/api/users/NAME (the admin flag, for the service's own token).
Used by tests/test_class_service.py; tests/test_class_service_hub.py
uses a real hub."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

SERVICE_NAME = "bertlab-class"
ACCESS = f"access:services!service={SERVICE_NAME}"
SERVICE_TOKEN = "service-token"


def user(name: str, groups: tuple[str, ...] = (), scopes: tuple[str, ...] = (ACCESS,)) -> dict:
    """The model the hub's /api/user gives for a token of user `name` (no admin flag: a server's token
    cannot read it)."""
    return {"kind": "user", "name": name, "groups": list(groups), "scopes": list(scopes)}


def hub_app(users: dict[str, dict], admins: set[str]) -> web.Application:
    """The two calls, for `users` (token -> model) and `admins` (names)."""

    class User(web.RequestHandler):
        def get(self) -> None:
            token = self.request.headers.get("Authorization", "").split(" ")[-1]
            if token not in users:
                raise web.HTTPError(403)
            self.finish(json.dumps(users[token]))

    class Users(web.RequestHandler):
        def get(self, name: str) -> None:
            if self.request.headers.get("Authorization") != f"token {SERVICE_TOKEN}":
                raise web.HTTPError(403)
            self.finish(json.dumps({"kind": "user", "name": name, "admin": name in admins}))

    return web.Application([("/hub/api/user", User), (r"/hub/api/users/([^/]+)", Users)])


@contextmanager
def serving(make_apps: Callable[[str], list[tuple[web.Application, list]]], users: dict[str, dict],
            admins: set[str] = frozenset()) -> Iterator[str]:
    """The stand-in hub in an event loop of its own thread; yields its API URL (…/hub/api).
    `make_apps(api_url)` (called in that loop) gives more (application, bound sockets) pairs to serve
    there, e.g. the class service itself; it may be None."""
    ready, started = threading.Event(), {}
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            socks = bind_sockets(0, "127.0.0.1")
            HTTPServer(hub_app(users, admins)).add_sockets(socks)
            started["api"] = api = f"http://127.0.0.1:{socks[0].getsockname()[1]}/hub/api"
            for app, app_socks in (make_apps(api) if make_apps else []):
                HTTPServer(app).add_sockets(app_socks)
            ready.set()

        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "the stand-in hub did not start"
    try:
        yield started["api"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
