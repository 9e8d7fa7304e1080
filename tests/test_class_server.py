"""The class server (`bertlab serve --class N`): what it runs (pure plan), the Host/Origin
guard and the kernel cap without a server, then the real server on loopback: a foreign Host is
refused, a token or password is required, the page asks no CDN, a closed tab's kernel is freed at
once (its beacon) or culled (no beacon), a page that never runs loses its kernel within seconds while a
page that runs keeps it however late it connects, a connected page keeps its kernel, and over the cap
a student gets the "class is full" page (503), never a crash. One client address holds at most its share
of seats (bare `GET /`s cannot take the class), and only the page that owns a kernel can shut it down."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aio import run_in_thread
from nbclient import NotebookClient
from requests.adapters import HTTPAdapter

from bertlab import cli
from bertlab.serving import PASSWORD_HASH_ENV, STATUS_PATH, TOKEN_ENV
from bertlab.serving.guard import HostGuard, is_loopback, known_names
from bertlab.serving.handlers import KERNEL_COOKIE
from bertlab.serving.kernels import ClassKernels
from bertlab.serving.plan import class_cap, make_plan

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "apps" / "bertlab.ipynb"


def plan(**kw):
    options = dict(app=APP, port=9000, host="127.0.0.1", open_browser=False, class_size=None, preheat=True,
                   pool_size=None, max_kernels=None, cull_idle=40, token=None, password_hash=None)
    return make_plan(**{**options, **kw})


# -- the plan: command line and environment ----------------------------------------------------------
def test_plain_serve_culls_closed_pages_and_keeps_open_ones():
    argv = plan().argv()
    assert argv[:4] == [sys.executable, "-m", "bertlab.serving", str(APP)]
    assert "--MappingKernelManager.cull_idle_timeout=40" in argv
    assert "--MappingKernelManager.cull_connected=False" in argv
    interval = int(next(a for a in argv if "cull_interval=" in a).split("=")[1])
    assert 40 + interval <= 60  # a closed tab's kernel is gone within a minute
    assert "--pool_size=1" in argv and not any("max_kernels" in a or "fill_delay" in a for a in argv)
    assert "--template=bertlab" in argv  # the page without Font Awesome from a CDN


def test_seats_per_client_can_be_raised_or_lifted(tmp_path):
    assert plan(class_size=30, per_client=40).per_client == 40  # a class behind one NAT address
    assert not any("max_per_client" in a for a in plan(class_size=30, per_client=0).argv())
    assert plan().per_client is None  # one-person mode: no limit
    args = cli.build_parser().parse_args(["serve", "--class", "5", "--per-client", "8"])
    assert "--BertlabVoila.max_per_client=8" in cli.serve_command(args, env={})[0]


def test_kernels_take_no_tcp_ports_and_pages_parse_plotly_once():
    argv = plan().argv()
    # a TCP port picked for a starting kernel can be taken by another loopback connection first
    assert "--KernelManager.transport=ipc" in argv
    denied = next(a for a in argv if a.startswith("--VoilaConfiguration.extension_denylist="))
    assert "jupyterlab-plotly" in denied.split("=", 1)[1]  # figures load plotly from the server's bundle


def test_class_mode_sizes_the_pool_and_caps_kernels(tmp_path):
    p = plan(class_size=30, class_dir=tmp_path)
    argv = p.argv()
    assert "--pool_size=30" in argv and "--preheat_kernel=True" in argv
    assert "--VoilaKernelManager.fill_delay=20" in argv  # refill after the class arrived, not during
    # pre-heating a class keeps a cell's late output (nbclient drops what comes after its timeout)
    timeout = next(a for a in argv if a.startswith("--VoilaExecutor.iopub_timeout="))
    assert int(timeout.split("=")[1]) > NotebookClient.iopub_timeout.default_value
    assert "--BertlabVoila.max_per_client=3" in argv  # a tab, a reload, a second window per address
    assert f"--BertlabVoila.max_kernels={class_cap(30)}" in argv and class_cap(30) >= 32
    env = p.env({"PATH": "/bin", "BERTLAB_QUEUE": "/srv/q.sqlite"})
    assert env["BERTLAB_CLASS"] == "1" and env["BERTLAB_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["BERTLAB_WORKSPACES"] == str(tmp_path.resolve() / "workspaces")
    assert env["BERTLAB_QUEUE"] == "/srv/q.sqlite"  # the teacher's own setting wins
    assert "BERTLAB_CLASS" not in plan().env({})  # one-person mode sets nothing


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "lab.example.org", "::"])
def test_beyond_loopback_a_token_is_generated_and_kept_out_of_argv(host):
    p = plan(host=host, class_size=10)
    assert len(p.token) >= 24
    assert p.env({})[TOKEN_ENV] == p.token
    assert not any(p.token in a for a in p.argv())  # `ps` shows argv to every user


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.0.2", "::1"])
def test_loopback_needs_no_door(host):
    """127.0.0.0/8 and ::1 are loopback: only this machine reaches them."""
    assert plan(host=host).token == "" and is_loopback(host)


def test_a_password_replaces_the_generated_token():
    p = plan(host="0.0.0.0", password_hash="argon2:xyz")
    assert p.token == "" and p.env({})[PASSWORD_HASH_ENV] == "argon2:xyz"


def test_pool_over_the_cap_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--class", "4", "--pool-size", "9", "--max-kernels", "5"])
    assert e.value.code == 1 and "--pool-size 9 is over --max-kernels 5" in capsys.readouterr().err


def test_password_is_read_from_stdin_and_hashed(monkeypatch):
    import io

    from jupyter_server.auth import passwd_check

    monkeypatch.setattr(sys, "stdin", io.StringIO("correct horse\n"))
    args = cli.build_parser().parse_args(["serve", "--host", "0.0.0.0", "--password"])
    cmd, env = cli.serve_command(args, env={})
    assert passwd_check(env[PASSWORD_HASH_ENV], "correct horse") and TOKEN_ENV not in env
    assert not any("correct horse" in c or "argon2" in c for c in cmd)


# -- the guard and the cap, without a server ---------------------------------------------------------
def test_host_guard_accepts_only_this_server_names():
    guard = HostGuard(known_names("127.0.0.1", ["lab.example.org"]))
    for ok in ["localhost:8866", "127.0.0.1:8866", "[::1]:8866", "LAB.example.org", "127.0.0.2"]:
        assert guard.problem(ok, None) is None, ok
    assert "Host" in guard.problem("evil.example:8866", None)  # DNS rebinding
    assert "Origin" in guard.problem("localhost:8866", "http://evil.example")
    assert guard.problem("localhost:8866", "null") is not None
    assert guard.problem("localhost:8866", "http://localhost:8866") is None
    assert guard.problem(None, None) is not None


def test_every_interface_address_is_accepted_when_listening_on_all():
    from bertlab.serving.guard import interface_addresses

    guard = HostGuard(known_names("0.0.0.0"))
    assert all(guard.problem(f"[{a}]:1" if ":" in a else a, None) is None for a in interface_addresses())
    assert guard.problem("evil.example", None) is not None


def test_a_page_that_never_runs_loses_its_kernel_after_the_grace_one_that_runs_keeps_it():
    import logging

    from bertlab.serving.kernels import PAGE_REQUEST, PageRequest

    class Kernels(ClassKernels):
        UNSEEN_GRACE_S = 0.05

        def __init__(self) -> None:
            self._kernels, self._kernel_connections, self.ended = dict.fromkeys("abcd"), {"d": 1}, []
            self.log = logging.getLogger("test")

        async def shutdown_kernel(self, kernel_id: str, *args, **kwargs) -> None:
            self.ended.append(kernel_id)

    async def run() -> list[str]:
        km = Kernels()
        page = PAGE_REQUEST.set(PageRequest("127.0.0.1", lambda kernel_id, secret: None))
        try:
            for kernel_id in "abcd":
                km._seat(kernel_id)
        finally:
            PAGE_REQUEST.reset(page)
        km.page_sent("a")  # a plain GET: sent, never runs
        km.page_seen("b")  # its first script said it runs ...
        km.page_sent("b")  # ... before the page was all sent (a kernel started for it while it streams)
        # "c": still being sent; "d": sent, its websocket already connected
        km.page_sent("d")
        await asyncio.sleep(0.3)
        return km.ended

    assert run_in_thread(run()) == ["a"]


def test_kernel_cap_refuses_a_new_kernel_without_starting_one():
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from bertlab.serving.kernels import ClassFullError, class_kernel_manager_factory

    cls = class_kernel_manager_factory(max_kernels=2)(AsyncMappingKernelManager, False, 0)
    km = cls()
    km._kernels.update({"a": object(), "b": object()})  # two live kernels (stand-ins)
    assert not km.has_room() and not km.can_serve("bertlab.ipynb")
    with pytest.raises(ClassFullError):
        run_in_thread(km.start_kernel(kernel_name="python3"))
    km._kernels.pop("b")
    assert km.can_serve("bertlab.ipynb")
    assert km.class_status()["kernels"] == 1 and km.class_status()["max_kernels"] == 2


def test_one_address_holds_its_share_of_seats_and_only_the_owner_ends_a_kernel():
    """The seat book of the kernel manager: kernels handed to pages, by client address, each with its
    owner's secret (what the page handler and the shutdown handlers ask)."""
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from bertlab.serving.kernels import PAGE_REQUEST, PageRequest, class_kernel_manager_factory

    km = class_kernel_manager_factory(max_kernels=10, max_per_client=2)(AsyncMappingKernelManager, False, 0)()
    handed: dict[str, str] = {}
    for kid in ("k1", "k2"):
        km._kernels[kid] = object()
        token = PAGE_REQUEST.set(PageRequest("10.0.0.9", lambda k, secret: handed.__setitem__(k, secret)))
        try:
            km._seat(kid)  # what start_kernel and get_rendered_notebook do for the page being served
        finally:
            PAGE_REQUEST.reset(token)
    assert km.client_full("10.0.0.9") and not km.client_full("10.0.0.5")
    assert km.owns("k1", handed["k1"]) and not km.owns("k1", handed["k2"]) and not km.owns("k1", None)
    assert not km.owns("k1", "") and not km.owns("nobody", handed["k1"])
    km._kernels.pop("k2")  # a kernel gone (culled, its tab closed) frees its address's seat
    assert not km.client_full("10.0.0.9")
    km._seat("k3")  # no page being served (a test, a pooled kernel): no seat, no owner
    assert km.seats().held_by("10.0.0.9", {"k1", "k3"}) == 1


