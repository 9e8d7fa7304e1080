"""`python -m bertlab.hubservice`: the class service, as JupyterHub starts it (a managed service).

The hub gives it its address and its token (JUPYTERHUB_SERVICE_URL, JUPYTERHUB_SERVICE_PREFIX,
JUPYTERHUB_API_URL, JUPYTERHUB_API_TOKEN, JUPYTERHUB_SERVICE_NAME); the options below (or their
variables, which the hub's `environment` for the service can set) say where its SQLite file is,
how many training runs go at once, and who teaches.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from urllib.parse import urlparse

from bertlab.hubservice import DEFAULT_TEACHER_GROUPS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m bertlab.hubservice",
                                description="bertlab's class service for JupyterHub (class store and training queue).")
    p.add_argument("--db", default=env("BERTLAB_CLASS_SERVICE_DB", "bertlab-class.sqlite"),
                   help="its SQLite file, on the hub's disk (BERTLAB_CLASS_SERVICE_DB; default ./bertlab-class.sqlite)")
    p.add_argument("--slots", type=int, default=int(env("BERTLAB_QUEUE_SLOTS", "") or os.cpu_count() or 1),
                   help="training runs of the whole class at once (BERTLAB_QUEUE_SLOTS; default: this machine's cores)")
    p.add_argument("--teacher-groups", default=env("BERTLAB_TEACHER_GROUPS", ",".join(DEFAULT_TEACHER_GROUPS)),
                   help="hub groups whose members teach, comma-separated (BERTLAB_TEACHER_GROUPS; default teachers)")
    p.add_argument("--no-admins", action="store_true", default=env("BERTLAB_ADMINS_TEACH", "1") == "0",
                   help="hub admins do not teach unless in a teacher group (BERTLAB_ADMINS_TEACH=0)")
    p.add_argument("--url", default=env("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"),
                   help="address to listen on (the hub sets JUPYTERHUB_SERVICE_URL)")
    p.add_argument("--ip", default=env("BERTLAB_CLASS_SERVICE_IP"),
                   help="interface to listen on when it is not --url's host (BERTLAB_CLASS_SERVICE_IP; on Kubernetes "
                        "0.0.0.0, while the servers reach it as http://hub:PORT)")
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error(f"--slots must be 1 or more, not {args.slots}")
    return args


async def serve(args: argparse.Namespace) -> None:
    from jupyterhub.services.auth import HubAuth
    from tornado.httpserver import HTTPServer

    from bertlab.hubservice.app import MAX_BODY_BYTES, ClassService, make_app

    hub_auth = HubAuth()  # api_url, api_token, base_url and access scopes from the hub's variables
    groups = [g.strip() for g in args.teacher_groups.split(",") if g.strip()]
    service = ClassService(args.db, args.slots, hub_auth, teacher_groups=groups, admins_teach=not args.no_admins)
    address = urlparse(args.url)
    server = HTTPServer(make_app(service, hub_auth.base_url), max_body_size=MAX_BODY_BYTES, xheaders=True)
    server.listen(address.port or 80, address.hostname if args.ip is None else args.ip)
    logging.getLogger("bertlab.hubservice").info(
        "bertlab class service on %s%s (store and queue in %s, %d slots, teachers: %s)",
        args.url, hub_auth.base_url, args.db, args.slots, ", ".join(groups) or "admins")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    service.store.close()


def main(argv: list[str] | None = None) -> None:
    try:
        import jupyterhub.services.auth  # noqa: F401
    except ImportError:
        raise SystemExit("The class service runs where JupyterHub is installed (it checks tokens with the hub): "
                         "start it from the hub's configuration (deploy/jupyterhub/bertlab_config.py), in an "
                         "environment with both bertlab and jupyterhub (pip install jupyterhub).") from None
    logging.basicConfig(level=logging.WARNING, format="[%(levelname)1.1s %(asctime)s bertlab-class] %(message)s")
    logging.getLogger("bertlab").setLevel(logging.INFO)  # its own start and the teacher's pushes, not its libraries'
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
