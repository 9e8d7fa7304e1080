"""Request handlers the class server adds to Voila's: the page (with a "class is full" answer and
the cookie Voila's tab-closing request needs) and a status report."""

from __future__ import annotations

import json
from pathlib import Path

import plotly
import tornado.web
from jupyter_server.base.handlers import APIHandler
from voila.tornado.handler import TornadoVoilaHandler

from bertlab.serving.kernels import ClassFullError

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


class ClassPageHandler(TornadoVoilaHandler):
    """Voila's page, answering "the class is full" (503) instead of starting a kernel over the cap."""

    @tornado.web.authenticated
    async def get(self, path: str | None = None) -> None:
        # Voila's page sends this cookie back when its tab closes (`/voila/api/shutdown/<id>`):
        # without it that request is refused and the kernel lives on until culled (voila#1458).
        self.xsrf_token  # noqa: B018 (reading it sets the cookie)
        if not path and not self.kernel_manager.can_serve(self.notebook_path):
            return self._class_full()
        try:
            await super().get(path)
        except ClassFullError:  # a race with another page for the last seat: nothing written yet
            self._class_full()

    def _class_full(self) -> None:
        self.log.warning("class is full: %s", self.kernel_manager.class_status())
        self.set_status(503)
        self.set_header("Retry-After", str(RETRY_AFTER_S))
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(CLASS_FULL_PAGE)


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
    websocket and the browser evaluating it again (see SyncedFigureWidget in bertlab/panels/base.py)."""

    @classmethod
    def get_absolute_path(cls, root: str, path: str) -> str:
        return str(PLOTLY_BUNDLE)  # the route matches this one file only

    def set_extra_headers(self, path: str) -> None:
        self.set_header("Content-Type", "text/javascript; charset=utf-8")
        self.set_header("Cache-Control", "public, max-age=3600")
