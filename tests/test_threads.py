"""BERTLAB_THREADS caps torch's threads in each dashboard kernel (class mode sets 1), so that many
kernels share the cores instead of each taking them all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bertlab.settings import threads


def test_threads_reads_bertlab_threads(monkeypatch):
    monkeypatch.delenv("BERTLAB_THREADS", raising=False)
    assert threads() is None
    monkeypatch.setenv("BERTLAB_THREADS", " 3 ")
    assert threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("BERTLAB_THREADS", bad)
        with pytest.raises(ValueError, match="BERTLAB_THREADS"):
            threads()


def _in_fresh_process(code: str, value: str | None) -> list[str]:
    """Run `code` in a new Python (torch's inter-op pool can only be sized before first use)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BERTLAB_THREADS", "OMP_NUM_THREADS")}
    if value is not None:
        env["BERTLAB_THREADS"] = value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_build_app_applies_the_thread_cap():
    code = ("import torch\nfrom bertlab.panels.app import build_app\n"
            "before = torch.get_num_threads()\n"
            "app = build_app(tabs=(('Input', 'bertlab.panels.representation:RepresentationPanel'),), first=0)\n"
            "print(before, torch.get_num_threads(), torch.get_num_interop_threads())\n")
    before, intra, interop = _in_fresh_process(code, "1")
    assert (intra, interop) == ("1", "1")
    if (os.cpu_count() or 1) > 1:
        assert int(before) > 1  # the cap did something: torch's default is one thread per core
    unset = _in_fresh_process("import torch\nfrom bertlab.panels.app import cap_threads\n"
                              "print(cap_threads(), torch.get_num_threads())\n", None)
    assert unset[0] == "None" and unset[1] == str(_default_threads())


def _default_threads() -> int:
    code = "import torch\nprint(torch.get_num_threads())\n"
    env = {k: v for k, v in os.environ.items() if k not in ("BERTLAB_THREADS", "OMP_NUM_THREADS")}
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=120).stdout)
