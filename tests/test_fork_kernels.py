"""Kernels forked from a warm parent (`bertlab serve --class N --fork-kernels`): the option's rules
without a server, the forked kernel's process bookkeeping, then the real class server on loopback: a page
gets a kernel forked by the zygote that has run the dashboard and executes code, it costs far less
memory (PSS) than a kernel started the usual way, and nothing is left running once the server stops."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aio import run_in_thread
from test_class_server import APP, REPO, TOKEN, Server, _free_port, _kernel_id, _stop

from bertlab import cli
from bertlab.serving.forking import ForkedKernel, _launcher_args, start_time
from bertlab.serving.plan import PlanError, make_plan
from bertlab.serving.teacher import teacher_plan

BUILD = "from bertlab.panels.app import build_app\napp = build_app()\napp.widget"


def plan(**kw):
    options = dict(app=APP, port=9000, host="127.0.0.1", open_browser=False, class_size=None, preheat=True,
                   pool_size=None, max_kernels=None, cull_idle=40, token=None, password_hash=None)
    return make_plan(**{**options, **kw})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernels are forked on Linux only")
def test_a_class_forks_kernels_by_default_and_can_opt_out(tmp_path):
    forked = "--BertlabVoila.fork_kernels=True"
    assert forked in plan(class_size=3).argv()  # the default for a class
    assert not any("fork_kernels" in a for a in plan().argv())  # one-person mode: one kernel, no warm parent
    assert not any("fork_kernels" in a for a in plan(class_size=3, fork_kernels=False).argv())
    p = plan(class_size=3, fork_kernels=True)
    assert forked in p.argv()
    assert not teacher_plan(p, APP).fork_kernels  # the teacher's one kernel needs no warm parent
    with pytest.raises(PlanError, match="--fork-kernels needs --class"):
        plan(fork_kernels=True)
    parse = cli.build_parser().parse_args
    assert forked in cli.serve_command(parse(["serve", "--class", "4"]), env={})[0]
    assert forked in cli.serve_command(parse(["serve", "--class", "4", "--fork-kernels"]), env={})[0]
    assert forked not in cli.serve_command(parse(["serve", "--class", "4", "--no-fork-kernels"]), env={})[0]
    assert forked not in cli.serve_command(parse(["serve"]), env={})[0]


def test_fork_kernels_on_another_platform_is_a_usage_error(monkeypatch):
    import bertlab.serving.plan as serve_plan

    monkeypatch.setattr(serve_plan, "FORK_SUPPORTED", False)
    assert not plan(class_size=3).fork_kernels  # the default falls back to kernels started the usual way
    with pytest.raises(PlanError, match="Linux only"):
        plan(class_size=3, fork_kernels=True)


def test_only_this_interpreters_ipykernel_is_forked():
    assert _launcher_args([sys.executable, "-m", "ipykernel_launcher", "-f", "k.json"]) == ["-f", "k.json"]
    assert _launcher_args(["/opt/other/bin/python", "-m", "ipykernel_launcher", "-f", "k.json"]) is None
    assert _launcher_args([sys.executable, "-m", "other_kernel", "-f", "k.json"]) is None


def test_a_forked_kernel_is_followed_by_pid_and_start_time():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kernel = ForkedKernel(proc.pid)
        assert kernel.poll() is None and start_time(proc.pid) is not None
        kernel.terminate()
        proc.wait(10)  # reaped by its parent (here the test, there the zygote)
        assert kernel.wait(5) is not None and kernel.poll() is not None
        kernel.kill()  # a kernel already gone: nothing to signal, no error
    finally:
        proc.kill()
        proc.wait()


# -- the real server -------------------------------------------------------------------------------------
START_S = 300


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`bertlab serve --class 2 --fork-kernels` (token in BERTLAB_TOKEN) on a free loopback port."""
    yield from _fork_server(tmp_path_factory)


