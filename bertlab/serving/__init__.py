"""The class server behind `bertlab serve`: Voila with culling, a capped pool of pre-heated
kernels, a token or password beyond loopback, a Host/Origin guard and no CDN.

    plan.py      options -> the server's command line and environment (pure)
    app.py       BertlabVoila, the Voila application `python -m bertlab.serving` runs
    kernels.py   the kernel manager: Voila's pool under a cap, status counts
    handlers.py  the page ("class is full" over the cap) and /bertlab/api/status
    guard.py     Host/Origin checks in front of every handler
    teacher.py   the teacher's view: a second server beside the students' one
    templates/   the `bertlab` page template (Voila's lab template, no CDN)

Only constants live here, so `bertlab serve --help` does not import Voila.
"""

TOKEN_ENV = "BERTLAB_SERVE_TOKEN"  # read once by the server, then removed: kernels must not inherit it
PASSWORD_HASH_ENV = "BERTLAB_SERVE_PASSWORD_HASH"
TEMPLATE = "bertlab"
STATUS_PATH = "/bertlab/api/status"
SEAT_PATH = "/bertlab/api/seat"  # + "/<kernel id>": a page says it runs (handlers.SeatHandler)
