"""The JupyterHub route (deploy/): a real hub on loopback with the repository's configuration.

Two students log in over HTTP (the login form's _xsrf cookie flow); each one's dashboard is served
by that student's own single-user server, whose kernel runs in class mode; one student cannot
open the other's dashboard; in Chromium the widgets render. The hub's proxy,
configurable-http-proxy, comes from npm (`npm install -g configurable-http-proxy`): without it the
hub tests skip on a developer machine and fail in CI (.ci/run installs it).

The memory of a student's server with the dashboard open (PSS, /proc/PID/smaps_rollup) is
measured on the way; BERTLAB_UPDATE_RESULTS=1 writes it to bench/results/jupyterhub_sizing.json.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from bertlab.hubservice import SERVICE_NAME
from bertlab.training.queue import process_alive

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
STUDENTS = ("alice", "bob")
HUB_START_S = 60
CULL_S = 150  # bertlab_config.py culls a kernel idle 60 s with no page, looking every 15 s
PAGE_S = 240  # a student's server + a kernel that imports torch and builds the dashboard, 2 busy cores
CLASS_ENV = {"BERTLAB_CLASS": "1", "BERTLAB_THREADS": "1", "OMP_NUM_THREADS": "1"}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(what: str) -> None:
    """Skip on a developer machine, fail in CI: CI installs the hub and its proxy."""
    if _in_ci():
        pytest.fail(f"{what} (CI=true, so this is an error: .ci/run installs it).")
    pytest.skip(what)


# -- the configuration files agree with each other (fast) --------------------------------------
def _hub_config(name: str) -> Config:
    """A config file of deploy/jupyterhub as JupyterHub reads it (load_subconfig and all)."""
    loader = PyFileConfigLoader(name, path=str(DEPLOY / "jupyterhub"))
    return loader.load_config()


def _lazy(value, initial):
    """The value a `c.X.y.update(...)` / `.extend(...)` line gives on top of `initial`."""
    return value.get_value(initial) if hasattr(value, "get_value") else value


def test_bertlab_config_sets_class_mode_and_the_dashboard_url():
    c = _hub_config("bertlab_config.py")
    assert c.Spawner.default_url == "/voila/render/bertlab.ipynb"
    env = _lazy(c.Spawner.environment, {})
    assert {k: env.get(k) for k in CLASS_ENV} == CLASS_ENV
    args = _lazy(c.Spawner.args, [])
    assert "--MappingKernelManager.cull_connected=False" in args


def test_z2jh_values_match_the_hub_config():
    """Kubernetes gets the same dashboard URL, class-mode environment and kernel culling as the
    one-server hub, plus enforced memory and CPU limits."""
    c = _hub_config("bertlab_config.py")
    values = yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text())
    single = values["singleuser"]
    assert single["defaultUrl"] == c.Spawner.default_url
    for name, value in CLASS_ENV.items():
        assert single["extraEnv"][name] == value
    assert values["hub"]["config"]["KubeSpawner"]["args"] == _lazy(c.Spawner.args, [])
    assert single["memory"]["limit"] and single["memory"]["guarantee"]
    assert single["cpu"]["limit"]
    link = " ".join(single["lifecycleHooks"]["postStart"]["exec"]["command"])
    assert "bertlab.ipynb" in link  # the dashboard put in the student's home


CLASS_ACCESS = f"access:services!service={SERVICE_NAME}"


def test_the_hub_starts_the_class_service_and_every_server_may_reach_it():
    """bertlab_config.py starts bertlab.hubservice as a managed service, tells every server where it is,
    and lets every user and their server's token (what the kernels hold) reach it."""
    c = _hub_config("bertlab_config.py")
    service = {s["name"]: s for s in _lazy(c.JupyterHub.services, [])}[SERVICE_NAME]
    assert service["command"][1:] == ["-m", "bertlab.hubservice"] and service["url"].startswith("http://")
    assert service["environment"]["BERTLAB_TEACHER_GROUPS"] == "teachers"
    env = _lazy(c.Spawner.environment, {})
    assert env["BERTLAB_CLASS_SERVICE_URL"] == f"{service['url']}/services/{SERVICE_NAME}/"
    assert CLASS_ACCESS in _lazy(c.JupyterHub.extra_user_scopes, set())
    assert CLASS_ACCESS in c.Spawner.server_token_scopes and "access:servers!server" in c.Spawner.server_token_scopes
    roles = {r["name"]: r for r in _lazy(c.JupyterHub.load_roles, [])}
    assert roles["bertlab-class-service"] == {"name": "bertlab-class-service", "services": [SERVICE_NAME],
                                              "scopes": ["read:users"]}


