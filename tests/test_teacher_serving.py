"""`bertlab serve --class N` starts the class store's variable for every kernel and, beside the
students' server, the teacher's view: apps/teacher.ipynb on the next port, with its own secret that
the students' server and kernels never hold."""

from __future__ import annotations

import json
from pathlib import Path

from bertlab import cli
from bertlab.serving import TOKEN_ENV
from bertlab.serving.plan import class_env
from bertlab.serving.teacher import TEACHER_APP, teacher_command, teacher_plan, teacher_url


def _plan(*argv: str):
    return cli.serve_plan(cli.build_parser().parse_args(["serve", *argv]))


def test_class_kernels_get_the_class_store_next_to_the_queue():
    env = class_env(Path("/srv/class"), {})
    assert env["BERTLAB_CLASS_STORE"] == "/srv/class/class.sqlite"
    assert class_env(Path("/srv/class"), {"BERTLAB_CLASS_STORE": "/elsewhere.sqlite"})["BERTLAB_CLASS_STORE"] == (
        "/elsewhere.sqlite")  # the teacher's own setting wins


def test_the_teacher_server_has_its_own_secret_port_and_notebook(tmp_path):
    (tmp_path / "token").write_text("students")
    plan = _plan("--class", "30", "--port", "9000", "--token-file", str(tmp_path / "token"), "--host", "0.0.0.0",
                 "--class-dir", str(tmp_path))
    teacher = teacher_plan(plan, cli.find_app(TEACHER_APP))
    assert teacher.port == 9001 and teacher.host == plan.host
    assert teacher.token not in ("", plan.token) and len(teacher.token) >= 20
    assert (teacher.class_size, teacher.pool_size, teacher.open_browser) == (None, 0, False)
    cmd, env = teacher_command(plan, teacher, {"PATH": "/bin"})
    assert cmd[3].endswith("apps/teacher.ipynb") and "--port=9001" in cmd and "--Voila.log_level=WARN" in cmd
    assert not any("preheat" in c or "pool_size" in c for c in cmd)
    assert teacher.token not in " ".join(cmd)  # secrets never in argv (ps shows it)
    assert env[TOKEN_ENV] == teacher.token
    _, students_env = cli.serve_command(cli.build_parser().parse_args(
        ["serve", "--class", "30", "--class-dir", str(tmp_path)]), env={"PATH": "/bin"})
    assert env["BERTLAB_CLASS_STORE"] == students_env["BERTLAB_CLASS_STORE"] == str(tmp_path / "class.sqlite")
    assert teacher.token not in json.dumps(students_env)
    url = teacher_url(teacher)
    assert url.endswith(f":9001/?token={teacher.token}") and "0.0.0.0" not in url


def test_serve_class_starts_both_servers_and_prints_the_teachers_address(tmp_path, monkeypatch, caplog):
    started = []

    class FakeServer:
        def __init__(self, cmd, env):
            started.append(self)
            self.cmd, self.env, self.terminated = cmd, env, False

        def wait(self):
            return 0

        def terminate(self):
            self.terminated = True

    monkeypatch.setattr(cli.subprocess, "Popen", FakeServer)
    caplog.set_level("INFO", logger="bertlab.cli")
    assert cli.main(["serve", "--class", "2", "--no-browser", "--port", "9100", "--teacher-port", "9200",
                     "--class-dir", str(tmp_path)]) == 0
    students, teacher = started
    assert students.cmd[3].endswith("apps/bertlab.ipynb") and teacher.cmd[3].endswith("apps/teacher.ipynb")
    assert "--port=9200" in teacher.cmd and teacher.terminated  # stopped with the students' server
    secret = teacher.env[TOKEN_ENV]
    assert f"http://127.0.0.1:9200/?token={secret}" in caplog.text
    assert TOKEN_ENV not in students.env  # loopback, no --token: the students' page needs none


def test_no_teacher_server_without_class_mode(monkeypatch):
    started = []
    monkeypatch.setattr(cli.subprocess, "Popen", lambda cmd, env: started.append(cmd) or _Done())
    assert cli.main(["serve", "--no-browser"]) == 0
    assert len(started) == 1


class _Done:
    def wait(self):
        return 0
