"""The reference check of an ablation (``pipeline.ablate.heldout``): any shared word n-gram with a training
document refuses the reference, as decontamination would drop that document; on random texts, against a
brute-force reference implementation of the rule."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.ablate.heldout import MIN_NGRAM, NGRAM, ReferenceOverlapError, find_overlaps, refuse_overlaps

WORDS = [f"w{i}" for i in range(40)]


def documents_folder(tmp_path: Path, texts: list[str]) -> SimpleNamespace:
    folder = tmp_path / "documents"
    folder.mkdir(parents=True)
    ids = [f"doc{i}" for i in range(len(texts))]
    urls = [f"https://example.org/{i}" for i in range(len(texts))]
    pq.write_table(pa.table({"id": ids, "url": urls, "text": texts}), folder / "part-0.parquet")
    return SimpleNamespace(path=tmp_path)


def brute_force(references: list[str], texts: list[str]) -> set[tuple[int, int]]:
    """(reference, training document) pairs sharing an n-gram, by the rule written out plainly."""
    pairs = set()
    for r, reference in enumerate(references):
        words = reference.lower().split()
        if len(words) < MIN_NGRAM:
            continue
        width = min(NGRAM, len(words))
        grams = {tuple(words[i : i + width]) for i in range(len(words) - width + 1)}
        for t, text in enumerate(texts):
            other = text.lower().split()
            if any(tuple(other[i : i + width]) in grams for i in range(len(other) - width + 1)):
                pairs.add((r, t))
    return pairs


@pytest.mark.parametrize("seed", range(4))
def test_overlaps_are_every_pair_sharing_an_ngram(tmp_path, seed):
    rng = random.Random(seed)
    references = [" ".join(rng.choices(WORDS, k=rng.randint(3, 40))) for _ in range(12)]
    texts = []
    for _ in range(30):
        words = rng.choices(WORDS, k=rng.randint(5, 80))
        if rng.random() < 0.4:  # plant a piece of a reference: a whole short one or a 13-word span
            source = rng.choice(references).split()
            take = min(len(source), NGRAM + rng.randint(-1, 2))
            start = rng.randint(0, len(source) - take)
            at = rng.randint(0, len(words))
            words[at:at] = source[start : start + take]
        texts.append(" ".join(words).upper() if rng.random() < 0.3 else " ".join(words))
    found = find_overlaps(references, {"v": [documents_folder(tmp_path, texts)]})
    expected = brute_force(references, texts)
    # One Overlap per (reference, variant): the first training document found for it.
    assert {o.reference_index for o in found} == {r for r, _ in expected}
    for overlap in found:
        assert (overlap.reference_index, int(overlap.document_id.removeprefix("doc"))) in expected


def test_one_shared_sentence_refuses_the_reference_naming_both(tmp_path):
    reference = (
        "The lighthouse keeper climbed the spiral stairs every evening before the storm came in from the west "
        "and lit the great lamp that guided the fishing boats home across the bay."
    )
    sentence = " ".join(reference.split()[5:15])  # ten words: no 13-gram, and the document is longer
    training = f"Something else entirely. {sentence} carefully, said the guide, {reference.split()[15]}."
    assert find_overlaps([reference], {"v": [documents_folder(tmp_path / "a", [training])]}) == []
    leaked = "An unrelated start. " + " ".join(reference.split()[3:16]) + " and then more words follow."
    overlaps = find_overlaps([reference], {"none": [documents_folder(tmp_path / "b", ["x y z", leaked])]})
    assert [(o.reference_index, o.document_id, o.shared) for o in overlaps] == [(0, "doc1", 1)]
    with pytest.raises(
        ReferenceOverlapError, match=r"reference document 0 .* variant none's training document doc1"
    ):
        refuse_overlaps(Path("ref.jsonl"), overlaps)


def test_a_short_reference_document_is_one_ngram_of_its_own_length(tmp_path):
    short = "nine words make this reference document quite short indeed"
    assert len(short.split()) == 9 >= MIN_NGRAM
    inside = f"Before it, {short.upper()}, and after it."
    folder = documents_folder(tmp_path, [inside, "nine words make this reference document quite"])
    overlaps = find_overlaps([short, "too short to check"], {"v": [folder]})
    assert [(o.reference_index, o.document_id) for o in overlaps] == [(0, "doc0")]
