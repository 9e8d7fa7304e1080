""""Use it" functions on hand-checked cases, and the fine-tuning figures.

The hand-checked cases use scripted models: Berts whose task logits are a fixed function of the
token ids, so that the expected labels, spans, offsets and probabilities can be worked out on
paper. The real path (tokenizer -> model -> head) is checked on a random tiny Bert."""

from __future__ import annotations

import math

import pytest
import torch

from bertlab.analysis.predict import (
    ClassPrediction,
    EntityPrediction,
    answer,
    classify,
    cls_vectors,
    entail,
    entities,
    pca_2d,
    split_words,
    tag_words,
)
from bertlab.config import BertConfig
from bertlab.families.bert import Bert
from bertlab.inputs import InputError
from bertlab.model import ModelOutput
from bertlab.tasks import CONLL_LABELS, NLI_LABELS, SST2_LABELS
from bertlab.tokenizer import Tokenizer
from bertlab.viz.finetune import (
    ANSWER_COLOR,
    answer_html,
    entities_html,
    plot_class_probabilities,
    plot_cls_pca,
    plot_confusion_matrix,
    plot_span_probabilities,
    plot_training_curves,
)

LABEL2ID = {v: k for k, v in CONLL_LABELS.items()}


pytestmark = pytest.mark.usefixtures("one_thread")  # torch on one thread (see conftest)


def config(tok: Tokenizer, task: str | None = None, id2label=None) -> BertConfig:
    return BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=128, task=task, id2label=dict(id2label or {}))


class Scripted(Bert):
    """Task logits looked up per token id: `table` [vocab, labels] (token classification),
    [vocab, 2] start/end (QA), or [vocab, labels] summed over the tokens (sentence classification)."""

    def __init__(self, cfg: BertConfig, table: torch.Tensor):
        super().__init__(cfg)
        self.table = table

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, head_mask=None, mlm_positions=None):
        hidden = torch.zeros(*input_ids.shape, self.config.hidden_size)
        looked = self.table[input_ids]  # [batch, seq, k]
        out = ModelOutput(last_hidden_state=hidden)
        if self.config.task == "token_classification":
            out.logits = looked
        elif self.config.task == "question_answering":
            out.start_logits, out.end_logits = looked.unbind(-1)
        else:
            out.logits = looked.sum(1)  # [batch, labels]
        return out


def token_id(tok: Tokenizer, word: str) -> int:
    (piece,) = tok.tokenize(word)
    return tok.token_to_id(piece)


# ---------------------------------------------------------------------------------------------
# classify / entail
# ---------------------------------------------------------------------------------------------
def sentiment_model(tok: Tokenizer) -> Scripted:
    table = torch.zeros(tok.vocab_size, 2)
    table[token_id(tok, "good"), 1] = 2.0  # "good" pushes towards positive by 2 logits
    table[token_id(tok, "bad"), 0] = 3.0
    return Scripted(config(tok, "sequence_classification", SST2_LABELS), table)


def test_classify_gives_the_softmax_of_the_logits_in_label_order(tok):
    pred = classify(sentiment_model(tok), tok, "a good film")
    p = 1 / (1 + math.exp(-2))  # softmax([0, 2])[1]
    assert pred.labels == ["negative", "positive"]
    assert pred.probabilities == pytest.approx([1 - p, p])
    assert (pred.label, pred.probability) == ("positive", pytest.approx(p))
    assert pred.as_dict() == pytest.approx({"negative": 1 - p, "positive": p})
    assert pred.tokens == ["[CLS]", "a", "good", "film", "[SEP]"]
    bad = classify(sentiment_model(tok), tok, "a bad, good film")
    assert bad.probabilities == pytest.approx(torch.tensor([3.0, 2.0]).softmax(-1).tolist())


def test_classify_on_a_real_model_matches_its_forward_pass(tok):
    torch.manual_seed(0)
    model = Bert(config(tok, "sequence_classification", NLI_LABELS)).eval()
    pred = classify(model, tok, "A man is cooking", "A person cooks")
    enc = tok.encode("A man is cooking", "A person cooks")
    with torch.no_grad():
        logits = model(torch.tensor([enc.ids]), torch.tensor([enc.type_ids])).logits[0]
    assert pred.probabilities == pytest.approx(logits.softmax(-1).tolist())
    assert sum(pred.probabilities) == pytest.approx(1.0)


