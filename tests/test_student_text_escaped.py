"""Whatever a student types is drawn as typed: in plotly figures (labels, bar text, hover, titles),
HTML widgets, the class's histogram on the teacher's and the students' pages, and the lab record.
plotly reads a subset of HTML in every string it draws (`<a href>` a live link, `<span style>` a
90 px word, `<b>` bold), and HTML widgets read all of it."""

from __future__ import annotations

import json

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

from bertlab.classroom.store import ClassStore
from bertlab.viz.classroom import plot_class_guesses
from bertlab.viz.text import plain_text
from bertlab.viz.theme import finish

# One word each, as a student might type them (a word-level chart draws each as one label).
LINK = '<a/href="http://evil.example/">here</a>'
BIG = '<span/style="font-size:90px">LOL</span>'
IMG = "<img/src=x/onerror=alert(1)>"
BOLD = "<b>BOLD!</b>"  # no token of a tokenizer: the builders' own <b> around a piece never matches
WORDS = (BOLD, LINK, BIG, IMG)
# What must never reach a figure or an HTML widget unescaped.
MARKUP = ("<b>BOLD!", "<a/href", "<span/style", "<img/src",
          '<a href="http://evil', '<span style="font-size:90', "<img src=x")


def hostile(mask: str) -> str:
    return f"the {BOLD} sat {LINK} on {BIG} the {IMG} {mask} ."