@pytest.fixture
def lone_fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The same, for one test that may break it."""
    yield from _fork_server(tmp_path_factory)


def _fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    folder = tmp_path_factory.mktemp("forkclass")
    log = folder / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"], env["BERTLAB_TOKEN"] = "1", TOKEN
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--class", "2", "--fork-kernels", "--no-browser",
             "--port", str(port), "--class-dir", str(folder / "class")],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    srv = Server(port, proc, log)
    try:
        srv.wait("the pool filled", lambda: srv.status()["pool"]["ready"] == 2, START_S)
        yield srv
    finally:
        _stop(proc)


def _ask(server: Server, client, kernel_id: str, msg_type: str, content: dict, timeout: float = 60) -> dict:
    """Send a shell request over the kernel's websocket, as a page does (Voila lets through only comm and
    kernel-info messages); returns the reply's content."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def run() -> dict:
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id=test-fork"
        conn = await websocket_connect(HTTPRequest(url, headers=server.ws_headers(client, kernel_id)))
        msg_id = uuid.uuid4().hex
        conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "username": "test", "session": "test-fork",
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "content": content}))
        end = time.monotonic() + timeout
        try:
            while True:
                raw = await asyncio.wait_for(conn.read_message(), end - time.monotonic())
                msg = json.loads(raw) if isinstance(raw, str) else {}
                if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["channel"] == "shell":
                    return msg["content"]
        finally:
            conn.close()

    return run_in_thread(run())


def _kernel_pid(kernel_id: str) -> int:
    """The process holding the kernel's sockets (with `--KernelManager.transport=ipc` they are files named
    after the kernel id): /proc/net/unix gives their inodes, /proc/PID/fd the process that has them open."""
    inodes = {line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
              if len(line.split()) > 7 and kernel_id in line.split()[7]}
    assert inodes, f"no socket of kernel {kernel_id}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):  # only the kernel's end has the name
            return int(proc.name)
    raise AssertionError(f"no process holds kernel {kernel_id}'s sockets")


