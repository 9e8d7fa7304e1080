"""`python -m bertlab.serving NOTEBOOK [Voila options]`: Voila, made fit to serve a class.

`bertlab serve` runs this (see bertlab/serving/plan.py for the options it passes). On top of
Voila it adds: a cap on live kernels with a "class is full" page, a pool that respects the cap,
a limit of kernels per client address, a Host/Origin guard, a working tab-close shutdown that only
the page owning the kernel may ask for, `/bertlab/api/status`, the `bertlab` page
template (Voila's, without its Font Awesome CDN links), and a start banner that says which
address students open. Secrets come through the environment, never argv (`ps` shows argv).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import voila.app
from jupyter_server.auth.logout import LogoutHandler
from jupyter_server.services.contents.largefilemanager import LargeFileManager
from jupyter_server.services.kernels.handlers import KernelHandler, _kernel_id_regex
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop
from traitlets import Bool, Integer, List, Unicode
from voila.app import Voila
from voila.shutdown_kernel_handler import VoilaShutdownKernelHandler
from voila.static_file_handler import TemplateStaticFileHandler
from voila.tornado.handler import TornadoVoilaHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

from bertlab.serving import PASSWORD_HASH_ENV, SEAT_PATH, STATUS_PATH, TOKEN_ENV
from bertlab.serving.forking import start_zygote
from bertlab.serving.guard import (
    ANY_ADDRESS,
    GuardedApplication,
    HostGuard,
    interface_addresses,
    is_loopback,
    known_names,
)
from bertlab.serving.handlers import (
    PLOTLY_BUNDLE,
    WORKSPACE_HEADER,
    ClassPageHandler,
    LogoutRedirectHandler,
    OwnerKernelHandler,
    OwnerShutdownHandler,
    PlotlyBundleHandler,
    SeatHandler,
    SeenKernelWebsocketHandler,
    StatusHandler,
    TemplateFileHandler,
)
from bertlab.serving.kernels import class_kernel_manager_factory
from bertlab.settings import PLOTLY_BUNDLE_PATH, shipped

TEMPLATES_ROOT = Path(__file__).resolve().parent / "templates"  # laid out like share/jupyter
# bertlab/ and its dashboards (inside the package when installed, at a checkout's top): their notebooks are trusted
TRUSTED_ROOTS = tuple(Path(os.path.realpath(p)) for p in (Path(__file__).parent.parent, shipped("apps")))


class ShippedNotebooksTrusted(LargeFileManager):
    """Voila's contents manager, trusting the notebooks bertlab ships (its dashboards: outputs stripped, so
    there is nothing in them to trust or not) without a "Notebook ... is not trusted" line in the teacher's
    terminal at every page. Any other notebook (`--app` a teacher's own) is checked as Voila checks it."""

    def mark_trusted_cells(self, nb, path: str = "") -> None:
        if _shipped(Path(self.root_dir, path)):
            self.notary.mark_cells(nb, True)
        else:
            super().mark_trusted_cells(nb, path)


def _shipped(path: Path) -> bool:
    """Whether `path` is a file of the bertlab package itself or one of its dashboards."""
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(root) for root in TRUSTED_ROOTS)