def test_z2jh_runs_the_same_class_service_in_the_hub_pod():
    c = _hub_config("bertlab_config.py")
    values = yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text())
    hub_values = values["hub"]
    service = hub_values["services"][SERVICE_NAME]
    assert service["command"][-2:] == ["-m", "bertlab.hubservice"]
    port = int(service["url"].rsplit(":", 1)[1])
    assert values["singleuser"]["extraEnv"]["BERTLAB_CLASS_SERVICE_URL"] == f"{service['url']}/services/{SERVICE_NAME}/"
    assert [p["port"] for p in hub_values["service"]["extraPorts"]] == [port]
    assert [p["port"] for rule in hub_values["networkPolicy"]["ingress"] for p in rule["ports"]] == [port]
    egress = values["singleuser"]["networkPolicy"]["egress"]
    assert [p["port"] for rule in egress for p in rule["ports"]] == [port]  # the students' pods may call it
    assert service["environment"]["BERTLAB_CLASS_SERVICE_IP"] == "0.0.0.0"
    assert service["environment"]["BERTLAB_CLASS_SERVICE_DB"].startswith("/srv/jupyterhub/")  # the hub's volume
    assert hub_values["config"]["KubeSpawner"]["server_token_scopes"] == c.Spawner.server_token_scopes
    assert hub_values["config"]["JupyterHub"]["extra_user_scopes"] == [CLASS_ACCESS]
    role = hub_values["loadRoles"]["bertlab-class-service"]
    roles = {r["name"]: r for r in _lazy(c.JupyterHub.load_roles, [])}
    assert role["scopes"] == roles["bertlab-class-service"]["scopes"] and role["services"] == [SERVICE_NAME]
    assert "teachers" in hub_values["config"]["JupyterHub"]["load_groups"]


def test_z2jh_tells_a_teachers_pod_to_link_the_teachers_view():
    from types import SimpleNamespace

    values = yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text())
    c = Config()
    exec(values["hub"]["extraConfig"]["bertlab-teachers"], {"c": c})  # as the chart runs hub.extraConfig
    hook = c.KubeSpawner.pre_spawn_hook
    for admin, groups, teaches in ((False, ["teachers"], "1"), (True, [], "1"), (False, ["class-a"], "")):
        user = SimpleNamespace(admin=admin, groups=[SimpleNamespace(name=g) for g in groups])
        spawner = SimpleNamespace(user=user, environment={})
        hook(spawner)
        assert spawner.environment["BERTLAB_TEACHER"] == teaches
    link = values["singleuser"]["lifecycleHooks"]["postStart"]["exec"]["command"][-1]
    assert "BERTLAB_TEACHER" in link and "teacher.ipynb" in link


# -- a hub on loopback ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Hub:
    url: str  # the proxy's public URL, ending in /
    token: str  # a service token with admin rights on users and servers
    password: str
    home: Path  # students' homes: home/<name>
    log: Path
    proc: subprocess.Popen
    pids: set[int] = field(default_factory=set)  # every process the test saw start, for teardown
    users: tuple[str, ...] = STUDENTS
    class_service: str = ""  # the class service's URL, as the students' servers get it

    def api(self, path: str) -> dict:
        import requests

        r = requests.get(f"{self.url}hub/api/{path}", headers={"Authorization": f"token {self.token}"}, timeout=30)
        r.raise_for_status()
        return r.json()

    def server_pid(self, name: str) -> int:
        server = self.api(f"users/{name}")["servers"][""]
        assert server["ready"] and server["url"] == f"/user/{name}/"
        return int(server["state"]["pid"])


