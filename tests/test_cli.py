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
    assert Path(cmd[3]) == REPO / "apps" / "bertlab.ipynb"
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


def test_serve_class_options(tmp_path):
    (tmp_path / "token").write_text("t0k3n\n")
    args = parse("serve", "--class", "30", "--pool-size", "20", "--max-kernels", "34", "--cull-idle", "60",
                 "--token-file", str(tmp_path / "token"), "--allow-host", "lab.example.org", "--class-dir", "/tmp/c")
    assert (args.class_size, args.pool_size, args.max_kernels, args.cull_idle) == (30, 20, 34, 60)
    cmd, env = cli.serve_command(args, env={})
    assert "--pool_size=20" in cmd and "--BertlabVoila.max_kernels=34" in cmd
    assert "--MappingKernelManager.cull_idle_timeout=60" in cmd
    assert "--BertlabVoila.allowed_hosts=lab.example.org" in cmd  # one option per name (no deprecated list form)
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
    assert [p.name for p in shipped] == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
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


# -- one clear line for every mistake, before anything loads ------------------------------------
def _all_parsers(parser=None, prog="bertlab"):
    """(prog, parser) of every command and sub-command of the full parser."""
    parser = parser or cli.build_parser()
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, cli.argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _all_parsers(child, f"{prog} {name}")


def test_every_option_has_help_and_every_command_a_description():
    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}" for prog, p in _all_parsers() for a in p._actions
               if not a.help and not isinstance(a, cli.argparse._SubParsersAction)]
    assert not missing, "options without help: " + ", ".join(missing)
    bare = [prog for prog, p in _all_parsers() if prog != "bertlab" and not p.description]
    assert not bare, "commands without a description: " + ", ".join(bare)


def test_help_texts_print_percent_signs_once(capsys):
    for prog, parser in _all_parsers():
        parser.print_help()
        assert "%%" not in capsys.readouterr().out, prog


def test_lazy_commands_list_the_help_of_their_real_parsers():
    full = {a.dest: a.help for a in cli.build_parser()._subparsers._group_actions[0]._choices_actions}
    for names in cli.LAZY.values():
        for name, text in names.items():
            assert full[name] == text, name


def test_help_imports_neither_torch_nor_the_lab():
    code = ("import sys\nfrom bertlab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('bertlab')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['bertlab', 'bertlab.cli']"
    assert "finetune" in out.stdout and "explain" in out.stdout and "notebooks" in out.stdout


def _refused(argv, capsys, monkeypatch) -> str:
    """Run `bertlab ARGV`, expecting the command line refused (exit 2) before any model loads; its message."""
    import bertlab.loading

    monkeypatch.setattr(bertlab.loading, "load", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv", [
    ["finetune", "--task", "sst2", "--out", "x"], ["evaluate", "--task", "sst2", "--model", "m"],
    ["pretrain", "--out", "x"], ["train-default-heads"],
    ["compress", "distill", "--model", "m", "--layers", "1", "--task", "sst2", "--out", "x"],
])
def test_a_device_that_does_not_exist_is_one_line(argv, capsys, monkeypatch):
    err = _refused([*argv, "--device", "tpu"], capsys, monkeypatch)
    assert err.startswith(f"bertlab {argv[0]}") and "'tpu' is not a device" in err and "auto, cpu" in err