def drawn_strings(node: object, skip: tuple[str, ...] = ("hovertemplate", "texttemplate")) -> list[str]:
    """Every string in a figure's JSON (templates are the builder's own markup, not data)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() if k not in skip for s in drawn_strings(v, skip)]
    if isinstance(node, (list, tuple)):
        return [s for v in node for s in drawn_strings(v, skip)]
    return []


def figure_strings(fig: go.Figure) -> list[str]:
    return drawn_strings(json.loads(go.Figure(fig).to_json()))


def shown_strings(root: widgets.Widget) -> list[str]:
    """What a panel draws: its HTML widgets' markup and its figures' strings."""
    out: list[str] = []

    def walk(w: object) -> None:
        if isinstance(w, go.FigureWidget):
            out.extend(figure_strings(w))
        elif isinstance(w, (widgets.HTML, widgets.HTMLMath)):
            out.append(w.value)
        for child in getattr(w, "children", ()) or ():
            walk(child)

    walk(root)
    return out


def assert_drawn_as_text(strings: list[str], where: str) -> None:
    leaks = [s for s in strings if any(m in s for m in MARKUP)]
    assert not leaks, f"{where}: student markup drawn as markup: {leaks[:3]}"


# -- the one escape -------------------------------------------------------------------------------
@pytest.mark.parametrize("typed", [*WORDS, "a & b", "it's \"quoted\"", "<s>"])
def test_plain_text_leaves_no_tag_and_round_trips_through_html(typed):
    import html

    out = plain_text(typed)
    assert "<" not in out and ">" not in out
    assert html.unescape(out) == typed  # browsers and plotly decode what it wrote


def test_finish_escapes_every_data_string_of_a_figure_and_its_tick_labels():
    fig = go.Figure(go.Bar(x=list(WORDS), y=[1, 2, 3, 4], text=list(WORDS), customdata=[[w] for w in WORDS],
                           hovertemplate="<b>%{x}</b>"))
    fig.update_layout(yaxis=dict(tickvals=[0, 1], ticktext=[BOLD, IMG]))
    strings = figure_strings(finish(fig))
    assert_drawn_as_text(strings, "a finished figure")
    assert plain_text(BOLD) in strings  # escaped, not dropped
    assert fig.data[0].hovertemplate == "<b>%{x}</b>"  # the builder's own markup stays


# -- plotly figures: the class's histogram ----------------------------------------------------------
@pytest.mark.parametrize("word", WORDS)
def test_a_guess_is_drawn_as_text_on_the_class_histogram(word):
    fig = plot_class_guesses([(word, 3), ("mat", 1)], [("mat", 0.4), (word, 0.1)], show_model=True)
    assert_drawn_as_text(figure_strings(fig), "class histogram")
    assert plain_text(word) in fig.data[0].y


# -- every tab that draws the student's sentence ------------------------------------------------------
def test_the_mask_tab_draws_typed_markup_as_text(default_model):
    from bertlab.panels.mask import MaskPanel

    model, tok = default_model
    panel = MaskPanel(model, tok, class_poll_s=None)
    panel.text.value = hostile(tok.mask_token)
    panel.each_button.click()  # "mask each word in turn": one label per typed word
    assert panel.predictions and panel.scores
    assert_drawn_as_text(shown_strings(panel.widget), "Mask tab")


def test_the_input_attention_and_nsp_tabs_draw_typed_markup_as_text(default_model):
    from bertlab.panels.attention import AttentionPanel
    from bertlab.panels.nsp import NSPPanel
    from bertlab.panels.representation import RepresentationPanel

    model, tok = default_model
    for cls in (RepresentationPanel, AttentionPanel, NSPPanel):
        panel = cls(model, tok) if cls is not NSPPanel else cls(model, tok, class_poll_s=None)
        panel.text_a.value = hostile("")
        panel.text_b.value = f"{IMG} and {LINK}"
        assert panel.figures(), cls.__name__
        assert_drawn_as_text(shown_strings(panel.widget), cls.__name__)


def test_the_embeddings_tab_draws_typed_markup_as_text(default_model):
    from bertlab.panels.similarity import SimilarityPanel

    model, tok = default_model
    panel = SimilarityPanel(model, tok)
    panel.text.value = hostile("")
    panel.contexts.value = f"the {BOLD} sat on it\nmy {BOLD} is {BIG}"
    panel.word.value = BOLD
    panel.map_sentences.value = f"the {BOLD} and {LINK}\nthe dog and {IMG}"
    panel.map_words.value = f"{BOLD}, dog"
    for i in range(len(panel.sections.children)):
        panel.sections.selected_index = i
    assert_drawn_as_text(shown_strings(panel.widget), "Embeddings tab")


def test_the_ablation_tab_and_its_logit_lens_draw_typed_markup_as_text(default_model):
    from bertlab.panels.ablation import AblationPanel

    model, tok = default_model
    panel = AblationPanel(model, tok)
    panel.text.value = hostile(tok.mask_token)
    panel.target.value = BOLD  # not one piece: the note says so, echoing it
    assert_drawn_as_text(shown_strings(panel.widget), "Ablation tab (note)")
    panel.target.value = "mat"
    panel.effects_button.click()
    assert panel.figures()
    assert_drawn_as_text(shown_strings(panel.widget), "Ablation tab")


def test_the_family_tab_draws_typed_markup_as_text(default_model):
    from bertlab.panels.family import FamilyPanel

    panel = FamilyPanel(*default_model)
    panel.text.value = hostile("")
    panel.compare_button.click()
    assert panel.figures()
    assert_drawn_as_text(shown_strings(panel.widget), "Family tab")


# -- the class question: the student's box, the teacher's page ------------------------------------------
def test_guesses_are_text_on_the_students_box_and_the_teachers_page(default_model, tmp_path):
    from bertlab.panels.classroom import ClassQuestionBox
    from bertlab.panels.teacher import TeacherPanel

    model, tok = default_model
    store = ClassStore(tmp_path / "class.sqlite")
    teacher = TeacherPanel(model, tok, store, poll_s=None)
    teacher.text.value = f"The {BOLD} sat on the {tok.mask_token}."
    teacher.push()
    q = store.current()
    for i, word in enumerate(WORDS):
        store.answer(q.id, f"student-{i}", word)
    box = ClassQuestionBox(ClassStore(store.path), "mask", poll_s=None, mask_token=tok.mask_token)  # another kernel
    box.show(store.current())
    box.input.value = LINK
    box.send()
    teacher.refresh()
    assert_drawn_as_text(shown_strings(teacher.widget), "teacher's page, live")
    teacher.reveal()
    box.poll()
    assert_drawn_as_text(shown_strings(teacher.widget), "teacher's page, revealed")
    assert_drawn_as_text(shown_strings(box.widget), "student's box, revealed")
    assert "You guessed" in box.status.value and "evil.example" in box.status.value  # the verdict, as text
    teacher.stop()


# -- the lab record ----------------------------------------------------------------------------------
def test_the_lab_record_draws_typed_markup_as_text(default_model, tmp_path, monkeypatch):
    from bertlab.panels.app import App
    from bertlab.panels.state import ModelState

    state = ModelState(*default_model)
    tabs = (("Mask", "bertlab.panels.mask:MaskPanel"), ("Export", "bertlab.panels.export:ExportPanel"))
    app = App(state, tabs=tabs, first=0)
    mask = app.panels["Mask"]
    mask.text.value = hostile(state.tok.mask_token)
    mask.each_button.click()
    export = app.open(1)
    monkeypatch.chdir(tmp_path)
    export.folder.value = "."
    export.student.value = f"Ada {BIG}"
    export.record_button.click()
    page = next(tmp_path.glob("*.html")).read_text(encoding="utf-8")
    body = page[page.index("<body>"):]  # plotly.js itself is in the head
    assert not [m for m in MARKUP if m in body], [m for m in MARKUP if m in body]
    assert "how predictable each word is" in body and plain_text(BOLD) in body


# -- a tokenizer's own tags ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    from tiny_models import family_folder

    from bertlab.loading import load

    return load(family_folder(tmp_path_factory.mktemp("roberta"), "roberta"))


def test_a_tokenizers_own_tags_are_drawn_as_text(roberta):
    """RoBERTa's pieces `<s>`, `</s>`, `<mask>` in tick labels, bars and hover: raw, plotly would strike
    the rest of a label through (`<s>`) or drop the piece."""
    from bertlab.panels.attention import AttentionPanel
    from bertlab.panels.mask import MaskPanel
    from bertlab.panels.representation import RepresentationPanel
    from bertlab.panels.similarity import SimilarityPanel

    model, tok = roberta
    assert tok.cls_token == "<s>" and tok.mask_token == "<mask>"
    for cls in (RepresentationPanel, AttentionPanel, SimilarityPanel, MaskPanel):
        panel = cls(model, tok) if cls is not MaskPanel else cls(model, tok, class_poll_s=None)
        if cls is MaskPanel:
            panel.text.value = f"the cat sat on the {tok.mask_token} ."
        strings = [s for fig in panel.figures().values() for s in figure_strings(fig)]
        assert strings, cls.__name__
        raw = [s for s in strings if any(tag in s for tag in ("<s>", "</s>", "<mask>"))]
        assert not raw, f"{cls.__name__}: {raw[:3]}"
        assert any(plain_text("<s>") in s or plain_text("<mask>") in s for s in strings), cls.__name__