def _test_config(tmp: Path, ports: dict[str, int], token: str, password: str, users: tuple[str, ...]) -> str:
    """The repository's one-server config, on loopback, with a password every test student
    shares and a spawner that needs no system users."""
    return f"""
load_subconfig({str(DEPLOY / "jupyterhub" / "jupyterhub_config.py")!r})
c.JupyterHub.bind_url = "http://127.0.0.1:{ports["public"]}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{ports["hub"]}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{ports["proxy_api"]}"
c.ConfigurableHTTPProxy.pid_file = {str(tmp / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{tmp / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = {str(tmp / "cookie_secret")!r}
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {password!r}
c.Authenticator.allowed_users = {set(users)!r}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {str(tmp / "home" / "{username}")!r}
c.Spawner.environment.update({{"HF_HUB_OFFLINE": "1"}})
c.Spawner.args.append("--ServerApp.allow_root={os.geteuid() == 0}")  # no system users: the test's own
c.JupyterHub.services.append({{"name": "hub-test", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "hub-test", "services": ["hub-test"],
                                "scopes": ["admin:users", "admin:servers", "admin:server_state"]}})
"""


def need_hub() -> None:
    """Skip (fail in CI) without JupyterHub or its proxy."""
    try:
        import jupyterhub  # noqa: F401
        import requests  # noqa: F401
    except ImportError:
        _missing("jupyterhub is not installed (pip install -e '.[test]')")
    if shutil.which("configurable-http-proxy") is None:
        _missing("configurable-http-proxy is not on PATH (npm install -g configurable-http-proxy)")


def start_hub(tmp: Path, users: tuple[str, ...] = STUDENTS, extra_config: str = "",
              env_extra: dict[str, str] | None = None) -> Hub:
    """JupyterHub on loopback with the repository's configuration (and `extra_config` after it), once it
    answers; the class service it starts listens on a free port. `_stop` it."""
    ports = {name: _free_port() for name in ("public", "hub", "proxy_api", "class_service")}
    token, password = secrets.token_hex(16), secrets.token_urlsafe(12)
    (tmp / "jupyterhub_config.py").write_text(_test_config(tmp, ports, token, password, users) + extra_config)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTLAB_", "JUPYTERHUB_"))}
    env["BERTLAB_HUB_STATE"] = str(tmp / "state")  # the class service's folder
    (tmp / "state").mkdir()
    service = f"http://127.0.0.1:{ports['class_service']}"
    env["BERTLAB_CLASS_SERVICE_ADDRESS"] = service
    env["CONFIGPROXY_AUTH_TOKEN"] = secrets.token_hex(16)
    env.update(env_extra or {})
    log = tmp / "jupyterhub.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
                                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    h = Hub(f"http://127.0.0.1:{ports['public']}/", token, password, tmp / "home", log, proc, {proc.pid},
            users, f"{service}/services/bertlab-class/")
    try:
        _wait_for_hub(h)
    except BaseException:
        _stop(h, tmp / "proxy.pid")
        raise
    return h


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    need_hub()
    tmp = tmp_path_factory.mktemp("hub")
    h = start_hub(tmp)
    try:
        yield h
    finally:
        _stop(h, tmp / "proxy.pid")


