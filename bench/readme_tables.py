"""Write the documentation's measured figures from bench/results/*.json, so none is typed by hand.

The pages of the docs site (docs/*.md) mark each generated block:

    <!-- figures:fillmask -->
    ...table written by this script...
    <!-- /figures:fillmask -->

    python bench/readme_tables.py           rewrite every block from the results files
    python bench/readme_tables.py --check   exit 1 (and name the blocks) when a page differs

tests/test_readme_figures.py runs the check, so a results file and the docs never drift apart.
(The name stays from when these tables lived in the README.)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The docs pages that may hold figure blocks."""
    return sorted(DOCS.glob("*.md"))


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


def class_service() -> str:
    """The hub's class service under a class (bench/bench_class_service.py): each figure over the runs,
    as the range from the best run to the worst."""
    d = _load("class_service")
    runs = d["runs"]

    def spread(get: Callable[[dict], float], unit: str) -> str:
        lo, hi = min(map(get, runs)), max(map(get, runs))
        return f"{lo} {unit}" if lo == hi else f"{lo}–{hi} {unit}"

    return "\n".join([
        f"| with {d['students']} students, {len(runs)} runs | median | worst / p95 |",
        "|---|---|---|",
        f"| a push reaches every student | {spread(lambda r: r['push_reach_s']['median'], 's')} "
        f"| {spread(lambda r: r['push_reach_s']['max'], 's')} |",
        f"| a reveal reaches every student | {spread(lambda r: r['reveal_reach_s']['median'], 's')} "
        f"| {spread(lambda r: r['reveal_reach_s']['max'], 's')} |",
        f"| an answer's round trip | {spread(lambda r: r['answer_ms']['median'], 'ms')} "
        f"| {spread(lambda r: r['answer_ms']['p95'], 'ms')} (p95) |",
        f"| one poll's round trip | {spread(lambda r: r['poll_ms']['median'], 'ms')} "
        f"| {spread(lambda r: r['poll_ms']['p95'], 'ms')} (p95) |",
        "| the service's share of one core, push to reveal "
        f"| {spread(lambda r: round(100 * r['service_cpu_share'], 1), '%')} | – |",
        f"| the service's memory (PSS) | {spread(lambda r: r['service_memory']['pss_mb'], 'MB')} | – |",
        "",
        f"(`{d['command']}`; load average {d['machine']['load_before']:.1f} on {d['machine']['cpus']} cores "
        "before it ran)",
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


def _cpu_per_student(row: dict) -> str:
    """Where a class's CPU went while the students worked (the simulated students' browsers run
    on the same machine as the server)."""
    cpu = row.get("cpu_s_during_flows")
    if not cpu:
        return "not measured"
    return " / ".join(_num(cpu[part] / row["n"]) for part in ("browsers", "kernels", "server"))


def class_load() -> str:
    d = _load("class")
    rows = ["| students | page ready p50 / p95 / max, s | Mask edit → chart p50 / p95, ms "
            "| Attention edit → chart p50 / p95, ms | PSS per kernel (median), MB | PSS of all kernels, MB "
            "| stale charts | closed pages' kernels left after 60 s | load avg before "
            "| CPU s per student: browsers / kernels / server |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        ready, mask, att = r["page_ready_s"], r["mask_edit_ms"], r["attention_edit_ms"]
        rows.append(
            f"| {r['n']} | {_num(ready['p50'])} / {_num(ready['p95'])} / {_num(ready['max'])} "
            f"| {_num(mask['p50'], 0)} / {_num(mask['p95'], 0)} | {_num(att['p50'], 0)} / {_num(att['p95'], 0)} "
            f"| {_num(r['pss_mb']['per_kernel_median'])} | {_num(r['pss_mb']['kernels_total'], 0)} "
            f"| {r['stale_charts']} of {r['charts_checked']} | {r['kernels_left']['of_closed_pages']} "
            f"| {_num(r['load_avg']['before'][0], 1)} | {_cpu_per_student(r)} |")
    rows.append("")
    rows.append(f"(`python bench/{d['meta']['command']}`, {d['meta']['cpus']} cores, {d['meta']['when']})")
    return "\n".join(rows)


def mask_edit() -> str:
    """One student alone: a Mask edit to its chart in Chromium (bench_class.py --n 1), with the load it ran under."""
    d = _load("class_one")
    rows = ["| students | Mask edit → chart p50 / p95 / max, ms | edits timed | Attention edit → chart, ms "
            "| load avg (1 min) before / after |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        mask, load = r["mask_edit_ms"], r["load_avg"]
        rows.append(f"| {r['n']} | {_num(mask['p50'], 0)} / {_num(mask['p95'], 0)} / {_num(mask['max'], 0)} "
                    f"| {mask['n']} | {_num(r['attention_edit_ms']['p50'], 0)} "
                    f"| {_num(load['before'][0], 2)} / {_num(load['after_flows'][0], 2)} |")
    rows += ["", f"(`python bench/{d['meta']['command']}`, {d['meta']['cpus']} cores, {d['meta']['when']})"]
    return "\n".join(rows)


def classic_panel() -> str:
    """The lectures' classic sentences: each model's verdict and top 5 (bench_panel.py)."""
    d = _load("classic_panel")
    measured = [r for r in d["rows"] if r["measured"]]
    rows = ["| sentence | " + " | ".join(f"{r['model']}: top 5" for r in measured) + " |",
            "|---|" + "---|" * len(measured)]
    for i, first in enumerate(measured[0]["sentences"] if measured else []):
        cells = [f"{'✓' if r['sentences'][i]['hit'] else '✗'} {', '.join(r['sentences'][i]['top'])}" for r in measured]
        rows.append(f"| {first['sentence']} | " + " | ".join(cells) + " |")
    rows.append("| **in its top 5** | " + " | ".join(f"**{r['hits']} of {r['total']}**" for r in measured) + " |")
    rows.append("")
    rows += [f"{r['model']}: not measured here ({r['why']})." for r in d["rows"] if not r["measured"]]
    rows.append(f"(`python bench/{d['meta']['command']}`, {d['meta']['when']})")
    return "\n".join(rows)


def install() -> str:
    """A first install from a checkout, timed (bench_install.py)."""
    d = _load("install")
    load = d["load_avg"]
    return (f"| what | wall time | CPU time | venv size | load avg (1 min) before / after |\n|---|---|---|---|---|\n"
            f"| `{d['what']}` | {d['wall_s'] / 60:.1f} min | {d['cpu_s']:.0f} s | {d['venv_mb']:,} MB "
            f"| {load['before'][0]:.2f} / {load['after'][0]:.2f} |\n\n"
            f"(`python bench/{d['meta']['command']}`, {d['meta']['cpus']} cores, Python {d['meta']['python']}, "
            f"pip reading {'; '.join(d['pip_index']) or 'PyPI'}, {d['meta']['when']})")


TASK_NAMES = {"sst2": "SST-2 sentences", "sick": "SICK sentence pairs"}


def _finetune_table(name: str) -> list[str]:
    """One bench_finetune.py result: a row per variant, its speed-ups over each HF baseline it ran against."""
    d = _load(name)
    m = d["meta"]
    load = m["load_avg_start"][0], m["load_avg_end"][0]
    rows = [f"| variant ({TASK_NAMES.get(m['task'], m['task'])}, one epoch of the same {m['examples']}, "
            f"{m['device']}, {m['threads']} thread) | precision | examples/s | real tokens/s | padding "
            "| vs HF `Trainer` | vs HF + `group_by_length` | vs HF + `group_by_length` + bf16 | peak RSS MiB "
            "| matmul GFLOP | HF grouped's matmul work ÷ this |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        ratios = " | ".join(_against_aim(r.get(f"speedup_vs_{b}"), FINETUNE_AIM)
                            for b in ("hf", "hf_grouped", "hf_grouped_bf16"))
        work = _grouped_work(r)
        rows.append(f"| {r['variant']} ({r['preset']}) | {r.get('precision', 'fp32')} | {_num(r['examples_per_s'])} "
                    f"| {_num(r['tokens_per_s'], 0)} | {r['padding']:.1%} | {ratios} | {r['peak_rss_mb']} "
                    f"| {_num(r.get('matmul_gflop'), 0)} | {_num(work, 2)} |")
    args = "" if m["task"] == "sst2" else f" --task {m['task']}"
    if m["examples_asked"] != 768:  # the CPU default
        args += f" --examples {m['examples_asked']}"
    args += f" --rounds {m['rounds']}"  # always: the run's own, whatever the default
    args += " --variants " + " ".join(r["variant"] for r in d["rows"])
    if name != ("finetune" if m["task"] == "sst2" else f"finetune_{m['task']}"):  # not the task's default file
        args += f" --out bench/results/{name}.json"
    counted = ("; matmul work counted by torch's `FlopCounterMode` over the same epoch, trained once more untimed"
               if any(r.get("matmul_gflop") for r in d["rows"]) else "")
    rows += ["", f"(`python bench/bench_finetune.py --device {m['device']} --threads {m['threads']}{args}`, "
             f"{m['rounds']} round(s), {_optimizers(d['rows'])}, "
             f"load average {load[0]} at the start and {load[1]} at the end, {m['when']}{counted})"]
    return rows


def _grouped_work(row: dict) -> float | None:
    """HF grouped's matmul work over this row's (its own precision's grouped run), when both were counted."""
    return row.get("matmul_work_vs_hf_grouped") or row.get("matmul_work_vs_hf_grouped_bf16")


def _optimizers(rows: list[dict]) -> str:
    """The optimizer each variant ran, as the rows recorded it: one for all, or each variant's."""
    ran = {r["variant"]: r.get("optimizer") or "optimizer not recorded" for r in rows}
    if len(set(ran.values())) == 1:
        return f"every variant {next(iter(ran.values()))}"
    return "; ".join(f"{v}: {o}" for v, o in ran.items())


def _like_for_like(name: str, variant: str, base: str) -> str | None:
    """'**N.NN×**' of `variant` over `base` in results file `name`, then each round's own ratio when there were
    several; None when they are not there."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    by = {r["variant"]: r for r in _load(name)["rows"]}
    if variant not in by or base not in by:
        return None
    key = base.replace("-", "_")
    said = f"**{_against_aim(by[variant]['speedup_vs_' + key], FINETUNE_AIM)}×**"
    notes = []
    ours, theirs = by[variant].get("seconds_each") or [], by[base].get("seconds_each") or []
    if len(ours) > 1 and len(ours) == len(theirs):  # the rounds ran in turns: each round's own ratio
        rounds = [t / o for o, t in zip(ours, theirs)]
        notes.append(f"rounds {', '.join(f'{r:.2f}' for r in rounds)}{straddle(rounds, FINETUNE_AIM, at_most=False)}")
    work = by[variant].get(f"matmul_work_vs_{key}")
    if work:
        notes.append(f"the matmul work alone differs {work:.2f}×")
    return said + (f" ({'; '.join(notes)})" if notes else "")


FINETUNE_AIM = 1.5  # bertlab's speed over HF's grouped `Trainer`, the same arithmetic: at least this


def _against_aim(x: float | None, aim: float, at_most: bool = False) -> str:
    """x to two decimals, or more where two would round it onto the other side of the aim (at least `aim`, or at
    most it): 1.495 against an aim of at least 1.5 reads 1.495, not 1.50; 1.154 against at most 1.15, 1.154."""
    if x is None:
        return "–"

    def meets(v: float) -> bool:
        return v <= aim if at_most else v >= aim

    digits = next((d for d in (2, 3, 4) if meets(round(x, d)) == meets(x)), 5)
    return f"{x:.{digits}f}"


def straddle(rounds: list[float] | None, limit: float, at_most: bool) -> str:
    """A warning when some rounds of a figure meet its aim (at most / at least `limit`) and others do not:
    the verdict is then the noise's."""
    met = {r <= limit if at_most else r >= limit for r in rounds or []}
    if len(met) < 2:
        return ""
    return f"; the rounds fall on both sides of {limit}, so whether it is met is within this machine's noise"


def finetune() -> str:
    """The fine-tuning speed tables (bench/bench_finetune.py): SST-2, SICK pairs, and bf16 like for like."""
    rows = _finetune_table("finetune")
    for name in ("finetune_sick", "finetune_bf16"):
        if (RESULTS / f"{name}.json").exists():
            rows += [""] + _finetune_table(name)
    cells = [("SST-2, fp32", _like_for_like("finetune", "bertlab-fp32", "hf-grouped")),
             ("SICK pairs, fp32", _like_for_like("finetune_sick", "bertlab-fp32", "hf-grouped")),
             ("SST-2, bf16", _like_for_like("finetune_bf16", "bertlab-bf16", "hf-grouped-bf16"))]
    said = "; ".join(f"{where} {cell}" for where, cell in cells if cell is not None)
    rows += ["", f"Against HF's `Trainer` with `group_by_length` in the same arithmetic (aim ≥ {FINETUNE_AIM}×): "
                 f"{said}."]
    return "\n".join(rows)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _dev_metric(r: dict) -> str:
    m, hist = r["metrics"], r.get("history", [])
    if r["task"] == "qa":
        text = f"EM {m['exact_match']:.1f}, F1 **{m['f1']:.1f}**"
    elif r["task"] == "ner":
        types = ", ".join(f"{t} {100 * v['f1']:.1f}" for t, v in sorted(m.get("per_type", {}).items()))
        text = f"entity F1 **{100 * m['f1']:.1f}**" + (f" ({types})" if types else "")
    else:
        text = f"accuracy **{100 * m['accuracy']:.1f} %**"
    if len(hist) > 1:  # the dev metric after each epoch (the lr still decaying)
        scale = 1 if r["task"] == "qa" else 100
        text += "; by epoch " + " / ".join(f"{scale * h[r['main_metric']]:.1f}" for h in hist)
    return text


def _current(r: dict, recipe: Callable) -> bool:
    """Whether a fine-tuning row ran with the defaults its task and mode have today."""
    rec = recipe(r["task"], r["mode"])
    settings = (r["model"], r["epochs"], r["lr"], r["batch_size"], r["max_length"], r.get("warmup_ratio"))
    return settings == (rec.model, rec.epochs, rec.lr, rec.batch_size, rec.max_length, rec.warmup_ratio)


def finetune_table() -> str:
    """The fine-tuning table (docs/results.md): rows of bench/results/finetune_table.json measured with the defaults
    the code has now (a row measured under other defaults is left out until `finetune_table.py --only` re-runs it)."""
    sys.path.insert(0, str(ROOT))
    from bertlab.training.finetune_defaults import START_NAMES, recipe

    d = _load("finetune_table")
    rows = ["| task | train data | mode, epochs (lr) | starts from | dev metric | wall time | device | measured |",
            "|---|---|---|---|---|---|---|---|"]
    task_names = {"sst2": "SST-2", "nli": "SICK (NLI)", "ner": "CoNLL-2003 (NER)", "qa": "SQuAD v1.1 (QA)"}
    order = {t: i for i, t in enumerate(task_names)}
    for r in sorted(d["rows"], key=lambda r: (order[r["task"]], r["name"])):
        rec = recipe(r["task"], r["mode"])
        if not _current(r, recipe):
            continue  # measured under other defaults
        start = START_NAMES.get(rec.model, rec.model)
        cpus = f", core {r['cpus']}" if r.get("cpus") not in (None, "any") else ""
        if r.get("load_avg_end"):  # how busy the shared machine was (1-minute load average at the end)
            cpus += f"; load {r['load_avg_end'][0]:.1f} on {r['cores']} cores"
        cpu = f" (CPU time {_duration(r['cpu_s'])})" if r.get("cpu_s") else ""  # the run's own, on a shared machine
        mode = r["mode"] if r["mode"] == "full" else f"{r['mode']} ({r['trainable_parameters'] / 1e6:.2f} M trained)"
        device = f"{r['device']} {r.get('precision', 'fp32')}"
        rows.append(f"| {task_names[r['task']]} | {r['data']} | {mode}, {r['epochs']} ({r['lr']:g}) | {start} "
                    f"| {_dev_metric(r)} | {_duration(r['train_s'])}{cpu} | {device}, "
                    f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}{cpus} | {r['when'][:10]} |")
    sys.path.insert(0, str(ROOT / "bench"))
    from finetune_table import ROWS

    measured = {r["name"] for r in d["rows"] if _current(r, recipe)}
    missing = [r.name for r in ROWS if r.name not in measured]
    rows.append("")
    if missing:
        rows.append(f"Not yet measured with today's defaults: {', '.join(missing)} "
                    f"(`python bench/finetune_table.py --only ROW`).")
        rows.append("")
    rows.append("(`python bench/finetune_table.py [--only ROW] [--threads N]`, or `make results`; each row's command "
                "is `python bench/finetune_table.py --list`)")
    return "\n".join(rows)


def finetune_defaults() -> str:
    """The fine-tuning defaults per task (from the code, not a measurement: kept in step with it here)."""
    sys.path.insert(0, str(ROOT))
    from bertlab.training.finetune_defaults import RECIPES

    rows = ["| task | starts from | epochs (full / feature / adapter) | lr (full / feature / adapter) | batch "
            "| max length | warm-up | chosen by (full; feature; adapter) |", "|---|---|---|---|---|---|---|---|"]
    for task in dict.fromkeys(t for t, _ in RECIPES):
        r = {m: RECIPES[(task, m)] for m in ("full", "feature", "adapter")}
        full = r["full"]
        source = "`default-encoder`" if full.model else "the offline default"
        rows.append(f"| {task} | {source} | {' / '.join(str(x.epochs) for x in r.values())} "
                    f"| {' / '.join(f'{x.lr:g}' for x in r.values())} | {full.batch_size} | {full.max_length} "
                    f"| {full.warmup_ratio:.0%} of the steps | {'; '.join(x.basis for x in r.values())} |")
    return "\n".join(rows)


def compress() -> str:
    """The compression lab on SST-2 (bench/bench_compress.py): every variant, then the ratios and the aims."""
    d = _load("compress")
    m, r = d["meta"], d["ratios"]
    rows = ["| model | library | layers | heads | weights, MB | CPU ms, batch 1 | CPU ms, batch 32 | accuracy |",
            "|---|---|---|---|---|---|---|---|"]
    for v in d["rows"]:
        rows.append(f"| {v['name']} | {v['lib']} | {v['layers']} | {v['heads']} | {_num(v['size_mb'])} "
                    f"| {_num(v['latency_ms_b1'])} | {_num(v['latency_ms_b32'], 0)} | {100 * v['accuracy']:.1f} % |")

    def met(aim: str) -> str:
        return "met" if d["aims"][aim] else "**not met**"

    def points(lost: float) -> str:
        return f"{lost:.1f} points lost" if lost >= 0 else f"{-lost:.1f} points gained"

    SIZE_AIM = "int8 ≤ 0.4× the weights' size"  # noqa: N806 (the aim's key in the results file)
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_compress import AIMS

    ORT_LIMIT = AIMS["int8_vs_ort_b1"]  # noqa: N806
    ORT_AIM = "int8 ≤ 1.1× ONNX Runtime int8's time at batch 1"  # noqa: N806

    i8, st, pr = r["int8"], r["student"], r["pruned_50"]
    hf, ort = r["int8_vs_hf_int8"], r["int8_vs_ort_int8"]
    curve = ", ".join(f"{p['heads_kept']}: {100 * p['accuracy']:.1f}" for p in d["curve"])
    rows += [
        "",
        f"- **int8** against fp32: **{i8['speedup_b1']:.2f}×** faster at batch 1, **{i8['speedup_b32']:.2f}×** at "
        f"batch 32 ({met('int8 ≥ 1.6× faster at batch 1 and 32')}), {points(i8['points_lost'])} "
        f"({met('int8 ≤ 1 point lost')}), **{i8['size_ratio']:.2f}×** the weights' size "
        f"({met(SIZE_AIM)}).",
        f"- bertlab int8 time / Hugging Face + `torch.ao` dynamic int8 time: {hf['time_ratio_b1']:.2f} at batch 1, "
        f"{hf['time_ratio_b32']:.2f} at batch 32 (below 1 = bertlab faster), {hf['size_ratio']:.2f}× its size; "
        f"/ ONNX Runtime int8: {ort['time_ratio_b1']:.2f}"
        + (f" (rounds {min(ort['time_ratio_b1_rounds']):.2f}–{max(ort['time_ratio_b1_rounds']):.2f})"
           if ort.get("time_ratio_b1_rounds") else "")
        + f" and {ort['time_ratio_b32']:.2f}"
        + (f" (≤ {ORT_LIMIT} at batch 1: {met(ORT_AIM)}"
           f"{straddle(ort.get('time_ratio_b1_rounds'), ORT_LIMIT, at_most=True)})"
           if ORT_AIM in d["aims"] else "")
        + f", {ort['size_ratio']:.2f}× its size.",
        f"- **3-layer student** distilled from the 6-layer model: {points(st['points_lost'])} "
        f"({met('student ≤ 3 points lost')}), {st['speedup_b1']:.2f}× faster at batch 1, {st['speedup_b32']:.2f}× "
        f"at batch 32 ({met('student ≥ 1.8× faster')}).",
        f"- **Pruned to 50 % of the heads**: {pr['speedup_b1']:.2f}× faster at batch 1, {pr['speedup_b32']:.2f}× at "
        f"batch 32, {points(pr['points_lost'])}. Accuracy (%) by heads kept: {curve}.",
        "",
        f"Teacher: {m['teacher']}; student: {m['student']}. Accuracy on {m['dev_examples']} held-out SST-2 "
        f"sentences (never trained on); latency: median of {m.get('reps_b1', m['reps'])} single sentences"
        + (f" (the median of {m['rounds_b1']} rounds)" if m.get("rounds_b1") else "") + " and "
        f"{m['reps']} batches of 32, {m['threads']} torch thread, "
        f"{m['cpu']}, load average {m['load_average'][0]} when measured ({m['date']}; `{m['command']}`).",
    ]
    return "\n".join(rows)


def objectives() -> str:
    """The pre-training objectives compared under one budget (bench/bench_objectives.py)."""
    d = _load("objectives")
    m = d["meta"]

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f} %"

    def probe(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.2f} %"

    own_names = {"loss": "MLM + pair", "mlm_loss": "MLM", "rtd_loss": "replaced-token", "sbo_loss": "span boundary"}

    rows = ["| objective | kept model | parameters kept / trained (M) | own loss, first → last "
            "| MLM accuracy, last batches | held-out MLM top-1 / top-5 | pair task (held-out) | probe P(target) "
            "| SST-2 dev accuracy, fine-tuned | SST-2 dev accuracy, linear probe (frozen) | pre-training time |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        held = r["held_out"]
        rows.append(
            f"| {r['objective']} | `{r['hf_class']}` | {r['kept_params_m']:.1f} / {r['trained_params_m']:.1f} "
            f"| {own_names.get(r['own_loss_name'], r['own_loss_name'])} {r['own_loss_first']:.2f} → "
            f"{r['own_loss_last']:.2f} | {pct(r['mlm_acc_last'])} "
            f"| {pct(held.get('mlm_top1'))} / {pct(held.get('mlm_top5'))} | {pct(held.get('pair_accuracy'))} "
            f"| {probe(r['probe_p_last'])} "
            f"| **{pct(r['sst2']['accuracy'])}** | **{pct((r.get('probe') or {}).get('accuracy'))}** "
            f"| {_duration(r['pretrain_s'])} |")
    floor = d["random_init"]
    rows.append(f"| untrained (random weights, BERT's shape) | – | – | – | – | – | – | – "
                f"| **{pct(floor['sst2']['accuracy'])}** | **{pct((floor.get('probe') or {}).get('accuracy'))}** "
                f"| – |")
    s = m["sst2"]
    ratio = m["bert_base_tokens"] / m["tokens_per_run"]
    rows.append("")
    rows.append(
        f"Each objective: a new {m['size']} model, {m['steps']} steps of {m['batch']} sequences of {m['seq_len']} "
        f"tokens ({m['tokens_per_run']:,} tokens, about 1/{ratio:,.0f} of BERT-base's pre-training), "
        f"lr {m['lr']:g}, seed 0, {m['documents']:,} `{m['corpus']}` documents; ELECTRA's MLM figures are its "
        f"generator's (a quarter of the width). SST-2: {s['train']:,} training sentences, {s['epochs']} epoch(s), "
        f"lr {s['lr']:g}, scored on {s['dev']:,} dev sentences never trained on (always saying the majority label "
        f"scores {100 * s['dev_majority']:.1f} % there); the linear probe: the frozen model's mean-pooled "
        f"last-layer features of the same sentences, a logistic regression fitted to convergence (L-BFGS, "
        f"l2 {m.get('probe', {}).get('l2', 0):g}). {m['threads']} CPU thread on a "
        f"shared {m['cpus']}-core machine, {m['when']} (`{m['command'].strip()}`).")
    return "\n".join(rows)


def replay() -> str:
    d = _load("replay")
    views = list(d["rows"][0]["views"])
    rows = ["| run | snapshots kept (steps) | on disk, MB (first one) | writing them, ms each | reading the probe "
            "with all, s | " + " | ".join(f"{v}: slider p95, ms (first visit / again)" for v in views) + " |",
            "|---|---|---|---|---|" + "---|" * len(views)]
    for r in d["rows"]:
        cells = [r["run"], f"{len(r['snapshots'])} ({', '.join(map(str, r['snapshots']))})",
                 f"{_num(r['snapshot_mb'])} ({_num(r['first_snapshot_mb'])})", f"{r['write_ms_per_snapshot']:,}",
                 _num(r["replay_s"]), *(f"{_num(r['views'][v]['first']['p95_ms'], 0)} / "
                                        f"{_num(r['views'][v]['again']['p95_ms'], 0)}" for v in views)]
        rows.append("| " + " | ".join(cells) + " |")
    s, m = d["summary"], d["meta"]
    rows.append("")
    rows.append(f"Slowest view at p95 over all slider moves: **{_num(s['worst_p95_ms'], 0)} ms** (aim ≤ "
                f"{_num(s['aim_ms'], 0)} ms; {m['sweeps']} sweeps of the slider per view, the first drawing every "
                f"frame for the first time; {m['threads']} torch thread, load average {m['load_before']} before, "
                f"`python bench/bench_replay.py`, {m['date']}).")
    return "\n".join(rows)


def explain() -> str:
    d = _load("explain")
    m = d["meta"]
    rows = [f"| input | tokens | IG points | completeness gap | bertlab IG, s (CPU s) | {m['peer']}, s (CPU s) | "
            "bertlab / peer (CPU) | gradient × input, s | max abs. difference |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['input']}: {r['target']} | {r['tokens']} | {r['steps']} | "
                    f"{100 * r['completeness_gap']:.2f} % | {_num(r['bertlab_ig_s'], 2)} "
                    f"({_num(r['bertlab_ig_cpu_s'], 2)}) | {_num(r['peer_s'], 2)} ({_num(r['peer_cpu_s'], 2)}) | "
                    f"{r['ratio_vs_peer']:.2f} ({r['cpu_ratio_vs_peer']:.2f}) | {_num(r['grad_x_input_s'], 2)} | "
                    f"{r['max_abs_diff_vs_peer']:.0e} |")
    s, g, f = d["summary"], d["gaps"], d["forward_no_grad"]
    rows.append("")
    rows.append(f"Slowest attribution at 32 tokens: **{_num(s['worst_ig_s'], 2)} s** wall clock, "
                f"{_num(s['worst_ig_cpu_s'], 2)} s of CPU (aim ≤ {_num(s['aim_s'], 0)} s; with one thread the CPU time "
                f"is what an idle machine's clock reads). Completeness gap at the default step count: at most "
                f"**{100 * g['max_gap']:.2f} %** over {g['inputs']} inputs (aim ≤ {100 * g['aim']:.0f} %; points used: "
                f"{', '.join(map(str, g['steps']))}). The no-gradient forward pass inside an empty hook context "
                f"takes {f['ratio']:.2f}× the plain one's CPU time ({_num(f['plain_cpu_ms'], 1)} ms). "
                f"{m['threads']} torch thread, {m['repeats']} calls each, `python bench/bench_explain.py`, "
                f"{m['date']}.")
    return "\n".join(rows)


FORWARD_MODELS = {"minilm": "MiniLM (offline default)", "bert-base-random": "BERT-base shape, random",
                  "roberta-random": "RoBERTa, MiniLM shape, random", "albert-random": "ALBERT, MiniLM shape, random",
                  "distilbert-random": "DistilBERT, MiniLM shape, random",
                  "electra-random": "ELECTRA, MiniLM shape, random",
                  "modernbert-random": "ModernBERT, MiniLM shape, random",
                  "deberta-v3-random": "DeBERTa-v3, MiniLM shape, random"}


def forward() -> str:
    """One forward pass, bertlab against transformers, plain and capturing (bench/bench_forward.py). Rows kept
    from an earlier run (`--keep-other-rows`) carry that run's settings."""
    d = _load("forward")
    meta, other = d["meta"], d["meta"].get("other_rows_meta")
    rows = ["| model | seq | bertlab plain ms | HF plain ms | ratio | bertlab capture ms | HF capture ms | ratio "
            "| capture / plain | threads, calls |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        run = other if other and r["model"] in ("minilm", "bert-base-random") else meta
        rows.append(
            f"| {FORWARD_MODELS.get(r['model'], r['model'])} | {r['seq']} | {_num(r['bertlab_plain'])} "
            f"| {_num(r['hf_plain'])} | {_num(r['plain_ratio_vs_hf'], 2)} | {_num(r['bertlab_capture'])} "
            f"| {_num(r['hf_capture'])} | {_num(r['capture_ratio_vs_hf'], 2)} | {_num(r['capture_overhead'], 2)} "
            f"| {run['threads']}, median of {run['repeats']} |")
    ratios = [r[k] for r in d["rows"] for k in ("plain_ratio_vs_hf", "capture_ratio_vs_hf")]
    rows.append("")
    rows.append(f"Ratios (bertlab / HF) from {min(ratios):.2f} to {max(ratios):.2f} "
                f"(`python bench/bench_forward.py`; the family rows with `--models roberta-random albert-random "
                f"distilbert-random electra-random --keep-other-rows`, batch {d['rows'][0]['batch']}).")
    if "mixed" in d:
        x, xm = d["mixed"]["row"], d["mixed"]["meta"]
        rows.append("")
        rows.append(
            f"Mixed lengths, MiniLM: {x['batch']} SST-2 dev sentences of {min(x['lengths'])} to {max(x['lengths'])} "
            f"tokens ({x['tokens']} real of {x['padded_tokens']} padded): HF {_num(x['hf_plain'])} ms, bertlab "
            f"padded {_num(x['bertlab_padded'])} ms ({_num(x['padded_ratio_vs_hf'], 2)}×), bertlab packed "
            f"(`model.bert.packing = \"always\"`) {_num(x['bertlab_packed'])} ms "
            f"(**{_num(x['packed_ratio_vs_hf'], 2)}×**; aim ≤ 0.9×), largest difference from HF's outputs at the "
            f"real tokens {x['packed_max_diff_vs_hf']:.1g}; "
            f"median of {xm['repeats']} calls each in turns, {xm['threads']} thread(s), load average "
            f"{xm['load_average'][0]} (`BERTLAB_DATA=../shared/data python bench/bench_forward.py --mixed-only "
            "--threads 1`).")
    if (RESULTS / "forward_capture.json").is_file():
        rows += ["", _capture_views(_load("forward_capture"))]
    return "\n".join(rows)


CAPTURE_AIM = 1.15  # what capturing the patterns a view draws may cost, times the plain pass: at most this


def _capture_views(d: dict) -> str:
    """What capturing costs when a view asks only for what it draws (bench/results/forward_capture.json)."""
    m = d["meta"]
    each = "; ".join(
        f"{FORWARD_MODELS.get(r['model'], r['model'])}: one layer's patterns "
        f"{_against_aim(r['view_layer_overhead'], CAPTURE_AIM, at_most=True)}×, "
        f"one head's {_against_aim(r['view_head_overhead'], CAPTURE_AIM, at_most=True)}×, "
        f"everything {_num(r['capture_overhead'], 2)}× "
        f"(plain {_num(r['bertlab_plain'])} ms)" for r in d["rows"])
    seqs = sorted({r["seq"] for r in d["rows"]})
    return (f"Capture that costs what a view shows, at {', '.join(map(str, seqs))} tokens, "
            f"batch {d['rows'][0]['batch']}: "
            f"`run_with_cache` asked for the patterns of one layer (or of one head in every layer, the head view) in "
            f"float16, against the plain pass (aim ≤ {CAPTURE_AIM}×), in a run of its own on this CPU, random token "
            f"ids, no padding, inference mode. {each}. "
            f"Median of {m['repeats']} calls each in turns, "
            f"{m['threads']} thread(s), load average {m['load_average'][0]} (`python bench/bench_forward.py --lengths "
            f"{' '.join(map(str, seqs))} --models {' '.join(r['model'] for r in d['rows'])} --repeats {m['repeats']} "
            f"--threads {m['threads']} --out bench/results/forward_capture.json`)"
            + (f"; rows kept from an earlier run (`--keep-other-rows`): median of {o['repeats']} calls, load average "
               f"{o['load_average'][0]}." if (o := m.get("other_rows_meta")) else "."))


def dashboard() -> str:
    """Widget edit to figure redrawn in the kernel, and start-up (bench/bench_dashboard.py)."""
    d = _load("dashboard")
    rows = ["| interaction | p50 ms | p95 ms |", "|---|---|---|"]
    for r in d["interactions"]:
        rows.append(f"| {r['interaction']} | {_num(r['p50_ms'])} | {_num(r['p95_ms'])} |")
    worst = max(d["interactions"], key=lambda r: r["p95_ms"])
    start = d["startup"]
    rows.append("")
    rows.append(f"Slowest p95: {worst['interaction']}, {_num(worst['p95_ms'])} ms (aim ≤ 100 ms). Start-up, a fresh "
                f"process to the app built: median {start['median_s']:.2f} s of {len(start['runs_s'])} runs "
                f"({min(start['runs_s']):.2f}–{max(start['runs_s']):.2f} s). (`python bench/bench_dashboard.py`, "
                f"offline default, {d['meta']['tokens']} tokens, {d['meta']['repeats']} edits each, "
                f"{d['meta']['threads']} threads)")
    return "\n".join(rows)


def _middle_half(ratios: list[float] | None) -> str:
    """' (q1–q3)' of per-step ratios (four or more, not all equal), else ''."""
    if not ratios or len(ratios) < 4 or len(set(ratios)) == 1:
        return ""
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f" ({q1:.2f}–{q3:.2f})"


def pretrain() -> str:
    """MLM pre-training tokens/s against HF's BertForMaskedLM (bench/bench_pretrain.py), fp32 and bf16."""
    rows = ["| shape | variant | precision | batch × seq | ms per step | tokens/s | vs HF "
            "| matmul GFLOP per step | HF's matmul work ÷ this |",
            "|---|---|---|---|---|---|---|---|---|"]
    notes, profiled = [], []
    for name in ("pretrain", "pretrain_bf16"):
        if not (RESULTS / f"{name}.json").exists():
            continue
        d = _load(name)
        m = d["meta"]
        profiled += d["rows"]
        for r in d["rows"]:
            work = ((_num(r["matmul_gflop_per_step"]), f"{r['matmul_work_vs_hf']:.2f}")
                    if r.get("matmul_work_vs_hf") is not None else ("–", "–"))
            rows.append(f"| {r['preset']} | {r['variant']} | {r.get('precision', m['precision'])} "
                        f"| {r['batch']} × {r['seq']} | {_num(r['ms_per_step'])} | {_num(r['tokens_per_s'])} "
                        f"| {r['speedup_vs_hf']:.2f}{_middle_half(r.get('speedup_vs_hf_per_step'))} "
                        f"| {work[0]} | {work[1]} |")
        load = (f", load average {m['load_avg_start'][0]} at the start and {m['load_avg_end'][0]} at the end"
                if m.get("load_avg_start") else "")
        heap = {"kept": ", the C heap kept between steps for both (`kept_heap`)",
                "default": ", glibc's default heap"}.get(m.get("heap") or "", "")
        notes.append(f"{m['precision']}: {m['steps']} steps after {m['warmup']} warm-up, median{load}{heap}")
    rows += ["", f"(`python bench/bench_pretrain.py --precision …`, {m['device']}, {m['threads']} thread(s); "
             + "; ".join(notes) + "; vs HF: the median steps' ratio, in brackets the middle half of the ratios of "
             "steps taken in turn, where there were four or more)"]
    profiled = profile_table(profiled)
    return "\n".join(rows + ([""] + profiled if profiled else []))


# bench_pretrain.KINDS' names and its "other", in the order the table shows them (a test keeps the two alike)
PROFILE_KINDS = ("matmul", "attention", "layernorm", "dropout", "elementwise", "memory", "loss", "optimizer", "other")


def profile_table(rows: list[dict]) -> list[str]:
    """Where a training step's time goes (`bench_pretrain.py --profile`), each kind of work as a share of the
    busy time, for the rows that were profiled; [] when none was."""
    failed = [f"{r['preset']} {r['variant']}: {r['profile']['error']}" for r in rows
              if r.get("profile") and "error" in r["profile"]]
    note = [f"The profile asked for failed ({'; '.join(failed)})."] if failed else []
    rows = [r for r in rows if r.get("profile") and "error" not in r["profile"]]
    if not rows:
        return note
    gpu = rows[0]["profile"]["launches_per_step"] is not None
    out = ["| shape | variant | precision | ms per step, profiled | busy | " + " | ".join(PROFILE_KINDS)
           + (" | kernel launches per step |" if gpu else " |"),
           "|---" * (5 + len(PROFILE_KINDS) + gpu) + "|"]
    for r in rows:
        pr = r["profile"]
        busy = pr["busy_ms_per_step"]
        shares = [f"{100 * pr['by_kind_ms_per_step'].get(k, 0.0) / busy:.0f} %" if busy else "–" for k in PROFILE_KINDS]
        out.append(f"| {r['preset']} | {r['variant']} | {r['precision']} | {_num(pr['wall_ms_per_step'])} "
                   f"| {_num(busy)} | " + " | ".join(shares)
                   + (f" | {_num(pr['launches_per_step'], 0)} |" if gpu else " |"))
    pr = rows[0]["profile"]
    out += ["", f"Busy: the time of the {pr['clock']}, per step, over {pr['steps']} profiled steps after the timed "
            "ones (the profiler's own cost is in the wall time); each kind of work as a share of it, by the names "
            "of the ops (`bench_pretrain.KINDS`)."
            + (" Wall far above busy means the GPU waits on the host (launches, syncs)." if gpu else "")]
    return out + ([""] + note if note else [])


def loss_curves() -> str:
    """Packed against padded training on a real short fine-tune, next to seed-to-seed noise
    (bench/bench_loss_curves.py)."""
    d = _load("loss_curves")
    m = d["meta"]
    rows = ["| runs compared | pairs | mean loss gap per step, median (min–max) "
            "| gap of the moving averages, median (min–max) | dev accuracy difference, median |",
            "|---|---|---|---|---|"]

    def spread(xs: list[float], fmt: str) -> str:
        return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"

    for name, g in d["gaps"].items():
        rows.append(f"| {name} | {len(g['pairs'])} | {spread(g['per_step'], '.4f')} "
                    f"| {spread(g['moving_average'], '.4f')} "
                    f"| {100 * statistics.median(g['dev_accuracy']):+.1f} points |")
    accs = ", ".join(f"{n} {100 * r['dev_accuracy']:.1f} %" for n, r in d["runs"].items())
    test = d["permutation_test"]
    verdict = {True: "Packed and padded **agree** within the seed-to-seed noise",
               False: "Packed and padded **differ** by more than the seed-to-seed noise",
               None: "Too few seeds to tell whether packed and padded differ"}[d["agree_within_noise"]]
    verdict += (f": permutation test over the {test['splits']} splits of the {2 * m['seeds']} runs into two "
                f"equal groups, p = {test['p_value']:.3f} (the smallest p these runs allow: "
                f"{test['smallest_p']:.3f}; agree when p ≥ 0.05)")
    rows += ["", f"{verdict}. Described another way, the median gap between a packed and a "
             f"padded run's moving averages is {d['gap_over_noise']:.2f}× the largest gap between two dropout "
             f"seeds of one path ({m['seeds']} seeds per path). Dev accuracy on the first "
             f"{m['dev_sentences']} SST-2 dev sentences after {m['steps']} steps of batch {m['batch']}: {accs}. "
             f"({m['model']}, fp32 on the CPU, moving average over {m['window']} steps, {m['threads']} thread, "
             f"load average "
             f"{m['load_avg_start'][0]} at the start and {m['load_avg_end'][0]} at the end; "
             f"`python bench/bench_loss_curves.py --seeds {m['seeds']}`, {m['when']}"
             + (f"; decided by the permutation test with `--rescore` on that run's curves, {m['rescored']}"
                if m.get("rescored") else "") + ")"]
    return "\n".join(rows)


def default_heads() -> str:
    """The shipped heads' figures, as `bertlab train-default-heads` measured them on the file it wrote
    (bertlab/assets/default_heads.json)."""
    d = json.loads((ROOT / "bertlab" / "assets" / "default_heads.json").read_text(encoding="utf-8"))
    wiki, text2 = d["mlm_wiki_held_out"], d["mlm_wikitext2_valid"]
    packed, single, everyday = d["nsp_wiki_held_out"], d["nsp_wiki_held_out_sentences"], d["nsp_everyday_pairs"]
    pairs = everyday["p_is_next"]
    right = round(everyday["accuracy"] * len(pairs))
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    rows = ["| held-out text | masked tokens | top-1 | top-5 | NSP accuracy |", "|---|---|---|---|---|",
            f"| Wikipedia (offline corpus, held-out articles) | {wiki['masked_tokens']:,} | **{pct(wiki['top1'])}** "
            f"| **{pct(wiki['top5'])}** | {pct(packed['accuracy'])} ({packed['pairs']:,} packed pairs), "
            f"{pct(single['accuracy'])} ({single['pairs']:,} one-sentence pairs) |",
            f"| WikiText-2 valid | {text2['masked_tokens']:,} | {pct(text2['top1'])} | {pct(text2['top5'])} | – |",
            f"| {len(pairs)} everyday pairs (`EVERYDAY_PAIRS`) | – | – | – | {right} of {len(pairs)} |",
            "", "| everyday pair (first half: real pairs; second half: random) | P(B follows A) |", "|---|---|"]
    rows += [f"| {pair} | {pct(prob)} |" for pair, prob in pairs.items()]
    rows += ["", "Fill-ins: " + "; ".join(f'"{k}" → {", ".join(v)}' for k, v in d["fill_ins"].items()) + ".",
             "", f"({d['total_steps']:,} steps in all; `_how` in bertlab/assets/default_heads.json gives the chain of "
             "commands)"]
    return "\n".join(rows)


def feature_table() -> str:
    from bertlab.training.finetune_defaults import START_NAMES

    d = _load("feature_table")
    choice = d["head_choice"]
    rows = [f"| features ({d['word_feature']} of each word) | head | dev F1 | precision | recall | epochs | lr "
            "| seconds | load avg at start |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        full = r["mode"] == "full"
        name = "fine-tuning (all weights learn)" if full else f"`{r['name']}` (frozen encoder)"
        head = "the model's token classifier" if full else r["head"]
        seconds = _num(r["seconds"], 0)
        if not full and r.get("features_s", 0) >= 10:  # the first row computes the word features for all
            seconds += f" (of which {_num(r['features_s'], 0)} computing the word features)"
        rows.append(f"| {name} | {head} | **{100 * r['dev_f1']:.1f}** | {100 * r['precision']:.1f} "
                    f"| {100 * r['recall']:.1f} | {r['epochs']} | {r['lr']:g} | {seconds} "
                    f"| {r['load_avg_start'][0]:.1f} |")
    mix = next((r["mix"] for r in d["rows"] if r.get("mix")), None)
    if mix:
        weights = ", ".join(f"{name} {w:.2f}" for name, w in zip(mix["layers"], mix["weights"]))
        rows += ["", f"`mix` learned these weights: {weights} (γ = {mix['gamma']:.2f})."]
    model = START_NAMES.get(d["model"], d["model"])
    sampled = "--dev" in d["command"] and "--dev 0" not in d["command"]  # a seeded part of the dev set
    dev = f" --max-eval-examples {d['dev_sentences']}" if sampled else ""
    rows += ["", f"Model: {model} (`{d['model']}`: {d['model_text']}). Entity F1 (%) on {d['dev_sentences']:,} "
             f"CoNLL-2003 dev sentences; every row fitted on the same {d['train_sentences']:,} train sentences "
             f"(seed {d['seed']}). The linear head's lr ({choice['lr']:g}) and epochs ({choice['epochs']}) were "
             f"chosen on the train subset alone: {choice['basis']}; they are the defaults of `--features`, so a row "
             f"is `bertlab finetune --task ner --mode feature --features NAME --max-train-examples "
             f"{d['train_sentences']}{dev}` and the fine-tuning row the same without `--mode` and `--features` (the "
             f"task's defaults). {d['threads']} torch thread(s) on {d['cores']} shared cores, load average "
             f"{d['load_avg_before'][0]:.1f} before and {d['load_avg_after'][0]:.1f} after; "
             f"{_num(d['seconds'] / 60, 1)} min in all, {d['when']} (`{d['command']}`)."]
    return "\n".join(rows)


def gpu() -> str:
    """The GPU check (bench/gpu_check.sh, bench/gpu_results.py): fine-tunes on a lent GPU, and the training
    benchmarks there against HF, with MFU against the GPU's bf16 peak."""
    g = _load("gpu_check_cuda")
    t = g["tests"]
    rows = [f"On one **{g['gpu']}** (torch {g['torch']}, CUDA {g['cuda']}; `bash bench/gpu_check.sh`, "
            f"{g['when'][:10]}). CUDA tests (`pytest -m cuda`): {t['passed']} passed, {t['failed']} failed, "
            f"{t['skipped']} skipped.",
            "", "| fine-tune (`bertlab finetune --device cuda`) | training examples | dev examples | steps "
            "| training time | dev figure | precision |", "|---|---|---|---|---|---|---|"]
    for key in ("finetune_sst2", "finetune_qa"):
        r = g.get(key) or {}
        if r.get("status") != "completed":
            why = r.get("error") or r.get("status")
            rows.append(f"| {key.split('_')[1]} | – | – | – | – | did not finish: {why} | – |")
            continue
        m = r["metrics"]
        fig = (f"accuracy {100 * m['accuracy']:.1f} %" if r["task"] == "sst2"
               else f"F1 {m['f1']:.1f}, EM {m['exact_match']:.1f}")
        rows.append(f"| {r['task']} | {r['train_examples']:,} | {r['eval_examples']:,} | {r['steps']:,} "
                    f"| {_duration(r['wall_time_s'])} | {fig} | {r['precision']} |")
    rows += ["", f"Start model: {g['start_model']}.", ""]
    ft = _load("finetune_cuda")
    m = ft["meta"]
    rows += [f"| fine-tuning speed ({m['task']}, one epoch of the same {m['examples']:,} sentences, "
             f"batch {m['batch']}) | precision | examples/s | padding | vs HF `Trainer` + `group_by_length` + bf16 |",
             "|---|---|---|---|---|"]
    for r in ft["rows"]:
        rows.append(f"| {r['variant']} ({r['preset']}) | {r['precision']} | {_num(r['examples_per_s'])} "
                    f"| {100 * r['padding']:.1f} % | {r['speedup_vs_hf_grouped_bf16']:.2f} |")
    rows += ["", "| pre-training (MLM) | variant | batch × seq | torch.compile | tokens/s | vs HF | MFU |",
             "|---|---|---|---|---|---|---|"]
    for name in ("pretrain_cuda", "pretrain_seq512_cuda", "pretrain_seq512_compile_cuda"):
        d = _load(name)
        for r in d["rows"]:
            rows.append(f"| {r['preset']} | {r['variant']} | {r['batch']} × {r['seq']} | "
                        f"{'yes' if d['meta']['compile'] else 'no'} | {_num(r['tokens_per_s'], 0)} "
                        f"| {r['speedup_vs_hf']:.2f} | {100 * r['mfu']:.1f} % |")
    peak = _load("pretrain_cuda")["meta"]["peak_tflops"]
    best_ft = max(r["speedup_vs_hf_grouped_bf16"] for r in ft["rows"] if r["variant"].startswith("bertlab"))
    best_mfu = max(r["mfu"] for n in ("pretrain_cuda", "pretrain_seq512_cuda", "pretrain_seq512_compile_cuda")
                   for r in _load(n)["rows"] if r["variant"].startswith("bertlab"))
    rows += ["", f"MFU against the GPU's dense bf16 peak ({peak:g} TFLOP/s), {m['gpu']}, one run each "
             f"(`bench/bench_pretrain.py --device cuda`, `bench/bench_finetune.py --device cuda`). Aims: ≥ 1.5× HF "
             f"and ≥ 45 % MFU; measured: at best {best_ft:.2f}× HF's grouped bf16 `Trainer` and "
             f"{100 * best_mfu:.1f} % MFU, so **neither aim is met** on the GPU yet."]
    if m.get("note"):
        rows += ["", f"Note: {m['note']}."]
    profiled = profile_table(_load("pretrain_cuda")["rows"])
    return "\n".join(rows + ([""] + profiled if profiled else []) + [""] + packing_on_gpu(ft))


def packing_on_gpu(ft: dict) -> list[str]:
    """Packed against padded training on the GPU (packing_cuda.json, and the check's own pair when it has one):
    the measurement behind training's padded path on a GPU (`BertModel.packing` "cpu")."""
    d = _load("packing_cuda")
    m = d["meta"]
    rows = ["| packing on the GPU | padding | sentences | packed, examples/s | padded, examples/s | packed ÷ padded |",
            "|---|---|---|---|---|---|"]
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_results import packed_padded_pairs

    pairs = []  # (row label, padding, sentences, packed examples/s, padded examples/s)
    for found, when, n, measured in (  # the full check's own pairs (before the plan), then the packing rerun's
            ("device", ft["meta"]["when"], ft["meta"]["examples"], packed_padded_pairs(ft["rows"])),
            ("host", m["when"], m["finetune"]["examples"], d["finetune"])):
        for r in measured:
            kind = "shuffled" if "shuffled" in r["packed"] else "bucketed"
            pairs.append((f"{kind}, tokens found on the {found} ({when[:16]})", r["padding"], n,
                          r["packed_examples_per_s"], r["padded_examples_per_s"]))
    for label, padding, n, packed, padded in pairs:
        rows.append(f"| fine-tuning, {label} | {100 * padding:.1f} % | {n:,} | {_num(packed)} | {_num(padded)} "
                    f"| {packed / padded:.2f} |")
    best = max(pairs, key=lambda p: p[3] / p[4])
    if best[3] < best[4]:
        verdict = (f"The packed path was slower in every pair (at best {best[3] / best[4]:.2f}× the padded path's "
                   f"speed, at {100 * best[1]:.0f} % padding). Why is not measured here; the likely causes: a packed "
                   "batch has a new number of tokens almost every step (new matrix shapes), and batches this small "
                   "leave an H100 waiting on the host, so computing the padding costs it little. Training on a GPU "
                   "therefore takes the padded path by default (`model.bert.packing = \"cpu\"`; `True` packs there "
                   "too).")
    else:
        verdict = (f"**The packed path was faster in a pair** ({best[3] / best[4]:.2f}× at {100 * best[1]:.0f} % "
                   "padding), yet training on a GPU takes the padded path by default (`model.bert.packing = \"cpu\"`): "
                   "measure again and revisit that default.")
    rows += ["", f"SST-2, BERT-base shape, batch {m['finetune']['batch']}, bf16, {m['gpu']}; each pair trains the same "
             f"sentences in the same batches, one run each, so a pair's ratio is its figure and rows of different "
             f"runs are not compared. {verdict} Pre-training's full-length batches, with the host's plan (no padding "
             "seen, so no mask and no packing) against without it (packed, tokens found on the device):", "",
             "| pre-training (MLM) | batch × seq | with the plan, ms/step | without, ms/step | vs HF, with / without "
             "| memory copies, ms/step, with / without |", "|---|---|---|---|---|---|"]
    for r in d["pretrain"]:
        mem = " / ".join("–" if x is None else _num(x, 1) for x in r["memory_ms"])
        spread = [_middle_half(x) for x in r.get("per_step_vs_hf") or (None, None)]
        rows.append(f"| {r['preset']} | {r['batch']} × {r['seq']} | {_num(r['planned_ms'])} "
                    f"| {_num(r['unplanned_ms'])} | {r['planned_vs_hf']:.2f}{spread[0]} "
                    f"/ {r['unplanned_vs_hf']:.2f}{spread[1]} | {mem} |")
    rows += ["", f"Median of {m['pretrain']['steps']} steps each (in brackets the middle half of the steps' own "
             f"ratios: where the two overlap, the difference is within the run's noise), {m['pretrain']['precision']} "
             f"(`bench/gpu_check.sh` rerun with GPU_CHECK_FT_VARIANTS, GPU_CHECK_PT_VARIANTS; `bench/gpu_results.py "
             f"--packing`; commands in bench/results/packing_cuda.json)."]
    return rows


def probes() -> str:
    """Probe accuracy per stage and property, with selectivity and the scalar mix (bench/probe_table.py)."""
    d = _load("probes")
    props = d["properties"]
    stages = next(iter(props.values()))["layers"]
    rows = ["| property | " + " | ".join(stages) + " | scalar mix | best selectivity | fit / scored |",
            "|---" * (len(stages) + 4) + "|"]
    for name, r in props.items():
        mix = r.get("mix") or {}
        if name == "tree":
            cells = [f"{a:.3f} / {b:.3f}" for a, b in zip(r["uuas"], r["spearman"])]
            mixed = f"{mix['uuas']:.3f} / {mix['spearman']:.3f}" if mix else "–"
            rows.append("| tree (UUAS / distance Spearman) | " + " | ".join(cells) + f" | {mixed} | – "
                        f"| {r['train_sentences']} / {r['eval_sentences']} sentences |")
            continue
        best = max(range(len(stages)), key=lambda i: r["selectivity"][i])
        rows.append(f"| {name} | " + " | ".join(f"{a:.3f}" for a in r["accuracy"])
                    + f" | {mix['accuracy']:.3f} | {r['selectivity'][best]:.3f} ({stages[best]}) "
                    f"| {r['train_words']:,} / {r['eval_words']:,} words |")
    rows += ["", f"Model: {d['model']} (the offline default); word = its {d['word_feature']}; {d['note']}; "
             f"{d['date']}, {d['threads']} thread. Accuracy on held-out sentences; selectivity = accuracy − the "
             "control task's (random labels per word type); scalar mix = one probe on a learned softmax-weighted sum "
             "of every stage (`python bench/probe_table.py`)."]
    return "\n".join(rows)


def rush() -> str:
    """Rush hour (bench/bench_rush.py): each run, the spread across runs, and what it says for sizing."""
    d = _load("rush")
    runs = d["runs"]
    rows = ["| run | students (browsers + light clients; light clients speak) | page ready p50 / p95 / max, s "
            "| browser page ready p50 / p95 / max, s | edit → chart p50 / p95, ms (edits redrawn) "
            "| browser edit p50 / max, ms | failures "
            "| CPU share: load generator / browsers / server / kernels | load avg before → after (1 min) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        ready, edit, share = r["page_ready_s"], r["edit_ms"], r["cpu_share"]
        browser, browser_edit = r["page_ready_browser_s"], r["edit_browser_ms"]
        rows.append(
            f"| {i} | {r['n']} ({r['browsers']} + {r['light_clients']}; "
            f"{r.get('light_client_speaks', 'json/per-widget')}) "
            f"| {_num(ready['p50'])} / {_num(ready['p95'])} / {_num(ready['max'])} "
            f"| {_num(browser['p50'])} / {_num(browser['p95'])} / {_num(browser['max'])} "
            f"| {_num(edit['p50'], 0)} / {_num(edit['p95'], 0)} ({r['edits_redrawn']} of {r['edits_sent']}) "
            f"| {_num(browser_edit['p50'], 0)} / {_num(browser_edit['max'], 0)} | {r['failures']} "
            f"| {' / '.join(f'{share.get(k, 0):.0%}' for k in ('load_generator', 'browsers', 'server', 'kernels'))} "
            f"| {_num(r['load_avg']['before'][0])} → {_num(r['load_avg']['after'][0])} |")
    sp = d["spread"]

    def mmm(name: str, digits: int = 1) -> str:
        return " / ".join(_num(sp[name][k], digits) for k in ("min", "median", "max"))

    rows += ["", f"Across {len(runs)} run(s), min / median / max: page ready p50 {mmm('page_ready_p50_s')} s, "
             f"p95 {mmm('page_ready_p95_s')} s, max {mmm('page_ready_max_s')} s; edit → chart p50 "
             f"{mmm('edit_p50_ms', 0)} ms, p95 {mmm('edit_p95_ms', 0)} ms; failures {mmm('failures', 0)}. "
             f"Students arrive evenly within {runs[0]['arrive_within_s']:.0f} s, {runs[0]['edits_per_student']} "
             f"Mask edits each ({_commands(runs, d['meta'])}, {d['meta']['cpus']} cores, shared with other "
             f"jobs: see the load averages; {d['meta']['when']})."]
    busy = statistics.median((r["cpu_s"]["server"] + r["cpu_s"]["kernels"]) / r["wall_s"] for r in runs)
    n = runs[0]["n"]
    failed = sum(r["failures"] for r in runs)
    seated = ("every student of every run was seated and had each edit redrawn" if failed == 0 else
              f"{failed} student(s) across the runs failed (see failure_details in bench/results/rush.json)")
    rows += ["", f"Sizing from these runs: {seated}. Through the rush the server and its {n} kernels kept a "
             f"median of {busy:.2f} cores busy on average (every process counted, kernels pre-heated or ended "
             f"during the rush included), {1000 * busy / n:.0f} millicores per student for this workload (page "
             "loads and Mask edits; the simulated students took their share of the same 2 cores). "
             "On Kubernetes, where each student's pod runs a whole kernel of its own (no pages shared "
             "with a warm parent), that average is a floor for a pod's CPU request, not a limit (an edit is a "
             "burst of a whole core), and its memory is an unshared kernel's (the class-load table), not a "
             "forked one's."]
    return "\n".join(rows)


def page_cost() -> str:
    """One student's page on a warm class server, by phase and by the way a client speaks
    (bench/bench_page.py)."""
    d = _load("page_cost")
    m = d["meta"]
    names = {"page": "page fetched", "states": "widget states read", "edit": "one Mask edit redrawn"}
    rows = ["| client speaks | phase | server CPU, s | kernel CPU, s | bytes read | wall, s |",
            "|---|---|---|---|---|---|"]
    for variant, phases in d["median"].items():
        for phase, f in phases.items():
            rows.append(f"| {variant} | {names[phase]} | {f['server_cpu_s']:.2f} | {f['kernels_cpu_s']:.2f} "
                        f"| {f['bytes']:,.0f} | {f['wall_s']:.2f} |")
    pages = d["pages"]
    loads = [pg["load_1min_before"] for pg in pages]
    per = {v: len([pg for pg in pages if pg["variant"] == v and not pg["errors"]]) for v in d["median"]}
    rows += ["", f"Median of {' / '.join(str(k) for k in per.values())} page(s) per variant, one at a time on an "
             f"idle {m['server']} ({m['cpus']} cores, load average {min(loads):g}–{max(loads):g} before each page; "
             f"`python bench/{m['command']}`, {m['when']}). \"page fetched\" is its HTML alone (a browser also fetches "
             "the page's scripts). `v1/control` is what the page's code does (the binary "
             "websocket subprotocol, every widget's state in one message on ipywidgets' control comm); "
             "`json/per-widget` is the JSON text with a `request_state` per widget, the widget manager's "
             "fallback when the control comm does not answer in time."]
    return "\n".join(rows)


def _commands(runs: list[dict], meta: dict) -> str:
    """The command(s) that made `runs`: one, or a first run and others appended in short jobs."""
    if not all(r.get("command") for r in runs):  # one command made them all
        return f"`python bench/{meta['command']}`"
    each = [r["command"] for r in runs]
    return ", then ".join(f"`python bench/{c}`" + (f" ×{each.count(c)}" if each.count(c) > 1 else "")
                          for c in dict.fromkeys(each))


def seat_hold() -> str:
    """Seconds a plain `GET /` holds a seat (bench/bench_seat_hold.py), per checkout measured."""
    d = _load("seat_hold")
    rows = ["| code | a plain GET / held its seat, s | load avg (1 min) before |", "|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['label']} | {_num(r['held_s'])} | {_num(r['load_avg_before'][0])} |")
    rows += ["", f"(`{d['meta']['command']}`, `bertlab serve --class 2` with its defaults, {d['meta']['cpus']} "
             f"cores, {d['meta']['when']})"]
    return "\n".join(rows)


def sizing() -> str:
    """Sizing a class on one server (kernels forked from a warm parent) and on Kubernetes (a pod per
    student), from bench/results: memory_fork_kernels.json, rush.json and jupyterhub_sizing.json."""
    mem, rush_d, hub = _load("memory_fork_kernels"), _load("rush"), _load("jupyterhub_sizing")
    big = max(mem["rows"], key=lambda r: r["seats"])
    per_seat, machine_gb = big["pss_total_per_seat_mb"], mem["meta"]["memory_gb"]
    runs = rush_d["runs"]
    n = runs[0]["n"]
    busy = statistics.median((r["cpu_s"]["server"] + r["cpu_s"]["kernels"]) / r["wall_s"] for r in runs)
    millicores = 1000 * busy / n
    pod_mb = hub["student"]["pss_mb"]

    def gb(mb: float) -> str:
        return f"{mb / 1024:,.1f} GB"

    def median_of(key: str, stat: str) -> str:
        values = [r[key][stat] for r in runs if r[key][stat] is not None]
        return _num(statistics.median(values)) if values else "–"

    failed = sum(r["failures"] for r in runs)
    rows = [
        "| | one server, `bertlab serve --class N` (forked kernels) | Kubernetes, one pod per student (JupyterHub) |",
        "|---|---|---|",
        f"| memory per student (PSS) | {_num(per_seat)} MB: its kernel and its share of the warm parent "
        f"({big['seats']} seats) | {_num(pod_mb)} MB: its own Jupyter server and kernel, nothing shared |",
        *(f"| memory for {k} students | {gb(k * per_seat)} | {gb(k * pod_mb)} |" for k in (30, 100)),
        f"| students whose idle kernels fit in half of {machine_gb:g} GB (the other half for training runs) "
        f"| {int(machine_gb * 1024 / 2 // per_seat)} | {int(machine_gb * 1024 / 2 // pod_mb)} |",
        f"| pre-heating {big['seats']} seats | {_num(big['preheat_s'])} s | each pod starts on its own |",
        f"| CPU through a rush of {n} | {busy:.2f} cores busy on average ({millicores:.0f} millicores per student) "
        f"| a pod's CPU request at least {max(1, round(millicores))}m; no limit below one core (an edit is a "
        "burst of a whole core) |",
        f"| page ready in that rush, median over runs of p50 / p95 | light clients {median_of('page_ready_s', 'p50')} "
        f"/ {median_of('page_ready_s', 'p95')} s; browsers {median_of('page_ready_browser_s', 'p50')} / "
        f"{median_of('page_ready_browser_s', 'p95')} s | – |",
        "",
        f"From `bench/results/memory_fork_kernels.json` ({mem['meta']['command']}, {mem['meta']['cpus']} cores, "
        f"{machine_gb:g} GB), `rush.json` ({len(runs)} run(s) on the same kind of machine, {failed} failed "
        f"student(s)) and `jupyterhub_sizing.json` (`{hub['command']}`). The memory does not count the server "
        "process itself, nor training runs, which the queue runs as many at once as the machine has cores. "
        "On the server the simulated students took a share of the same cores (the rush table)."
        + ("" if failed == 0 else f" The rush had {failed} failed student(s): its CPU and page-ready rows describe "
           "an overloaded machine, not the size of a server that serves every student."),
    ]
    return "\n".join(rows)


def cls_only() -> str:
    """A sentence classifier's training step with its last layer for [CLS] alone (bench/bench_cls_only.py)."""
    d = _load("cls_only")
    m = d["meta"]
    rows = ["| shape | precision | batch × padded length | every position, ms/step | [CLS] alone, ms/step | speed-up "
            "| largest logit difference (fp32) |", "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['preset']} | {r['precision']} | {r['batch']} × {r['seq']} | {_num(r['all_positions_ms'])} "
                    f"| {_num(r['cls_only_ms'])} | {r['speedup']:.2f} | {r['max_logit_diff_fp32']:.1e} |")
    load = m.get("load_avg_start", [None])[0]
    rows += ["", f"Forward + backward + AdamW, the two paths taking turns step by step, median of {m['steps']} steps "
             f"each, {m['threads']} thread, load average {load} at the start (`python bench/bench_cls_only.py`)."]
    return "\n".join(rows)


def packing() -> str:
    """Training with the real tokens packed against the padded path (bench/bench_packing.py)."""
    d = _load("packing")
    m = d["meta"]
    rows = ["| shape | precision | batch × padded length | padding | padded, ms/step | packed, ms/step | speed-up "
            "| largest logit difference |", "|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        rows.append(f"| {r['preset']} | {r['precision']} | {r['batch']} × {r['seq']} | {100 * r['padding']:.1f} % "
                    f"| {_num(r['padded_ms'])} | {_num(r['packed_ms'])} | {r['speedup']:.2f} "
                    f"| {r['max_logit_diff_fp32']:.1e} |")
    start, end = m["load_avg_start"][0], m["load_avg_end"][0]
    rows += ["", f"Forward + backward + AdamW of a sentence classifier, the two paths taking turns step by step, "
             f"median of {m['steps']} steps each, {m['threads']} thread, load average {start} at the start and {end} "
             "at the end (`python bench/bench_packing.py`). On a shared machine these ratios move from run to run."]
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "default-heads": default_heads,
    "gpu": gpu,
    "cls-only": cls_only,
    "packing": packing,
    "loss-curves": loss_curves,
    "probes": probes,
    "dashboard": dashboard,
    "pretrain": pretrain,
    "forward": forward,
    "explain": explain,
    "compress": compress,
    "fillmask": fillmask,
    "memory": memory,
    "class-store": class_store,
    "hub-sizing": hub_sizing,
    "class-service": class_service,
    "class-load": class_load,
    "rush": rush,
    "page-cost": page_cost,
    "sizing": sizing,
    "seat-hold": seat_hold,
    "finetune": finetune,
    "finetune-table": finetune_table,
    "finetune-defaults": finetune_defaults,
    "objectives": objectives,
    "replay": replay,
    "feature-table": feature_table,
    "mask-edit": mask_edit,
    "classic-panel": classic_panel,
    "install": install,
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
    parser.add_argument("--check", action="store_true", help="only say whether the docs pages are up to date")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        old = page.read_text(encoding="utf-8")
        new, changed = render(old)
        name = page.relative_to(DOCS.parent)
        if changed and args.check:
            stale.append(f"{name} ({', '.join(changed)})")
        elif changed:
            page.write_text(new, encoding="utf-8")
            print(f"{name}: rewrote {', '.join(changed)}")
    if stale:
        print(f"figures differ from bench/results in: {'; '.join(stale)} (run python bench/readme_tables.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
