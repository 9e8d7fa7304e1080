"""Predict, then reveal without a browser: a TeacherPanel and students' Mask and Next
sentence tabs share one class store (as separate kernels do); the teacher pushes, students answer,
the histogram counts them, and the reveal reaches everyone. No student sees the model's answer
before answering or the reveal."""

from __future__ import annotations

import html
import time

import pytest

from bertlab.analysis.mask import fill_mask
from bertlab.analysis.nsp import next_sentence
from bertlab.classroom.questions import NSP_CHOICES, PAIR_CHOICES, model_rank, pair_objective, tally, verdict
from bertlab.classroom.store import ClassStore
from bertlab.panels.classroom import HELD_NOTE, ClassQuestionBox
from bertlab.panels.mask import MaskPanel
from bertlab.panels.nsp import NSPPanel
from bertlab.panels.teacher import NO_STORE, TeacherPage, TeacherPanel, teacher_view
from bertlab.viz import theme
from bertlab.viz.classroom import ALONE, SHARED, TOP, plot_class_guesses
from bertlab.viz.theme import NEUTRAL, NORMAL, OKABE_ITO, PROJECTOR

SENTENCE = "The man went to the [MASK] to buy a gallon of milk."


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "class.sqlite"


@pytest.fixture
def teacher(default_model, store_path) -> TeacherPanel:
    return TeacherPanel(*default_model, ClassStore(store_path), poll_s=None)


def _students(default_model, store_path, n=2) -> list[MaskPanel]:
    # Each student's tab opens the store itself, as each kernel does.
    return [MaskPanel(*default_model, classroom=ClassStore(store_path), class_poll_s=None) for _ in range(n)]


def _figure_bars(box, trace: int) -> dict[str, float]:
    data = box.children[0].data[trace]
    return dict(zip(data.y or (), data.x or ()))


def _shown(widget) -> bool:
    return widget.layout.display != "none"


def test_teacher_pushes_two_students_answer_and_the_reveal_reaches_both(default_model, store_path, teacher):
    students = _students(default_model, store_path)
    for s in students:
        s.class_box.poll()
        assert not _shown(s.class_box.widget)  # no question yet: no box, the tab as usual
        assert _shown(s.fill_box) and s.predictions

    teacher.text.value = SENTENCE
    teacher.push_button.click()
    expected = fill_mask(*default_model, SENTENCE, teacher.k.value)[0].candidates
    assert teacher.question.model == [(c.token, c.probability) for c in expected]  # fill_mask's answer

    for s in students:
        s.class_box.poll()
        box = s.class_box
        assert _shown(box.widget) and "buy a gallon of milk" in box.prompt.value
        # Predict first: neither the box nor the tab shows the model's guesses yet.
        assert box.figure_box.children == ()
        assert not _shown(s.fill_box) and not _shown(s.each_box)
        assert s.figures() == {}  # nor through the Export tab
        assert expected[0].token not in box.widget.children[0].value + box.status.value

    for s, guess in zip(students, ["Store", "house "]):
        s.class_box.input.value = guess
        s.class_box.send_button.click()
    assert [s.class_box.guess for s in students] == ["store", "house"]
    # answered: the tab is back, but the model's guess for the question's own sentence waits for the reveal
    assert all(_shown(s.fill_box) and ("info", HELD_NOTE) in s.messages and s.figures() == {} for s in students)
    assert all(s.class_box.figure_box.children == () for s in students)  # but no reveal yet

    teacher.refresh()
    assert teacher.counts == [("house", 1), ("store", 1)]
    assert _figure_bars(teacher.figure_box, 0) == {"house": 1, "store": 1}  # the histogram counts them
    assert _figure_bars(teacher.figure_box, 1) == {}  # the model's side hidden until the reveal
    assert ">2</b> answers" in teacher.status.value

    teacher.reveal_button.click()
    model = _figure_bars(teacher.figure_box, 1)
    assert list(model) == [c.token for c in expected]
    for s, guess in zip(students, ["store", "house"]):
        s.class_box.poll()
        box = s.class_box
        assert _figure_bars(box.figure_box, 0) == {"house": 1, "store": 1}
        assert _figure_bars(box.figure_box, 1) == model  # the same answer as the teacher's
        assert box.status.value.count("You guessed") == 1 and guess in box.status.value
        assert box.send_button.disabled and box.input.disabled  # answers closed
        assert s.predictions[0].candidates[0].token == expected[0].token and s.figures()  # the tab's own, too
    assert teacher.reveal_button.disabled


