"""The `bertlab` command: argument parsing and the Voila command `serve` builds (nothing is served
here; tests/browser/ serves for real)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar

import pytest

from bertlab import cli
from bertlab.settings import PLOTLY_BUNDLE_ENV, PLOTLY_BUNDLE_PATH

REPO = Path(__file__).resolve().parents[1]


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_serve_defaults():
    args = parse("serve")
    assert (args.command, args.port, args.no_browser, args.model) == ("serve", 8866, False, None)
    assert args.host == "127.0.0.1" and args.func is cli.cmd_serve


def test_serve_options():
    args = parse("serve", "--port", "9001", "--no-browser", "--model", "bert-base-uncased")
    assert (args.port, args.no_browser, args.model) == (9001, True, "bert-base-uncased")


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_bad_port_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as e:
        parse("serve", "--port", port)
    assert e.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert "serve" in out and "usage: bertlab" in out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["fly"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_serve_command_runs_voila_on_the_app():
    cmd, env = cli.serve_command(parse("serve", "--port", "9001", "--no-browser"), env={})
    assert cmd[:3] == [sys.executable, "-m", "bertlab.serving"]  # Voila, with bertlab's class server parts
    assert Path(cmd[3]) == REPO / "bertlab" / "apps" / "bertlab.ipynb"
    assert "--port=9001" in cmd and "--no-browser" in cmd and "--Voila.ip=127.0.0.1" in cmd
    assert "--preheat_kernel=True" in cmd  # ~6 s to a page instead of ~15 s
    assert "--MappingKernelManager.cull_idle_timeout=40" in cmd  # closed pages' kernels are freed
    # loopback, one person: no token, no class settings; figures load plotly's code from the server
    assert cli.MODEL_ENV not in env
    assert env == {PLOTLY_BUNDLE_ENV: PLOTLY_BUNDLE_PATH, cli.WORKDIR_ENV: os.getcwd()}  # kernels work here


def test_serve_command_passes_model_and_options():
    args = parse("serve", "--model", "some/folder", "--host", "0.0.0.0", "--no-preheat")
    cmd, env = cli.serve_command(args, env={"KEEP": "1"})
    token = env.pop("BERTLAB_SERVE_TOKEN")  # beyond loopback: a door, generated
    assert env == {"KEEP": "1", cli.MODEL_ENV: "some/folder", PLOTLY_BUNDLE_ENV: PLOTLY_BUNDLE_PATH,
                   cli.WORKDIR_ENV: os.getcwd()}
    assert len(token) >= 24
    assert "--Voila.ip=0.0.0.0" in cmd
    assert "--no-browser" not in cmd and not any("preheat" in c for c in cmd)


class FakeVoila:
    """Stands in for subprocess.Popen: records the command, exits with `code` (or raises on wait)."""

    calls: ClassVar[list[tuple[list[str], dict]]] = []

    def __init__(self, cmd, env, code=3, interrupt=False):
        self.calls.append((cmd, env))
        self.code, self.interrupt, self.terminated, self.waits = code, interrupt, False, 0

    def wait(self):
        self.waits += 1
        if self.interrupt and self.waits == 1:
            raise KeyboardInterrupt
        return self.code

    def terminate(self):
        self.terminated = True


def test_main_serve_runs_the_command_and_returns_its_code(monkeypatch):
    FakeVoila.calls = []
    monkeypatch.setattr(cli.subprocess, "Popen", FakeVoila)
    assert cli.main(["serve", "--no-browser", "--model", "m"]) == 3
    ((cmd, env),) = FakeVoila.calls
    assert cmd[2] == "bertlab.serving" and env[cli.MODEL_ENV] == "m"


def test_ctrl_c_waits_for_voila_then_exits_cleanly(monkeypatch):
    procs = []
    monkeypatch.setattr(cli.subprocess, "Popen",
                        lambda cmd, env: procs.append(FakeVoila(cmd, env, interrupt=True)) or procs[-1])
    assert cli.main(["serve", "--no-browser"]) == 0
    assert procs[0].waits == 2  # waited again for Voila to shut its kernels down


def test_sigterm_is_passed_on_to_voila(monkeypatch):
    procs = []

    class SelfTerminating(FakeVoila):
        def wait(self):
            signal.raise_signal(signal.SIGTERM)  # what a supervisor (or a test fixture) sends
            return -15 if self.terminated else 0

    monkeypatch.setattr(cli.subprocess, "Popen", lambda cmd, env: procs.append(SelfTerminating(cmd, env)) or procs[-1])
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["serve", "--no-browser"]) == -15
    assert procs[0].terminated and signal.getsignal(signal.SIGTERM) is before


def test_serve_class_options():
    args = parse("serve", "--class", "30", "--pool-size", "20", "--max-kernels", "34", "--cull-idle", "60",
                 "--token", "t0k3n", "--allow-host", "lab.example.org", "--class-dir", "/tmp/c")
    assert (args.class_size, args.pool_size, args.max_kernels, args.cull_idle) == (30, 20, 34, 60)
    cmd, env = cli.serve_command(args, env={})
    assert "--pool_size=20" in cmd and "--BertlabVoila.max_kernels=34" in cmd
    assert "--MappingKernelManager.cull_idle_timeout=60" in cmd
    assert "--BertlabVoila.allowed_hosts=['lab.example.org']" in cmd
    assert env["BERTLAB_SERVE_TOKEN"] == "t0k3n" and env["BERTLAB_CLASS"] == "1"
    assert env["BERTLAB_QUEUE"] == "/tmp/c/queue.sqlite" and env["BERTLAB_WORKSPACES"] == "/tmp/c/workspaces"


@pytest.mark.parametrize("bad", [["--class", "0"], ["--max-kernels", "-1"], ["--cull-idle", "x"]])
def test_bad_class_options_are_usage_errors(bad, capsys):
    with pytest.raises(SystemExit) as e:
        parse("serve", *bad)
    assert e.value.code == 2 and bad[0] in capsys.readouterr().err


def test_model_folder_is_passed_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "my-model").mkdir()
    monkeypatch.chdir(tmp_path)  # the kernel may run elsewhere: a relative path would break there
    _, env = cli.serve_command(parse("serve", "--model", "my-model"), env={})
    assert env[cli.MODEL_ENV] == str(tmp_path / "my-model")


def test_missing_model_folder_fails_before_serving(capsys, monkeypatch):
    monkeypatch.setattr(cli.subprocess, "Popen", lambda *a, **k: pytest.fail("Voila should not start"))
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", "./no/such/folder"])
    assert e.value.code == 1 and "no such folder" in capsys.readouterr().err


def test_find_app_takes_a_path(tmp_path):
    nb = tmp_path / "mine.ipynb"
    nb.write_text("{}")
    assert cli.find_app(str(nb)) == nb.resolve()


def test_missing_app_says_what_to_do(capsys):
    with pytest.raises(cli.AppNotFoundError, match="--app"):
        cli.find_app("nope.ipynb")
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--app", "nope.ipynb"])
    assert e.value.code == 1
    assert "nope.ipynb" in capsys.readouterr().err


def test_console_script_is_installed():
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "bertlab"]
    assert ep.value == "bertlab.cli:main"
    out = subprocess.run([sys.executable, "-m", "bertlab.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--no-browser" in out.stdout


def test_user_errors_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    """main() prints the message of errors meant for the user (bad data, a full disk ...) as one line."""
    from bertlab.training.checkpoint import DiskFullError
    from bertlab.training.corpora import CorpusError

    def run(error: BaseException) -> int:
        def fails(args):
            raise error

        monkeypatch.setattr(cli, "COMMANDS", (lambda sub: sub.add_parser("x").set_defaults(func=fails),))
        return cli.main(["x"])

    for error, text in [(CorpusError("this corpus needs the package 'x':\n pip install x"),
                         "this corpus needs the package 'x': pip install x"),
                        (DiskFullError("/tmp/out"), "the disk is full while writing /tmp/out"),
                        (FileNotFoundError(2, "No such file or directory", "a.txt"), "No such file or directory"),
                        (KeyError("unknown task 'y'"), "unknown task 'y'")]:
        assert run(error) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bertlab x: ") and text in err, err
    with pytest.raises(ZeroDivisionError):  # a bug is not dressed up as a user error
        run(ZeroDivisionError("division by zero"))


def test_notebooks_copies_the_teaching_notebooks_and_keeps_a_students_work(tmp_path, capsys):
    shipped = cli.teaching_notebooks()
    assert [p.name for p in shipped] == sorted(p.name for p in (REPO / "bertlab" / "notebooks").glob("*.ipynb"))
    dest = tmp_path / "class" / "notebooks"
    assert cli.main(["notebooks", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == [p.name for p in shipped]
    assert (dest / shipped[0].name).read_bytes() == shipped[0].read_bytes()
    (dest / shipped[0].name).write_text("my answers")
    assert cli.main(["notebooks", str(dest)]) == 0
    assert (dest / shipped[0].name).read_text() == "my answers" and "already there, kept" in capsys.readouterr().out
    assert cli.main(["notebooks", str(dest), "--force"]) == 0
    assert (dest / shipped[0].name).read_bytes() == shipped[0].read_bytes()


def test_notebooks_refuses_a_file_as_the_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit) as e:
        cli.main(["notebooks", str(tmp_path / "f")])
    assert e.value.code == 1 and "is a file" in capsys.readouterr().err
