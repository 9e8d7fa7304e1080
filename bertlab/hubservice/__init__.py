"""The class service for JupyterHub: the teacher's questions, the students' guesses and the training
queue in one SQLite file of its own, served over HTTP to every student's server, for a hub whose
servers share no disk (Zero to JupyterHub: each student's pod has its own).

    app.py       the handlers: the `ClassStore` and `ClassQueue` operations, each checked against
                 the hub user of the request's token (JupyterHub's HubAuth)
    __main__.py  `python -m bertlab.hubservice`, as the hub starts it (deploy/jupyterhub/bertlab_config.py)

The student servers reach it through bertlab.classroom.remote and bertlab.training.queue.RemoteQueue
when the hub sets `BERTLAB_CLASS_SERVICE_URL`. Nothing here imports torch: the service runs in the
hub's environment.
"""

SERVICE_NAME = "bertlab-class"  # its name in the hub's services, and so its URL: /services/bertlab-class/
DEFAULT_TEACHER_GROUPS = ("teachers",)  # hub groups whose members may push, reveal and run the queue