class BertlabVoila(Voila):
    """Voila with the class server's additions (module docstring)."""

    max_kernels = Integer(0, config=True, help="Live kernels at most, pool included (0: no cap).")
    max_per_client = Integer(0, config=True, help="Kernels the pages of one client address may hold (0: no limit).")
    class_size = Integer(0, config=True, help="Students the teacher expects (0: one-person mode).")
    fork_kernels = Bool(False, config=True, help="Fork kernels from a warm parent (bertlab/serving/forking.py).")
    allowed_hosts = List(Unicode(), config=True,
                         help="Host names accepted besides localhost, loopback and this machine's own.")

    def initialize(self, argv: list[str] | None = None) -> None:
        # Voila finds templates on the Jupyter data path: put bertlab's first.
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (str(TEMPLATES_ROOT), os.environ.get("JUPYTER_PATH", "")) if p)
        super().initialize(argv)
        # the page's workspace key reaches its kernel as this header (bertlab.workspace.Workspace.adopt)
        self.voila_configuration.http_header_envs = [*self.voila_configuration.http_header_envs, WORKSPACE_HEADER]
        if re.fullmatch(r"[0-9.]+", self.ip or "") and self.ip not in ANY_ADDRESS:  # kernels ask Voila there
            os.environ["VOILA_APP_IP"] = self.ip  # for their page's request (Voila's default: 127.0.0.1)
        token = os.environ.pop(TOKEN_ENV, "")
        password_hash = os.environ.pop(PASSWORD_HASH_ENV, "")
        if token:
            self.token = token
        if password_hash:
            self.config.PasswordIdentityProvider.hashed_password = password_hash
        if not (self.token or password_hash or is_loopback(self.ip)):
            self.auto_token = True  # never open beyond this machine without a door
        if self.fork_kernels:  # after the secrets left the environment: the kernels inherit the zygote's
            start_zygote()

    def init_settings(self) -> dict:
        with _swapped(voila.app, "voila_kernel_manager_factory",
                      class_kernel_manager_factory(self.max_kernels or None,
                                                   self.max_per_client or None)), \
                _swapped(voila.app, "LargeFileManager", ShippedNotebooksTrusted):
            settings = super().init_settings()
        settings["bertlab_class_size"] = self.class_size or None
        return settings

    def init_handlers(self) -> list:
        ours = {TornadoVoilaHandler: ClassPageHandler, VoilaShutdownKernelHandler: OwnerShutdownHandler,
                KernelHandler: OwnerKernelHandler, TemplateStaticFileHandler: TemplateFileHandler,
                LogoutHandler: LogoutRedirectHandler, VoilaKernelWebsocketHandler: SeenKernelWebsocketHandler}
        handlers = [(h[0], ours.get(h[1], h[1]), *h[2:]) for h in super().init_handlers()]
        bundle = (re.escape(url_path_join(self.server_url, PLOTLY_BUNDLE_PATH)) + "()",  # one file, no path part
                  PlotlyBundleHandler, {"path": str(PLOTLY_BUNDLE.parent)})
        seat = (url_path_join(self.server_url, SEAT_PATH, _kernel_id_regex), SeatHandler)
        return [(url_path_join(self.server_url, STATUS_PATH), StatusHandler), seat, bundle, *handlers]

    def start(self) -> None:
        """Voila's `start`, with the guarded Application."""
        self.connection_dir = tempfile.mkdtemp(prefix="voila_", dir=self.connection_dir_root)
        settings = self.init_settings()
        guard = HostGuard(known_names(self.ip, self.allowed_hosts))
        self.app = GuardedApplication(guard, **settings)
        self.app.settings.update(self.tornado_settings)
        self.app.add_handlers(".*$", self.init_handlers())
        IOLoop.current().add_callback(self._banner)  # runs once listening succeeded
        self.listen()

    @property
    def display_url(self) -> str:
        """What Voila logs at start: the first address students open, token included."""
        return self._student_urls()[0]

    def _student_urls(self) -> list[str]:
        token = self.identity_provider.token
        hosts = _student_addresses() if self.ip in ANY_ADDRESS else [self.ip]
        return [self._url(_url_host(h)) + (f"?token={token}" if token else "") for h in hosts]

    def _banner(self) -> None:
        who = f"a class of {self.class_size}" if self.class_size else "one person"
        pool = self.voila_configuration.default_pool_size if self.voila_configuration.preheat_kernel else 0
        cap = f", at most {self.max_kernels} kernels" if self.max_kernels else ""
        lines = [f"bertlab is serving {who} ({pool} pre-heated kernel(s){cap}). Open:"]
        lines += [f"    {url}" for url in self._student_urls()]
        if getattr(self.identity_provider, "hashed_password", ""):
            lines.append("    and log in with the password you set.")
        self.log.info("\n".join(lines))


def _student_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (what students type), else its host name."""
    found = sorted(a for a in interface_addresses() if ":" not in a and not is_loopback(a))
    return found or [socket.gethostname()]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def _swapped(module: object, name: str, value: object) -> Iterator[None]:
    """Voila builds its kernel manager class inside `init_settings` with a module-level factory:
    lend it ours for that call only."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


main = BertlabVoila.launch_instance