def test_entail_reads_the_nli_labels_and_checks_the_model(tok):
    table = torch.zeros(tok.vocab_size, 3)
    table[token_id(tok, "nobody"), 2] = 4.0
    nli = Scripted(config(tok, "sequence_classification", NLI_LABELS), table)
    pred = entail(nli, tok, "A man plays", "nobody plays")
    assert pred.labels == ["entailment", "neutral", "contradiction"] and pred.label == "contradiction"
    assert pred.probability == pytest.approx(math.exp(4) / (math.exp(4) + 2))
    assert pred.text_b == "nobody plays"
    with pytest.raises(InputError, match="hypothesis"):
        entail(nli, tok, "A man plays", "  ")
    with pytest.raises(InputError, match="negative, positive"):
        entail(sentiment_model(tok), tok, "A man plays", "nobody plays")


def test_a_missing_head_names_the_head_the_model_has(tok):
    qa = Scripted(config(tok, "question_answering"), torch.zeros(tok.vocab_size, 2))
    with pytest.raises(InputError, match="this one has a question answering head"):
        classify(qa, tok, "a good film")
    encoder = Bert(config(tok))
    with pytest.raises(InputError, match="no task head"):
        entities(encoder, tok, "John lives in Paris")
    with pytest.raises(InputError, match="sentence classification head"):
        answer(sentiment_model(tok), tok, "Who?", "John.")


def test_empty_input_is_an_input_error(tok):
    with pytest.raises(InputError, match="empty"):
        classify(sentiment_model(tok), tok, "   ")
    with pytest.raises(InputError, match="empty"):
        entities(ner_model(tok), tok, "")
    with pytest.raises(InputError, match="question is empty"):
        answer(qa_model(tok), tok, "", "Paris is big.")
    with pytest.raises(InputError, match="paragraph is empty"):
        answer(qa_model(tok), tok, "Where?", "\n")
    with pytest.raises(InputError, match="question is too long"):
        answer(qa_model(tok), tok, "why " * 30, "Paris is big.", max_length=24)


# ---------------------------------------------------------------------------------------------
# entities
# ---------------------------------------------------------------------------------------------
def ner_model(tok: Tokenizer) -> Scripted:
    table = torch.zeros(tok.vocab_size, len(CONLL_LABELS))
    table[:, LABEL2ID["O"]] = 2.0
    for word, tag in (("john", "B-PER"), ("smith", "I-PER"), ("paris", "B-LOC"), ("u", "B-ORG")):
        table[token_id(tok, word), LABEL2ID[tag]] = 5.0
    return Scripted(config(tok, "token_classification", CONLL_LABELS), table)


def test_split_words_follows_conll_tokenization():
    words = [w for w, _, _ in split_words("Germany's U.S. office, AT&T. Rolls-Royce sold 3.5 cars")]
    assert words == ["Germany", "'s", "U.S.", "office", ",", "AT&T", ".", "Rolls-Royce", "sold", "3.5", "cars"]
    text = "Hi, Bob!"
    assert [(w, text[a:b]) for w, a, b in split_words(text)] == [("Hi", "Hi"), (",", ","), ("Bob", "Bob"), ("!", "!")]


def test_entities_with_character_offsets_and_scores(tok):
    text = "Yesterday John Smith flew to Paris, said the U.S. embassy."
    found = entities(ner_model(tok), tok, text)
    p = math.exp(5) / (math.exp(5) + math.exp(2) + 7)  # softmax of one scripted row, at its tag
    assert [e[:4] for e in found] == [
        (10, 20, "PER", "John Smith"),
        (29, 34, "LOC", "Paris"),
        (45, 49, "ORG", "U.S."),  # one word: its first piece "u" carries the tag
    ]
    assert all(isinstance(e, EntityPrediction) and e.score == pytest.approx(p) for e in found)
    assert all(text[e.start_char : e.end_char] == e.text for e in found)


