"""The decontaminate stage in Spark: every kind of evaluation set, drop and cut modes, broadcast and join paths."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.decontaminate import job
from pipeline.decontaminate.ngrams import NgramIndex, item_ngram_rows
from tests.classify.corpus import document, publish_documents
from tests.conftest import make_config
from tests.decontaminate.test_ngrams import disguise, filler

pytestmark = pytest.mark.slow
SNAPSHOT = "s2"
QUESTIONS = [
    {
        "question": "Which gas do plants absorb from the air to make sugar through photosynthesis in their leaves?",
        "answer": "carbon dioxide",
    },
    {
        "question": "Who wrote the novel about a white whale hunted by a captain with a wooden leg named Ahab?",
        "answer": "Herman Melville",
    },
]
TASK_ITEMS = [
    {
        "query": "In which year did the first person walk on the surface of the moon during the Apollo program?",
        "gold": "1969",
    },
    {
        "query": "What is the largest ocean on the planet that lies between Asia and the Americas to the west?",
        "gold": "the Pacific",
    },
]
VALIDATION_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening to light the great lamp that warned ships away "
    "from the rocks below the cliff."
)
HELDOUT_ITEM = {
    "context": "The old bridge over the river was built from stone blocks carried by",
    "choices": ["horses and carts from the quarry nearby", "x"],
    "label": 0,
}

TASK_YAML = """task: local_trivia
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{gold}}}}"
"""


def publish_heldout(config, snapshot: str) -> None:
    """Another snapshot's dedup documents, tokenize validation ids and an evaluate task file."""
    documents = [document(VALIDATION_TEXT, key="val"), document(filler(random.Random(9), 60), key="train")]
    dedup = publish_documents(config, "dedup", snapshot, documents, files=1)
    tokenize = DatasetRef.of(config, "tokenize", snapshot)
    with StageOutput(tokenize, config, [dedup]) as out:
        (out.path / "validation").mkdir()
        pq.write_table(
            pa.table({"id": [documents[0]["id"]], "domain": ["x"], "lang": ["en"]}),
            out.path / "validation" / "shard-00000-0000.docs.parquet",
        )
        out.commit(rows={"documents": 2})
    evaluate = DatasetRef(config.project.data_root, config.project.corpus, "evaluate", snapshot, "run1")
    with StageOutput(evaluate, config, []) as out:
        (out.path / "lm_eval").mkdir()
        (out.path / "lm_eval" / "pretrain_heldout_continuation.jsonl").write_text(
            json.dumps(HELDOUT_ITEM) + "\n"
        )
        out.commit()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("decontaminate")
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "local_trivia.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASK_ITEMS))
    (tasks / "local_trivia.yaml").write_text(
        TASK_YAML.format(data=json.dumps(str(tasks / "local_trivia.jsonl")))
    )
    base = make_config(root / "data")
    publish_heldout(base, "earlier")

    rng = random.Random(3)
    plants = {
        "questions": f"{QUESTIONS[0]['question']} {QUESTIONS[0]['answer']}",
        "trivia": f"{TASK_ITEMS[1]['query']} {TASK_ITEMS[1]['gold']}",
        "heldout": VALIDATION_TEXT,
        "heldout_task": f"{HELDOUT_ITEM['context']} {HELDOUT_ITEM['choices'][0]}",
    }
    documents, expected = [], {}
    for name, text in plants.items():
        for copy in range(2):
            row = document(
                f"{filler(rng, 300)}. {disguise(text, rng)}. {filler(rng, 300)}", key=f"{name}{copy}"
            )
            documents.append(row)
            expected[row["id"]] = "heldout" if name.startswith("heldout") else name
    tokens = QUESTIONS[1]["question"].split()
    near = document(
        f"{filler(rng, 50)} {' '.join(tokens[:12])} and then {' '.join(tokens[1:13])} {filler(rng, 50)}",
        key="near",
    )
    documents.append(near)  # shares only 12-grams: kept
    documents += [document(filler(rng, 200), key=f"clean{i}") for i in range(30)]
    publish_documents(base, "classify", SNAPSHOT, documents, files=3)
    sets = (
        "decontaminate.sets=[{name: heldout, kind: heldout},"
        f"{{name: questions, path: {questions}, fields: [question, answer]}},"
        f"{{name: trivia, kind: lm_eval, tasks: [local_trivia, no_such_task], include_path: {tasks}}}]"
    )
    results = {}
    for label, extra in (
        ("drop", []),
        ("join", ["decontaminate.broadcast_max_ngrams=0"]),
        (
            "cut",
            [
                "decontaminate.mode=cut",
                "decontaminate.cut_margin_chars=10",
                "decontaminate.min_piece_chars=100",
            ],
        ),
    ):
        config = make_config(root / "data", sets, *extra)
        output = DatasetRef.of(config, "decontaminate", f"{SNAPSHOT}-{label}")
        manifest = job.run(config, [DatasetRef.of(config, "classify", SNAPSHOT)], output)
        results[label] = (manifest, output)
    return {"results": results, "expected": expected, "near": near, "documents": documents, "root": root}