def _pss_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {"pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def _fresh_kernel_memory() -> dict[str, float]:
    """A kernel started the usual way (`python -m ipykernel_launcher`), having built the dashboard."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "BERTLAB_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        reply = kc.execute(BUILD, reply=True, timeout=300)
        assert reply["content"]["status"] == "ok", reply["content"]
        time.sleep(3)
        return _pss_mb(km.provisioner.pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _frame(raw: str | bytes) -> dict:
    """A websocket message: JSON text, or the binary form (buffer count, offsets, JSON, buffers)."""
    if isinstance(raw, str):
        return json.loads(raw)
    import struct

    n = struct.unpack("!I", raw[:4])[0]
    offsets = struct.unpack(f"!{n}I", raw[4:4 + 4 * n])
    return json.loads(raw[offsets[0]:offsets[1] if n > 1 else len(raw)])


def _control_comm(server: Server, client, kernel_id: str, timeout: float = 120) -> dict:
    """What a page's widget manager does first: open a `jupyter.widget.control` comm and ask it for every
    widget's state at once. Returns the kernel's first word on that comm (its reply, or its comm_close)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    comm_id = uuid.uuid4().hex

    def msg(msg_type: str, content: dict, metadata: dict | None = None) -> str:
        return json.dumps({
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "test", "session": "test-ctl",
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": metadata or {}, "channel": "shell", "content": content})

    async def run() -> dict:
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id=test-ctl"
        conn = await websocket_connect(HTTPRequest(url, headers=server.ws_headers(client, kernel_id)),
                                       max_message_size=256 * 2**20)
        conn.write_message(msg("comm_open", {"comm_id": comm_id, "target_name": "jupyter.widget.control",
                                             "data": {}}, {"version": "1.0.0"}))
        conn.write_message(msg("comm_msg", {"comm_id": comm_id, "data": {"method": "request_states"}}))
        end = time.monotonic() + timeout
        try:
            while True:
                reply = _frame(await asyncio.wait_for(conn.read_message(), end - time.monotonic()))
                if (reply.get("msg_type") in ("comm_msg", "comm_close")
                        and reply.get("content", {}).get("comm_id") == comm_id):
                    return reply
        finally:
            conn.close()

    return run_in_thread(run())


@pytest.mark.slow
def test_a_forked_kernel_hands_a_page_every_widget_state_at_once(fork_server):
    """A browser's widget manager asks for the widgets' states on the `jupyter.widget.control` comm. ipywidgets
    registers that comm's target when it is imported inside a running kernel; the zygote imports it before
    any kernel exists, so a forked kernel must register it itself, or it closes the page's comm (the page then
    asks each widget in turn; in the rush bench no Chromium page then showed the Mask tab).
    Runs before the test below, which stops the module's server."""
    client = fork_server.session()
    page = client.get(fork_server.base + "/", timeout=120)
    assert page.status_code == 200
    kernel = _kernel_id(page.text)
    reply = _control_comm(fork_server, client, kernel)
    assert reply["msg_type"] == "comm_msg", f"the kernel closed the control comm: {reply['content']}"
    data = reply["content"]["data"]
    assert data["method"] == "update_states"
    models = {state["model_name"] for state in data["states"].values()}
    assert len(data["states"]) > 10 and "TextareaModel" in models  # the dashboard's widgets, the Mask box among them


@pytest.mark.slow
def test_a_page_gets_a_forked_kernel_that_works_and_shares_the_warm_parents_memory(fork_server):
    client = fork_server.session()
    page = client.get(fork_server.base + "/", timeout=120)
    assert page.status_code == 200
    kernel = _kernel_id(page.text)
    assert _ask(fork_server, client, kernel, "kernel_info_request", {})["status"] == "ok"  # it answers
    comms = _ask(fork_server, client, kernel, "comm_info_request", {"target_name": "jupyter.widget"})["comms"]
    assert len(comms) > 10  # the notebook ran in it: the dashboard's widgets are there
    pid = _kernel_pid(kernel)
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert "bertlab.serving.forking" in Path(f"/proc/{ppid}/cmdline").read_bytes().decode()  # the zygote's child
    forked = _pss_mb(pid)
    zygote = ppid
    fresh = _fresh_kernel_memory()
    print(f"\nforked kernel: {forked}; fresh kernel: {fresh}")
    assert forked["pss"] < 0.8 * fresh["pss"], (forked, fresh)
    assert forked["uss"] < 0.6 * fresh["uss"], (forked, fresh)
    # Stopping the server leaves no kernel and no zygote behind.
    _stop(fork_server.proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (start_time(pid) or start_time(zygote)):
        time.sleep(0.5)
    assert start_time(pid) is None and start_time(zygote) is None


def _zygotes(server: Server) -> list[int]:
    """The zygote processes under the server (its forked kernels keep the zygote's command line)."""
    parent, cmdline = {}, {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline[int(proc.name)] = (proc / "cmdline").read_bytes()
        except OSError:
            continue

    def under_server(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == server.proc.pid:
                return True
        return False

    zygote = b"bertlab.serving.forking"
    return [pid for pid, cmd in cmdline.items()
            if zygote in cmd and zygote not in cmdline.get(parent.get(pid, 0), b"") and under_server(pid)]


@pytest.mark.slow
def test_a_dead_zygote_is_replaced_and_students_still_get_a_seat(lone_fork_server):
    srv = lone_fork_server
    [old] = _zygotes(srv)
    os.kill(old, 9)
    session = srv.session()
    first = [_kernel_id(session.get(srv.base + "/", timeout=120).text) for _ in range(2)]  # the pool's two
    srv.wait("the pool refilled without the zygote", lambda: srv.status()["pool"]["ready"] == 2, START_S)
    page = session.get(srv.base + "/", timeout=120)
    assert page.status_code == 200
    kernel = _kernel_id(page.text)
    assert kernel not in first
    assert _ask(srv, session, kernel, "comm_info_request", {"target_name": "jupyter.widget"})["status"] == "ok"
    ppid = int(Path(f"/proc/{_kernel_pid(kernel)}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert ppid != old  # started after the zygote died
    new = _zygotes(srv)
    assert new and old not in new  # a new zygote took its place
    assert "exited with -9: starting a new one" in srv.log.read_text()
