"""Write the README's measured figures from bench/results/*.json, so none is typed by hand.

The README marks each generated block:

    <!-- figures:fillmask -->
    ...table written by this script...
    <!-- /figures:fillmask -->

    python bench/readme_tables.py           rewrite every block from the results files
    python bench/readme_tables.py --check   exit 1 (and name the blocks) when the README differs

tests/test_readme_figures.py runs the check, so a results file and the README never drift apart.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"


def _load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def fillmask() -> str:
    d = _load("fillmask")
    rows = ["| sentence | tokens | bertlab ms | HF pipeline ms | ratio | top-5 (both) |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['text']} | {r['tokens']} | {_num(r['bertlab_ms'])} | {_num(r['hf_pipeline_ms'])} "
                    f"| {r['ratio_vs_hf']:.2f} | {', '.join(r['top5'])} |")
    s = d["summary"]
    rows.append("")
    rows.append(f"Median ratio **{s['median_ratio_vs_hf']:.2f}** (aim ≤ {s['aim']}; {d['meta']['threads']} torch "
                f"thread, {d['meta']['repeats']} calls each, `python bench/bench_fillmask.py`).")
    return "\n".join(rows)


def memory() -> str:
    d = _load("memory")
    rows = ["| kernels at once | PSS per kernel, MB | of it private (USS), MB | PSS total, MB |", "|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['kernels']} | {_num(r['pss_mean_mb'])} | {_num(max(r['uss_mb']))} "
                    f"| {_num(r['pss_total_mb'])} |")
    s = d["summary"]
    rows.append("")
    rows.append(f"Marginal PSS of one more idle student: **{_num(s['marginal_pss_mb'])} MB** (aim ≤ "
                f"{_num(s['aim_mb'], 0)} MB; Jupyter kernels running `build_app()` on the offline default, "
                f"`python bench/bench_memory.py`).")
    return "\n".join(rows)


def class_store() -> str:
    d = _load("class_store")
    return "\n".join([
        "| with %d student processes | median | worst / p95 |" % d["students"],
        "|---|---|---|",
        f"| a push reaches every student | {d['push_to_every_student_s']['median']} s "
        f"| {d['push_to_every_student_s']['max']} s |",
        f"| a reveal reaches every student | {d['reveal_to_every_student_s']['median']} s "
        f"| {d['reveal_to_every_student_s']['max']} s |",
        f"| an answer, all sent at once | {d['answer_ms']['median']} ms | {d['answer_ms']['p95']} ms (p95) |",
        f"| one poll of the store | {d['one_poll']['changed_us']} µs | – |",
        "",
        "(`python bench/bench_class_store.py --students %d`)" % d["students"],
    ])


def hub_sizing() -> str:
    d = _load("jupyterhub_sizing")
    rows = ["| process | RSS MB | PSS MB | private (USS) MB |", "|---|---|---|---|"]
    for key, label in (("server", "the student's Jupyter server (Voilà)"), ("kernel", "the dashboard page's kernel"),
                       ("student", "**one student**")):
        r = d[key]
        rows.append(f"| {label} | {_num(r['rss_mb'])} | {_num(r['pss_mb'])} | {_num(r['uss_mb'])} |")
    rows.append("")
    rows.append(f"(`{d['command']}`)")
    return "\n".join(rows)


def class_load() -> str:
    d = _load("class")
    rows = ["| students | page ready p50 / p95 / max, s | Mask edit → chart p50 / p95, ms "
            "| Attention edit → chart p50 / p95, ms | PSS per kernel (median), MB | PSS of all kernels, MB "
            "| stale charts | closed pages' kernels left after 60 s | load avg before |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        ready, mask, att = r["page_ready_s"], r["mask_edit_ms"], r["attention_edit_ms"]
        rows.append(
            f"| {r['n']} | {_num(ready['p50'])} / {_num(ready['p95'])} / {_num(ready['max'])} "
            f"| {_num(mask['p50'], 0)} / {_num(mask['p95'], 0)} | {_num(att['p50'], 0)} / {_num(att['p95'], 0)} "
            f"| {_num(r['pss_mb']['per_kernel_median'])} | {_num(r['pss_mb']['kernels_total'], 0)} "
            f"| {r['stale_charts']} of {r['charts_checked']} | {r['kernels_left']['of_closed_pages']} "
            f"| {_num(r['load_avg']['before'][0], 1)} |")
    rows.append("")
    rows.append(f"(`python bench/{d['meta']['command']}`, {d['meta']['cpus']} cores, {d['meta']['when']})")
    return "\n".join(rows)


def finetune() -> str:
    d = _load("finetune")
    m = d["meta"]
    rows = [f"| variant ({m['task']}, one epoch of the same {m['examples']} sentences, {m['device']}, "
            f"{m['threads']} thread) | examples/s | real tokens/s | padding | vs HF `Trainer` "
            "| vs HF `Trainer` + `group_by_length` | peak RSS MiB |",
            "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['variant']} ({r['preset']}) | {_num(r['examples_per_s'])} | {_num(r['tokens_per_s'], 0)} "
                    f"| {r['padding']:.1%} | {r['speedup_vs_hf']:.2f} | {r['speedup_vs_hf_grouped']:.2f} "
                    f"| {r['peak_rss_mb']} |")
    rows.append("")
    rows.append(f"(`python bench/bench_finetune.py --device cpu --threads 1`, {m['rounds']} rounds, {m['when']})")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "fillmask": fillmask,
    "memory": memory,
    "class-store": class_store,
    "hub-sizing": hub_sizing,
    "class-load": class_load,
    "finetune": finetune,
}


def render(text: str) -> tuple[str, list[str]]:
    """`text` with every marked block rewritten; also the names of the blocks that changed."""
    changed: list[str] = []
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- figures:{name} -->\n)(.*?)(<!-- /figures:{name} -->)", re.S)
        match = pattern.search(text)
        if match is None:
            continue
        body = make().rstrip("\n") + "\n"
        if match.group(2) != body:
            changed.append(name)
            text = text[: match.start(2)] + body + text[match.end(2):]
    return text, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the README is up to date")
    args = parser.parse_args(argv)
    old = README.read_text(encoding="utf-8")
    new, changed = render(old)
    if args.check:
        if changed:
            print(f"README.md figures differ from bench/results for: {', '.join(changed)} "
                  f"(run python bench/readme_tables.py)")
            return 1
        return 0
    if changed:
        README.write_text(new, encoding="utf-8")
    print(f"README.md: rewrote {', '.join(changed) or 'nothing (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
