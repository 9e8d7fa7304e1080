"""Messages a student can act on: no errno, no whole path, at most a short quote of what was typed."""

from __future__ import annotations

import errno

import pytest

import bertlab
from bertlab.inputs import ECHO_CHARS, InputError, check_path_text, os_error_message
from bertlab.loading import CheckpointError
from bertlab.workspace import Workspace

ESSAY = "word " * 5000


def test_a_pasted_essay_is_no_path_and_the_message_says_so_briefly():
    with pytest.raises(InputError) as info:
        check_path_text(ESSAY.strip())
    text = str(info.value)
    assert "not a path" in text and "Errno" not in text and len(text) < 200
    with pytest.raises(InputError, match="longer than the 255 characters"):
        check_path_text("runs/" + "x" * 300)
    assert check_path_text("runs/my-model") == "runs/my-model"


@pytest.mark.parametrize("confined", [False, True])
def test_every_path_field_refuses_it_through_the_workspace(confined, tmp_path, monkeypatch):
    if confined:
        monkeypatch.setenv("BERTLAB_CLASS", "1")
        monkeypatch.setenv("BERTLAB_WORKSPACES", str(tmp_path / "ws"))
        ws = Workspace.for_session()
    else:
        ws = Workspace(None)
    for call in (lambda: ws.resolve(ESSAY, "data"), lambda: ws.model_source(ESSAY)):
        with pytest.raises(ValueError) as info:
            call()
        assert "not a path" in str(info.value) and len(str(info.value)) < 200


def test_loading_a_model_by_an_essay_or_a_missing_folder_quotes_it_short():
    with pytest.raises(CheckpointError, match="not a path"):
        bertlab.load(ESSAY)
    with pytest.raises(CheckpointError) as info:
        bertlab.load("/no/such/folder/" + "y" * 200)
    assert "does not exist" in str(info.value) and len(str(info.value)) < ECHO_CHARS + 60


@pytest.mark.parametrize("code, words", [
    (errno.EEXIST, "in the way"), (errno.ENAMETOOLONG, "too long"), (errno.ENOSPC, "disk is full"),
    (errno.EACCES, "may not open"),
])
def test_os_errors_become_sentences_without_errno(code, words):
    text = os_error_message(OSError(code, "raw text", "/srv/class/" + "z" * 500), "save it in the folder")
    assert words in text and "Errno" not in text and "raw text" not in text
    assert text.startswith("Could not save it in the folder '/srv/class/") and len(text) < 250
