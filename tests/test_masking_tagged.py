"""Entity (ERNIE) and noun-phrase masking: CoNLL-2003 text read with its tags, mentions carried through the
pairs to the collator, whole mentions masked, the 15 % budget kept, and untagged text refused in words."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.training.corpora import iob_spans, load_conll2003, load_corpus
from bertlab.training.masking import (
    MENTION_B,
    MENTION_I,
    MENTION_O,
    STRATEGIES,
    MaskingConfig,
    MaskingError,
    MaskKind,
    MLMCollator,
    mask_tokens,
)
from bertlab.training.pairs import build_pairs, mention_codes
from bertlab.training.pretrain import PretrainConfig, pretrain, require_tags
from bertlab.training.preview import mask_every_strategy, mask_example, spans_of_phrases

pytestmark = pytest.mark.usefixtures("one_thread")

SHARED_CONLL = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003" / "train.txt"
STORY = """\
EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

{city} NNP B-NP B-LOC
1996-08-22 CD I-NP O

The DT B-NP O
European NNP I-NP B-ORG
Commission NNP I-NP I-ORG
said VBD B-VP O
on IN B-PP O
Thursday NNP B-NP O
it PRP B-NP O
disagreed VBD B-VP O
with IN B-PP O
German JJ B-NP B-MISC
advice NN I-NP O
to TO B-PP O
consumers NNS B-NP O
to TO B-VP O
shun VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
until IN B-SBAR O
scientists NNS B-NP O
determine VBP B-VP O
whether IN B-SBAR O
mad JJ B-NP O
cow NN I-NP O
disease NN I-NP O
can MD B-VP O
be VB I-VP O
transmitted VBN I-VP O
to TO B-PP O
sheep NN B-NP O
. . O O