def read(ref: DatasetRef, name: str) -> list[dict]:
    return pq.read_table(ref.path / name).to_pylist()


def test_planted_items_from_every_kind_of_set_are_dropped_with_their_set_and_ngram(world):
    manifest, output = world["results"]["drop"]
    excluded = {row["id"]: row for row in read(output, "excluded")}
    assert {i: row["drop_reason"] for i, row in excluded.items()} == {
        i: f"contaminated:{s}" for i, s in world["expected"].items()
    }
    for row in excluded.values():
        assert row["contamination_matches"] >= 1 and len(row["contamination_ngram"].split()) >= 8
        assert row["contamination_ngram"] == row["contamination_ngram"].lower()
    assert manifest.counters["dropped"] == {
        "contaminated:heldout": 4,
        "contaminated:questions": 2,
        "contaminated:trivia": 2,
    }
    kept = read(output, "documents")
    assert world["near"]["id"] in {row["id"] for row in kept}  # only 12-grams shared
    assert "contamination_set" not in kept[0]  # documents keep their own columns


def test_the_sets_record_what_they_read(world):
    sets = world["results"]["drop"][0].extra["decontaminate"]["sets"]
    assert sets["questions"]["items"] == 2 and sets["questions"]["ngrams"] > 0
    assert sets["trivia"]["tasks"] == {"local_trivia": 2} and "no_such_task" in sets["trivia"]["missing"]
    assert sets["heldout"]["validation_snapshots"] == ["earlier"] and len(sets["heldout"]["task_files"]) == 1


def test_the_join_path_decides_as_the_broadcast_path_does(world):
    broadcast, join = world["results"]["drop"], world["results"]["join"]
    assert join[0].extra["decontaminate"]["index"]["path"] == "join"
    assert broadcast[0].extra["decontaminate"]["index"]["path"] == "broadcast"
    assert {r["id"]: r["drop_reason"] for r in read(join[1], "excluded")} == {
        r["id"]: r["drop_reason"] for r in read(broadcast[1], "excluded")
    }
    assert join[0].files == broadcast[0].files  # the same bytes


def test_cut_mode_keeps_the_rest_of_each_document(world):
    manifest, output = world["results"]["cut"]
    kept = {row["id"]: row for row in read(output, "documents")}
    originals = {row["id"]: row for row in world["documents"]}
    assert manifest.counters["cut_documents"] == len(world["expected"])
    assert not read(output, "excluded")
    for doc_id in world["expected"]:
        text = kept[doc_id]["text"]
        assert len(text) < len(originals[doc_id]["text"]) and kept[doc_id]["n_chars"] == len(text)
        assert len(text) > 1000  # the ~300 filler words on each side stay
    # The cut texts, matched again against every item, hold no shared n-gram.
    items = (
        [f"{q['question']} {q['answer']}" for q in QUESTIONS]
        + [f"{t['query']} {t['gold']}" for t in TASK_ITEMS]
        + [VALIDATION_TEXT]
    )
    rows, _ = item_ngram_rows(items, [0] * len(items), 13, 8)
    columns = rows.to_pydict()
    index = NgramIndex.from_columns(columns, 8)
    assert not any(index.matches([kept[doc_id]["text"] for doc_id in world["expected"]]))


