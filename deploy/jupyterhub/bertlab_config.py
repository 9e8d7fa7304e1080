"""bertlab's part of a JupyterHub configuration: each student's server opens the dashboard, in
class mode. Nothing here picks users, passwords or a spawner: the file that loads it does.

Used by
- deploy/jupyterhub/jupyterhub_config.py (JupyterHub on one server; also the loopback test),
- The Littlest JupyterHub: copy it to /opt/tljh/config/jupyterhub_config.d/ (deploy/tljh/README.md),
- Zero to JupyterHub: deploy/z2jh/values.yaml repeats these settings in the chart's own keys
  (tests/test_jupyterhub.py checks that they agree).

Each student's server is a Jupyter server with Voila's server extension; the dashboard notebook
sits in the student's home (a link to the installed one), so `/user/<name>/voila/render/bertlab.ipynb`
is the dashboard.
"""

import logging
import os

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

# Class-wide state (the training queue) lives in one folder that every student's server can
# write, made by the admin (deploy/tljh/README.md, step 4). One machine only: SQLite in WAL mode
# needs all its users on the same host (deploy/README.md says what that means on Kubernetes).
# Without the folder (or with BERTLAB_HUB_STATE="" in the hub's environment) there is no class
# queue: training runs start at once.
STATE_DIR = os.environ.get("BERTLAB_HUB_STATE", "/srv/bertlab/state")
if STATE_DIR and os.path.isdir(STATE_DIR):
    c.Spawner.environment.update({"BERTLAB_QUEUE": os.path.join(STATE_DIR, "queue.sqlite")})
elif STATE_DIR:
    logging.getLogger("JupyterHub").warning(
        "bertlab: no folder %s for the class queue; students' training runs are not queued", STATE_DIR)

# Kernels of closed pages: Voila cannot shut them down itself (its shutdown POST is refused),
# so the student's server culls idle kernels that no page is connected to. An open page's kernel
# is kept however long it sits idle (cull_connected=False).
KERNEL_CULLING = [
    "--MappingKernelManager.cull_idle_timeout=60",
    "--MappingKernelManager.cull_interval=15",
    "--MappingKernelManager.cull_connected=False",
]
c.Spawner.args.extend(KERNEL_CULLING)