def test_a_student_who_did_not_answer_sees_the_reveal_and_cannot_answer_after(default_model, store_path, teacher):
    late, = _students(default_model, store_path, 1)
    teacher.push()
    late.class_box.poll()
    assert not _shown(late.fill_box)
    teacher.reveal()
    late.class_box.input.value = "store"
    late.class_box.send()  # too late: the click raced the reveal
    assert "already revealed" in late.class_box.status.value or late.class_box.question.revealed
    late.class_box.poll()
    assert late.class_box.question.revealed and late.class_box.guess is None
    assert "did not send a guess" in late.class_box.status.value
    assert late.class_box.figure_box.children and _shown(late.fill_box)  # revealed: nothing is hidden now
    assert ClassStore(store_path).answers(teacher.question.id) == {}


def test_a_new_push_replaces_the_question_and_end_clears_every_box(default_model, store_path, teacher):
    s, = _students(default_model, store_path, 1)
    teacher.push()
    s.class_box.poll()
    s.class_box.input.value = "store"
    s.class_box.send()
    teacher.text.value = "Paris is the [MASK] of France."
    teacher.push()
    s.class_box.poll()
    assert "Paris" in s.class_box.prompt.value and s.class_box.guess is None  # a fresh question
    assert not _shown(s.fill_box)
    teacher.end_button.click()
    s.class_box.poll()
    assert not _shown(s.class_box.widget) and _shown(s.fill_box)
    assert teacher.question is None and teacher.end_button.disabled


def test_a_pair_question_goes_to_the_next_sentence_tab(default_model, store_path, teacher):
    mask_tab, = _students(default_model, store_path, 1)
    nsp_tab = NSPPanel(*default_model, classroom=ClassStore(store_path), class_poll_s=None)
    teacher.kind.value = "nsp"
    teacher.text.value, teacher.text_b.value = "The man went to the store.", "Penguins live in the south."
    teacher.push()
    result = next_sentence(*default_model, teacher.text.value, teacher.text_b.value)
    assert teacher.question.model == [(NSP_CHOICES[0], pytest.approx(result.is_next_probability)),
                                      (NSP_CHOICES[1], pytest.approx(result.not_next_probability))]
    mask_tab.class_box.poll()
    nsp_tab.class_box.poll()
    assert "Next sentence tab" in mask_tab.class_box.status.value and _shown(mask_tab.fill_box)
    assert not _shown(nsp_tab.probability_box) and nsp_tab.figures() == {}
    nsp_tab.class_box.input.value = NSP_CHOICES[1]
    nsp_tab.class_box.send()
    teacher.refresh()
    assert teacher.counts == [(NSP_CHOICES[1].casefold(), 1)]
    teacher.reveal()
    nsp_tab.class_box.poll()
    assert set(_figure_bars(nsp_tab.class_box.figure_box, 1)) == set(NSP_CHOICES)
    assert _figure_bars(nsp_tab.class_box.figure_box, 0) == {NSP_CHOICES[1]: 1}  # spelled as the model's answer
    assert _shown(nsp_tab.probability_box)


def test_an_albert_pair_question_asks_about_sentence_order_not_whether_b_follows(store_path, tmp_path):
    """ALBERT's pair head was pre-trained on sentence ORDER (two consecutive segments, in order or
    swapped), never on random B sentences: the class is asked what that head answers."""
    from tiny_models import family_folder

    from bertlab.loading import load

    model, tok = load(family_folder(tmp_path, "albert"))
    assert pair_objective(model) == "sop"
    teacher = TeacherPanel(model, tok, ClassStore(store_path), poll_s=None)
    nsp_tab = NSPPanel(model, tok, classroom=ClassStore(store_path), class_poll_s=None)
    teacher.kind.value = "nsp"
    teacher.text.value, teacher.text_b.value = "The man went to the store.", "He bought milk there."
    teacher.push()
    result = next_sentence(model, tok, teacher.text.value, teacher.text_b.value)
    assert teacher.question.model == [("A comes before B", pytest.approx(result.is_next_probability)),
                                      ("B comes before A", pytest.approx(result.not_next_probability))]
    nsp_tab.class_box.poll()
    box = nsp_tab.class_box
    assert tuple(box.input.options) == PAIR_CHOICES["sop"]
    shown = box.prompt.value + box.status.value
    assert "comes before B" in shown and "follow" not in shown and "random" not in shown
    box.input.value = "B comes before A"
    box.send()
    teacher.refresh()
    assert teacher.counts == [("b comes before a", 1)]
    teacher.reveal()
    box.poll()
    assert set(_figure_bars(box.figure_box, 1)) == set(PAIR_CHOICES["sop"])
    said = html.unescape(box.status.value)  # the verdict names the model's answer in the same words
    assert "'b comes before a'" in said and any(f"top answer is '{c}'" in said for c in PAIR_CHOICES["sop"])
    teacher.stop()


