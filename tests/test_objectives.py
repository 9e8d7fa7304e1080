"""The family's pre-training objectives. Data making on fixed seeds and hand-made cases
(RoBERTa packing and dynamic masks, SOP order labels, SpanBERT's boundary targets, ELECTRA's replaced
labels), a few steps lowering each loss, and each saved folder read back by bertlab and by the matching
transformers class with no missing or unexpected keys."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

import bertlab
from bertlab.tokenizer import Tokenizer
from bertlab.training.corpora import Document
from bertlab.training.loop import DataPlan, train
from bertlab.training.masking import IGNORE_INDEX, MaskKind
from bertlab.training.objectives import OBJECTIVES, ModelShape, ObjectiveError, get_objective
from bertlab.training.objectives.base import pack_full_sentences
from bertlab.training.objectives.electra import corrupt, sample_replacements
from bertlab.training.objectives.spanbert import SBO_FILE, load_sbo_head, span_targets
from bertlab.training.pairs import build_pairs
from bertlab.training.pretrain import ObjectiveRun, PretrainConfig, pretrain_objective

ANIMALS = ["cat", "dog", "horse", "bird", "fish", "cow"]
PLACES = ["mat", "sofa", "field", "tree", "river", "barn"]
SHAPE = ModelShape(layers=2, hidden=32, heads=2, max_len=64)


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory) -> Tokenizer:
    """A WordPiece vocabulary of the corpus's words (and a few more): tiny models train in a blink."""
    folder = tmp_path_factory.mktemp("vocab")
    words = ["the", "sat", "on", "was", "happy", "a", "dog", "near", *ANIMALS, *PLACES, "red", "blue", "green"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *dict.fromkeys(words)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def documents() -> list[Document]:
    rng = random.Random(0)
    docs = []
    for _ in range(30):
        sentences = []
        for _ in range(6):
            a, p = rng.choice(ANIMALS), rng.choice(PLACES)
            sentences += [f"The {a} sat on the {p}.", f"The {a} was happy on the {p}."]
        docs.append(Document(sentences))
    return docs


# -- data making -----------------------------------------------------------------------------
def test_full_sentence_packing_runs_across_documents_after_one_separator():
    sep = 99
    docs = [[[1, 2], [3, 4, 5]], [[6, 7]], [[8, 9, 10, 11, 12, 13, 14]]]
    assert pack_full_sentences(docs, 8, sep) == [[1, 2, 3, 4, 5, sep, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    assert pack_full_sentences(docs, 5, sep) == [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12], [13, 14]]
    # a piece never starts or ends on the separator; without crossing, each document closes its piece
    assert pack_full_sentences(docs, 8, sep, cross_documents=False) == [[1, 2, 3, 4, 5], [6, 7],
                                                                         [8, 9, 10, 11, 12, 13, 14]]


def test_roberta_examples_are_single_segments_and_masks_change_every_epoch(tok, documents):
    roberta = get_objective("roberta")
    examples = roberta.examples(documents, tok, 64, 0)
    assert all(len(e["input_ids"]) <= 64 and e["input_ids"][0] == tok.cls_token_id for e in examples)
    body = [t for e in examples for t in e["input_ids"][1:-1]]
    assert body.count(tok.sep_token_id) >= 1  # document boundaries inside pieces
    collate = roberta.collate(tok, 0)
    plan = DataPlan(len(examples), 4, 1, 1, seed=0, shuffle=True)
    batch = examples[:4]
    first = collate(batch, generator=plan.collate_generator(0, 0, 0, 0))
    again = collate(batch, generator=plan.collate_generator(0, 0, 0, 0))
    later = collate(batch, generator=plan.collate_generator(1, 0, 0, 0))
    assert torch.equal(first.labels, again.labels)  # fixed by the position in the run: resumable
    assert not torch.equal(first.labels, later.labels)  # dynamic: a new mask the next time round
    assert first.next_sentence_label is None and int(first.token_type_ids.max()) == 0


def test_sop_labels_say_whether_the_segments_were_swapped(tok):
    # sentences of distinct ids, so each token's place in its document is known
    docs = [[[100 + 10 * d + s, 101 + 10 * d + s] for s in range(0, 8, 2)] for d in range(6)]
    place = {t: (d, i) for d, doc in enumerate(docs) for i, s in enumerate(doc) for t in s}
    pairs = build_pairs(docs, tok, task="sop", max_seq_length=64, seed=3)
    assert {p.label for p in pairs} == {0, 1}
    for p in pairs:
        a = p.input_ids[1 : 1 + p.num_a]
        b = p.input_ids[2 + p.num_a : -1]
        assert {place[t][0] for t in a + b} == {p.doc_index}  # SOP never leaves the document
        in_order = max(place[t][1] for t in a) < min(place[t][1] for t in b)
        assert in_order == (p.label == 0)


def test_span_targets_on_hand_made_spans():
    unit_ids = torch.tensor([[-1, 0, 0, 0, -1, 1, -1, -1],
                             [-1, -1, 0, -1, 1, 1, -1, -1]])
    t = span_targets(unit_ids)
    assert t.row.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert t.position.tolist() == [1, 2, 3, 5, 2, 4, 5]
    assert t.left.tolist() == [0, 0, 0, 4, 1, 3, 3]
    assert t.right.tolist() == [4, 4, 4, 6, 3, 6, 6]
    assert t.relative.tolist() == [0, 1, 2, 0, 0, 0, 1]


def test_spanbert_masks_whole_word_spans_whose_boundaries_are_visible(tok, documents):
    spanbert = get_objective("spanbert")
    examples = spanbert.examples(documents, tok, 64, 0)[:8]
    batch = spanbert.collate(tok, 0)(examples, generator=torch.Generator().manual_seed(5))
    chosen = batch.labels != IGNORE_INDEX
    t = span_targets(batch.unit_ids)
    assert not chosen[t.row, t.left].any() and not chosen[t.row, t.right].any()  # boundaries are never masked
    real = batch.attention_mask.sum(1) - 2
    assert ((chosen.sum(1) - 0.15 * real).abs() <= 1).all()  # the 15 % budget
    # SpanBERT's 80/10/10 is per span: every token of a span got the same treatment
    for row, span in {(int(r), int(u)) for r, u in zip(t.row, batch.unit_ids[t.row, t.position])}:
        kinds = batch.kind[row][batch.unit_ids[row] == span]
        assert len(set(kinds.tolist())) == 1 and int(kinds[0]) != MaskKind.NOT_CHOSEN


def test_modernbert_masks_30_percent_of_single_segments(tok, documents):
    modernbert = get_objective("modernbert")
    batch = modernbert.collate(tok, 0)(modernbert.examples(documents, tok, 64, 0)[:8],
                                       generator=torch.Generator().manual_seed(0))
    real = batch.attention_mask.sum(1) - 2  # [CLS] and [SEP] are never chosen
    assert ((batch.labels != IGNORE_INDEX).sum(1) - 0.30 * real).abs().max() <= 1  # ModernBERT's rate
    assert not batch.token_type_ids.any()  # one segment, no sentence-pair task


def test_electra_labels_mark_exactly_the_sampled_tokens_that_differ():
    original = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    picked = torch.tensor([[0, 1, 0, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    logits = torch.full((4, 12), -30.0)
    logits[0, 3], logits[1, 7], logits[2, 10], logits[3, 9] = 30.0, 30.0, 30.0, 30.0  # 2nd and 4th = original
    sampled = sample_replacements(logits, torch.Generator().manual_seed(0))
    assert sampled.tolist() == [3, 7, 10, 9]
    ids, replaced = corrupt(original, picked, sampled)
    assert ids.tolist() == [[1, 3, 6, 7, 2], [1, 10, 9, 2, 0]]
    assert replaced.tolist() == [[False, True, False, False, False], [False, True, False, False, False]]
    assert torch.equal(replaced, ids != original)
    # sampled from the softmax: a flat distribution gives different tokens for different seeds
    flat = sample_replacements(torch.zeros(64, 1000), torch.Generator().manual_seed(1))
    assert len(set(flat.tolist())) > 40


def test_electra_masks_with_the_mask_token_or_keeps_never_a_random_token(tok, documents):
    electra = get_objective("electra")
    batch = electra.collate(tok, 0)(electra.examples(documents, tok, 64, 0)[:8],
                                    generator=torch.Generator().manual_seed(0))
    kinds = batch.kind[batch.labels != IGNORE_INDEX]
    assert (kinds != MaskKind.RANDOM).all() and (kinds == MaskKind.MASK).any()


# -- training and saving -----------------------------------------------------------------------
TRANSFORMERS_OUT = {  # objective -> (transformers output field, the bertlab output it equals)
    "bert": ("prediction_logits", "mlm_logits"), "roberta": ("logits", "mlm_logits"),
    "albert": ("prediction_logits", "mlm_logits"), "electra": ("logits", "rtd_logits"),
    "spanbert": ("logits", "mlm_logits"), "modernbert": ("logits", "mlm_logits"),
    "deberta-v3": ("last_hidden_state", "last_hidden_state"), "causal": ("logits", "mlm_logits"),
    "peek": ("logits", "mlm_logits"), "elmo": ("logits", "mlm_logits"),
}
UNREAD = {"deberta-v3": "mask_predictions."}  # a head transformers' class leaves unread (it has no class for it)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_each_objective_learns_and_its_folder_loads_in_bertlab_and_transformers(name, small_tok, documents, tmp_path,
                                                                                 one_thread):
    import transformers

    transformers.utils.logging.set_verbosity_error()
    objective = get_objective(name)
    cfg = PretrainConfig(objective=name, size="tiny", steps=24, seq_len=32, batch_size=8, lr=3e-3, log_every=4,
                         device="cpu", seed=1)
    module = objective.build(dataclasses.replace(SHAPE, shared_layers=name == "albert"), small_tok)
    examples = objective.examples(documents, small_tok, cfg.seq_len, cfg.seed)
    result = train(module, objective.loss, examples, cfg.train_config(), collate=objective.collate(small_tok, cfg.seed))
    losses = [h[objective.own_loss] for h in result.history if h["kind"] == "train"]
    assert result.status == "completed" and losses[-1] < losses[0], losses

    run = ObjectiveRun(objective, module.eval(), small_tok, result, cfg)
    folder = run.save(tmp_path / name)
    assert json.loads((folder / "pretraining_objective.json").read_text())["objective"] == name
    hf, info = getattr(transformers, objective.hf_class).from_pretrained(folder, output_loading_info=True)
    if name in UNREAD:
        assert info["unexpected_keys"] and all(k.startswith(UNREAD[name]) for k in info["unexpected_keys"]), info
        info["unexpected_keys"] = []
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    ours, _ = bertlab.load(folder)
    enc = small_tok.encode_batch([f"the cat sat on the {small_tok.mask_token}.", "a dog was happy."])
    hf_field, our_field = TRANSFORMERS_OUT[name]
    with torch.no_grad():
        ref = getattr(hf.eval()(input_ids=enc.input_ids, attention_mask=enc.attention_mask), hf_field)
        got = getattr(ours(enc.input_ids, None, enc.attention_mask), our_field)
        trained = getattr(run.kept(enc.input_ids, None, enc.attention_mask), our_field)
    assert (got - ref).abs().max() < 1e-4 and (got - trained).abs().max() < 1e-4
    if name == "electra":  # the generator beside it, and the discriminator's own loss learned
        gen, info = transformers.ElectraForMaskedLM.from_pretrained(folder / "generator", output_loading_info=True)
        assert not any(info.values()), info
        assert gen.config.hidden_size == max(16, SHAPE.hidden // 4) < hf.config.hidden_size
    if name == "spanbert":  # the SBO head in its own file, read back into the same numbers
        again = load_sbo_head(folder, ours)
        assert (folder / SBO_FILE).is_file()
        for k, v in module.sbo.state_dict().items():
            assert torch.equal(again.sbo.state_dict()[k], v)
    if name == "albert":
        assert ours.config.num_hidden_groups == 1 and ours.config.embedding_size == 16
    if name == "deberta-v3":  # the detector learned; GDES: the generator's table plus the discriminator's own part
        assert ours.has_rtd and not ours.family.has_segments
        gen, info = transformers.DebertaV2ForMaskedLM.from_pretrained(folder / "generator", output_loading_info=True)
        assert not any(info.values()), info
        assert gen.config.num_hidden_layers == max(1, SHAPE.layers // 2)
        delta = module.discriminator.deberta.embeddings.word_embeddings.delta
        assert float(delta.detach().abs().max()) > 0
        torch.testing.assert_close(ours.deberta.embeddings.word_embeddings.weight,
                                   gen.deberta.embeddings.word_embeddings.weight + delta.detach(), atol=1e-6, rtol=0)


def test_deberta_v3_embedding_sharing_is_gradient_disentangled(small_tok):
    """GDES: the detector's loss reaches only the discriminator's E_Δ; the generator's MLM loss reaches E_G."""
    pair = get_objective("deberta-v3").build(SHAPE, small_tok)
    ids = torch.tensor([small_tok.encode("the cat sat on the mat").ids])
    table = pair.generator.deberta.embeddings.word_embeddings.weight
    delta = pair.discriminator.deberta.embeddings.word_embeddings.delta
    pair.discriminator(ids).rtd_logits.sum().backward()
    assert table.grad is None and delta.grad is not None and float(delta.grad.abs().max()) > 0
    pair.zero_grad()
    pair.generator(ids).mlm_logits.sum().backward()
    assert table.grad is not None and float(table.grad.abs().max()) > 0 and delta.grad is None
    assert sum(p.numel() for p in pair.parameters()) == sum(p.numel() for p in pair.generator.parameters()) + sum(
        p.numel() for p in pair.discriminator.parameters())  # E_G counted once: the generator owns it


def test_size_options_belong_to_their_objectives():
    with pytest.raises(ObjectiveError, match="size option of albert"):
        PretrainConfig(objective="roberta", shared_layers=True)
    with pytest.raises(ObjectiveError, match="between 8 and the hidden size"):
        PretrainConfig(objective="albert", size="tiny", embedding_size=512)
    with pytest.raises(ObjectiveError, match="not one of"):
        get_objective("xlnet")
    shape = PretrainConfig(objective="albert", size="mini", shared_layers=False, embedding_size=64).shape()
    assert (shape.layers, shape.embedding_size, shape.shared_layers) == (4, 64, False)


def test_the_pretrain_command_runs_an_objective_and_keeps_its_model(tmp_path, documents, capsys, one_thread):
    from bertlab.cli import main

    corpus = tmp_path / "animals.txt"
    corpus.write_text("\n\n".join(" ".join(d.sentences) for d in documents) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["pretrain", "--objective", "albert", "--no-shared-layers", "--embedding-size", "32", "--corpus",
                 str(corpus), "--size", "tiny", "--steps", "2", "--batch-size", "4", "--seq-len", "32",
                 "--out", str(out), "--device", "cpu"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["model"] == str(out / "final")
    model, _ = bertlab.load(out / "final")
    assert model.config.model_type == "albert" and model.config.num_hidden_groups == 2
    assert model.config.embedding_size == 32 and model.has_nsp

    # options of another objective: one line, no traceback
    assert main(["pretrain", "--objective", "roberta", "--pair-task", "sop", "--corpus", str(corpus),
                 "--out", str(tmp_path / "r2")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertlab pretrain: --pair-task cannot be combined")


def test_pretrain_objective_runs_on_the_loop_with_held_out_figures(small_tok, documents, one_thread):
    cfg = PretrainConfig(objective="spanbert", size="tiny", steps=2, seq_len=32, batch_size=4, device="cpu")
    run = pretrain_objective(cfg, tokenizer=small_tok, documents=documents[:20], eval_documents=documents[20:])
    assert run.result.status == "completed" and set(run.result.eval_metrics) == {"mlm_top1", "mlm_top5"}
    assert run.kept.config.pretraining_heads == ("mlm",) and not run.kept.training


# -- item 5: every CLI error is one line (missing paths: refused while parsing, tests/test_cli.py) ----
@pytest.mark.parametrize("argv, says", [
    (["pretrain", "--objective", "bert", "--embedding-size", "64"], "size option of albert and electra"),
    (["pretrain", "--objective", "albert", "--size", "tiny", "--embedding-size", "4096"], "between 8 and the hidden"),
    (["pretrain", "--objective", "roberta", "--shared-layers"], "size option of albert, not of roberta"),
    (["pretrain", "--objective", "spanbert", "--masking", "token"], "--masking cannot be combined"),
    (["pretrain", "--corpus", "{tmp}/missing.txt"], "neither a corpus name"),
    (["pretrain", "--objective", "electra", "--model", "{model}"], "from scratch"),
])
def test_bad_input_ends_in_one_line(argv, says, tmp_path, small_tok, capsys):
    from bertlab.cli import main

    bert = get_objective("bert")
    bert.save(bert.build(SHAPE, small_tok), small_tok, tmp_path / "bert")  # a BERT made here, on disk
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n", encoding="utf-8")
    argv = [a.format(tmp=tmp_path, model=tmp_path / "bert") for a in argv]
    if argv[0] == "pretrain":
        argv += ["--out", str(tmp_path / "run"), "--device", "cpu"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bertlab {argv[0]}: ") and says in err[0], err


# -- the linear probe of frozen features (compare.linear_probe / sst2_probe) -------------------
def test_the_linear_probe_separates_separable_features_and_not_shuffled_labels():
    from bertlab.training.objectives.compare import linear_probe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 16, generator=g)
    y = (x[:, 3] - 0.5 * x[:, 7] > 0).long()  # a linear rule: a probe fitted to convergence gets it all
    x[:, 3] += torch.where(y == 1, 0.2, -0.2)  # a margin, so held-out points are separable too
    fit = linear_probe(x[:400], y[:400], x[400:], y[400:])
    assert fit["accuracy"] == 1.0 and fit["train_accuracy"] == 1.0
    assert linear_probe(x[:400], y[:400], x[400:], y[400:]) == fit  # deterministic: L-BFGS from zero
    shuffled = y[torch.randperm(600, generator=g)]  # the same features, labels unrelated to them
    chance = linear_probe(x[:400], shuffled[:400], x[400:], shuffled[400:])
    assert 0.35 < chance["accuracy"] < 0.65, chance
    with pytest.raises(ObjectiveError):
        linear_probe(x[:0], y[:0], x, y)


def test_the_probe_reads_each_text_in_order_and_the_compare_row_carries_it(small_tok, tmp_path, one_thread):
    from bertlab.tasks import ClassificationExample
    from bertlab.training.objectives.compare import mean_pooled_features, sst2_probe, untrained_like
    from bertlab.viz.objectives import scores_html

    objective = get_objective("albert")
    torch.manual_seed(1)  # not untrained_like's seed: its floor must differ from this model
    module = objective.build(dataclasses.replace(SHAPE, shared_layers=True), small_tok).eval()
    folder = objective.save(module, small_tok, tmp_path / "albert")
    model, _ = bertlab.load(folder)
    texts = ["the cat sat on the mat .", "a dog", "the red fish was happy near the river ."]
    together = mean_pooled_features(model, small_tok, texts, batch_size=2)  # sorted by length inside
    alone = torch.cat([mean_pooled_features(model, small_tok, [t]) for t in texts])
    assert together.shape == (3, SHAPE.hidden) and torch.allclose(together, alone, atol=1e-5)

    words = {1: ["happy", "green", "blue"], 0: ["sat", "red", "near"]}  # the label is in one word
    examples = [ClassificationExample(str(i), f"the {a} {w} on the {p}", None, label)
                for i, (label, a, p) in enumerate((i % 2, ANIMALS[i % 6], PLACES[i // 6 % 6]) for i in range(72))
                for w in [words[label][i % 3]]]
    probe = sst2_probe(folder, examples[:48], examples[48:])
    assert probe["accuracy"] >= 0.9 and probe["train_examples"] == 48 and probe["dev_examples"] == 24, probe
    floor, again = untrained_like(model), untrained_like(model)
    weights = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    assert type(floor) is type(model) and floor.state_dict().keys() == model.state_dict().keys()
    assert all(floor.state_dict()[k].shape == v.shape for k, v in weights.items())
    matrices = [k for k, v in weights.items() if v.dim() == 2]
    assert matrices and not any(torch.equal(floor.state_dict()[k], weights[k]) for k in matrices)  # fresh
    assert all(torch.equal(floor.state_dict()[k], again.state_dict()[k]) for k in weights)  # seeded
    html = scores_html([{"run": "mini ALBERT", "objective": "albert", "steps": 4, "accuracy": 0.5,
                         "probe": probe["accuracy"]}])
    assert "linear probe" in html and f"{100 * probe['accuracy']:.1f} %" in html