def test_tag_words_uses_the_first_piece_of_each_word(tok):
    # "Parisxyz" = paris ##xy ##z: its first piece is tagged B-LOC, the word gets B-LOC;
    # "Xyzparis" = x ##y ##z ##par ##is: its first piece says O, whatever the later pieces say.
    tagged = tag_words(ner_model(tok), tok, "John met Parisxyz and Xyzparis")
    assert [w for w, _, _ in tagged.words] == ["John", "met", "Parisxyz", "and", "Xyzparis"]
    assert tagged.tags == ["B-PER", "O", "B-LOC", "O", "O"]
    assert len(tagged.scores) == 5


def test_no_entities_is_an_empty_list(tok):
    assert entities(ner_model(tok), tok, "nothing to see here .") == []


# ---------------------------------------------------------------------------------------------
# answer
# ---------------------------------------------------------------------------------------------
def qa_model(tok: Tokenizer) -> Scripted:
    table = torch.zeros(tok.vocab_size, 2)
    table[token_id(tok, "paris")] = torch.tensor([5.0, 5.0])  # start and end logits
    table[token_id(tok, "google")] = torch.tensor([3.0, 3.0])
    return Scripted(config(tok, "question_answering"), table)


def test_answer_best_span_offsets_top_k_and_token_probabilities(tok):
    context = "John was born in Paris. He works for Google."
    result = answer(qa_model(tok), tok, "Where was John born?", context, k=3)
    assert (result.text, result.start_char, result.end_char) == ("Paris", 17, 22)
    # scores: Paris..Paris 10, Paris..Google 8, Google..Google 6 (start + end logits)
    assert [s.text for s in result.top_k] == ["Paris", "Paris. He works for Google", "Google"]
    assert [s.score for s in result.top_k] == [10.0, 8.0, 6.0]
    assert result.probability == result.top_k[0].probability > result.top_k[1].probability
    n = len(result.tokens)  # 11 context tokens: john was born in paris . he works for google .
    assert result.tokens[4] == "paris" and result.offsets[4] == (17, 22) and n == 11
    expected = math.exp(5) / (math.exp(5) + math.exp(3) + (n - 2))  # softmax over the context tokens
    assert result.start_probs[4] == pytest.approx(expected) and result.end_probs[4] == pytest.approx(expected)
    assert sum(result.start_probs) == pytest.approx(1.0) and result.windows == 1


def test_answer_over_several_windows(tok):
    filler = "The weather was mild and the streets were quiet that day. " * 12
    context = filler + "Later she moved to Paris."
    result = answer(qa_model(tok), tok, "Where did she move?", context, max_length=48)
    assert result.windows > 1
    assert context[result.start_char : result.end_char] == result.text == "Paris"
    best = max(range(len(result.tokens)), key=result.start_probs.__getitem__)
    assert result.tokens[best] == "paris" and len(result.start_probs) == len(result.tokens)


# ---------------------------------------------------------------------------------------------
# [CLS] vectors and PCA
# ---------------------------------------------------------------------------------------------
def test_cls_vectors_are_the_last_layer_cls_whatever_the_padding(tok):
    torch.manual_seed(0)
    model = Bert(config(tok, "sequence_classification", SST2_LABELS)).eval()
    texts = ["a good film", "an utterly boring and far too long film about nothing", "fine"]
    vectors = cls_vectors(model, tok, texts, batch_size=2)
    assert vectors.shape == (3, 16)
    for i, text in enumerate(texts):
        enc = tok.encode(text)
        with torch.no_grad():
            alone = model(torch.tensor([enc.ids])).last_hidden_state[0, 0]
        torch.testing.assert_close(vectors[i], alone, atol=1e-5, rtol=1e-4)
    with pytest.raises(InputError):
        cls_vectors(model, tok, ["fine", " "])


def test_pca_2d_is_deterministic_with_fixed_signs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 8, generator=g) * torch.tensor([5.0, 2.0, 1, 1, 1, 1, 1, 1])
    points, explained = pca_2d(x)
    again, _ = pca_2d(x.clone())
    assert points.shape == (20, 2) and torch.equal(points, again)
    assert 0 < explained[1] <= explained[0] and float(explained.sum()) <= 1.0
    flipped, _ = pca_2d(-x)  # the same cloud mirrored gets the same picture
    torch.testing.assert_close(flipped, points, atol=1e-4, rtol=1e-4)
    for axis in range(2):  # the farthest point along each axis is on the positive side
        assert points[points[:, axis].abs().argmax(), axis] > 0


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def history(losses, evals, metric="accuracy"):
    out = [{"kind": "train", "step": s, "epoch": s / 10, "loss": v} for s, v in losses]
    return out + [{"kind": "eval", "step": s, "epoch": s / 10, metric: v} for s, v in evals]


