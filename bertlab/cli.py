"""The `bertlab` command. Each subcommand is one `_add_<name>(subparsers)` function that
declares its options and sets `func`, the function that runs it and returns an exit code.

    bertlab serve [--class N] [--port N] [--no-browser] [--model SOURCE] [--projector]   the dashboard (Voila)
    bertlab notebooks DIR                                        copy the teaching notebooks out
    bertlab pretrain --corpus C --size S --steps N --out DIR     pre-train a mini BERT
    bertlab evaluate-mlm --model M --text FILE                   masked-token top-1/top-5 (JSON)
    bertlab train-default-heads                                  the offline default's MLM+NSP heads
    bertlab finetune --task T --data PATH --model M --out DIR    fine-tune sst2|nli|ner|qa
    bertlab evaluate --task T --model DIR --data FILE            the task metric (JSON)
    bertlab compress quantize|prune|distill --model M --out DIR  a smaller model (JSON)
    bertlab explain --text T [--model M] [--method ig|grad-x-input]  per-token attribution (JSON)
    bertlab probe --property P --train FILE [--eval FILE]        probe accuracy per layer (JSON)
    bertlab patch --clean T --corrupt T --answer W --wrong W     activation patching grid (JSON)
    bertlab download NAME...                                     fill the hub cache ahead of a class

`bertlab --help` stays light (no torch): the commands whose options need the training code are
listed in LAZY with their one-line help, and their parsers are built only for the command that runs.
A mistake on the command line is one line (CommandParser), said before anything loads.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

log = logging.getLogger("bertlab.cli")

DISTRIBUTION = "bert-classroom-lab"  # the name on PyPI; the import name and the command are bertlab
DEFAULT_APP = "bertlab.ipynb"
DEFAULT_PORT = 8866
MODEL_ENV = "BERTLAB_MODEL"  # read by apps/bertlab.ipynb: which model to load
WORKDIR_ENV = "BERTLAB_WORKDIR"  # read by the dashboards: their kernels work in the folder `serve` started in
TOKEN_ENV = "BERTLAB_TOKEN"  # `serve`'s token, from the environment (never argv; kernels do not inherit it)
PROJECTOR_ENV = "BERTLAB_PROJECTOR"  # bertlab.settings.PROJECTOR_ENV (not imported: --help stays light)
DEFAULT_CULL_IDLE_S = 40  # bertlab.serving.plan.DEFAULT_CULL_IDLE_S (not imported: --help stays light)
MAX_MESSAGE_CHARS = 400  # an error message longer than this is cut (it may quote what was pasted)


class AppNotFoundError(FileNotFoundError):
    """The dashboard notebook is neither a file given by path nor in the installed package."""


class UsageError(ValueError):
    """An option value that cannot work; the message says what to give instead."""


class CommandParser(argparse.ArgumentParser):
    """argparse, with a mistake said in one line and where to read more (not the whole usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# -- the notebooks shipped with the lab ----------------------------------------------------------
def shipped(folder: str) -> Path:
    """`apps` or `notebooks`, in the installed package or at the top of a checkout (settings.shipped)."""
    from bertlab.settings import shipped

    return shipped(folder)


def app_dirs() -> list[Path]:
    """Where dashboards live: the `apps/` folder shipped with the lab."""
    return [shipped("apps")]


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
        f"dashboard {name!r} not found (looked in {looked}). Reinstall the lab "
        f"(pip install --force-reinstall {DISTRIBUTION}), or pass --app PATH/TO/NOTEBOOK.ipynb."
    )


def teaching_notebooks() -> list[Path]:
    """The teaching notebooks shipped with the lab, in lesson order."""
    return sorted(shipped("notebooks").glob("*.ipynb"))


