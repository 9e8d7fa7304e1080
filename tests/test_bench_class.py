"""The class benchmark's bookkeeping (bench/bench_class.py), without a server or a browser: its
statistics, when it calls a chart up to date, and how it finds kernels and their memory. The whole
run (a server, N kernels, Chromium) takes minutes, so it is not run here: see bench/README.md."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _module():
    spec = importlib.util.spec_from_file_location("bench_class", BENCH / "bench_class.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_class"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_stats():
    bc = _module()
    assert bc._stats([]) == {"n": 0, "p50": None, "p95": None, "max": None}
    s = bc._stats([float(v) for v in range(1, 101)])
    assert s == {"n": 100, "p50": 50.5, "p95": 95.0, "max": 100.0}


def test_a_chart_is_up_to_date_only_with_its_title_and_all_its_bars():
    bc = _module()
    want = ("[MASK] at token 4", ["city", "capital", "republic", "country", "capitol"])
    chart = {"title": "[MASK]  at token 4", "ticks": ["capitol", "city", "country", "republic", "capital"], "reads": ""}
    assert bc.shows(chart, want)
    assert not bc.shows({**chart, "title": "[MASK] at token 6"}, want)  # the old sentence's chart
    assert not bc.shows({**chart, "ticks": ["farm", "garden", "man", "mother", "house"]}, want)
    assert not bc.shows({**chart, "ticks": chart["ticks"][:4]}, want)
    assert not bc.shows(None, want)


def test_kernels_are_found_under_the_server_with_their_memory():
    bc = _module()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ipykernel_launcher"])
    try:
        import os

        assert child.pid in bc.kernel_pids(os.getpid())
        assert bc.pss_mb(child.pid) > 1
        assert bc.pss_mb(2**22 + 17) is None  # no such process
    finally:
        child.kill()
        child.wait()


ZYGOTE = """
import os, sys, time
if os.fork() == 0:  # a forked kernel: the zygote's command line, the zygote as its parent
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


def test_kernels_forked_by_the_zygote_count_as_kernels_and_the_zygote_does_not():
    """`bertlab serve --class N` forks its kernels from a zygote (bertlab/serving/forking.py): they keep
    the zygote's command line, with no "ipykernel" in it."""
    import os
    import time

    bc = _module()
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE, "-m", "bertlab.serving.forking", "socket"])
    try:
        end = time.monotonic() + 10
        while not (forked := bc._children().get(zygote.pid)) and time.monotonic() < end:
            time.sleep(0.05)
        assert forked, "the zygote did not fork"
        me = os.getpid()
        assert set(forked) <= set(bc.kernel_pids(me))
        assert zygote.pid not in bc.kernel_pids(me)
    finally:
        zygote.kill()
        zygote.wait()
        for pid in forked or []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