def _wait_for_hub(h: Hub) -> None:
    import requests

    deadline = time.monotonic() + HUB_START_S
    while time.monotonic() < deadline:
        if h.proc.poll() is not None:
            pytest.fail(f"jupyterhub exited with {h.proc.returncode}:\n{h.log.read_text()[-3000:]}")
        try:
            if requests.get(f"{h.url}hub/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"jupyterhub did not answer within {HUB_START_S} s:\n{h.log.read_text()[-3000:]}")


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (a student's server: its kernels)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _stop(h: Hub, proxy_pid_file: Path) -> None:
    """SIGTERM the hub (it stops the students' servers and its proxy); then SIGTERM, and after
    20 s SIGKILL, whatever the test saw start and is still there."""
    if proxy_pid_file.exists() and proxy_pid_file.read_text().strip().isdigit():
        h.pids.add(int(proxy_pid_file.read_text()))
    for name in h.users:  # servers a failed test did not get to look at
        try:
            h.pids.add(h.server_pid(name))
        except Exception:  # no server, or the hub is not answering: nothing more to learn
            pass
    for pid in list(h.pids):  # servers' kernels started after the last look
        h.pids.update(_children(pid))
    try:
        os.killpg(h.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        h.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(h.proc.pid, signal.SIGKILL)
        h.proc.wait(timeout=10)
    left = [pid for pid in h.pids if process_alive(pid)]
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if process_alive(pid)]
    _signal(left, signal.SIGKILL)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # gone meanwhile
            pass


# -- logging in over HTTP -------------------------------------------------------------------------
def _login(h: Hub, name: str, password: str):
    """A browser-like session that has logged in with the hub's form (the _xsrf cookie flow)."""
    import requests

    s = requests.Session()
    r = s.get(f"{h.url}hub/login", timeout=30)
    r.raise_for_status()
    xsrf = s.cookies.get("_xsrf")
    assert xsrf, "the login page set no _xsrf cookie"
    r = s.post(f"{h.url}hub/login", data={"username": name, "password": password, "_xsrf": xsrf},
               allow_redirects=False, timeout=30)
    return s, r


def _open_dashboard(h: Hub, name: str):
    """Log in, start the student's server and follow it to the default URL, as the hub's
    spawn-pending page does in a browser (it reloads until the server is up)."""
    s, r = _login(h, name, h.password)
    assert r.status_code == 302, f"{name} could not log in: HTTP {r.status_code}"
    deadline = time.monotonic() + PAGE_S
    page = s.get(f"{h.url}hub/spawn", timeout=PAGE_S)
    while "/hub/spawn-pending/" in page.url and page.status_code == 200 and time.monotonic() < deadline:
        time.sleep(1)
        page = s.get(page.url, timeout=PAGE_S)
    return s, page


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _kernels(server_pid: int) -> list[int]:
    """The kernels a student's server runs (its ipykernel children)."""
    out = []
    for pid in _children(server_pid):
        try:
            if "ipykernel" in Path(f"/proc/{pid}/cmdline").read_text():
                out.append(pid)
        except OSError:  # ended meanwhile
            pass
    return out


def _start_time(pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/PID/stat field 22)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _memory_mb(pid: int) -> dict[str, float]:
    """Resident, proportional and private (unique) set size of one process, in MB
    (/proc/PID/smaps_rollup). PSS splits shared pages among every process that maps them."""
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    kb = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE)}
    uss = kb["Private_Clean"] + kb["Private_Dirty"]
    return {"rss_mb": round(kb["Rss"] / 1024, 1), "pss_mb": round(kb["Pss"] / 1024, 1), "uss_mb": round(uss / 1024, 1)}


@pytest.mark.slow
def test_each_student_gets_the_dashboard_from_their_own_server(hub: Hub):
    """Two students log in at once; each lands on the dashboard, served by a server of their own
    whose kernel runs in class mode in their home; neither can open the other's."""
    from bertlab.cli import find_app

    _, wrong = _login(hub, "alice", hub.password + "x")
    assert wrong.status_code == 403, "a wrong password must not log in"

    with ThreadPoolExecutor(len(STUDENTS)) as pool:  # two students arrive together
        opened = dict(zip(STUDENTS, pool.map(lambda name: _open_dashboard(hub, name), STUDENTS)))

    pids = {}
    for name, (_, page) in opened.items():
        assert page.status_code == 200, f"{name}: HTTP {page.status_code} at {page.url}"
        assert page.url == f"{hub.url}user/{name}/voila/render/bertlab.ipynb"
        assert f'"baseUrl": "/user/{name}/"' in page.text  # Voila's page of the student's own server
        assert "application/vnd.jupyter.widget-view+json" in page.text, "the dashboard cell showed no widget"
        assert "Traceback" not in page.text and "error when executing" not in page.text.lower()
        outside = re.findall(r'<(?:link|script)[^>]+(?:href|src)="((?:https?:)?//[^"]+)"', page.text)
        assert outside == [], f"the page loads files from outside this server: {outside}"

        pids[name] = pid = hub.server_pid(name)
        hub.pids.add(pid)
        server_env = _environ(pid)
        assert server_env["JUPYTERHUB_USER"] == name and server_env["HOME"] == str(hub.home / name)
        link = hub.home / name / "bertlab.ipynb"
        assert link.is_symlink() and link.resolve() == find_app()  # the installed dashboard

        kernels = _kernels(pid)
        assert len(kernels) == 1, f"{name}'s server runs {len(kernels)} kernels after one page"
        hub.pids.update(kernels)
        kernel_env = _environ(kernels[0])
        assert {k: kernel_env.get(k) for k in CLASS_ENV} == CLASS_ENV
        assert kernel_env["JUPYTERHUB_USER"] == name
        assert kernel_env["BERTLAB_CLASS_SERVICE_URL"] == hub.class_service  # the class's questions and queue
        assert kernel_env["JUPYTERHUB_API_TOKEN"]  # the server's token, which the class service accepts
        assert Path(os.readlink(f"/proc/{kernels[0]}/cwd")) == hub.home / name
    assert pids["alice"] != pids["bob"]

    # Bob's login does not open Alice's dashboard, and starts nothing in her server.
    bob, _ = opened["bob"]
    r = bob.get(f"{hub.url}user/alice/voila/render/bertlab.ipynb", timeout=60)
    assert r.status_code == 403 and r.url.startswith(f"{hub.url}hub/"), f"HTTP {r.status_code} at {r.url}"
    assert len(_kernels(pids["alice"])) == 1


