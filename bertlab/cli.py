"""The `bertlab` command. Each subcommand is one `_add_<name>(subparsers)` function that
declares its options and sets `func`, the function that runs it and returns an exit code.

    bertlab serve [--port N] [--no-browser] [--model SOURCE]   the dashboard, with Voila
    bertlab pretrain --corpus C --size S --steps N --out DIR     pre-train a mini BERT
    bertlab evaluate-mlm --model M --text FILE                   masked-token top-1/top-5 (JSON)
    bertlab train-default-heads                                  the offline default's MLM+NSP heads
    bertlab finetune --task T --data PATH --model M --out DIR    fine-tune sst2|nli|ner|qa
    bertlab evaluate --task T --model DIR --data FILE            the task metric (JSON)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("bertlab.cli")

DEFAULT_APP = "bertlab.ipynb"
DEFAULT_PORT = 8866
MODEL_ENV = "BERTLAB_MODEL"  # read by apps/bertlab.ipynb: which model to load


class AppNotFoundError(FileNotFoundError):
    """The dashboard notebook is neither in a source checkout nor installed with the package."""


class UsageError(ValueError):
    """An option value that cannot work; the message says what to give instead."""


# -- finding the dashboard notebooks ---------------------------------------------------------
def app_dirs() -> list[Path]:
    """Where dashboards live, first match wins: `apps/` of a source checkout (editable
    installs), then `<prefix>/share/bertlab/apps` (where a wheel installs them)."""
    root = Path(__file__).resolve().parent.parent
    installed = Path(sysconfig.get_path("data")) / "share" / "bertlab" / "apps"
    return ([root / "apps"] if (root / "pyproject.toml").is_file() else []) + [installed]


def find_app(name: str = DEFAULT_APP) -> Path:
    """Path of the dashboard notebook `name` (or `name` itself when it is a file)."""
    given = Path(name).expanduser()
    if given.is_file():
        return given.resolve()
    for folder in app_dirs():
        if (folder / name).is_file():
            return (folder / name).resolve()
    looked = ", ".join(str(d) for d in app_dirs())
    raise AppNotFoundError(
        f"dashboard {name!r} not found (looked in {looked}). Run bertlab from a source checkout, "
        f"reinstall it (pip install -e .), or pass --app PATH/TO/NOTEBOOK.ipynb."
    )


# -- serve -------------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the dashboard in the browser (Voila)",
                       description="Serve the bertlab dashboard with Voila.")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for a classroom)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument("--model", metavar="SOURCE", default=None,
                   help="model to load: a folder or a Hugging Face name (default: the offline MiniLM)")
    p.add_argument("--app", default=DEFAULT_APP, help="dashboard notebook to serve (default %(default)s)")
    p.add_argument("--no-preheat", action="store_true",
                   help="do not start a kernel before the first visit (slower page, less memory)")
    p.set_defaults(func=cmd_serve)


def serve_command(args: argparse.Namespace, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The Voila command line and environment that `bertlab serve` runs."""
    app = find_app(args.app)
    cmd = [
        sys.executable, "-m", "voila", str(app),
        f"--port={args.port}",
        f"--Voila.ip={args.host}",
    ]
    if not args.no_preheat:
        # A kernel runs the notebook before anyone asks: ~6 s to a page instead of ~15 s.
        cmd += ["--preheat_kernel=True", "--pool_size=1"]
    if args.no_browser:
        cmd.append("--no-browser")
    env = dict(os.environ if env is None else env)
    if args.model:
        env[MODEL_ENV] = model_source(args.model)
    return cmd, env


def model_source(source: str) -> str:
    """A local folder as an absolute path (the kernel runs in apps/), a hub name as given."""
    path = Path(source).expanduser()
    if path.exists():
        return str(path.resolve())
    if source.startswith((".", "/", "~")):  # clearly meant as a folder ("org/name" may be a hub name)
        raise UsageError(f"--model {source}: no such folder. Give a model folder (config.json + weights) "
                         f"or a Hugging Face name such as bert-base-uncased.")
    return source


def cmd_serve(args: argparse.Namespace) -> int:
    """Run Voila until it stops: Ctrl-C, or SIGTERM (passed on, so no server is left behind)."""
    cmd, env = serve_command(args)
    log.info("serving %s on http://%s:%d (Ctrl-C stops it)", cmd[3], args.host, args.port)
    proc = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Voila got the same Ctrl-C: let it shut its kernels down
        proc.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the command -------------------------------------------------------------------------------
def _add_training(sub: argparse._SubParsersAction) -> None:
    # Imported here: `bertlab serve` must not pay for the training modules.
    from bertlab.training.finetune_cli import add_evaluate_parser, add_finetune_parser
    from bertlab.training.pretrain_cli import add_pretrain_parsers

    add_pretrain_parsers(sub)
    add_finetune_parser(sub)
    add_evaluate_parser(sub)


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_serve, _add_training)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertlab", description="An interactive lab for exploring BERT.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bertlab` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (AppNotFoundError, UsageError) as e:
        parser.exit(1, f"bertlab: {e}\n")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1..65535")
    return port


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bertlab")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
