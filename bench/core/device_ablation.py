"""Each old speed device switched off alone, fine-tuning SST-2 fp32 (bench_finetune's worker, 1 thread), in turns.

Runs the tree from BEFORE issue 47's refactor (its devices are gone since): extract it first, e.g.

    git archive 7dc3b5f | tar -x -C /tmp/core_before
    BERTLAB_DATA=../shared/data python bench/core/device_ablation.py 2 384 /tmp/core_res/ablation.json /tmp/core_before

arguments: rounds, examples, output file, old tree. ablate_site/sitecustomize.py (first on the workers'
PYTHONPATH) switches off the devices named in BERTLAB_OFF; worth = seconds with it off / seconds with all on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = ["", "dropout_bypass", "dropout_scale", "head_major", "stacked_projection", "grad_table", "grad_scale",
            "heap", "packing", "cls_only"]
RESULT = "RESULT "  # bench_finetune's worker line


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    examples = int(sys.argv[2]) if len(sys.argv) > 2 else 384
    out = sys.argv[3] if len(sys.argv) > 3 else "ablation.json"
    old = sys.argv[4] if len(sys.argv) > 4 else "/tmp/core_before"
    site = str(Path(__file__).resolve().parent / "ablate_site")
    spec = {"preset": "minilm", "variant": "bertlab-fp32", "batch": 32, "examples": examples, "task": "sst2",
            "warmup": 3, "max_length": 128, "threads": 1, "seed": 0, "device": "cpu", "count_work": False}
    runs: dict[str, list[float]] = {s: [] for s in SETTINGS}
    t0 = time.time()
    for r in range(rounds):  # every other round in reverse order: a drift in load hits all alike
        for s in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
            env = {**os.environ, "PYTHONPATH": f"{site}:{old}", "BERTLAB_OFF": s, "PYTHONUNBUFFERED": "1"}
            p = subprocess.run([sys.executable, f"{old}/bench/bench_finetune.py", "--worker", json.dumps(spec)],
                               capture_output=True, text=True, env=env)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
            if p.returncode or not lines:
                print(s, "FAILED", p.stderr[-2000:])
                continue
            runs[s].append(json.loads(lines[-1][len(RESULT):])["seconds"])
            print(r, s or "all on", runs[s][-1], os.getloadavg(), flush=True)
    base = sum(runs[""]) / max(1, len(runs[""]))
    rows = [{"off": s or "(none: every device on)", "seconds_each": v, "seconds": round(sum(v) / len(v), 3),
             "worth": round(sum(v) / len(v) / base, 3)} for s, v in runs.items() if v]
    meta = {"what": "old tree (before the refactor), fine-tuning SST-2 fp32, MiniLM shape, one device off at a time; "
                    "worth = seconds with it off / seconds with all on", "spec": spec, "rounds": rounds,
            "wall_s": round(time.time() - t0), "load_end": os.getloadavg()}
    Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