@pytest.mark.slow
@pytest.mark.browser
def test_the_widgets_render_in_a_students_browser(hub: Hub):
    """Log in with the hub's form in Chromium as a student would; the dashboard's tabs appear.
    Measures that student's server and the page's kernel while the dashboard is open. Then the
    kernels of pages nobody has open (the HTTP test's) are culled; the open page's kernel stays."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")

    def drive() -> None:
        name = "bob"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.set_default_timeout(PAGE_S * 1000)
                refused = []  # nothing may leave loopback: a CDN request is refused and recorded
                page.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/])"),
                           lambda route: (refused.append(route.request.url), route.abort()))
                page.goto(f"{hub.url}hub/login")
                page.fill("#username_input", name)
                page.fill("#password_input", hub.password)
                page.click("#login_submit")
                page.wait_for_url(re.compile(rf"/user/{name}/voila/render/bertlab\.ipynb"))
                page.locator(".bertlab-tabs").first.wait_for(state="visible")

                pid = hub.server_pid(name)
                hub.pids.add(pid)
                kernels = _kernels(pid)
                hub.pids.update(kernels)
                open_kernel = max(kernels, key=_start_time)  # the kernel of this page
                _record_sizing(_memory_mb(pid), _memory_mb(open_kernel))

                left = _wait_for_culling(hub, CULL_S)
                mine = left.pop(name)
                assert mine == [open_kernel], \
                    f"{name}'s kernels after {CULL_S} s: {mine}, the open page's: {open_kernel}"
                assert left.get("alice", []) == [], f"kernels of pages nobody has open after {CULL_S} s: {left}"
                assert page.locator(".bertlab-tabs").first.is_visible()
                assert refused == [], f"the page asked for files outside this machine: {refused[:5]}"
            finally:
                browser.close()

    # In a thread of its own: the browser tests' session-wide sync_playwright() (tests/browser/conftest.py)
    # keeps an event loop running in the main thread, where a second sync_playwright() is refused.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(drive).result()


def _wait_for_culling(hub: Hub, seconds: float) -> dict[str, list[int]]:
    """Kernels of each student's server once only connected ones are left (or time is up)."""
    pids = {name: hub.server_pid(name) for name in STUDENTS if hub.api(f"users/{name}")["servers"]}
    deadline = time.monotonic() + seconds
    while True:
        left = {name: sorted(_kernels(pid)) for name, pid in pids.items()}
        if sum(map(len, left.values())) <= 1 or time.monotonic() > deadline:
            return left
        time.sleep(2)


def _record_sizing(server: dict[str, float], kernel: dict[str, float]) -> None:
    """Print one student's memory; BERTLAB_UPDATE_RESULTS=1 also writes it to bench/results."""
    sizing = {"server": server, "kernel": kernel}
    sizing["student"] = {k: round(server[k] + kernel[k], 1) for k in server}
    print(f"\none student's server with the dashboard open (MB): {json.dumps(sizing)}")
    if os.environ.get("BERTLAB_UPDATE_RESULTS") == "1":
        out = REPO / "bench" / "results" / "jupyterhub_sizing.json"
        what = ("one student's JupyterHub server (jupyterhub-singleuser with Voila) and the kernel of their "
                "open dashboard page: offline default model, class mode; MB from /proc/PID/smaps_rollup")
        out.write_text(json.dumps({"what": what, "command": "BERTLAB_UPDATE_RESULTS=1 pytest "
                                   "tests/test_jupyterhub.py", **sizing}, indent=2) + "\n")
    assert kernel["rss_mb"] > 100, "the page's kernel has not built the dashboard"