def _add_notebooks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "notebooks", help="copy the teaching notebooks into a folder, to open in Jupyter",
        description="Copy the teaching notebooks (prose and exercises that call into bertlab) into DIR. "
                    "A notebook already in DIR is kept, so a student's work is never overwritten, "
                    "unless --force is given.",
        epilog="bertlab notebooks ~/bertlab-notebooks && jupyter lab ~/bertlab-notebooks")
    p.add_argument("dest", metavar="DIR", type=Path, help="folder to copy them into (made if missing)")
    p.add_argument("--force", action="store_true", help="overwrite notebooks already in DIR")
    p.set_defaults(func=cmd_notebooks)


def cmd_notebooks(args: argparse.Namespace) -> int:
    """Copy each teaching notebook into args.dest; one line per notebook."""
    dest = args.dest.expanduser()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} is a file: give a folder to copy the notebooks into.")
    sources = teaching_notebooks()
    if not sources:
        raise AppNotFoundError(f"no teaching notebooks in {shipped('notebooks')}: reinstall the lab "
                               f"(pip install --force-reinstall {DISTRIBUTION}).")
    dest.mkdir(parents=True, exist_ok=True)
    for source in sources:
        target = dest / source.name
        if target.exists() and not args.force:
            print(f"{target}: already there, kept (--force overwrites it)")
            continue
        shutil.copyfile(source, target)
        print(target)
    return 0


# -- serve -------------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve the dashboard in the browser (Voila), for one person or a class",
        description="Serve the bertlab dashboard with Voila. Kernels of closed or idle pages are freed; "
                    "with --class N, a pool of pre-heated kernels, a cap, and class settings for the kernels.",
        epilog="A class on this machine's network: bertlab serve --class 30 --host 0.0.0.0 --password")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for a classroom, "
                        "which then needs a token or password)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument("--model", metavar="SOURCE", default=None,
                   help="model to load: a folder or a Hugging Face name (default: the offline MiniLM)")
    p.add_argument("--projector", action="store_true",
                   help="pages start in projector mode: larger text and figures for a lecture hall "
                        "(a page can also ask with ?projector=1, and switch with its toggle)")
    p.add_argument("--app", default=DEFAULT_APP, help="dashboard notebook to serve (default %(default)s)")
    p.add_argument("--no-preheat", action="store_true",
                   help="do not start kernels before the first visit (slower page, less memory)")
    p.add_argument("--class", dest="class_size", type=_positive, metavar="N", default=None,
                   help="serve a class of about N students: N pre-heated kernels, at most N + max(2, N/10) "
                        "live kernels, one torch thread per kernel, a class folder (see --class-dir)")
    p.add_argument("--pool-size", type=_count, metavar="K", default=None,
                   help="pre-heated kernels kept ready (default: N with --class, else 1)")
    p.add_argument("--max-kernels", type=_positive, metavar="M", default=None,
                   help="live kernels at most, pool included; beyond it a page says the class is full "
                        "(default: N + max(2, N/10) with --class, else no cap)")
    p.add_argument("--fork-kernels", action=argparse.BooleanOptionalAction, default=None,
                   help="with --class: fork each student's kernel from one warm process that has loaded the "
                        "dashboard and the model once (less memory per student, faster pre-heating); on by "
                        "default with --class on Linux, --no-fork-kernels to start each kernel the usual way")
    p.add_argument("--per-client", type=_count, metavar="K", default=None,
                   help="kernels the pages of one client address may hold (default 3 with --class, else no "
                        "limit; 0: no limit). Raise it when the class reaches the server through one address "
                        "(a school NAT or a proxy)")
    p.add_argument("--cull-idle", type=_count, metavar="SECONDS", default=DEFAULT_CULL_IDLE_S,
                   help="free a kernel whose page is gone after this many idle seconds "
                        "(default %(default)s; open pages are never culled)")
    p.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                   help=f"require the token written in FILE (students open http://HOST:PORT/?token=TOKEN once); "
                        f"or set {TOKEN_ENV}. Beyond loopback one is generated and printed unless a token or "
                        f"--password is given")
    p.add_argument("--token", action=_RefuseSecret, help=argparse.SUPPRESS)
    p.add_argument("--password", action="store_true",
                   help="require a password: asked at start (read from stdin when it is not a terminal)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name students use to reach this server (repeatable); localhost and this "
                        "machine's own names and addresses are always accepted, other Host headers refused")
    p.add_argument("--class-dir", type=Path, default=None, metavar="DIR",
                   help="with --class: folder for the students' workspaces and the training queue "
                        "(default ~/.cache/bertlab/class)")
    p.add_argument("--teacher-port", type=_port, default=None, metavar="P",
                   help="with --class: port of the teacher's view (default: --port + 1); its address, with its "
                        "own secret, is printed at start: keep it to yourself")
    p.set_defaults(func=cmd_serve)


