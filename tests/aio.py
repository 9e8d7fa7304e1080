"""Running a coroutine from a test."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_in_thread(coro):
    """`asyncio.run(coro)` in a thread of its own: some libraries the suite imports (ipykernel,
    Playwright) leave an event loop marked as running in the main thread, where asyncio.run fails."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
