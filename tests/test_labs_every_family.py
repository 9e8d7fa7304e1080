"""Every lab takes every family member: for each architecture (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA,
ModernBERT, DeBERTa-v3; SpanBERT is a BERT), a tiny random checkpoint written by transformers (its tokenizer
trained here by `tokenizers`) is loaded as the picker loads it, the Fine-tuning tab's Start is pressed in full,
adapter and feature modes, and the Compression tab's in int8, prune and distil, on a handful of sentences; each
result is then used in "Use it". The panels are driven through their widgets and joined with `job.wait()`."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from tiny_models import byte_level_bpe, deberta_hub_folder, family_folder

from bertlab.loading import load
from bertlab.panels.compress import CompressPanel
from bertlab.panels.finetune import FinetunePanel
from bertlab.panels.use import UsePanel
from bertlab.tasks import get_task
from bertlab.training.finetune import FinetuneConfig, finetune, with_task_head
from bertlab.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")

ARCHS = ["bert", "roberta", "albert", "distilbert", "electra", "modernbert", "deberta-v3"]
WORDS = {1: ["good", "fun", "great"], 0: ["bad", "dull", "awful"]}


def _transformers():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def modernbert_folder(root: Path) -> Path:
    """A tiny random ModernBertForMaskedLM with a byte-level BPE tokenizer of BERT's special tokens."""
    T = _transformers()
    hf, _ = byte_level_bpe()
    tok = T.PreTrainedTokenizerFast(tokenizer_object=hf.backend_tokenizer, cls_token="<s>", sep_token="</s>",
                                    pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
                                    model_input_names=["input_ids", "attention_mask"])
    cfg = T.ModernBertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=48, max_position_embeddings=96, local_attention=16,
                             global_attn_every_n_layers=2, pad_token_id=tok.pad_token_id,
                             cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                             bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    torch.manual_seed(0)
    folder = root / "modernbert"
    T.ModernBertForMaskedLM(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def checkpoint(root: Path, arch: str) -> Path:
    """The tiny `arch` checkpoint's folder (written once per module)."""
    if arch == "modernbert":
        return modernbert_folder(root)
    if arch == "deberta-v3":
        pytest.importorskip("sentencepiece")
        return deberta_hub_folder(root / "deberta-v3")
    member = {"bert": "bert", "roberta": "roberta", "albert": "albert", "distilbert": "distilbert",
              "electra": "electra"}[arch]
    return family_folder(root, member)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {arch: checkpoint(root, arch) for arch in ARCHS}


def write_sst2(folder: Path, train: int = 16, dev: int = 8) -> Path:
    """A handful of SST-2 rows (train.tsv, dev.tsv) made of words every tiny tokenizer knows."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, first in (("train.tsv", train, 100), ("dev.tsv", dev, 500)):
        rows = ["sentence\tlabel"]
        for i in range(n):  # a number of its own: no row is a phrase of another (which would pool the parts)
            label = i % 2
            rows.append(f"the quick brown fox was {rng.choice(WORDS[label])} on day {first + i}\t{label}")
        (folder / name).write_text("\n".join(rows) + "\n")
    return folder


def errors(panel) -> str:
    return " ".join(text for level, text in panel.messages if level == "error")


def use_it(model, tok) -> None:
    """The model in "Use it": the sentiment view draws two class probabilities that sum to 1, no error."""
    use = UsePanel(model, tok)
    use.show_model(model, tok, "made here")
    use.sentence.value = "the quick brown fox was good"
    assert not errors(use), use.messages
    bars = use.probs_box.children[0].data[0]
    assert len(bars.x) == 2 and sum(bars.x) == pytest.approx(1, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# The bug that kept six of seven architectures out of the Fine-tuning tab
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_finetune_takes_a_model_object_of_any_family(folders, tmp_path, arch):
    model, tok = load(str(folders[arch]))
    data = write_sst2(tmp_path / "sst2")
    cfg = FinetuneConfig(task="sst2", model=model, data=str(data), epochs=1, batch_size=8, max_length=32,
                         eval_every=0, device="cpu", precision="fp32", out_dir=str(tmp_path / "run"))
    result = finetune(cfg, tokenizer=tok)
    result.train.raise_for_status()
    assert result.train.step == 2 and cfg.to_dict()["model"] == model.describe()


# ---------------------------------------------------------------------------------------------
# Fine-tuning tab: Start in every mode, then "Use it"
# ---------------------------------------------------------------------------------------------
def finetune_panel(model, tok, ws: Workspace, mode: str, made: list) -> FinetunePanel:
    panel = FinetunePanel(model, tok, device="cpu", workspace=ws)
    panel.model_made = lambda name, m, t: made.append((name, m, t))
    panel.path.value = str(write_sst2(ws.uploads / "sst2"))
    panel.mode.value = mode
    panel.max_train.value, panel.max_dev.value, panel.epochs.value = 16, 8, 1
    panel.batch.value, panel.max_length.value = 8, 32
    return panel


MODES = [pytest.param("full"), pytest.param("adapter", marks=pytest.mark.slow),
         pytest.param("feature", marks=pytest.mark.slow)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_finetuning_tab_start_and_use_it(folders, tmp_path, arch, mode):
    model, tok = load(str(folders[arch]))
    made: list = []
    panel = finetune_panel(model, tok, Workspace(tmp_path / "ws"), mode, made)
    panel.start_button.click()
    assert not errors(panel), panel.messages
    assert panel.job.wait(120)
    assert not errors(panel), panel.messages
    run = panel.runs[-1]
    assert run.status == "completed" and run.step == run.total_steps == 2, (run.status, run.step)
    name, trained, tok2 = made[-1]
    assert name.startswith(f"sst2 · {mode}") and tok2 is tok
    assert panel.use.model is trained and panel.use.kind == "sst2"  # the tab's own "Use it" shows it
    panel.use.sentence.value = "the quick brown fox was fun"
    bars = panel.use.probs_box.children[0].data[0]
    assert sum(bars.x) == pytest.approx(1, abs=1e-3) and not errors(panel.use)
    reloaded, tok3 = load(run.out_dir)
    use_it(reloaded, tok3)


# ---------------------------------------------------------------------------------------------
# Compression tab: int8, prune, distil, then "Use it"
# ---------------------------------------------------------------------------------------------
def classifier(folder: Path):
    """The tiny checkpoint with a fresh SST-2 head (what a fine-tuned model in the picker has)."""
    model, tok = load(str(folder))
    torch.manual_seed(0)
    return with_task_head(model, get_task("sst2")).eval(), tok


COMPRESS = [pytest.param("quantize"), pytest.param("prune", marks=pytest.mark.slow),
            pytest.param("distill", marks=pytest.mark.slow)]


@pytest.mark.parametrize("method", COMPRESS)
@pytest.mark.parametrize("arch", ARCHS)
def test_compression_tab_start_and_use_it(folders, tmp_path, arch, method):
    model, tok = classifier(folders[arch])
    ws = Workspace(tmp_path / "ws")
    made: list = []
    panel = CompressPanel(model, tok, workspace=ws, latency_reps=1)
    panel.model_made = lambda name, m, t: made.append((name, m, t))
    panel.path.value = str(write_sst2(ws.uploads / "sst2"))
    panel.max_train.value, panel.max_dev.value = 16, 8
    panel.method.value = method
    panel.layers.value, panel.epochs.value = 1, 1
    if arch == "albert" and method == "prune":  # one layer shared across depth: refused with a message
        panel.start_button.click()
        assert panel.job.wait(60) and "cannot be pruned" in errors(panel), panel.messages
        return
    panel.start_button.click()
    assert panel.job.wait(120)
    assert not errors(panel), panel.messages
    made_as = {"quantize": "int8", "prune": "pruned", "distill": "distilled"}[method]
    peer = ["int8 (onnxruntime)"] if method == "quantize" and importlib.util.find_spec("onnxruntime") else []
    assert [v["method"] for v in panel.variants] == ["original", made_as, *peer], panel.messages
    if peer:  # ONNX Runtime ran the exported int8 model of this family, scored on the same dev examples
        assert panel.variants[2]["score"] is not None and panel.variants[2]["latency_ms_b1"] > 0
    name, small, tok2 = made[-1]
    assert tok2 is tok and all(v["score"] is not None for v in panel.variants)
    use_it(small, tok)
    reloaded, tok3 = load(panel.variants[1]["folder"])
    use_it(reloaded, tok3)
