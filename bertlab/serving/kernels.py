"""Kernels for a class: Voila's pre-heated pool, with a cap on live kernels.

Voila builds its kernel manager class with `voila_kernel_manager_factory(base, preheat, pool_size)`
(the pool of pre-heated kernels lives in the class it returns). `class_kernel_manager_factory`
wraps that factory: the class it returns adds, on top of Voila's,

- a cap: a page that would start a kernel beyond `max_kernels` gets `ClassFullError`
  (the page handler turns it into a "class is full" page);
- a kernel handed to a page that never runs (a plain `GET /`: no browser) is freed `UNSEEN_GRACE_S`
  after the page was sent; a page that runs says so at once (`page_seen`: its first script, or its
  kernel's websocket), and then culling spares its kernel while it is still loading (up to 3x the idle
  timeout), so a slow page on a busy server keeps its seat;
- a pool that never grows past the cap, refilled when a kernel ends (culled, or its tab closed)
  and when a pooled kernel finishes starting;
- seats: each page's kernel is recorded with the client address that asked for it and a secret that
  only that page's cookies carry (`Seats`), so that one address holds at most `max_per_client`
  kernels (a loop of bare `GET /` cannot take the class) and only the page that owns a kernel can
  shut it down;
- `class_status()`, the counts that `/bertlab/api/status` reports.

Culling itself is jupyter_server's (`MappingKernelManager.cull_idle_timeout`, `cull_interval`,
`cull_connected`); Voila's pool class already keeps pooled kernels from being culled.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from jupyter_server._tz import utcnow
from voila.voila_kernel_manager import voila_kernel_manager_factory

Factory = Callable[..., type]


class ClassFullError(RuntimeError):
    """No kernel can start: `max_kernels` are alive or starting."""


@dataclass(frozen=True)
class PageRequest:
    """The page request a kernel is being handed to: the client's address, and what to call with the
    kernel's id and its owner's secret once it is known (the handler sets the owner's cookies)."""

    client: str
    on_seat: Callable[[str, str], None]


# Set by the page handler around Voila's page generator, which asks the kernel manager for a kernel
# (a pooled one, or a new one) before it writes a byte: the manager records the seat from here.
PAGE_REQUEST: contextvars.ContextVar[PageRequest | None] = contextvars.ContextVar("bertlab_page", default=None)


class Seats:
    """Kernels handed to pages: the client address each came from, and its owner's secret."""

    def __init__(self) -> None:
        self._seats: dict[str, tuple[str, str]] = {}  # kernel id -> (client address, secret)

    def take(self, kernel_id: str, client: str) -> str:
        """Record `kernel_id` as `client`'s; returns the secret its owner's cookie carries."""
        secret = secrets.token_urlsafe(24)
        self._seats[kernel_id] = (client, secret)
        return secret

    def release(self, kernel_id: str) -> None:
        self._seats.pop(kernel_id, None)

    def held_by(self, client: str, alive: set[str]) -> int:
        """Kernels among `alive` that pages from `client` hold."""
        return sum(1 for kid, (who, _) in self._seats.items() if who == client and kid in alive)

    def __contains__(self, kernel_id: str) -> bool:
        return kernel_id in self._seats

    def owns(self, kernel_id: str, secret: str | None) -> bool:
        """Whether `secret` (from the request's cookie) is the one handed out with `kernel_id`."""
        seat = self._seats.get(kernel_id)
        return seat is not None and bool(secret) and hmac.compare_digest(seat[1], secret)


class ClassKernels:
    """Mixed in above Voila's kernel manager class (see `class_kernel_manager_factory`)."""

    max_kernels: int | None = None  # set on the class the factory builds
    max_per_client: int | None = None  # kernels one client address may hold (None: no limit)
    _stopping = False
    CONNECT_GRACE = 3  # x cull_idle_timeout: how long a handed-out kernel waits for its page to connect
    UNSEEN_GRACE_S = 15.0  # how long after its page was sent a kernel waits for that page to run

    # -- counting --------------------------------------------------------------------------------
    def _pool_tasks(self) -> list[asyncio.Future]:
        return [task for pool in getattr(self, "_pools", {}).values() for task in pool]

    def _prune_failed_pool_tasks(self) -> None:
        """Drop pooled kernels that failed to start, so no page is handed one."""
        for pool in getattr(self, "_pools", {}).values():
            pool[:] = [t for t in pool if not (t.done() and (t.cancelled() or t.exception() is not None))]

    def _ready_pool_ids(self) -> set[str]:
        return {t.result()["kernel_id"] for t in self._pool_tasks()
                if t.done() and not t.cancelled() and t.exception() is None}

    def kernels_alive(self) -> set[str]:
        """Ids of kernels running or starting (pooled ones included)."""
        return set(self._kernels) | set(self._pending_kernels)

    def kernels_reserved(self) -> int:
        """Kernels alive or starting, plus pooled kernels not started yet. A pooled kernel counts
        twice while it boots, so this errs on the side of a fuller class."""
        self._prune_failed_pool_tasks()
        return len(self.kernels_alive() - self._ready_pool_ids()) + len(self._pool_tasks())

    def seats(self) -> Seats:
        return self.__dict__.setdefault("_seats", Seats())

    def client_full(self, client: str) -> bool:
        """Whether pages from `client` already hold `max_per_client` kernels."""
        if self.max_per_client is None:
            return False
        return self.seats().held_by(client, self.kernels_alive()) >= self.max_per_client

    def seated(self, kernel_id: str) -> bool:
        """Whether `kernel_id` was handed to a page (and so has an owner)."""
        return kernel_id in self.seats()

    def owns(self, kernel_id: str, secret: str | None) -> bool:
        """Whether a request carrying `secret` comes from the page that holds `kernel_id`."""
        return self.seats().owns(kernel_id, secret)

    def _seat(self, kernel_id: str) -> None:
        """Record a kernel just handed to the page being served (if any: tests start kernels directly)."""
        request = PAGE_REQUEST.get()
        if request is not None:
            self._unseen().setdefault(kernel_id, None)
            request.on_seat(kernel_id, self.seats().take(kernel_id, request.client))

    # -- a page that never runs: freed within seconds ---------------------------------------------
    def _unseen(self) -> dict[str, asyncio.TimerHandle | None]:
        """Kernels handed to a page that has not shown it runs yet -> the timer that frees them (None
        while the page is still being sent)."""
        return self.__dict__.setdefault("_unseen_pages", {})

    def page_seen(self, kernel_id: str) -> None:
        """The page holding `kernel_id` runs (its first script said so, or it opens the kernel's
        websocket): from now on only culling, with its grace for a loading page, can free the kernel."""
        handle = self._unseen().pop(kernel_id, None)
        if handle is not None:
            handle.cancel()

    def page_sent(self, kernel_id: str) -> None:
        """The page holding `kernel_id` has been sent (or its request ended): unless it runs within
        `UNSEEN_GRACE_S`, its kernel is freed (a plain request that never loads the page's code)."""
        unseen = self._unseen()
        if kernel_id in unseen and unseen[kernel_id] is None:
            unseen[kernel_id] = asyncio.get_event_loop().call_later(
                self.UNSEEN_GRACE_S, self._free_unseen, kernel_id)

    def _free_unseen(self, kernel_id: str) -> None:
        if self._unseen().pop(kernel_id, False) is False or self._stopping:
            return
        if kernel_id in self._kernels and not self._kernel_connections.get(kernel_id, 0):
            self.log.info("Freeing kernel %s: its page never ran (a plain request, not a browser page)", kernel_id)
            asyncio.ensure_future(self._shutdown_unseen(kernel_id))

    async def _shutdown_unseen(self, kernel_id: str) -> None:
        try:
            await self.shutdown_kernel(kernel_id)
        except Exception as e:  # noqa: BLE001  already gone (its tab closed meanwhile): nothing to free
            self.log.debug("kernel %s was already gone: %s", kernel_id, e)

    def has_room(self) -> bool:
        return self.max_kernels is None or self.kernels_reserved() < self.max_kernels

    def can_serve(self, notebook_path: str) -> bool:
        """Whether a page for `notebook_path` gets a kernel now: a pooled one, or room for a new one."""
        self._prune_failed_pool_tasks()
        return self.get_pool_size(notebook_path) > 0 or self.has_room()

    def class_status(self) -> dict[str, Any]:
        """Counts for `/bertlab/api/status`; a pooled kernel is "ready" once it has run the notebook."""
        self._prune_failed_pool_tasks()
        tasks = self._pool_tasks()
        ready = sum(1 for t in tasks if _heated(t))
        return {
            "kernels": len(self.kernels_alive()),
            "connected": sum(1 for n in self._kernel_connections.values() if n > 0),
            "pool": {"ready": ready, "starting": len(tasks) - ready, "target": self._pool_target()},
            "max_kernels": self.max_kernels,
        }

    def _pool_target(self, notebook_name: str | None = None) -> int:
        config = getattr(self, "kernel_pools_config", {})
        return int(config.get(notebook_name, config.get("default", {})).get("pool_size", 0))

    # -- starting, pooling, ending ------------------------------------------------------------------
    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:
        """A page's own kernel (pooled kernels start from Voila's `_initialize`, under the pool's limit)."""
        if kwargs.get("kernel_id") is None and not self.has_room():
            raise ClassFullError(f"{self.max_kernels} kernels are running")
        kernel_id = await super().start_kernel(*args, **kwargs)
        self._awaiting_page()[kernel_id] = time.monotonic()
        self._seat(kernel_id)
        return kernel_id

    async def get_rendered_notebook(self, *args: Any, **kwargs: Any) -> tuple:
        """Voila's hand-out of a pooled kernel, with its idle clock restarted: a pooled kernel may
        have been idle longer than the cull timeout, and the page needs a moment to connect."""
        render_task, rendered, kernel_id = await super().get_rendered_notebook(*args, **kwargs)
        self.get_kernel(kernel_id).last_activity = utcnow()
        self._awaiting_page()[kernel_id] = time.monotonic()
        self._seat(kernel_id)
        return render_task, rendered, kernel_id

    # -- culling: a page that is still loading keeps its kernel -------------------------------------
    def _awaiting_page(self) -> dict[str, float]:
        """Kernels handed to a page that has not connected yet -> when (time.monotonic())."""
        return self.__dict__.setdefault("_awaiting", {})

    def notify_connect(self, kernel_id: str) -> None:
        super().notify_connect(kernel_id)
        self._awaiting_page().pop(kernel_id, None)
        self.page_seen(kernel_id)

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        """jupyter_server's culling, except for a kernel whose page is still loading: on a busy
        server a page may take longer than the idle timeout to connect, and culling its kernel
        would leave it broken. A page that never connects (a plain GET) loses it after the grace."""
        since = self._awaiting_page().get(kernel_id)
        if since is not None and time.monotonic() - since < self.CONNECT_GRACE * self.cull_idle_timeout:
            return
        await super().cull_kernel_if_idle(kernel_id)

    def fill_if_needed(self, delay: float | None = None, notebook_name: str | None = None, **kwargs: Any) -> None:
        """Voila's pool refill, limited to what the cap leaves room for, and started after `delay`
        (Voila's `fill_delay` when None). Voila would add a sleeping kernel to the pool at once, and a
        page arriving meanwhile would wait out the sleep; here the pool stays as it is until then, so
        that page starts its own kernel straight away (or hears the class is full)."""
        if self._stopping:
            return
        delay = self.fill_delay if delay is None else delay
        if delay > 0:
            self._fill_later(delay, notebook_name, kwargs)
            return
        self._prune_failed_pool_tasks()
        pool = self._pools.get(notebook_name, [])
        before = list(pool)
        room = float("inf") if self.max_kernels is None else max(self.max_kernels - self.kernels_reserved(), 0)
        size = int(min(self._pool_target(notebook_name), len(pool) + room))
        with self._pool_size(notebook_name, size):
            super().fill_if_needed(delay=0, notebook_name=notebook_name, **kwargs)
        for task in self._pools.get(notebook_name, []):
            if task not in before:  # once it has started, the count is exact again: top up if it can
                task.add_done_callback(lambda t, nb=notebook_name: self._refill_after_start(t, nb))

    def _fill_later(self, delay: float, notebook_name: str | None, kwargs: dict[str, Any]) -> None:
        """One pending refill per notebook: a burst of pages does not push it back."""
        pending = self.__dict__.setdefault("_pending_fills", {})
        if notebook_name not in pending:
            pending[notebook_name] = asyncio.get_event_loop().call_later(
                delay, self._fill_now, notebook_name, kwargs)

    def _fill_now(self, notebook_name: str | None, kwargs: dict[str, Any]) -> None:
        self._pending_fills.pop(notebook_name, None)
        self.fill_if_needed(0, notebook_name, **kwargs)

    def _refill_after_start(self, task: asyncio.Future, notebook_name: str | None) -> None:
        if not task.cancelled() and task.exception() is None:  # a failing start must not loop
            self._refill(notebook_name)

    def _refill(self, notebook_name: str | None = None) -> None:
        if hasattr(super(), "fill_if_needed") and not self._stopping:
            for name in [notebook_name] if notebook_name is not None else list(self._pools):
                self.fill_if_needed(notebook_name=name)

    async def shutdown_kernel(self, kernel_id: str, *args: Any, **kwargs: Any) -> None:
        self._awaiting_page().pop(kernel_id, None)
        self.page_seen(kernel_id)  # nothing left to free later
        self.seats().release(kernel_id)
        await super().shutdown_kernel(kernel_id, *args, **kwargs)
        self._refill()

    async def shutdown_all(self, *args: Any, **kwargs: Any) -> None:
        self._stopping = True
        for handle in self.__dict__.get("_pending_fills", {}).values():
            handle.cancel()
        await super().shutdown_all(*args, **kwargs)

    @contextlib.contextmanager
    def _pool_size(self, notebook_name: str | None, size: int) -> Iterator[None]:
        """Voila's `fill_if_needed` reads the pool size from `kernel_pools_config`: lend it `size`."""
        config = dict(self.kernel_pools_config)
        key = notebook_name if notebook_name in config else "default"
        self.kernel_pools_config = {**config, key: {**config.get(key, {}), "pool_size": size}}
        try:
            yield
        finally:
            self.kernel_pools_config = config


def _heated(pool_task: asyncio.Future) -> bool:
    """A pooled kernel that has run the whole notebook (its page is ready to hand out)."""
    if not pool_task.done() or pool_task.cancelled() or pool_task.exception() is not None:
        return False
    return pool_task.result()["task"].done()


def class_kernel_manager_factory(max_kernels: int | None, max_per_client: int | None = None) -> Factory:
    """A drop-in for `voila_kernel_manager_factory` whose classes carry `ClassKernels`."""

    def factory(base_class: type, preheat_kernel: bool, default_pool_size: int,
                page_config_hook: Callable | None = None) -> type:
        voila_class = voila_kernel_manager_factory(base_class, preheat_kernel, default_pool_size,
                                                   page_config_hook=page_config_hook)
        return type("ClassKernelManager", (ClassKernels, voila_class),
                    {"max_kernels": max_kernels, "max_per_client": max_per_client})

    return factory