def test_nothing_to_match_passes_the_documents_through(world):
    config = make_config(
        world["root"] / "data", "decontaminate.sets=[{name: heldout, kind: heldout, snapshots: [none]}]"
    )
    output = DatasetRef.of(config, "decontaminate", "passed")
    manifest = job.run(config, [DatasetRef.of(config, "classify", SNAPSHOT)], output)
    assert manifest.rows == {"documents": len(world["documents"]), "excluded": 0}
    assert "contamination_ngram" in pq.read_schema(next((output.path / "excluded").glob("*.parquet"))).names


def test_an_ngram_in_more_documents_than_the_cap_is_no_evidence_as_a_brute_force_finds(world):
    """A licence line an item shares with many pages drops none of them; a rarer shared n-gram still drops its
    documents, on both paths; an item too short to give an n-gram is counted as skipped."""
    from tests.decontaminate import reference

    root = world["root"]
    licence = "Permission is hereby granted free of charge to any person obtaining a copy of this software"
    question = QUESTIONS[1]["question"]
    items = root / "capped.jsonl"
    lines = [f"{licence} and the question {question}", "too short to count"]
    items.write_text("".join(json.dumps({"text": text}) + "\n" for text in lines))
    rng = random.Random(11)
    texts = [f"{filler(rng, 40)} {disguise(licence, rng)} {filler(rng, 40)}" for _ in range(5)]
    texts += [f"{filler(rng, 40)} {disguise(question, rng)} {filler(rng, 40)}" for _ in range(2)]
    texts.append(f"{disguise(licence, rng)} {filler(rng, 20)} {question}")
    texts += [filler(rng, 60) for _ in range(4)]
    documents = [document(text, key=f"capped{n}") for n, text in enumerate(texts)]
    config = make_config(root / "data", "project.corpus=capped")
    publish_documents(config, "classify", SNAPSHOT, documents, files=2)

    grams = reference.item_ngrams(lines, 13, 8)
    expected = reference.contaminated_with_cap(texts, grams, 4)
    assert expected == [False] * 5 + [True] * 3 + [False] * 4  # the licence's 6 documents are over the cap
    for path in ("broadcast", "join"):
        config = make_config(
            root / "data",
            "project.corpus=capped",
            f"decontaminate.sets=[{{name: capped, path: {items}}}]",
            "decontaminate.max_matches=4",
            *(["decontaminate.broadcast_max_ngrams=0"] if path == "join" else []),
        )
        output = DatasetRef.of(config, "decontaminate", f"{SNAPSHOT}-capped-{path}")
        manifest = job.run(config, [DatasetRef.of(config, "classify", SNAPSHOT)], output)
        record = manifest.extra["decontaminate"]
        assert record["index"]["path"] == path
        dropped = {row["id"] for row in read(output, "excluded")}
        assert [row["id"] in dropped for row in documents] == expected
        assert record["sets"]["capped"]["items"] == 2 and record["sets"]["capped"]["skipped_short_items"] == 1
        cap = record["frequency_cap"]
        assert cap["max_matches"] == 4 and cap["ngrams_over_cap"] > 0
        assert all(example["documents"] == 6 for example in cap["examples"])
        # The document holding both counts the question's n-grams only.
        both = next(row for row in read(output, "excluded") if row["id"] == documents[7]["id"])
        question_grams = reference.shared_grams(texts[7], grams) - reference.shared_grams(texts[0], grams)
        assert both["contamination_matches"] == len(question_grams)
