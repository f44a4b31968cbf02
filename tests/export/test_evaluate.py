"""The evaluate stage's arithmetic: windows score every target of a document once, and group losses are
token-weighted means that add back up to the overall one (hand-computed and random inputs)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.evaluate.job import document_windows, grouped, summary


@settings(max_examples=100, deadline=None)
@given(length=st.integers(2, 60), context=st.integers(1, 16))
def test_windows_score_every_token_after_the_first_once_from_earlier_tokens(length, context):
    tokens = np.arange(length)
    windows = document_windows(tokens, context)
    targets = np.concatenate([y for _, y in windows])
    assert targets.tolist() == list(range(1, length))
    for inputs, outputs in windows:
        assert len(inputs) == len(outputs) <= context
        assert (outputs == inputs + 1).all()  # each target's input is the token just before it


def test_grouped_losses_by_hand():
    # Two English documents (loss sums 6 and 2 over 3 and 1 tokens), one Chinese (3 over 2).
    groups = grouped(np.array([6.0, 2.0, 3.0]), np.array([3, 1, 2]), ["en", "en", "zh"])
    assert list(groups) == ["en", "zh"]
    assert groups["en"] == {"loss": 2.0, "perplexity": math.exp(2.0), "tokens": 4, "documents": 2}
    assert groups["zh"]["loss"] == 1.5 and groups["zh"]["documents"] == 1
    top = grouped(np.array([6.0, 2.0, 3.0]), np.array([3, 1, 2]), ["a", "b", "c"], top=1)
    assert list(top) == ["a", "other"] and top["other"]["loss"] == 5.0 / 3


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 50), st.integers(1, 100), st.sampled_from("abcdef")), min_size=1, max_size=40
    ),
    top=st.integers(1, 6),
)
def test_groups_add_up_to_the_overall_loss(rows, top):
    losses = np.array([loss * count for loss, count, _ in rows])
    counts = np.array([count for _, count, _ in rows])
    groups = grouped(losses, counts, [key for _, _, key in rows], top=top)
    assert len(groups) <= top + 1
    overall = summary(float(losses.sum()), int(counts.sum()), len(rows))
    assert sum(g["tokens"] for g in groups.values()) == overall["tokens"]
    assert sum(g["documents"] for g in groups.values()) == len(rows)
    weighted = sum(g["loss"] * g["tokens"] for g in groups.values()) / overall["tokens"]
    assert math.isclose(weighted, overall["loss"], rel_tol=1e-9, abs_tol=1e-9)
