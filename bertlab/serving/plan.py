"""What `bertlab serve` runs: the server's command line and environment, from its options.

Pure (no server is started here), so the rules are easy to test:
- culling is always on: a kernel with no page connected and idle `cull_idle` s is shut down;
- class mode (`class_size`): a pool of `class_size` pre-heated kernels, at most
  `class_size + max(2, class_size // 10)` live kernels, at most `DEFAULT_PER_CLIENT` of them held by
  the pages of one client address (`per_client`, 0: no limit), and the class environment for kernels;
- class mode forks the students' kernels from a warm parent (`fork_kernels`, on Linux) unless told not to;
- beyond loopback a token is required (generated here unless a token or password is given);
- secrets travel in the environment, which `ps` does not show, and the server removes them.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bertlab.serving import PASSWORD_HASH_ENV, TEMPLATE, TOKEN_ENV
from bertlab.serving.guard import is_loopback
from bertlab.settings import PLOTLY_BUNDLE_ENV, PLOTLY_BUNDLE_PATH

DEFAULT_CULL_IDLE_S = 40
REFILL_DELAY_S = 20  # class mode: seconds between handing out a pooled kernel and starting its successor
# How long pre-heating waits for a cell's output after the kernel says the cell ran (nbclient waits a few
# seconds by default, then drops what has not arrived): on a machine busy pre-heating a class, the dashboard cell's
# widget output came later than that, and its page then showed no dashboard at all.
IOPUB_TIMEOUT_S = 60
CLASS_DIR = Path("~/.cache/bertlab/class")
DEFAULT_PER_CLIENT = 3  # class mode: a student's tab, a reload, a second window
FORK_SUPPORTED = sys.platform.startswith("linux")  # bertlab/serving/forking.py: fork(), Unix sockets, /proc


class PlanError(ValueError):
    """Options that cannot work together; the message says what to give instead."""


UNUSED_LABEXTENSIONS = ("jupyterlab-plotly",)  # no output uses plotly's mime renderer


@dataclass(frozen=True)
class ServePlan:
    """Everything `bertlab serve` decided; `argv()` and `env()` turn it into a process."""

    app: Path
    port: int
    host: str = "127.0.0.1"
    open_browser: bool = True
    class_size: int | None = None
    pool_size: int = 1
    max_kernels: int | None = None
    per_client: int | None = None  # kernels one client address may hold (None: no limit)
    cull_idle: int = DEFAULT_CULL_IDLE_S
    token: str = ""
    password_hash: str = ""
    allow_hosts: tuple[str, ...] = ()
    class_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    fork_kernels: bool = False  # kernels forked from a warm parent (bertlab/serving/forking.py)

    @property
    def cull_interval(self) -> int:
        """How often idle kernels are looked for: a closed tab's kernel goes within cull_idle + this."""
        return max(2, min(10, self.cull_idle // 4))

    def argv(self) -> list[str]:
        """The server's command line (no secrets in it)."""
        cmd = [
            sys.executable, "-m", "bertlab.serving", str(self.app),
            f"--port={self.port}",
            f"--Voila.ip={self.host}",
            "--Voila.port_retries=0",  # a class is told one address: fail rather than move
            f"--template={TEMPLATE}",
            f"--MappingKernelManager.cull_idle_timeout={self.cull_idle}",
            f"--MappingKernelManager.cull_interval={self.cull_interval}",
            "--MappingKernelManager.cull_connected=False",  # an open page keeps its kernel
            # Kernels talk to the server over Unix sockets named after their connection files, not
            # TCP ports: a port picked for a starting kernel can be taken by one of the class's many
            # loopback connections before the kernel binds it ("Address already in use", the page
            # gets an error instead of its kernel). Sockets are also out of other local users' reach.
            "--KernelManager.transport=ipc",
            # Figures are widgets whose code comes from the server's plotly bundle (env below):
            # plotly's JupyterLab extension, a second copy of plotly.js for the page to parse, is unused.
            # A list option is given once per item: traitlets deprecates the "=['a', 'b']" form, and says
            # so in the teacher's terminal at every start.
            *(f"--VoilaConfiguration.extension_denylist={name}" for name in UNUSED_LABEXTENSIONS),
        ]
        if self.pool_size > 0:
            # Kernels run the notebook before anyone asks, so a page need not wait for one to start.
            cmd += ["--preheat_kernel=True", f"--pool_size={self.pool_size}",
                    f"--VoilaExecutor.iopub_timeout={IOPUB_TIMEOUT_S}"]
            if self.class_size:  # refill after the rush, not while students' pages load
                cmd.append(f"--VoilaKernelManager.fill_delay={REFILL_DELAY_S}")
        if self.max_kernels:
            cmd.append(f"--BertlabVoila.max_kernels={self.max_kernels}")
        if self.per_client:
            cmd.append(f"--BertlabVoila.max_per_client={self.per_client}")
        if self.class_size:
            cmd.append(f"--BertlabVoila.class_size={self.class_size}")
        if self.fork_kernels:
            cmd.append("--BertlabVoila.fork_kernels=True")
        if self.allow_hosts:
            cmd += [f"--BertlabVoila.allowed_hosts={host}" for host in self.allow_hosts]
        if not self.open_browser:
            cmd.append("--no-browser")
        return cmd

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The server's environment (its kernels inherit it, less the secrets)."""
        env = {**base, **self.extra_env}
        env[PLOTLY_BUNDLE_ENV] = PLOTLY_BUNDLE_PATH  # figures load plotly's code from the server, once
        if self.token:
            env[TOKEN_ENV] = self.token
        if self.password_hash:
            env[PASSWORD_HASH_ENV] = self.password_hash
        if self.class_size:
            env.update(class_env(self.class_dir or CLASS_DIR.expanduser(), base))
        return env


def class_env(class_dir: Path, base: dict[str, str]) -> dict[str, str]:
    """Class-mode variables for the kernels (what the environment already sets wins, but
    class mode itself is always on)."""
    wanted = {
        "BERTLAB_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "BERTLAB_WORKSPACES": str(class_dir / "workspaces"),
        "BERTLAB_QUEUE": str(class_dir / "queue.sqlite"),
        "BERTLAB_CLASS_STORE": str(class_dir / "class.sqlite"),  # the teacher's questions (bertlab.classroom)
    }
    return {**wanted, **{k: base[k] for k in wanted if base.get(k)}, "BERTLAB_CLASS": "1"}


def class_cap(class_size: int) -> int:
    """Live kernels at most for a class: a few seats over the class for reloads and latecomers."""
    return class_size + max(2, class_size // 10)


def make_plan(*, app: Path, port: int, host: str, open_browser: bool, class_size: int | None,
              preheat: bool, pool_size: int | None, max_kernels: int | None, cull_idle: int,
              token: str | None, password_hash: str | None, allow_hosts: tuple[str, ...] = (),
              class_dir: Path | None = None, extra_env: dict[str, str] | None = None,
              per_client: int | None = None, fork_kernels: bool | None = None) -> ServePlan:
    """Fill in the defaults and check the options fit together. `per_client`: None for the default
    (DEFAULT_PER_CLIENT in class mode, no limit otherwise), 0 for no limit. `fork_kernels`: None for the
    default (forked in class mode where the platform can, else not)."""
    if class_size is not None and class_size < 1:
        raise PlanError(f"--class {class_size}: give the number of students, 1 or more.")
    if not preheat:
        pool = 0
    elif pool_size is not None:
        pool = pool_size
    else:
        pool = class_size or 1
    cap = max_kernels if max_kernels is not None else (class_cap(class_size) if class_size else None)
    if cap is not None and cap < 1:
        raise PlanError(f"--max-kernels {cap}: give 1 or more.")
    if pool < 0:
        raise PlanError(f"--pool-size {pool}: give 0 or more.")
    if cap is not None and pool > cap:
        raise PlanError(f"--pool-size {pool} is over --max-kernels {cap}: the pool counts towards the cap; "
                        f"give a smaller pool or a larger cap.")
    if per_client is not None and per_client < 0:
        raise PlanError(f"--per-client {per_client}: give 1 or more (0: no limit).")
    per_client = (DEFAULT_PER_CLIENT if class_size else None) if per_client is None else (per_client or None)
    if fork_kernels and not class_size:
        raise PlanError("--fork-kernels needs --class N: kernels are forked with one torch thread each, "
                        "as class mode runs them.")
    if fork_kernels and not FORK_SUPPORTED:
        raise PlanError(f"--fork-kernels works on Linux only (this is {sys.platform}): leave it out, and "
                        f"each student's kernel starts the usual way.")
    if fork_kernels is None:
        fork_kernels = bool(class_size) and FORK_SUPPORTED
    if cull_idle < 5:
        raise PlanError(f"--cull-idle {cull_idle}: give 5 seconds or more (a page needs time to connect).")
    plan_token = token or ""
    if not plan_token and not password_hash and not is_loopback(host):
        plan_token = secrets.token_hex(12)  # like Jupyter: never open beyond this machine without a door
    return ServePlan(app=app, port=port, host=host, open_browser=open_browser, class_size=class_size,
                     pool_size=pool, max_kernels=cap, per_client=per_client, cull_idle=cull_idle, token=plan_token,
                     password_hash=password_hash or "", allow_hosts=tuple(allow_hosts),
                     class_dir=(class_dir.expanduser().resolve() if class_dir else None),
                     extra_env=dict(extra_env or {}), fork_kernels=fork_kernels)