# -- the real server ------------------------------------------------------------------------------------
TOKEN = "class-test-token"
PASSWORD = "class-test-password"
CULL_IDLE_S = 20
START_S = 240  # the server and two pre-heated kernels that load MiniLM, on 2 busy cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path):
        self.base, self.port, self.proc, self.log = f"http://127.0.0.1:{port}", port, proc, log

    def session(self, source: str | None = None):
        """A logged-in client; `source`: the loopback address it connects from (127.0.0.0/8 are all this
        machine), so that the server sees several client addresses."""
        import requests

        s = requests.Session()
        s.headers["Authorization"] = f"token {TOKEN}"
        if source is not None:
            s.mount("http://", _SourceAdapter(source))
        return s

    def status(self) -> dict:
        return self.session().get(self.base + STATUS_PATH, timeout=30).json()

    @staticmethod
    def ws_headers(client, kernel_id: str) -> dict[str, str]:
        """Headers of `client`'s websocket to `kernel_id`, as its page sends them: the login token and the
        kernel's owner cookie (the server refuses the websocket to anyone but the page that holds it)."""
        cookie = next((c.value for c in client.cookies if c.name == KERNEL_COOKIE and c.path.endswith(kernel_id)), "")
        return {"Authorization": f"token {TOKEN}", "Cookie": f"{KERNEL_COOKIE}={cookie}"}

    def wait(self, what: str, check, timeout: float) -> float:
        """Seconds until `check()` holds; fails with the server log after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if check():
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"{what}: not within {timeout} s\n{self.log.read_text()[-3000:]}")

    def pool_ready(self) -> float:
        return self.wait("the pool filled", lambda: self.status()["pool"]["ready"] == 2, START_S)

    def alive(self, kernel_id: str) -> bool:
        return self.session().get(f"{self.base}/api/kernels/{kernel_id}", timeout=30).status_code == 200


class _SourceAdapter(HTTPAdapter):
    """requests' adapter, connecting from a given local address."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        return super().init_poolmanager(*args, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`BERTLAB_TOKEN=... bertlab serve --class 2 --max-kernels 3 --per-client 1 --cull-idle 20 --password` on
    a free loopback port (the password comes on stdin, as from a script)."""
    port = _free_port()
    folder = tmp_path_factory.mktemp("class")
    log = folder / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "BERTLAB_MODEL"}
    env["HF_HUB_OFFLINE"] = "1"
    env["BERTLAB_TOKEN"] = TOKEN  # the token from the environment, not argv
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertlab.cli", "serve", "--class", "2", "--max-kernels", "3", "--per-client", "1",
             "--no-browser", "--port", str(port), "--cull-idle", str(CULL_IDLE_S), "--password",
             "--class-dir", str(folder / "class")],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.stdin.write(f"{PASSWORD}\n".encode())
    proc.stdin.close()
    srv = Server(port, proc, log)
    srv.class_dir = folder / "class"
    try:
        srv.wait("the server listened", lambda: socket.create_connection(("127.0.0.1", port), 1).close() or True,
                 START_S)
        yield srv
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _kernel_id(page_html: str) -> str:
    return re.search(r'"kernelId": "([0-9a-f-]{36})"', page_html).group(1)


@pytest.mark.slow
def test_foreign_host_and_origin_are_refused(server):
    import requests

    for path in ["/", "/voila/static/voila.js", STATUS_PATH, "/api/kernels/00000000-0000-0000-0000-000000000000"]:
        r = requests.get(server.base + path, headers={"Host": f"evil.example:{server.port}"}, timeout=30)
        assert r.status_code == 403 and "not a name of this server" in r.text, path
    r = server.session().post(server.base + "/voila/api/shutdown/x", headers={"Origin": "http://evil.example"})
    assert r.status_code == 403


@pytest.mark.slow
def test_a_token_is_required_and_the_page_asks_no_cdn(server):
    import requests

    assert requests.get(server.base + STATUS_PATH, timeout=30).status_code == 403
    r = requests.get(server.base + "/", allow_redirects=False, timeout=30)
    assert r.status_code == 302 and "/login" in r.headers["Location"]
    server.pool_ready()
    s = requests.Session()
    page = s.get(server.base + f"/?token={TOKEN}", timeout=120)
    assert page.status_code == 200 and "username-" in "".join(s.cookies.keys())  # the token set a login cookie
    external = re.findall(r'<(?:link|script)[^>]+(?:href|src)="(https?://[^"]+)"', page.text)
    assert not external, external  # Voila's lab template asks cdn.jsdelivr.net for Font Awesome
    # Closing the tab: the page's beforeunload request frees the kernel at once (voila#1458).
    kernel = _kernel_id(page.text)
    _page_runs(server, s, kernel)
    r = s.post(f"{server.base}/voila/api/shutdown/{kernel}", files={"_xsrf": (None, s.cookies["_xsrf"])}, timeout=60)
    assert r.status_code == 204
    assert not server.alive(kernel)


@pytest.mark.slow
def test_a_password_logs_a_student_in(server):
    import requests

    s = requests.Session()
    form = s.get(server.base + "/login?next=%2F", timeout=30)
    assert form.status_code == 200 and 'name="password"' in form.text
    assert not re.findall(r'<(?:link|script)[^>]+(?:href|src)="https?://', form.text)
    wrong = s.post(server.base + "/login?next=%2F", data={"password": "nope", "_xsrf": s.cookies["_xsrf"]},
                   allow_redirects=False, timeout=30)
    assert wrong.status_code != 302 and s.get(server.base + STATUS_PATH, timeout=30).status_code == 403
    right = s.post(server.base + "/login?next=%2F", data={"password": PASSWORD, "_xsrf": s.cookies["_xsrf"]},
                   allow_redirects=False, timeout=30)
    assert right.status_code == 302 and right.headers["Location"] == "/"
    assert s.get(server.base + STATUS_PATH, timeout=30).json()["class_size"] == 2


@pytest.mark.slow
def test_bare_requests_cannot_take_the_class_nor_end_a_students_kernel(server):
    server.pool_ready()
    attacker, student = server.session("127.0.0.9"), server.session("127.0.0.5")
    pages = [attacker.get(server.base + "/", timeout=120) for _ in range(12)]  # like `curl /` in a loop
    assert pages[0].status_code == 200
    assert [p.status_code for p in pages[1:]] == [429] * 11
    assert "Too many bertlab pages" in pages[1].text and "--per-client" in pages[1].text
    taken = _kernel_id(pages[0].text)
    mine = student.get(server.base + "/", timeout=120)
    assert mine.status_code == 200, "a real student was kept out by bare requests"
    kernel = _kernel_id(mine.text)
    # The attacker cannot keep a seat it holds no page for by saying another page's "I run", nor open
    # the student's kernel websocket (it would read and drive the student's widgets).
    stranger = attacker.post(f"{server.base}/bertlab/api/seat/{kernel}",
                             headers={"X-XSRFToken": attacker.cookies["_xsrf"]}, timeout=60)
    assert stranger.status_code == 403
    with pytest.raises(Exception, match="403"):
        _hold_websocket(server, attacker, kernel)
    for client, kid in ((attacker, taken), (student, kernel)):  # both pages run, so both keep their kernels
        _page_runs(server, client, kid)
    # The attacker, logged in with its own cookies, cannot end the student's kernel (tab-close route, REST).
    r = attacker.post(f"{server.base}/voila/api/shutdown/{kernel}", files={"_xsrf": (None, attacker.cookies["_xsrf"])},
                      timeout=60)
    assert r.status_code == 403 and "only the page that opened" in r.text
    assert attacker.delete(f"{server.base}/api/kernels/{kernel}", timeout=60).status_code == 403
    assert server.alive(kernel)
    # Each page ends its own (seats free for the next test).
    r = student.post(f"{server.base}/voila/api/shutdown/{kernel}", files={"_xsrf": (None, student.cookies["_xsrf"])},
                     timeout=60)
    assert r.status_code == 204 and not server.alive(kernel)
    assert attacker.delete(f"{server.base}/api/kernels/{taken}", timeout=60).status_code == 204
    assert not server.alive(taken)


def _page_runs(server: Server, client, kernel_id: str) -> None:
    """What a page's first script does (seat_hello.js): say it runs, so its kernel waits for it to connect."""
    said = client.post(f"{server.base}/bertlab/api/seat/{kernel_id}",
                       headers={"X-XSRFToken": client.cookies["_xsrf"]}, timeout=60)
    assert said.status_code == 204