def test_cuda_where_there_is_none_is_one_line(capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    err = _refused(["finetune", "--task", "sst2", "--out", "x", "--device", "cuda"], capsys, monkeypatch)
    assert "CUDA is not available" in err


@pytest.mark.parametrize("argv, says", [
    (["finetune", "--task", "sst3", "--out", "x"], "invalid choice: 'sst3'"),
    (["finetune", "--task", "sst2", "--out", "x", "--data", "/no/such/data"], "'/no/such/data': no such file"),
    (["finetune", "--task", "sst2", "--out", "x", "--model", "./no/such/model"], "no such folder"),
    (["evaluate-mlm", "--text", "/no/such.txt"], "no such file"),
    (["evaluate", "--task", "sst2", "--model", "/no/such/model"], "no such folder"),
    (["pretrain", "--out", "x", "--resume", "/no/such/checkpoint"], "no such file or folder"),
    (["pretrain", "--out", "x", "--model", "/no/such/model"], "no such folder"),
    (["pretrain", "--out", "x", "--steps", "0"], "0 is not 1 or more"),
    (["compress", "prune", "--model", "m", "--task", "sst2", "--out", "x", "--data", "/no/such"], "no such file"),
    (["explain", "--text", "a", "--model", "~/no/such/model"], "no such folder"),
])
def test_wrong_values_are_one_line_before_loading(argv, says, capsys, monkeypatch):
    assert says in _refused(argv, capsys, monkeypatch)


def test_distill_names_its_teacher_model_and_still_reads_teacher(capsys):
    args = parse("compress", "distill", "--model", "t", "--layers", "2", "--task", "sst2", "--out", "s")
    assert args.model == "t"
    old = parse("compress", "distill", "--teacher", "t", "--layers", "2", "--task", "sst2", "--out", "s")
    assert old.model == "t" and "--teacher is now --model" in capsys.readouterr().err
    helps = {prog: p.format_help() for prog, p in _all_parsers()}
    assert "--model" in helps["bertlab compress distill"] and "--teacher" not in helps["bertlab compress distill"]


def test_serve_takes_no_secret_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--token", "s3cret"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--token-file" in err and "BERTLAB_TOKEN" in err


def test_serve_reads_the_token_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.TOKEN_ENV, "from-env")
    cmd, env = cli.serve_command(parse("serve", "--host", "0.0.0.0"), env=dict(os.environ))
    assert env["BERTLAB_SERVE_TOKEN"] == "from-env" and cli.TOKEN_ENV not in env  # kernels never see it
    assert not any("from-env" in c for c in cmd)
    (tmp_path / "t").write_text("from-file\n")
    _, env = cli.serve_command(parse("serve", "--token-file", str(tmp_path / "t")), env={})
    assert env["BERTLAB_SERVE_TOKEN"] == "from-file"
    (tmp_path / "empty").write_text("")
    with pytest.raises(cli.UsageError, match="empty"):
        cli.serve_command(parse("serve", "--token-file", str(tmp_path / "empty")), env={})


def test_loading_an_encoder_without_mlm_head_says_nothing_at_start(caplog):
    import logging

    from bertlab.loading import load

    with caplog.at_level(logging.INFO):
        model, _ = load("default-encoder")
    assert "no MLM head" in " ".join(model.load_report.notes)  # kept for the panels
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "no MLM head" in r.getMessage()]


def test_import_bertlab_is_light_and_its_names_come_on_first_use():
    code = ("import sys, bertlab\nprint('torch' in sys.modules)\n"
            "from bertlab import load, Tokenizer\n"
            "print(load.__module__, bertlab.loading.__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "bertlab.loading", "bertlab.loading", "True"]


LONG = "a" * 26_000  # a pasted essay where a path goes


@pytest.mark.parametrize("argv", [
    ["finetune", "--task", "sst2", "--out", "run", "--data", LONG],
    ["finetune", "--task", "sst2", "--out", "run", "--model", LONG],
    ["finetune", "--task", "sst2", "--out", LONG],
    ["pretrain", "--out", "run", "--model", LONG],
    ["evaluate", "--task", "sst2", "--model", "default", "--data", LONG],
    ["evaluate", "--task", "sst2", "--model", LONG],
], ids=["finetune-data", "finetune-model", "finetune-out", "pretrain-model", "evaluate-data", "evaluate-model"])
def test_an_over_long_path_is_one_short_line(argv, capsys, tmp_path, monkeypatch):
    """A 26,000-character --data or --model was an OSError traceback (File name too long) echoing the value."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and len(err) < 600, err[:300]
    assert "26,000 characters long" in err and not list(tmp_path.iterdir())


def test_a_long_error_message_is_cut_to_one_short_line(capsys, monkeypatch):
    """An OSError that quotes a long name (here: raised by the command itself) prints one short line."""
    def command(args):
        raise OSError(36, "File name too long", LONG)

    parser = cli.build_parser(only="download")
    monkeypatch.setattr(cli, "build_parser", lambda only="": parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: type("A", (), {"verbose": False, "command": "download",
                                                                          "func": staticmethod(command)})())
    assert cli.main(["download"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and len(err) < 600 and "26,0" in err
