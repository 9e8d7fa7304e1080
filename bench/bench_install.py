"""A teacher's first install, timed: a fresh `python -m venv` and `pip install -e .` of this checkout
(its committed files, copied to a temporary folder), with this machine's pip settings (its index,
find-links and constraints) and no pip cache, as a first install has none.

Writes bench/results/install.json: the wall time, the CPU time it used, what it installed (MB in the
venv), the pip index it read from and the machine's load before and after (a shared machine's load
stretches the wall time; the CPU seconds do not).

    python bench/bench_install.py [--python python3] [--extras test]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "install.json"


def pip_index() -> list[str]:
    """pip's configured index settings here (`pip config list`, environment included)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if any(k in line for k in ("index-url", "find-links", "constraint"))]


def _folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default="python3", help="the interpreter that makes the venv (default python3)")
    p.add_argument("--extras", default="", help="extras to install too, e.g. test (default: none, as `pip install`)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        src, venv = Path(tmp) / "bertlab", Path(tmp) / "venv"
        src.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
        target = f".[{args.extras}]" if args.extras else "."
        load_before = os.getloadavg()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "-e", target], cwd=src, env=env, check=True,
                       stderr=subprocess.DEVNULL)
        wall = time.monotonic() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        load_after = os.getloadavg()
        venv_mb = _folder_mb(venv)
        version = subprocess.run([str(venv / "bin" / "python"), "--version"], capture_output=True, text=True).stdout
        shutil.rmtree(venv)
    result = {
        "meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": version.split()[-1],
                 "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
                 "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "what": f"python -m venv + pip install -e {target} (no pip cache)",
        "pip_index": pip_index(),
        "wall_s": round(wall, 1),
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "venv_mb": round(venv_mb),
        "load_avg": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['what']}: {wall / 60:.1f} min wall, {result['cpu_s']:.0f} s CPU, {venv_mb:.0f} MB; "
          f"load {load_before[0]:.1f} -> {load_after[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