def serve_command(args: argparse.Namespace, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The server command line (`python -m bertlab.serving ...`) and environment `bertlab serve` runs."""
    plan = serve_plan(args)
    return plan.argv(), plan.env(server_env(env))


def serve_plan(args: argparse.Namespace):  # -> bertlab.serving.plan.ServePlan (imported lazily)
    """What the parsed `serve` options amount to; made once per command, so a generated token or
    a typed password stays the same however often it is asked for."""
    if getattr(args, "_serve_plan", None) is None:
        args._serve_plan = _make_plan(args)
    return args._serve_plan


def _make_plan(args: argparse.Namespace):
    from bertlab.serving.plan import PlanError, make_plan

    password_hash = hash_password(read_password()) if getattr(args, "password", False) else None
    try:
        return make_plan(
            app=find_app(args.app), port=args.port, host=args.host, open_browser=not args.no_browser,
            class_size=getattr(args, "class_size", None), preheat=not args.no_preheat,
            pool_size=getattr(args, "pool_size", None), max_kernels=getattr(args, "max_kernels", None),
            cull_idle=getattr(args, "cull_idle", DEFAULT_CULL_IDLE_S), token=read_token(args),
            password_hash=password_hash, allow_hosts=tuple(getattr(args, "allow_host", ())),
            class_dir=getattr(args, "class_dir", None), per_client=getattr(args, "per_client", None),
            fork_kernels=getattr(args, "fork_kernels", None),
            extra_env={WORKDIR_ENV: os.getcwd(),
                       **({MODEL_ENV: model_source(args.model)} if args.model else {}),
                       **({PROJECTOR_ENV: "1"} if getattr(args, "projector", False) else {})},
        )
    except PlanError as e:
        raise UsageError(str(e)) from None


class _RefuseSecret(argparse.Action):
    """`serve --token`: the secret would sit on the command line, where `ps` shows it to everyone."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} puts the secret where `ps` shows it to every user of this machine: "
                     f"write it to a file and give --token-file FILE, or set {TOKEN_ENV}")


def read_token(args: argparse.Namespace) -> str | None:
    """The class token: from --token-file, else the BERTLAB_TOKEN variable, else None."""
    path = getattr(args, "token_file", None)
    if path is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = path.expanduser().read_text().strip()
    except OSError as e:
        raise UsageError(f"--token-file {path}: {e.strerror or e}") from None
    if not token:
        raise UsageError(f"--token-file {path} is empty: write the token in it.")
    return token


def server_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a server starts from: the caller's, less the token variable (kernels must not see it)."""
    base = dict(os.environ if env is None else env)
    base.pop(TOKEN_ENV, None)
    return base


def read_password() -> str:
    """The class password: asked twice on a terminal, else one line of stdin."""
    import getpass

    if sys.stdin.isatty():
        first = getpass.getpass("Password for the class: ")
        if getpass.getpass("Again: ") != first:
            raise UsageError("the two passwords differ; run bertlab serve --password again.")
    else:
        first = sys.stdin.readline().rstrip("\r\n")
    if len(first) < 4:
        raise UsageError("--password: give a password of 4 characters or more.")
    return first


def hash_password(password: str) -> str:
    from jupyter_server.auth import passwd

    return passwd(password)


