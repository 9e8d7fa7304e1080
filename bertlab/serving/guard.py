"""The door of the class server: which Host and Origin headers it answers.

A DNS-rebinding page reaches a server on this machine under the attacker's own name
(`Host: evil.example:8866`); a cross-site page sends its own `Origin`. The guard accepts only
the names this server is known by: localhost and loopback addresses, the address it listens
on, this machine's host name and interface addresses, and names the teacher adds
(`--allow-host`). Anything else gets a 403 before any handler (page, kernel, static file) runs.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import tornado.web
from tornado import httputil

log = logging.getLogger(__name__)

ANY_ADDRESS = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1): only this machine reaches them."""
    host = _bare(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def interface_addresses() -> set[str]:
    """Every IP address of this machine's network interfaces."""
    import psutil  # a dependency of ipykernel, so always there next to Voila

    return {_bare(a.address.split("%")[0]) for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def known_names(listen_on: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names and addresses a server listening on `listen_on` answers to."""
    names = {"localhost", "127.0.0.1", "::1", *(_bare(n) for n in extra)}
    if listen_on in ANY_ADDRESS:
        names |= interface_addresses() | {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(_bare(listen_on))
    return frozenset(n for n in names if n)


@dataclass(frozen=True)
class HostGuard:
    """Accepts a request when its Host (and Origin, if any) name one of `names`, or a loopback address."""

    names: frozenset[str]

    def allows(self, host: str) -> bool:
        host = _bare(host)
        return host in self.names or is_loopback(host)

    def problem(self, host_header: str | None, origin: str | None) -> str | None:
        """Why a request with these headers is refused, or None when it may go on."""
        host = httputil.split_host_and_port(host_header or "")[0]
        if not self.allows(host):
            return f"Host {_cut(host_header or '')!r} is not a name of this server"
        if origin is not None:
            origin_host = urlsplit(origin).hostname if origin != "null" else None
            if not origin_host or not self.allows(origin_host):
                return f"Origin {_cut(origin)!r} is not this server"
        return None


class ForbiddenHostHandler(tornado.web.RequestHandler):
    """403 for a request the guard refused; says what was wrong and what to do."""

    def initialize(self, reason: str) -> None:
        self.reason = reason

    def prepare(self) -> None:
        log.warning("refused %s %s: %s", self.request.method, _cut(self.request.path), self.reason)
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"403 Forbidden: {self.reason}. Open the address the teacher gave "
                    f"(a server name can be added with bertlab serve --allow-host NAME).\n")


class GuardedApplication(tornado.web.Application):
    """A tornado Application that sends refused requests to `ForbiddenHostHandler`."""

    def __init__(self, guard: HostGuard, *args: Any, **kwargs: Any) -> None:
        self.guard = guard
        super().__init__(*args, **kwargs)

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs: Any):  # noqa: ANN201 (tornado's private type)
        reason = self.guard.problem(request.headers.get("Host"), request.headers.get("Origin"))
        if reason is not None:
            return self.get_handler_delegate(request, ForbiddenHostHandler, {"reason": reason})
        return super().find_handler(request, **kwargs)


def _bare(host: str) -> str:
    """`[::1]` -> `::1`, `Name.` -> `name`."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def _cut(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