def test_the_teacher_gets_a_message_for_a_sentence_that_cannot_be_asked(teacher):
    teacher.text.value = "The [MASK] went to the [MASK]."
    teacher.push()
    assert teacher.messages[0][0] == "error" and "one [MASK]" in teacher.messages[0][1]
    teacher.text.value = "No hidden word here."
    teacher.push()
    assert "nothing to guess" in teacher.messages[0][1]
    assert teacher.question is None and teacher.store.current() is None  # nothing was pushed


def test_a_reloaded_teacher_page_picks_up_the_live_question(default_model, store_path, teacher):
    teacher.push()
    again = TeacherPanel(*default_model, ClassStore(store_path), poll_s=None)
    assert again.question.id == teacher.question.id and not again.reveal_button.disabled


def test_the_background_threads_follow_the_store_without_being_asked(default_model, store_path, teacher):
    student = MaskPanel(*default_model, classroom=ClassStore(store_path), class_poll_s=0.05)
    watching = TeacherPanel(*default_model, ClassStore(store_path), poll_s=0.05)
    student.class_box._idle_s = 0.05
    try:
        teacher.push()
        _until(lambda: student.class_box.question is not None)
        student.class_box.input.value = "store"
        student.class_box.send()
        _until(lambda: watching.counts == [("store", 1)])
        teacher.reveal()
        _until(lambda: bool(student.class_box.figure_box.children))
    finally:
        student.class_box.stop()
        watching.stop()


def test_class_mode_gives_the_mask_tab_its_box_and_none_without_a_store(default_model, store_path, monkeypatch):
    monkeypatch.delenv("BERTLAB_CLASS_STORE", raising=False)
    assert MaskPanel(*default_model).class_box is None
    assert html.escape(NO_STORE) in teacher_view().value  # the teacher's page says what to do
    monkeypatch.setenv("BERTLAB_CLASS_STORE", str(store_path))
    panel = MaskPanel(*default_model, class_poll_s=None)
    assert isinstance(panel.class_box, ClassQuestionBox) and panel.class_box.widget in panel.widget.children
    assert panel.class_box.store.path == store_path


def test_verdicts_and_tallies():
    from bertlab.classroom.store import Question

    q = Question("mask", "x [MASK]", model=[("house", 0.5), ("store", 0.2)])
    assert tally({"a": "store", "b": "house", "c": "store"}) == [("store", 2), ("house", 1)]
    assert model_rank(q, "store") == (2, 0.2) and model_rank(q, "shop") is None
    assert "the model's top answer, at 50%" in verdict(q, "house")
    assert "number 2" in verdict(q, "store") and "not among the model's top 2" in verdict(q, "shop")


def test_the_figure_colours_guesses_by_the_models_answer_and_sums_the_tail():
    counts = [("house", 3), ("store", 2), ("shop", 1)] + [(f"w{i}", 1) for i in range(20)]
    fig = plot_class_guesses(counts, [("house", 0.5), ("store", 0.2), ("bank", 0.1)])
    left, right = fig.data
    assert list(left.y[:3]) == ["house", "store", "shop"] and left.y[-1] == "other (8)" and sum(left.x) == 26
    assert list(left.marker.color[:3]) == [TOP, SHARED, ALONE]
    assert list(right.marker.color) == [TOP, SHARED, ALONE]  # bank: nobody guessed it
    hidden = plot_class_guesses(counts, [("house", 0.5)], show_model=False)
    assert hidden.data[1].x is None or len(hidden.data[1].x) == 0
    assert any("Reveal" in a.text for a in hidden.layout.annotations)