def _hold_websocket(server: Server, client, kernel_id: str) -> threading.Event:
    """Connect to the kernel as `client`'s open page does; the connection lasts until the event is set."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    stop, connected, failed = threading.Event(), threading.Event(), []

    async def hold():
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id=test-open-page"
        try:
            conn = await websocket_connect(HTTPRequest(url, headers=server.ws_headers(client, kernel_id)))
        except Exception as e:  # noqa: BLE001  handed to the caller
            failed.append(e)
            connected.set()
            return
        connected.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        conn.close()

    threading.Thread(target=asyncio.run, args=(hold(),), daemon=True).start()
    assert connected.wait(30)
    if failed:
        raise failed[0]
    return stop


@pytest.mark.slow
def test_kernels_of_gone_pages_are_culled_open_page_kept_and_a_full_class_gets_503(server):
    open_page, closed_tab, plain_get = (server.session(f"127.0.0.{i}") for i in (11, 12, 13))
    kept = _kernel_id(open_page.get(server.base + "/", timeout=120).text)
    stop_kept = _hold_websocket(server, open_page, kept)
    lost = _kernel_id(closed_tab.get(server.base + "/", timeout=120).text)
    _hold_websocket(server, closed_tab, lost).set()  # a tab that connected, then vanished without its beacon
    closed_at = time.monotonic()
    never = _kernel_id(plain_get.get(server.base + "/", timeout=120).text)  # like `curl /`: never connects
    got_at = time.monotonic()
    try:
        # Three kernels taken, cap 3: the next student is told the class is full, not shown a traceback.
        full = server.session().get(server.base + "/", timeout=60)
        assert full.status_code == 503 and "The class is full" in full.text and "Traceback" not in full.text
        assert full.headers["Retry-After"] == "60"
        assert server.status()["kernels"] <= 3  # the pool's refill never goes past the cap
        # A page that never runs (no browser) holds its seat for seconds, not for a loading page's grace.
        server.wait("the never-connected kernel freed", lambda: not server.alive(never), 90)
        assert time.monotonic() - got_at < ClassKernels.UNSEEN_GRACE_S + 10
        server.wait("the closed tab's kernel culled", lambda: not server.alive(lost), 90)
        assert time.monotonic() - closed_at < 60  # "a closed tab's kernel gone within a minute"
        assert server.alive(kept), "a connected page's kernel must not be culled"
        # A freed seat goes to the next student.
        again = server.session("127.0.0.12").get(server.base + "/", timeout=120)  # the closed tab's address
        assert again.status_code == 200 and _kernel_id(again.text) not in (kept, lost, never)
        assert server.status()["kernels"] <= 3
    finally:
        stop_kept.set()


@pytest.mark.slow
def test_a_page_that_runs_keeps_its_kernel_however_late_it_connects(server):
    """The page's first script says it runs (as seat_hello.js does); its code then takes longer than a plain
    request's grace to open the kernel's websocket, as on a busy server: the kernel is still there and
    the page connects."""
    slow = server.session("127.0.0.21")
    deadline = time.monotonic() + 120
    while (page := slow.get(server.base + "/", timeout=120)).status_code == 503 and time.monotonic() < deadline:
        time.sleep(2)  # the previous test's seats are being freed
    assert page.status_code == 200
    kernel = _kernel_id(page.text)
    _page_runs(server, slow, kernel)
    time.sleep(ClassKernels.UNSEEN_GRACE_S + 5)
    assert server.alive(kernel), "a page that runs lost its kernel before it connected"
    _hold_websocket(server, slow, kernel).set()  # it connects, late, and the kernel answers (a page's own socket)
    assert server.alive(kernel)
    ended = slow.post(f"{server.base}/voila/api/shutdown/{kernel}", files={"_xsrf": (None, slow.cookies["_xsrf"])},
                      timeout=60)
    assert ended.status_code == 204  # its seat is free for the next test


def test_voilas_error_pages_ask_no_cdn(monkeypatch):
    """A page whose notebook fails to render (e.g. a kernel lost under load) is Voila's error.html,
    which extends page.html: bertlab's template has its own, without base/page.html's CDN link."""
    import jinja2
    from voila.paths import collect_template_paths

    from bertlab.serving import TEMPLATE
    from bertlab.serving.app import TEMPLATES_ROOT

    monkeypatch.setenv("JUPYTER_PATH", str(TEMPLATES_ROOT))  # as BertlabVoila.initialize sets it
    paths = collect_template_paths(["voila"], TEMPLATE)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(paths), extensions=["jinja2.ext.i18n"])
    env.install_null_translations()
    html = env.get_template("error.html").render(status_code=500, status_message="Internal Server Error",
                                                 base_url="/", include_css=None)
    assert "500: Internal Server Error" in html
    assert not re.findall(r'(?:href|src)="https?://', html), html


def test_a_browser_keeps_one_workspace_across_its_pages(server):
    """Each browser gets a random workspace key in an HttpOnly cookie; its page's kernel, pre-heated before
    the page was asked for, moves into the folder named after it, so a reload's kernel finds the same one."""
    import hashlib

    from bertlab.serving.handlers import WORKSPACE_COOKIE

    server.pool_ready()
    student, other = server.session("127.0.0.21"), server.session("127.0.0.22")
    page = student.get(server.base + "/", timeout=120)
    assert page.status_code == 200
    cookie = next(c for c in student.cookies if c.name == WORKSPACE_COOKIE)
    assert re.fullmatch(r"[0-9a-f]{64}", cookie.value) and cookie.has_nonstandard_attr("HttpOnly")
    kernel = _kernel_id(page.text)
    _page_runs(server, student, kernel)
    workspaces = server.class_dir / "workspaces"
    mine = hashlib.sha256(cookie.value.encode()).hexdigest()[:32]
    server.wait("the page's kernel took its browser's workspace",
                lambda: [p.name for p in workspaces.iterdir() if p.name.endswith(mine)], 120)
    # A reload: the tab's kernel ends, the next page gets a pooled kernel and the same cookie back.
    r = student.post(f"{server.base}/voila/api/shutdown/{kernel}", files={"_xsrf": (None, student.cookies["_xsrf"])},
                     timeout=60)
    assert r.status_code == 204
    again = student.get(server.base + "/", timeout=120)
    assert WORKSPACE_COOKIE not in again.cookies, "a browser that has a key keeps it"
    kernel = _kernel_id(again.text)
    _page_runs(server, student, kernel)
    theirs = other.get(server.base + "/", timeout=120)  # another browser, with a key the student never sees
    key = next(c.value for c in other.cookies if c.name == WORKSPACE_COOKIE)
    assert key != cookie.value
    server.wait("the other browser's page took a folder of its own",
                lambda: [p for p in workspaces.iterdir()
                         if p.name.endswith(hashlib.sha256(key.encode()).hexdigest()[:32])], 120)
    assert len([p for p in workspaces.iterdir() if p.name.endswith(mine)]) == 1
    for client, kid in ((student, kernel), (other, _kernel_id(theirs.text))):
        assert client.delete(f"{server.base}/api/kernels/{kid}", timeout=60).status_code == 204
