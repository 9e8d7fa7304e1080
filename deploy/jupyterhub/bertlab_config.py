"""bertlab's part of a JupyterHub configuration: each student's server opens the dashboard, in
class mode. Nothing here picks users, passwords or a spawner: the file that loads it does.

Used by
- deploy/jupyterhub/jupyterhub_config.py (JupyterHub on one server; also the loopback test),
- The Littlest JupyterHub: copy it to /opt/tljh/config/jupyterhub_config.d/ (deploy/tljh/README.md),
- Zero to JupyterHub: deploy/z2jh/values.yaml repeats these settings in the chart's own keys
  (tests/test_jupyterhub.py checks that they agree).

Each student's server is a Jupyter server with Voila's server extension; the dashboard notebook
sits in the student's home (a link to the installed one), so `/user/<name>/voila/render/bertlab.ipynb`
is the dashboard. The hub also starts bertlab's class service (`python -m bertlab.hubservice`): the
teacher's questions and the class's training queue for every student's server; the teacher (a member
of the hub group `teachers`, or a hub admin) pushes questions from `/user/<name>/voila/render/teacher.ipynb`.
"""

import importlib.util
import logging
import os
import sys

c = get_config()  # noqa: F821  (JupyterHub runs this file with get_config defined)

DASHBOARD = "bertlab.ipynb"  # file name in each student's home (the server's root folder)

# What the student sees after logging in: the dashboard, not JupyterLab.
c.Spawner.default_url = f"/voila/render/{DASHBOARD}"

# Class mode for every kernel of the student's server (read by bertlab.settings).
CLASS_ENV = {
    "BERTLAB_CLASS": "1",  # sandboxed fields, per-session workspaces, upload limit
    "BERTLAB_THREADS": "1",  # torch intra-op threads per kernel
    "OMP_NUM_THREADS": "1",  # the same for OpenMP/BLAS, set before torch loads
}
c.Spawner.environment.update(CLASS_ENV)

# -- the class service: the teacher's questions, the students' guesses and the training queue ------
# One small HTTP service that the hub starts and authenticates (bertlab.hubservice), holding the class
# store and the queue in its own SQLite file; every student's server reaches it with its own hub
# token (BERTLAB_CLASS_SERVICE_URL below), so the teacher's push reaches every student whether their
# servers share a disk (one server, TLJH) or not (Kubernetes). Students never write its file.
CLASS_SERVICE = "bertlab-class"  # bertlab.hubservice.SERVICE_NAME (not imported: the hub may lack bertlab)
# The service's address as the students' servers reach it (on Kubernetes: http://hub:10101, values.yaml).
CLASS_SERVICE_URL = os.environ.get("BERTLAB_CLASS_SERVICE_ADDRESS", "http://127.0.0.1:10101")
TEACHER_GROUP = os.environ.get("BERTLAB_TEACHER_GROUP", "teachers")  # hub group; hub admins teach too
# Its SQLite file, in a folder only the hub's account writes (made by the admin, deploy/tljh/README.md).
STATE_DIR = os.environ.get("BERTLAB_HUB_STATE", "/srv/bertlab/state")
# The Python that has bertlab: the hub's own, or TLJH's students' environment when the hub's lacks it.
SERVICE_PYTHON = os.environ.get("BERTLAB_SERVICE_PYTHON") or (
    sys.executable if importlib.util.find_spec("bertlab") is not None else "/opt/tljh/user/bin/python")
SLOTS = os.environ.get("BERTLAB_QUEUE_SLOTS", "")  # training runs of the whole class at once (default: cores)

if not os.path.isdir(STATE_DIR):
    logging.getLogger("JupyterHub").warning(
        "bertlab: no folder %s for the class service's file; it starts in the hub's folder instead", STATE_DIR)
c.JupyterHub.services.append({
    "name": CLASS_SERVICE,
    "url": CLASS_SERVICE_URL,
    "command": [SERVICE_PYTHON, "-m", "bertlab.hubservice"],
    "environment": {
        "BERTLAB_CLASS_SERVICE_DB": os.path.join(STATE_DIR if os.path.isdir(STATE_DIR) else ".",
                                                 "bertlab-class.sqlite"),
        "BERTLAB_TEACHER_GROUPS": TEACHER_GROUP,
        **({"BERTLAB_QUEUE_SLOTS": SLOTS} if SLOTS else {}),
    },
    "display": False,  # an API for the students' servers, not a page
})
# The service asks the hub whether a user is an admin (a server's token cannot say).
c.JupyterHub.load_roles.append({"name": "bertlab-class-service", "services": [CLASS_SERVICE], "scopes": ["read:users"]})
# Every user, and their server's token (what the kernels hold), may reach the service; the service itself
# decides who teaches.
CLASS_ACCESS = f"access:services!service={CLASS_SERVICE}"
c.JupyterHub.extra_user_scopes.add(CLASS_ACCESS)  # a set
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", CLASS_ACCESS]  # the `server` role's + it
c.Spawner.environment.update({"BERTLAB_CLASS_SERVICE_URL": f"{CLASS_SERVICE_URL}/services/{CLASS_SERVICE}/"})

# Kernels of closed pages: Voila cannot shut them down itself (its shutdown POST is refused),
# so the student's server culls idle kernels that no page is connected to. An open page's kernel
# is kept however long it sits idle (cull_connected=False).
KERNEL_CULLING = [
    "--MappingKernelManager.cull_idle_timeout=60",
    "--MappingKernelManager.cull_interval=15",
    "--MappingKernelManager.cull_connected=False",
]
c.Spawner.args.extend(KERNEL_CULLING)