"""
CITIES = ["BRUSSELS", "LONDON", "PARIS", "BONN", "ROME", "MADRID"]


@pytest.fixture(scope="module")
def conll_file(tmp_path_factory) -> Path:
    """Six short Reuters-like stories in CoNLL-2003 layout, no -DOCSTART- lines (as the shared train.txt)."""
    path = tmp_path_factory.mktemp("conll") / "train.txt"
    path.write_text("".join(STORY.format(city=c) for c in CITIES), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(default_model):
    return default_model[1]


def _codes_are_whole(chosen: list[bool], codes: list[int]) -> None:
    """Every mention (a B then its I's) is chosen whole or not at all."""
    start = None
    for i, c in enumerate([*codes, MENTION_O]):
        if c != MENTION_I and start is not None:
            assert len(set(chosen[start:i])) == 1, (start, i, chosen[start:i])
            start = None
        if c == MENTION_B:
            start = i


# -- reading the tags -----------------------------------------------------------------------------
def test_conll_file_reads_as_stories_with_entity_and_phrase_spans(conll_file):
    docs = load_corpus(conll_file, split="all")
    assert len(docs) == len(CITIES)  # cut at the datelines, headline and byline with their story
    first = docs[0]
    assert first.sentences[0] == "EU rejects German call to boycott British lamb ."
    assert first.tagged == ("entity", "phrase")
    s = first.sentences[3]
    assert [s[a:b] for a, b, _ in first.spans["entity"][3]] == ["European Commission", "German", "British"]
    head = first.sentences[0]
    assert [head[a:b] for a, b, _ in first.spans["phrase"][0]] == ["EU", "German call", "British lamb"]
    assert all(label == "NP" for sent in first.spans["phrase"] for _, _, label in sent)


def test_iob_spans_follow_conlleval():
    words = ["a", "b", "c", "d", "e"]
    assert iob_spans(words, ["B-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [(0, 3, "PER"), (6, 7, "LOC"),
                                                                           (8, 9, "LOC")]


def test_a_file_that_is_not_conll_is_said_so(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("EU NNP B-NP B-ORG\nrejects VBZ\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: expected `word POS chunk NER`"):
        load_conll2003(bad)


def test_mention_codes_mark_every_piece_of_a_mention():
    # "John McNamara went home"
    spans = [(0, 13, "PER")]
    offsets = [(0, 4), (5, 7), (7, 10), (10, 13), (14, 18), (19, 23)]  # john mc ##nam ##ara went home
    assert mention_codes(offsets, spans) == [MENTION_B, MENTION_I, MENTION_I, MENTION_I, MENTION_O, MENTION_O]
    # two adjacent mentions stay two
    assert mention_codes([(0, 4), (5, 8)], [(0, 4, "X"), (5, 8, "X")]) == [MENTION_B, MENTION_B]


# -- masking ----------------------------------------------------------------------------------------
def test_entity_masking_masks_whole_mentions_first_and_keeps_the_budget():
    g = torch.Generator().manual_seed(0)
    rows, seq = 400, 64
    ids = torch.randint(1000, 30000, (rows, seq), generator=g)
    special = torch.zeros(rows, seq, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    word_starts = torch.rand(rows, seq, generator=g) < 0.7
    # mentions of 1-4 tokens at random places, about 10 % of the tokens (fewer than the 15 % budget)
    mentions = torch.zeros(rows, seq, dtype=torch.long)
    for r in range(rows):
        pos = 1
        while pos < seq - 6:
            pos += int(torch.randint(4, 30, (1,), generator=g))
            n = int(torch.randint(1, 5, (1,), generator=g))
            if pos + n < seq - 1:
                mentions[r, pos] = MENTION_B
                mentions[r, pos + 1 : pos + n] = MENTION_I
                word_starts[r, pos + n] = True  # a word starts after a mention
            pos += n
    out = mask_tokens(ids, special, 30522, 103, torch.Generator().manual_seed(1), strategy="entity",
                      word_starts=word_starts, mentions=mentions)
    chosen = out.chosen
    budget = round(0.15 * (seq - 2))
    assert (chosen.sum(1) <= budget).all() and chosen.sum(1).float().mean() > budget - 0.5
    for r in range(rows):
        _codes_are_whole(chosen[r].tolist(), mentions[r].tolist())
    # mentions come first: in a row whose mentions fit the budget, every mention is chosen
    in_mention = mentions != MENTION_O
    fits = in_mention.sum(1) <= budget
    assert int(fits.sum()) > rows // 4
    assert bool(chosen[fits][in_mention[fits]].all())
    # the 80/10/10 rule as for the other strategies
    n = int(chosen.sum())
    assert abs(int((out.kind == MaskKind.MASK).sum()) / n - 0.8) < 0.03


def test_tagged_strategies_without_mentions_are_refused_in_words():
    ids = torch.tensor([[101, 2000, 2001, 102]])
    for strategy in ("entity", "phrase"):
        with pytest.raises(MaskingError, match=f"{strategy} masking hides whole .* needs text tagged"):
            mask_tokens(ids, ids > 2100, 30522, 103, torch.Generator(), strategy=strategy,
                        word_starts=torch.ones_like(ids, dtype=torch.bool))


@pytest.mark.parametrize("strategy", ["entity", "phrase"])
def test_the_collator_masks_whole_mentions_from_the_corpus_at_15_percent(conll_file, tok, strategy):
    pairs = build_pairs(load_corpus(conll_file, split="all"), tok, max_seq_length=64, seed=0)
    assert pairs and all(p.mentions and len(p.mentions[strategy]) == len(p) for p in pairs)
    batch = MLMCollator(tok, MaskingConfig(strategy=strategy), seed=0)(pairs, torch.Generator().manual_seed(2))
    eligible = int(batch.attention_mask.sum()) - 3 * len(pairs)
    rate = int((batch.kind != MaskKind.NOT_CHOSEN).sum()) / eligible
    assert 0.13 < rate < 0.16
    picked = []
    for row, p in enumerate(pairs):
        chosen = (batch.kind[row, : len(p)] != MaskKind.NOT_CHOSEN).tolist()
        _codes_are_whole(chosen, p.mentions[strategy])
        picked += [c for c, m in zip(chosen, p.mentions[strategy]) if m != MENTION_O]
    assert sum(picked) / len(picked) > 0.2  # mentions are what gets hidden: more than 15 % of their tokens


def test_an_untagged_corpus_gets_a_clear_error(tmp_path, tok):
    plain = tmp_path / "plain.txt"
    plain.write_text("The cat sat. The dog ran.\n\nA bird sang. A fish swam.\n", encoding="utf-8")
    docs = load_corpus(plain, split="all")
    with pytest.raises(MaskingError, match="entity masking .*plain.txt is plain text.*conll2003"):
        require_tags(docs, "entity", str(plain))
    with pytest.raises(MaskingError, match="phrase masking"):
        pretrain(PretrainConfig(size="tiny", steps=1, masking="phrase", device="cpu"), tokenizer=tok, documents=docs)
    pairs = build_pairs(docs, tok, max_seq_length=32, seed=0)
    with pytest.raises(MaskingError, match="needs text tagged"):
        MLMCollator(tok, MaskingConfig(strategy="entity"))(pairs)


def test_the_preview_draws_all_five_on_one_tagged_sentence(tok):
    text = "The Eiffel Tower is in Paris, France."
    spans = {"entity": spans_of_phrases(text, [("Eiffel Tower", "LOC"), ("Paris", "LOC"), ("France", "LOC")]),
             "phrase": spans_of_phrases(text, [("The Eiffel Tower", "NP"), ("Paris", "NP"), ("France", "NP")])}
    by = mask_every_strategy(tok, text, 0.6, 0, spans=spans)  # a budget of 7: the 6 entity tokens and a word
    assert list(by) == list(STRATEGIES)
    ent = by["entity"]
    hidden = [t for t, k in zip(ent.tokens, ent.kinds) if k != MaskKind.NOT_CHOSEN]
    assert len(hidden) == 7 and {"e", "##iff", "##el", "tower", "paris", "france"} < set(hidden)
    assert list(mask_every_strategy(tok, text, 0.3, 0)) == ["token", "whole_word", "span"]
    with pytest.raises(ValueError, match="needs text tagged"):
        mask_example(tok, text, "phrase")


# -- the command ------------------------------------------------------------------------------------
def test_the_command_offers_every_strategy(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    help_text = capsys.readouterr().out
    assert "{token,whole_word,span,entity,phrase}" in help_text


def test_entity_masking_of_a_plain_named_corpus_is_one_line_before_loading(tmp_path, capsys):
    code = main(["pretrain", "--corpus", "gensim-wiki", "--masking", "entity", "--out", str(tmp_path / "r")])
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gensim-wiki is plain text" in err[0]


def test_a_few_steps_of_entity_masking_save_a_model(tmp_path, conll_file, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--corpus", str(conll_file), "--masking", "entity", "--size", "tiny", "--steps", "3",
                 "--batch-size", "4", "--seq-len", "32", "--out", str(out), "--device", "cpu", "--pair-task", "none"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["step"] == 3
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "config.json").is_file()
    from transformers import AutoModelForMaskedLM

    AutoModelForMaskedLM.from_pretrained(out / "final")  # the folder transformers loads


def test_tagged_documents_keep_their_spans_through_a_jsonl_file(tmp_path, conll_file):
    from bertlab.training.corpora import load_documents, save_documents

    docs = load_corpus(conll_file, split="all")
    path = save_documents(tmp_path / "docs.jsonl", {"train": docs[:4], "held_out": docs[4:]})
    again = load_documents(path)
    assert [d.spans for d in again] == [d.spans for d in docs]
    assert load_corpus(path, split="train")[0].tagged == ("entity", "phrase")


@pytest.mark.skipif(not (Path(os.environ.get("BERTLAB_DATA", "")) / "conll2003" / "train.txt").is_file()
                    and not SHARED_CONLL.is_file(), reason="CoNLL-2003 is not in BERTLAB_DATA")
def test_conll2003_by_name_trains_on_train_and_holds_out_dev(monkeypatch):
    if not os.environ.get("BERTLAB_DATA"):
        monkeypatch.setenv("BERTLAB_DATA", str(SHARED_CONLL.parents[1]))
    train = load_corpus("conll2003", split="train")
    dev = load_corpus("conll2003", split="held_out")
    assert sum(len(d) for d in train) == 14_041 and sum(len(d) for d in dev) == 3_250
    assert len(train) > 500  # the stories, cut at their datelines
    assert {d.source for d in train} == {str(Path(train[0].source))} and train[0].source.endswith("train.txt")
    assert dev[0].source.endswith("dev.txt")