def test_the_class_figure_follows_the_theme():
    counts, model = [("house", 3), ("store", 1)], [("house", 0.5), ("store", 0.2), ("bank", 0.1)]
    normal = plot_class_guesses(counts, model, style=NORMAL)
    big = plot_class_guesses(counts, model, style=PROJECTOR)
    assert big.layout.font.size == 1.5 * normal.layout.font.size
    assert [a.font.size for a in big.layout.annotations] == [1.5 * a.font.size for a in normal.layout.annotations]
    assert big.layout.width == PROJECTOR.page_width and normal.layout.width == 880  # the page's whole width
    assert {TOP, SHARED, ALONE} <= set(OKABE_ITO) | {NEUTRAL}  # colour-blind safe


def test_the_teacher_page_switches_projector_mode_and_its_histogram_follows(default_model, store_path):
    try:
        page = TeacherPage(TeacherPanel(*default_model, ClassStore(store_path), poll_s=None))
        page.panel.push()
        fig = page.panel.figure_box.children[0]
        assert fig.layout.font.size == theme.BASE_FONT and theme.PROJECTOR_CLASS not in page.widget._dom_classes
        page.projector.value = True
        fig = page.panel.figure_box.children[0]
        assert fig.layout.font.size == PROJECTOR.px(theme.BASE_FONT) and fig.layout.width == theme.current().page_width
        assert theme.PROJECTOR_CLASS in page.widget._dom_classes
        page.page.query = "?projector=0"  # the page's address asks for the normal page
        assert not page.projector.value and page.panel.figure_box.children[0].layout.font.size == theme.BASE_FONT
    finally:
        theme.use(NORMAL)


def _until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the background thread did not catch up"
        time.sleep(0.05)


def test_a_new_question_hides_the_tabs_results_before_the_box_shows(default_model, store_path, teacher):
    """The page gets the widgets' changes in the order the kernel makes them: the tab's guesses must be hidden
    before the question box appears, or a student sees both for a moment."""
    student = _students(default_model, store_path, n=1)[0]
    student.class_box.poll()
    changes = []
    student.fill_box.layout.observe(lambda c: changes.append(("guesses", c["new"])), names="display")
    student.class_box.widget.layout.observe(lambda c: changes.append(("question box", c["new"])), names="display")
    teacher.text.value = SENTENCE
    teacher.push_button.click()
    student.class_box.poll()
    assert changes.index(("guesses", "none")) < changes.index(("question box", None)), changes


def _tab_sentences() -> list[str]:
    """Every sentence a tab opens with: the str constants of each tab's module, templates spelled."""
    import importlib

    from bertlab.panels.app import TABS
    from bertlab.tokenizer import spell_specials

    out = []
    for _, spec in TABS:
        module = importlib.import_module(spec.split(":")[0])
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str) and " " in value:
                out.append(spell_specials(value) if "{mask}" in value else value)
    return out


def test_the_teachers_default_question_is_no_tabs_default():
    """Each student's tab shows the model's answer for its own default sentence on page load: the
    question the teacher's page opens with must be another sentence, or it is answered before it is asked."""
    from bertlab.classroom.questions import same_sentence
    from bertlab.panels import teacher
    from bertlab.tokenizer import spell_specials

    asked = spell_specials(teacher.DEFAULT_TEMPLATE)
    defaults = _tab_sentences()
    assert any("[MASK]" in d for d in defaults) and len(defaults) > 10  # the scan finds the tabs' sentences
    assert not [d for d in defaults if same_sentence(d, asked, "[MASK]")]
    assert not {teacher.DEFAULT_A, teacher.DEFAULT_B} & set(defaults)  # the pair: the Next sentence tab's


def test_a_student_who_opened_the_page_before_the_push_never_saw_the_answer(default_model, store_path, teacher):
    """The student's Mask tab opens (no question yet), the teacher pushes the question their page opens
    with: neither before nor after the push did the tab show guesses for its sentence, and after the
    student's guess the tab still holds them back until the reveal."""
    (student,) = _students(default_model, store_path, n=1)
    on_load = [p.tokens for p in student.predictions]
    assert on_load  # the tab's own default shows its guesses at once
    teacher.push_button.click()
    asked = teacher.question.text
    from bertlab.classroom.questions import same_sentence

    assert not same_sentence(student.text.value, asked, "[MASK]")  # what the page showed on load
    student.class_box.poll()
    student.text.value = asked  # the student copies the question into the tab
    student.class_box.input.value = "fridge"
    student.class_box.send_button.click()
    assert _shown(student.fill_box) and not student.predictions
    assert HELD_NOTE[:40] in html.unescape(student.message.value)
    teacher.reveal_button.click()
    student.class_box.poll()
    assert student.predictions  # the reveal frees them