def test_training_curves_show_each_run_in_both_panels():
    runs = {"full": history([(5, 0.7), (10, 0.4)], [(10, 0.8)]),
            "feature": history([(5, 0.69), (10, 0.6)], [(10, 0.6)])}
    fig = plot_training_curves(runs, "accuracy")
    assert [t.name for t in fig.data] == ["full", "full", "feature", "feature"]
    assert list(fig.data[0].y) == [0.7, 0.4] and list(fig.data[1].y) == [0.8]
    assert fig.data[0].line.color == fig.data[1].line.color != fig.data[2].line.color
    assert list(plot_training_curves(runs, "accuracy", x="epoch").data[1].x) == [1.0]
    with pytest.raises(ValueError):
        plot_training_curves(runs, "accuracy", x="time")


def test_confusion_matrix_colours_rows_by_share_and_shows_counts():
    fig = plot_confusion_matrix([[8, 2], [1, 9]], ["negative", "positive"])
    heat = fig.data[0]
    assert [list(r) for r in heat.z] == [[0.8, 0.2], [0.1, 0.9]]
    assert [list(r) for r in heat.text] == [["8", "2"], ["1", "9"]]
    assert "85.0 %" in fig.layout.title.text
    with pytest.raises(ValueError, match="2x2"):
        plot_confusion_matrix([[1, 2, 3]], ["a", "b"])


def test_class_probability_bars(tok):
    pred = ClassPrediction("x", None, ["negative", "positive"], [0.25, 0.75], [])
    fig = plot_class_probabilities(pred)
    assert list(fig.data[0].x) == [0.25, 0.75] and "positive (75.0%)" in fig.layout.title.text


def test_entities_html_colours_by_type_and_escapes_the_text(tok):
    text = "<b>John</b> flew to Paris"
    found = [EntityPrediction(3, 7, "PER", "John", 0.9), EntityPrediction(20, 25, "LOC", "Paris", 0.8)]
    page = entities_html(text, found)
    assert "<b>" not in page and "&lt;b&gt;" in page
    assert page.count("<mark") == 2 + 4  # two entities, four legend entries
    assert "#fdd49e" in page and "#b2df8a" in page  # PER and LOC colours
    assert "No entities found" in entities_html("nothing", [])


def test_answer_html_and_span_bars(tok):
    context = "John was born in Paris. He works for Google."
    result = answer(qa_model(tok), tok, "Where was <John> born?", context, k=3)
    page = answer_html(result)
    assert "&lt;John&gt;" in page and "<b>Answer:</b> Paris" in page
    assert page.count("<mark") == 2  # the answer, and "Google" (the 2nd span overlaps the answer)
    assert f'background:{ANSWER_COLOR};padding:1px 3px;border-radius:3px">Paris</mark>' in page
    fig = plot_span_probabilities(result)
    assert len(fig.data) == 2 and len(fig.data[0].y) == len(result.tokens)
    assert fig.data[0].x[4] == "4 paris" and list(fig.data[0].marker.line.width).count(2) == 1


def test_cls_pca_scatter_before_and_after():
    g = torch.Generator().manual_seed(0)
    before, after = torch.randn(6, 2, generator=g), torch.randn(6, 2, generator=g)
    labels = ["negative", "positive"] * 3
    fig = plot_cls_pca({"before": before, "after": after}, labels, texts=[f"t{i}" for i in range(6)],
                       explained={"before": torch.tensor([0.3, 0.2]), "after": torch.tensor([0.6, 0.1])})
    assert len(fig.data) == 4 and [t.name for t in fig.data[:2]] == ["negative", "positive"]
    assert list(fig.data[0].text) == ["t0", "t2", "t4"]
    assert "70%" in fig.layout.annotations[1].text
    with pytest.raises(ValueError, match="points must be"):
        plot_cls_pca({"before": before[:3]}, labels)
