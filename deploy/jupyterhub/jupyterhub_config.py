"""JupyterHub on one server for a bertlab class: students log in with their system account (PAM),
each gets a Jupyter server of their own (a local process running as that user) that opens the
bertlab dashboard in class mode.

    sudo jupyterhub -f deploy/jupyterhub/jupyterhub_config.py      (from /srv/jupyterhub)

The hub, its proxy (configurable-http-proxy, from npm) and bertlab are in one Python environment
here. deploy/README.md has the steps, the sizing and what to change for a real class (HTTPS, an
authenticator of your school's). The loopback test (tests/test_jupyterhub.py) loads this file and
swaps in a test authenticator and a spawner that needs no system users.
"""

import os
import pwd
import sys
from pathlib import Path

c = get_config()  # noqa: F821  (JupyterHub runs this file with get_config defined)
load_subconfig(os.path.join(os.path.dirname(__file__), "bertlab_config.py"))  # noqa: F821

DASHBOARD = c.Spawner.default_url.rsplit("/", 1)[-1]  # bertlab_config.py's, e.g. bertlab.ipynb
TEACHER_DASHBOARD = "teacher.ipynb"  # the teacher's view, linked into teachers' homes
TEACHER_GROUP = os.environ.get("BERTLAB_TEACHER_GROUP", "teachers")  # as bertlab_config.py reads it

# -- the hub ------------------------------------------------------------------------------------
c.JupyterHub.bind_url = "http://:8000"  # put HTTPS in front of it, or set ssl_cert/ssl_key
c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"
c.Authenticator.allowed_users = set()  # fill in, or use a group: c.PAMAuthenticator.allowed_groups
c.Authenticator.admin_users = set()  # the hub's admins (they also teach, unless BERTLAB_ADMINS_TEACH=0)
# The teachers: members of this group push questions and run the class queue (bertlab_config.py).
c.JupyterHub.load_groups = {TEACHER_GROUP: {"users": []}}  # fill in, e.g. {"users": ["tess"]}

# -- each student's server ------------------------------------------------------------------------
# The single-user server of this Python environment, whatever PATH the hub was started with.
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
# A local process spawner does not enforce limits (The Littlest JupyterHub's systemd spawner
# and Kubernetes do): these are exported to the server as MEM_LIMIT/CPU_LIMIT for information.
# Sizing from deploy/README.md: one student with the dashboard open ~0.6 GB, after training ~1.3 GB.
c.Spawner.mem_limit = "2G"
c.Spawner.cpu_limit = 1.0
c.Spawner.http_timeout = 120  # a busy 2-core server takes a while to start Jupyter
c.Spawner.start_timeout = 120

# bertlab's page template: Voila's "lab" page without the Font Awesome links to a CDN (icons come
# from Voila's own files), so a page asks nothing of the internet.
try:
    from bertlab.serving import TEMPLATE
    from bertlab.serving.app import TEMPLATES_ROOT
except ImportError:  # a bertlab without it: Voila's own template
    pass
else:
    c.Spawner.environment.update({"JUPYTER_PATH": str(TEMPLATES_ROOT)})
    c.Spawner.args.append(f"--VoilaConfiguration.template={TEMPLATE}")


def dashboard_source(name: str = DASHBOARD) -> Path:
    """A dashboard notebook installed with bertlab in the hub's Python environment."""
    from bertlab.cli import find_app

    return find_app(name)


def teaches(user) -> bool:
    """Whether the hub user is a teacher as the class service decides it: in the group, or an admin."""
    return user.admin or TEACHER_GROUP in {group.name for group in user.groups}


def link_dashboard(spawner) -> None:
    """Put a link to the installed dashboard in the student's home (the server's root folder), and the
    teacher's view in a teacher's, replacing old links; a real file of that name (a teacher's own
    version) is left alone."""
    home = Path(getattr(spawner, "home_dir", "") or pwd.getpwnam(spawner.user.name).pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    for name in (DASHBOARD, TEACHER_DASHBOARD) if teaches(spawner.user) else (DASHBOARD,):
        link = home / name
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            continue
        link.symlink_to(dashboard_source(name))


c.Spawner.pre_spawn_hook = link_dashboard

# -- stop servers nobody uses (frees a student's kernels and memory) -----------------------------
# pip install jupyterhub-idle-culler to turn it on; a server idle for an hour is stopped.
try:
    import jupyterhub_idle_culler  # noqa: F401
except ImportError:
    pass
else:
    c.JupyterHub.load_roles.append(
        {"name": "idle-culler", "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
         "services": ["idle-culler"]})
    c.JupyterHub.services.append(
        {"name": "idle-culler", "command": [sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=3600"]})
