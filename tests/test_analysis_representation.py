"""Input representation on the real MiniLM: pieces and ids, each embedding part against the
embedding tables, the norms, the 2-D projection, and the three figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertlab.analysis.representation import PARTS, input_representation
from bertlab.inputs import InputError
from bertlab.viz.representation import plot_input_table, plot_part_norms, plot_part_projection, table_rows

A = "Embeddings are learned."
B = "The bank was closed."
TOL = 1e-5


@pytest.fixture(scope="module")
def rep(default_model):
    model, tok = default_model
    return input_representation(model, tok, A, B)


def test_pieces_segments_positions_and_words(rep):
    assert rep.tokens == ["[CLS]", "em", "##bed", "##ding", "##s", "are", "learned", ".", "[SEP]",
                          "the", "bank", "was", "closed", ".", "[SEP]"]
    assert rep.segment_ids == [0] * 9 + [1] * 6
    assert rep.position_ids == list(range(15))
    assert rep.word_ids == [None, 0, 0, 0, 0, 1, 2, 3, None, 0, 1, 2, 3, 4, None]
    assert rep.text_b == B and rep.warning is None


def test_parts_equal_the_embedding_tables_and_layernorm(default_model, rep):
    model, _ = default_model
    emb = model.bert.embeddings
    ids, types = torch.tensor(rep.ids), torch.tensor(rep.segment_ids)
    with torch.no_grad():
        token = emb.word_embeddings.weight[ids]
        segment = emb.token_type_embeddings.weight[types]
        position = emb.position_embeddings.weight[: len(ids)]
        total = token + segment + position
        normalised = F.layer_norm(total, total.shape[-1:], emb.LayerNorm.weight, emb.LayerNorm.bias,
                                  emb.LayerNorm.eps)
    expected = dict(token=token, segment=segment, position=position, sum=total, normalised=normalised)
    assert list(rep.parts) == list(PARTS)
    for name, value in expected.items():
        assert rep.part(name).shape == (15, 384)
        assert torch.allclose(rep.part(name), value, atol=TOL), name
        assert torch.allclose(rep.norms[name], value.norm(dim=-1), atol=TOL), name
    # sentence A tokens share one segment vector, sentence B tokens another
    assert torch.equal(rep.part("segment")[1], rep.part("segment")[8])
    assert not torch.equal(rep.part("segment")[8], rep.part("segment")[9])
    with pytest.raises(KeyError, match="choose one of"):
        rep.part("colour")


def test_projection_is_linear_additive_and_matches_an_svd(rep):
    proj = dict(zip(rep.projected_parts, rep.projection))  # name -> [seq, 2]
    assert rep.projected_parts == ("token", "segment", "position", "sum")
    assert rep.projection.shape == (4, 15, 2)
    # not centred, so the sum's point is the sum of its parts' points
    assert torch.allclose(proj["sum"], proj["token"] + proj["segment"] + proj["position"], atol=1e-4)
    # against numpy's SVD of the same stacked vectors, up to the sign convention
    stacked = torch.cat([rep.part(p) for p in rep.projected_parts]).double().numpy()
    u, s, _ = np.linalg.svd(stacked, full_matrices=False)
    ref = u[:, :2] * s[:2]
    ours = rep.projection.reshape(-1, 2).double().numpy()
    assert np.allclose(np.abs(ours), np.abs(ref), atol=1e-3)
    for j in range(2):  # sign convention: the farthest point along each direction is positive
        assert ours[np.abs(ours[:, j]).argmax(), j] > 0
    assert np.allclose(rep.explained.numpy(), s[:2] ** 2 / (s**2).sum(), atol=1e-4)


def test_same_input_same_picture_and_chosen_parts(default_model, rep):
    model, tok = default_model
    again = input_representation(model, tok, A, B)
    assert torch.equal(again.projection, rep.projection)
    only = input_representation(model, tok, A, projected=["normalised"])
    assert only.projected_parts == ("normalised",) and only.projection.shape == (1, 9, 2)
    assert only.text_b is None and set(only.segment_ids) == {0}


def test_bad_input_gives_clear_errors(default_model):
    model, tok = default_model
    with pytest.raises(InputError, match="empty"):
        input_representation(model, tok, "   ")
    with pytest.raises(InputError, match="choose among"):
        input_representation(model, tok, A, projected=["colour"])


def test_long_text_is_cut_with_a_warning(default_model):
    model, tok = default_model
    rep = input_representation(model, tok, "word " * 600)
    assert len(rep.tokens) == 512 and rep.warning and "cut" in rep.warning


def test_table_figure_shows_pieces_segments_positions(rep):
    fig = plot_input_table(rep)
    table = fig.data[0]
    rows = table_rows(rep)
    assert list(table.header.values) == ["", *map(str, range(15))]
    cells = table.cells.values
    assert list(cells[0]) == list(rows)  # row names
    assert [c[0] for c in cells[1:]] == rep.tokens
    assert [c[1] for c in cells[1:]] == ["A"] * 9 + ["B"] * 6
    assert [c[2] for c in cells[1:]] == [str(i) for i in range(15)]
    assert table.cells.fill.color[1][0] != table.cells.fill.color[10][0]  # A and B tinted apart


def test_the_input_table_is_never_squeezed_for_long_pieces(default_model):
    """64 long pieces with five-digit ids: every column as wide as its longest cell, and the figure as wide as
    its columns (plotly shrinks every column of a narrower table: digits overlapped, "segment" was cut)."""
    from bertlab.analysis.representation import first_tokens

    model, tok = default_model
    rep = first_tokens(input_representation(model, tok, " ".join(["extraordinarily"] * 40)), 64)
    fig = plot_input_table(rep)
    widths = list(fig.data[0].columnwidth)
    assert fig.layout.width >= sum(widths)
    assert widths[0] >= 9 * len("position")
    for i, column in enumerate(fig.data[0].cells.values[1:], start=1):
        assert widths[i] >= 9 * max(len(c) for c in column), (i, column)


def test_norms_figure_has_one_bar_group_per_part(rep):
    fig = plot_part_norms(rep)
    assert [b.type for b in fig.data] == ["bar"] * 5 and fig.layout.barmode == "group"
    for bar, name in zip(fig.data, PARTS):
        assert np.allclose(bar.y, rep.norms[name].numpy(), atol=1e-4)
        assert len(bar.x) == 15
    assert list(fig.layout.xaxis.ticktext) == rep.tokens
    assert len(plot_part_norms(rep, ["token", "sum"]).data) == 2
    with pytest.raises(KeyError):
        plot_part_norms(rep, ["colour"])


def test_projection_figure_matches_the_projection(rep):
    fig = plot_part_projection(rep)
    assert len(fig.data) == 4
    for trace, points in zip(fig.data, rep.projection):
        assert np.allclose(trace.x, points[:, 0].numpy(), atol=1e-4)
        assert np.allclose(trace.y, points[:, 1].numpy(), atol=1e-4)
        assert [c[1] for c in trace.customdata] == rep.tokens  # every token on hover
        drawn = [i for i, text in enumerate(trace.text) if text]  # the labelled few, drawn
        assert 0 < len(drawn) <= 12 and all(trace.text[i] == rep.tokens[i] for i in drawn)
