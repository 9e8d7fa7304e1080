"""The teacher's view server: with `--class N`, `bertlab serve` starts a second Voila beside the
students' one, serving apps/teacher.ipynb on the next port with its own secret token.

Why a second server rather than a route in the students' one: Voila started on one notebook serves
only that notebook, and the students' server hands out its own token (or password) to everyone.
A separate server keeps the teacher's page out of the students' reach by construction (another
secret, no pool of pre-heated teacher kernels, no share of the class's kernel cap), and leaves the
students' server untouched. Both servers' kernels get the same class environment, so they open the
same class store (`BERTLAB_CLASS_STORE`).
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import replace
from pathlib import Path

from bertlab.serving.guard import ANY_ADDRESS, interface_addresses, is_loopback
from bertlab.serving.plan import CLASS_DIR, ServePlan, class_env

TEACHER_APP = "teacher.ipynb"
TEACHER_MAX_KERNELS = 3  # the teacher's page, a reload, a second screen


def teacher_plan(plan: ServePlan, app: Path, port: int | None = None, secret: str | None = None) -> ServePlan:
    """The teacher's server for the class server `plan`: same host, the next port (or `port`), its own
    secret token (generated unless given), no pool, a small cap, no browser tab."""
    return replace(plan, app=app, port=port or plan.port + 1, open_browser=False, class_size=None, pool_size=0,
                   max_kernels=TEACHER_MAX_KERNELS, token=secret or secrets.token_urlsafe(18), password_hash="",
                   fork_kernels=False)  # one kernel: a warm parent would only add its memory


def teacher_command(plan: ServePlan, teacher: ServePlan, base: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of the teacher's server: the class environment of `plan`, so both
    servers' kernels share one class store. Its start banner is silenced (it would print the teacher's
    address like a student address); `teacher_url` is printed instead."""
    env = {**teacher.env(base), **class_env(plan.class_dir or CLASS_DIR.expanduser(), base)}
    return [*teacher.argv(), "--Voila.log_level=WARN"], env


def teacher_url(teacher: ServePlan) -> str:
    """The address the teacher opens (secret included)."""
    host = teacher.host
    if host in ANY_ADDRESS:
        found = sorted(a for a in interface_addresses() if ":" not in a and not is_loopback(a))
        host = found[0] if found else socket.gethostname()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{teacher.port}/?token={teacher.token}"