def model_source(source: str) -> str:
    """A local folder as an absolute path (the kernel may run elsewhere), a hub name as given."""
    path = Path(source).expanduser()
    if path.exists():
        return str(path.resolve())
    if source.startswith((".", "/", "~")):  # clearly meant as a folder ("org/name" may be a hub name)
        raise UsageError(f"--model {source}: no such folder. Give a model folder (config.json + weights) "
                         f"or a Hugging Face name such as bert-base-uncased.")
    return source


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until it stops: Ctrl-C, or SIGTERM (passed on, so no server is left behind)."""
    plan = serve_plan(args)
    cmd, env = serve_command(args)
    if plan.class_size:
        for folder in (env["BERTLAB_WORKSPACES"], str(Path(env["BERTLAB_QUEUE"]).parent)):
            Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
    log.info("serving %s on http://%s:%d (Ctrl-C stops it)", plan.app, args.host, args.port)
    procs = [subprocess.Popen(cmd, env=env)]
    if plan.class_size:  # the teacher's view: a second server, its own secret (bertlab/serving/teacher.py)
        procs.append(_start_teacher(args, plan))
    previous = signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
    try:
        return procs[0].wait()
    except KeyboardInterrupt:  # the servers got the same Ctrl-C: let them shut their kernels down
        procs[0].wait()
        return 0
    finally:
        for p in procs[1:]:
            p.terminate()
            p.wait()
        signal.signal(signal.SIGTERM, previous)


def _start_teacher(args: argparse.Namespace, plan) -> subprocess.Popen:
    from bertlab.serving.teacher import TEACHER_APP, teacher_command, teacher_plan, teacher_url

    teacher = teacher_plan(plan, find_app(TEACHER_APP), port=getattr(args, "teacher_port", None))
    cmd, env = teacher_command(plan, teacher, server_env())
    proc = subprocess.Popen(cmd, env=env)
    log.info("teacher's view (keep this address to yourself; students use the one below):\n    %s",
             teacher_url(teacher))
    return proc


# -- the command -------------------------------------------------------------------------------
def _add_training(sub: argparse._SubParsersAction) -> None:
    # Imported here: `bertlab serve` must not pay for the training modules.
    from bertlab.recipes.cli import add_recipe_parsers
    from bertlab.training.finetune_cli import add_evaluate_parser, add_finetune_parser
    from bertlab.training.pretrain_cli import add_pretrain_parsers

    add_pretrain_parsers(sub)
    add_recipe_parsers(sub)
    add_finetune_parser(sub)
    add_evaluate_parser(sub)


def _add_download(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "download", help="fill the Hugging Face cache with hub models, ahead of an offline class",
        description="Download the files bertlab reads (config, tokenizer, weights) of each hub model into the "
                    "Hugging Face cache (HF_HOME), so that the picker and `bertlab.load(NAME)` work offline.",
        epilog="bertlab download bert-base-uncased roberta-base google/electra-small-discriminator "
               "(--recommended: the picker's list)")
    p.add_argument("names", nargs="*", metavar="NAME", help="hub model names, e.g. bert-base-uncased")
    p.add_argument("--recommended", action="store_true", help="also every model the picker recommends")
    p.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    p.set_defaults(func=cmd_download)


def cmd_download(args: argparse.Namespace) -> int:
    """Download each model in turn; one line per model (and per error); exit 1 if any failed."""
    from bertlab.hub import RECOMMENDED, HubError, download, human_size, remote_files

    for noisy in ("httpx", "httpx2", "huggingface_hub"):  # one line per model, not one per request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    names = list(dict.fromkeys([*args.names, *([m.name for m in RECOMMENDED] if args.recommended else [])]))
    if not names:
        raise UsageError("name at least one hub model (e.g. bertlab download bert-base-uncased), or --recommended.")
    failed = 0
    for name in names:
        try:
            files = remote_files(name, args.revision)
            folder = download(name, args.revision, files=files)
        except HubError as e:
            print(f"bertlab download: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name}: {human_size(sum(f.size for f in files))} in {folder}")
    return 1 if failed else 0


def _add_compress(sub: argparse._SubParsersAction) -> None:
    from bertlab.compress.cli import add_parser  # the compression lab (imported here: `serve` stays light)

    add_parser(sub)


def _add_explain(sub: argparse._SubParsersAction) -> None:
    from bertlab.explain_cli import add_parser  # attributions (imported here: `serve` stays light)

    add_parser(sub)


def _add_knows(sub: argparse._SubParsersAction) -> None:
    from bertlab.knows_cli import add_parsers  # probes and patching (imported here: `serve` stays light)

    add_parsers(sub)


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_serve, _add_notebooks, _add_training, _add_download, _add_compress, _add_explain, _add_knows,
)
# The commands whose parsers import torch (their defaults come from the training code): name and
# one-line help for `bertlab --help`; tests/test_cli.py checks these against the real parsers.
LAZY: dict[Callable[[argparse._SubParsersAction], None], dict[str, str]] = {
    _add_training: {
        "pretrain": "pre-train a mini BERT, or another family member with its own objective, on a corpus",
        "evaluate-mlm": "masked-token top-1/top-5 accuracy of a model on a text file",
        "train-default-heads": "train the offline default's MLM + NSP heads (the recipe)",
        "finetune": "fine-tune a model on sst2, nli, sts, ner or qa",
        "evaluate": "score a fine-tuned model on a task's data (one JSON line)",
    },
    _add_compress: {"compress": "make a model smaller: int8 quantization, head pruning, distillation"},
    _add_explain: {"explain": "attribution of one prediction to the input tokens (one JSON line)"},
    _add_knows: {"probe": "probe accuracy per layer for one property (one JSON line)",
                 "patch": "activation patching of a masked word (one JSON line)"},
}


def build_parser(only: str | None = None) -> CommandParser:
    """The `bertlab` parser. `only`: the command about to run; the LAZY commands other than it are
    listed by name and help without building their options. None builds every command."""
    parser = CommandParser(prog="bertlab", description="An interactive lab for exploring BERT.",
                           epilog="bertlab COMMAND --help: the options of one command.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (a failure's full traceback too)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        names = LAZY.get(add, {})
        if only is None or not names or only in names:
            add(sub)
        else:
            for name, text in names.items():
                sub.add_parser(name, help=text, add_help=False)
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The command word of `argv` ("" when there is none): the first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bertlab` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_in(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (AppNotFoundError, UsageError) as e:
        parser.exit(1, f"bertlab: {e}\n")
    except Exception as e:
        if not is_user_error(e):
            raise
        log.debug("the error in full:", exc_info=e)  # -v shows the traceback
        text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        line = " ".join(str(text).split()) or type(e).__name__
        if len(line) > MAX_MESSAGE_CHARS:  # e.g. an OSError that quotes a pasted essay as its file name
            line = f"{line[: MAX_MESSAGE_CHARS - 1]}… ({len(line):,} characters)"
        print(f"bertlab {args.command}: {line}", file=sys.stderr)
        return 1


# Errors whose message is for the user, printed as one line: bad options, data, models, a full disk.
# The RuntimeError kinds are named by module, so that `bertlab serve` never imports the training code.
_USER_RUNTIME_ERRORS = (
    ("bertlab.training.checkpoint", "TrainingStateError"),  # DiskFullError too
    ("bertlab.training.loop", "TrainingError"),
    ("bertlab.tasks.readers", "DataSourceError"),
    ("bertlab.model", "MissingHeadError"),  # `bertlab explain` on a model without the head it needs
)


def is_user_error(error: BaseException) -> bool:
    """ValueError (CorpusError, CheckpointError, DataFormatError ...), KeyError, OSError (a missing
    file, a full disk) and the training RuntimeErrors that carry a message for the user."""
    if isinstance(error, (ValueError, KeyError, OSError)):
        return True
    for module, name in _USER_RUNTIME_ERRORS:
        kind = getattr(sys.modules.get(module), name, None)
        if kind is not None and isinstance(error, kind):
            return True
    return False


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1..65535")
    return port


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
