"""Kernels forked from a warm parent (`bertlab serve --class N --fork-kernels`).

A fresh kernel (`python -m ipykernel_launcher`) imports torch, the dashboard and its widgets and loads
the model on its own: every student pays for all of it. Here the class server starts one *zygote*
(`python -m bertlab.serving.forking SOCKET`) that does that work once, loads the model the page will
ask for, runs `gc.freeze()` (the collector then leaves the inherited objects' pages alone, so they
stay shared), and then forks one child per kernel: the child shares the parent's pages until it
writes to them (copy-on-write) and becomes an ipykernel with the connection file it was given.

- `ForkProvisioner`, jupyter_client's kernel provisioner: it asks the zygote for a kernel over its Unix
  socket (the kernel command, environment and folder) and follows the child by its pid. The zygote, not
  the server, is the child's parent and reaps it; the provisioner sees a kernel end when its pid goes
  (checked against the process's start time, so a reused pid is not taken for it). Until the zygote is
  ready a kernel start waits for it. A zygote that died is replaced (its exit status logged); until the
  new one is ready, kernels start the usual way.
- In the child the first `bertlab.loading.load` of the zygote's model hands back the zygote's copy
  (the child's own, copy-on-write); later loads read from disk as usual.

The zygote starts no thread, event loop or ZMQ context before forking: each child creates its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner

log = logging.getLogger(__name__)

PROVISIONER_NAME = "bertlab-fork"
READY_TIMEOUT_S = 600.0  # the zygote imports torch and loads the model, on a busy machine
LAUNCHER = ("-m", "ipykernel_launcher")


# -- the zygote (its own process) ----------------------------------------------------------------
def warm() -> tuple[str | None, Any]:
    """Import what a student's kernel imports and load the page's model; returns (source, (model, tok))
    or (source, None) when the model cannot be loaded here (the kernel then loads it itself)."""
    import ipykernel.ipkernel  # noqa: F401  the kernel itself
    import ipykernel.kernelapp  # noqa: F401
    import ipywidgets  # noqa: F401
    import plotly.graph_objects  # noqa: F401

    import bertlab.panels.app  # noqa: F401  the dashboard and its first tabs
    import bertlab.panels.classroom  # noqa: F401
    import bertlab.panels.mask  # noqa: F401
    from bertlab.loading import load
    from bertlab.runtime import cap_threads

    cap_threads()
    source = os.environ.get("BERTLAB_MODEL") or None
    try:
        return source, load(source)
    except Exception as e:  # noqa: BLE001  the kernel reports it to the student as usual
        print(f"bertlab zygote: the model was not preloaded ({e}); kernels load it themselves.",
              file=sys.stderr, flush=True)
        return source, None


def serve(path: str) -> None:
    """Warm up, then fork a kernel for each request on the Unix socket `path` until the server goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's: it shuts the kernels down
    server_pid = os.getppid()
    source, loaded = warm()
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the system as they end
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)
    os.replace(path + ".tmp", path)  # connectable only once ready
    listener.listen(1024)
    listener.settimeout(1.0)
    while os.getppid() == server_pid:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(30)
            try:
                request = json.loads(_read_all(conn))
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    _become_kernel(conn, request, source, loaded)  # never returns
                conn.sendall(json.dumps({"pid": pid}).encode())
            except Exception as e:  # noqa: BLE001  one bad request must not end the class's kernels
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
    listener.close()


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _become_kernel(conn: socket.socket, request: dict, source: str | None, loaded: Any) -> None:
    """In the forked child: a session of its own, the kernel's environment and folder, then ipykernel."""
    code = 1
    try:
        conn.close()
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request.get("cwd") or os.getcwd())
        if loaded is not None:
            _hand_back_once(source, loaded)
        # ipykernel read JPY_PARENT_PID when the zygote imported it: the kernel's parent is the zygote,
        # which ends with the server; the kernel ends with it.
        args = [*request["args"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        sys.argv = ["ipykernel_launcher", *args]
        from ipykernel.kernelapp import IPKernelApp

        app = IPKernelApp.instance()
        app.initialize(args)
        register_comm_targets()
        app.start()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001  the traceback goes to the server's log
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def register_comm_targets() -> None:
    """In the forked child, once its kernel exists: what ipywidgets does when it is imported inside a kernel.

    ipywidgets registers its comm targets (`jupyter.widget`, and `jupyter.widget.control`, on which a
    page asks for every widget's state in one message) at import, and only if a kernel is running then.
    The zygote imported it before any kernel existed, so a forked kernel would have neither: a browser's
    `jupyter.widget.control` comm was closed at once and the page fell back to asking each widget for its
    state in turn; in a rush of 10 or 100 simulated students no Chromium page then showed
    the Mask tab's text box."""
    widgets = sys.modules.get("ipywidgets")
    if widgets is not None:
        widgets.register_comm_target()


def _hand_back_once(source: str | None, loaded: Any) -> None:
    import bertlab.loading

    original = bertlab.loading.load

    def load(src: Any = None, revision: str | None = None):
        bertlab.loading.load = original
        if src == source and revision is None:
            return loaded
        return original(src, revision)

    load.__doc__ = original.__doc__
    bertlab.loading.load = load


# -- the server's side ---------------------------------------------------------------------------
class Zygote:
    """The zygote process the server starts, and the socket kernels are asked for on."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="bertlab_zygote_")
        self.path = os.path.join(self.folder, "socket")
        self.proc = subprocess.Popen([sys.executable, "-m", "bertlab.serving.forking", self.path],
                                     env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL)
        self._lock: asyncio.Lock | None = None  # one request at a time: a class's pool asks all at once
        self.replaced: int | None = None  # the exit status of the zygote this one replaces, if any

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        return self.alive() and os.path.exists(self.path)

    async def fork(self, args: list[str], env: dict[str, str], cwd: str | None) -> int:
        """A new kernel's pid; waits for the zygote to be ready. OSError when it is gone."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready():
            if not self.alive():
                raise OSError(f"the kernel zygote exited ({self.proc.returncode})")
            if time.monotonic() > deadline:
                raise OSError("the kernel zygote was not ready in time")
            await asyncio.sleep(0.2)
        if self._lock is None:
            self._lock = asyncio.Lock()
        request = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
        async with self._lock:
            try:
                reply = await self._ask(request)
            except (OSError, ValueError, asyncio.TimeoutError) as e:
                raise OSError(f"the kernel zygote did not answer: {e}") from e
        if "error" in reply:
            raise OSError(f"the kernel zygote could not fork: {reply['error']}")
        return int(reply["pid"])

    async def _ask(self, request: bytes) -> dict:
        for attempt in range(3):  # a busy machine may refuse a connection: try again before giving up
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
                break
            except OSError:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.5)
        try:
            writer.write(request)
            await writer.drain()
            writer.write_eof()
            return json.loads(await asyncio.wait_for(reader.read(), 60))
        finally:
            writer.close()

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


ZYGOTE: Zygote | None = None  # set by the class server (bertlab/serving/app.py)


def start_zygote() -> Zygote:
    """Start the zygote (once) and make `ForkProvisioner` jupyter_client's default provisioner."""
    global ZYGOTE
    if ZYGOTE is None:
        ZYGOTE = Zygote()
        import atexit

        atexit.register(ZYGOTE.stop)
    register_provisioner()
    return ZYGOTE


def replace_zygote(dead: Zygote) -> Zygote:
    """A new zygote in place of `dead` (its exit status logged): kernels start the usual way until the
    new one is warm, then are forked again."""
    global ZYGOTE
    code = dead.proc.poll()
    log.warning("the kernel zygote (pid %s) exited with %s: starting a new one; until it is ready, kernels "
                "start the usual way", dead.pid, code)
    dead.stop()
    ZYGOTE = Zygote()
    ZYGOTE.replaced = code
    import atexit

    atexit.register(ZYGOTE.stop)
    return ZYGOTE


def register_provisioner() -> None:
    from importlib.metadata import EntryPoint

    from jupyter_client.provisioning import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    factory.provisioners[PROVISIONER_NAME] = EntryPoint(
        name=PROVISIONER_NAME, value=f"{__name__}:ForkProvisioner", group="jupyter_client.kernel_provisioners")
    factory.default_provisioner_name = PROVISIONER_NAME


def start_time(pid: int) -> str | None:
    """Process `pid`'s start time (/proc/PID/stat), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


class ForkedKernel:
    """What `LocalProvisioner` expects of its `subprocess.Popen`, for a kernel that is not our child."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._started = start_time(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and (self._started is None or start_time(self.pid) != self._started):
            self.returncode = -signal.SIGKILL if self._started is None else 0  # the zygote reaped it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkProvisioner(LocalProvisioner):
    """Kernels forked by the zygote (module docstring); any other kernel command starts as usual."""

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        args = _launcher_args(cmd)
        zygote = ZYGOTE
        if zygote is not None and not zygote.alive():
            zygote = replace_zygote(zygote)
        if args is None or zygote is None or (zygote.replaced is not None and not zygote.ready()):
            return await super().launch_kernel(cmd, **kwargs)  # a student does not wait for a new zygote
        env = {str(k): str(v) for k, v in (kwargs.get("env") or os.environ).items()}
        cwd = str(kwargs["cwd"]) if kwargs.get("cwd") else None
        try:
            pid = await zygote.fork(args, env, cwd)
        except OSError as e:
            log.warning("starting this kernel the usual way: %s", e)
            return await super().launch_kernel(cmd, **kwargs)
        self.process = ForkedKernel(pid)
        self.pid = self.pgid = pid  # the child called setsid(): its own process group
        self.cwd = cwd
        return self.connection_info


def _launcher_args(cmd: list[str]) -> list[str] | None:
    """The arguments after `python -m ipykernel_launcher` when `python` is this interpreter, else None."""
    for i in range(1, len(cmd) - 1):
        if tuple(cmd[i:i + 2]) == LAUNCHER:
            same = os.path.abspath(cmd[0]) == os.path.abspath(sys.executable) or cmd[0] in ("python", "python3")
            return list(cmd[i + 2:]) if same and i == 1 else None
    return None


if __name__ == "__main__":
    serve(sys.argv[1])
