"""Request handlers the class server adds to Voila's: the page (with a "class is full" answer, a
limit of seats per client address, and the cookies Voila's tab-closing request needs), kernel
shutdown by the page that owns the kernel only, and a status report."""

from __future__ import annotations

import json
import posixpath
import re
import secrets
from pathlib import Path

import plotly
import tornado.web
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.auth.logout import LogoutHandler
from jupyter_server.base.handlers import APIHandler
from jupyter_server.services.kernels.handlers import KernelHandler
from jupyter_server.utils import url_path_join
from voila.shutdown_kernel_handler import VoilaShutdownKernelHandler
from voila.static_file_handler import TemplateStaticFileHandler
from voila.tornado.handler import TornadoVoilaHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

from bertlab.serving import SEAT_PATH
from bertlab.serving.kernels import PAGE_REQUEST, ClassFullError, PageRequest

RETRY_AFTER_S = 60
# plotly's FigureWidget code (plotly.js inside), read from the installed package, never copied.
PLOTLY_BUNDLE = Path(plotly.__file__).resolve().parent / "package_data" / "widgetbundle.js"

CLASS_FULL_PAGE = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{RETRY_AFTER_S}">
<title>bertlab: the class is full</title>
<style>body{{font-family:sans-serif;max-width:36em;margin:4em auto;line-height:1.5;color:#222}}</style>
</head><body>
<h1>The class is full — try again in a minute</h1>
<p>Every seat on this bertlab server is taken right now. A seat frees up when someone closes
their tab. This page tries again by itself in a minute; you can also reload it.</p>
<p>Teacher: more seats with <code>bertlab serve --class N --max-kernels M</code>, if the machine has the memory.</p>
</body></html>
"""


RETRY_SEATS_S = 30
TOO_MANY_PAGES = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{RETRY_SEATS_S}">
<title>bertlab: too many pages from your address</title>
<style>body{{font-family:sans-serif;max-width:36em;margin:4em auto;line-height:1.5;color:#222}}</style>
</head><body>
<h1>Too many bertlab pages from your address</h1>
<p>Pages from your computer's address already hold {{limit}} seat(s) on this server. Close a bertlab tab
you do not use (its seat frees at once), then reload this page; it also tries again by itself.</p>
<p>Teacher: if the whole class reaches the server through one address (a school network's NAT or a
proxy), allow more pages per address with <code>bertlab serve --per-client N</code> (0: no limit).</p>
</body></html>
"""
# The page's proof that it owns its kernel: one cookie per route that can end, reach or keep the kernel,
# each scoped to that kernel's path (a browser sends it there only; a reload's new kernel gets its own).
CLOSE_COOKIE, KERNEL_COOKIE, HELLO_COOKIE = "bertlab_seat_close", "bertlab_seat", "bertlab_seat_hello"
# The browser's workspace key (bertlab.workspace.Workspace.adopt): random, HttpOnly, sent to the page's kernel
# as this request header (Voila's `http_header_envs`), so that a reloaded page finds the runs of the last one.
WORKSPACE_COOKIE, WORKSPACE_HEADER = "bertlab_workspace", "X-Bertlab-Workspace"
WORKSPACE_DAYS = 1  # a lesson's day; the next day's first page starts a new workspace
_WORKSPACE_KEY = re.compile(r"[0-9a-f]{64}")


class ClassPageHandler(TornadoVoilaHandler):
    """Voila's page, answering "the class is full" (503) instead of starting a kernel over the cap, and
    "too many pages" (429) to a client address that already holds its share of seats. The page that
    gets a kernel gets its owner's cookie, scoped to that kernel's shutdown and API paths."""

    @tornado.web.authenticated
    async def get(self, path: str | None = None) -> None:
        # Voila's page sends this cookie back when its tab closes (`/voila/api/shutdown/<id>`):
        # without it that request is refused and the kernel lives on until culled (voila#1458).
        self.xsrf_token  # noqa: B018 (reading it sets the cookie)
        if not path and not self.kernel_manager.can_serve(self.notebook_path):
            return self._class_full()
        if not path and self.kernel_manager.client_full(self.request.remote_ip):
            return self._too_many_pages()
        if not path:
            self._workspace_key()
        page = PAGE_REQUEST.set(PageRequest(self.request.remote_ip, self._set_owner_cookies))
        try:
            await super().get(path)
        except ClassFullError:  # a race with another page for the last seat: nothing written yet
            self._class_full()
        finally:
            PAGE_REQUEST.reset(page)

    def _workspace_key(self) -> None:
        """The browser's workspace key (a new one in a new cookie if it has none), put in the request's
        header for Voila to hand to the kernel; whatever header the client sent is replaced."""
        key = self.get_cookie(WORKSPACE_COOKIE, "")
        if not _WORKSPACE_KEY.fullmatch(key):
            key = secrets.token_hex(32)
            self.set_cookie(WORKSPACE_COOKIE, key, path=self.base_url, httponly=True, samesite="Strict",
                            expires_days=WORKSPACE_DAYS)
        self.request.headers[WORKSPACE_HEADER] = key

    def _set_owner_cookies(self, kernel_id: str, secret: str) -> None:
        self._seat_kernel = kernel_id
        for name, path in owner_cookies(self.base_url, kernel_id):
            self.set_cookie(name, secret, path=path, httponly=True, samesite="Strict")

    def on_finish(self) -> None:
        self._page_sent()
        super().on_finish()

    def on_connection_close(self) -> None:
        self._page_sent()
        super().on_connection_close()

    def _page_sent(self) -> None:
        """The page is out (or its client left): its kernel now waits a few seconds for the page to run."""
        kernel_id = getattr(self, "_seat_kernel", None)
        if kernel_id is not None:
            self._seat_kernel = None
            self.kernel_manager.page_sent(kernel_id)

    def _too_many_pages(self) -> None:
        limit = self.kernel_manager.max_per_client
        self.log.warning("%s holds %s kernel(s): page refused", self.request.remote_ip, limit)
        self.set_status(429)
        self.set_header("Retry-After", str(RETRY_SEATS_S))
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(TOO_MANY_PAGES.replace("{limit}", str(limit)))

    def _class_full(self) -> None:
        self.log.warning("class is full: %s", self.kernel_manager.class_status())
        self.set_status(503)
        self.set_header("Retry-After", str(RETRY_AFTER_S))
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(CLASS_FULL_PAGE)


def owner_cookies(base_url: str, kernel_id: str) -> tuple[tuple[str, str], ...]:
    """(name, path) of a kernel's owner cookies: the page's tab-closing request, the kernel's REST
    path (its websocket lies under it) and the page's "I run" request (seat_hello.js)."""
    return ((CLOSE_COOKIE, url_path_join(base_url, "voila/api/shutdown", kernel_id)),
            (KERNEL_COOKIE, url_path_join(base_url, "api/kernels", kernel_id)),
            (HELLO_COOKIE, url_path_join(base_url, SEAT_PATH, kernel_id)))


class OwnerOnly:
    """Mixed into a handler that ends, reaches or keeps a kernel: only a request carrying the kernel's owner
    cookie (`owner_cookie`, the one scoped to the handler's path) may."""

    owner_cookie = KERNEL_COOKIE

    def refuse_stranger(self, kernel_id: str, action: str) -> None:
        """403 (`HTTPError`) when `kernel_id` was handed to a page and this request is not from it. A kernel
        no page holds (one started through the REST API) stays open to any logged-in request, as in Voila."""
        km = self.kernel_manager
        if km.seated(kernel_id) and not km.owns(kernel_id, self.get_cookie(self.owner_cookie)):
            self.log.warning("refused to %s kernel %s: not from the page that holds it", action, kernel_id)
            raise tornado.web.HTTPError(403, f"only the page that opened this kernel can {action} it")

    def refuse_unless_owner(self, kernel_id: str) -> bool:
        """True (after answering 403) when the request does not come from the page that owns `kernel_id`."""
        if self.kernel_manager.owns(kernel_id, self.get_cookie(self.owner_cookie)):
            return False
        self.log.warning("refused to end kernel %s: the request is not from the page that owns it", kernel_id)
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish("403 Forbidden: only the page that opened this kernel can shut it down.\n")
        return True


class OwnerShutdownHandler(OwnerOnly, VoilaShutdownKernelHandler):
    """Voila's tab-closing shutdown (`POST /voila/api/shutdown/<id>`), for the owner page only."""

    owner_cookie = CLOSE_COOKIE

    @tornado.web.authenticated
    async def post(self, kernel_id: str) -> None:
        if not self.refuse_unless_owner(kernel_id):
            await super().post(kernel_id)


class OwnerKernelHandler(OwnerOnly, KernelHandler):
    """jupyter_server's `/api/kernels/<id>`: GET as usual, DELETE for the owner page only."""

    @tornado.web.authenticated
    async def delete(self, kernel_id: str) -> None:
        if not self.refuse_unless_owner(kernel_id):
            await super().delete(kernel_id)


class SeatHandler(OwnerOnly, APIHandler):
    """POST /bertlab/api/seat/<kernel id>: the page's first script says it runs in a browser, so its
    kernel is kept while the rest of the page loads (a plain request that never runs it loses the kernel
    within seconds: `ClassKernels.page_sent`). Only the page the kernel was handed to may say so (its
    owner cookie for this path); anyone else gets 403 and changes nothing. Answers 204, also for a
    kernel that is gone."""

    owner_cookie = HELLO_COOKIE

    @tornado.web.authenticated
    def post(self, kernel_id: str) -> None:
        self.refuse_stranger(kernel_id, "keep")
        self.kernel_manager.page_seen(kernel_id)
        self.set_status(204)
        self.finish()


class SeenKernelWebsocketHandler(OwnerOnly, VoilaKernelWebsocketHandler):
    """The kernel's websocket (Voila's handler), for the page that holds the kernel only (its owner
    cookie; a kernel no page holds, e.g. one started through the REST API, is open as in Voila). A page
    opening it runs, even if its kernel is slow to answer the connection's first request on a busy
    server."""

    async def pre_get(self) -> None:
        self.refuse_stranger(self.kernel_id, "connect to")
        self.kernel_manager.page_seen(self.kernel_id)
        await super().pre_get()


class StatusHandler(APIHandler):
    """GET /bertlab/api/status: kernels alive, pages connected, the pool, the cap (JSON)."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        status = {**self.kernel_manager.class_status(), "class_size": self.settings.get("bertlab_class_size")}
        self.finish(json.dumps(status))


class PlotlyBundleHandler(tornado.web.StaticFileHandler):
    """plotly's widget code at one URL, so a page fetches and parses it once for all its figures
    (and the browser caches it), instead of each figure carrying all of it through the kernel's
    websocket and the browser evaluating it again (see SyncedFigureWidget in bertlab/viz/figure_widget.py)."""

    @classmethod
    def get_absolute_path(cls, root: str, path: str) -> str:
        return str(PLOTLY_BUNDLE)  # the route matches this one file only

    def set_extra_headers(self, path: str) -> None:
        self.set_header("Content-Type", "text/javascript; charset=utf-8")
        self.set_header("Cache-Control", "public, max-age=3600")


class TemplateFileHandler(TemplateStaticFileHandler):
    """Voila's `/voila/templates/<template>/static/<file>`, answering 404 to any other path. Voila's own
    handler meets one with a failed unpacking or assertion (e.g. `/voila/templates/..%2f..`): a 500 and
    a traceback in the teacher's terminal."""

    def parse_url_path(self, path: str) -> str:
        parts = path.split("/", 2)
        normal = posixpath.normpath(path).split("/", 2)  # what Voila's get_absolute_path reads
        if (len(parts) != 3 or parts[1] != "static" or parts[0] in ("", ".", "..")
                or normal[:2] != parts[:2] or len(normal) != 3):
            raise tornado.web.HTTPError(404)
        return super().parse_url_path(path)

    def validate_absolute_path(self, root: str, absolute_path: str) -> str | None:
        if not self.roots:  # no such template: Voila's handler would fail an assertion
            raise tornado.web.HTTPError(404)
        return super().validate_absolute_path(root, absolute_path)


class LogoutRedirectHandler(LogoutHandler):
    """`/logout`: forget the login and go back to the page (which asks for the password again when there
    is one). jupyter_server's handler renders a page template that Voila's server cannot draw (no static
    path): a 500 and a traceback in the teacher's terminal."""

    @allow_unauthenticated
    def get(self) -> None:
        self.identity_provider.clear_login_cookie(self)
        self.redirect(self.base_url)
