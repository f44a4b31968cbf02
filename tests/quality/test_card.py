"""`pretrain card`: a dataset card the Hub's parser reads, whose counts are the manifests' own."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard

from pipeline.core.manifest import DamagedInputError
from pipeline.core.storage import DatasetRef, StageOutput
from pipeline.quality import card
from tests.conftest import make_config
from tests.test_cli import assert_one_line_exit_2, pretrain

SNAPSHOT = "2026-11-29"
SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())])
# What each stage of the chain drops, by reason: the funnel the card must repeat.
CLEAN_DROPS = {"language.not_kept": 7, "c4.min_num_sentences": 5, "fineweb.empty": 3}
DEDUP_DROPS = {"exact_duplicate": 4, "near_duplicate": 2}
CLASSIFY_DROPS = {"classifier:fasttext_hq": 6}
DECONTAMINATE_DROPS = {"contaminated:heldout": 1}
LANGUAGES = ["en"] * 19 + ["de"] * 6 + ["und"] * 2 + [None]


def documents(count: int, offset: int = 0) -> list[dict]:
    return [
        {
            "id": hashlib.sha1(str(i).encode()).hexdigest()[:16],
            "text": f"document {i} " * (i % 5 + 1),
            "lang": LANGUAGES[i % len(LANGUAGES)],
        }
        for i in range(offset, offset + count)
    ]


def publish(
    config, stage, rows, dropped, inputs=(), documents_in=None, counted=None, extra=None
) -> DatasetRef:
    """``rows`` as ``<stage>/<SNAPSHOT>/documents/`` in two Parquet files, with the counters a stage keeps."""
    ref = DatasetRef.of(config, stage, SNAPSHOT)
    with StageOutput(ref, config, list(inputs)) as out:
        (out.path / "documents").mkdir()
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        half = table.num_rows // 2
        pq.write_table(table.slice(0, half), out.path / "documents" / "part-00000.parquet")
        pq.write_table(table.slice(half), out.path / "documents" / "part-00001.parquet")
        # As the stages do: what was dropped, with its reason, beside the documents (the card must not load it).
        (out.path / "excluded").mkdir()
        reasons = [reason for reason, n in sorted(dropped.items()) for _ in range(n)]
        excluded = {
            "id": [f"x{i}" for i in range(len(reasons))],
            "text": ["x"] * len(reasons),
            "reason": reasons,
        }
        pq.write_table(pa.table(excluded), out.path / "excluded" / "part-00000.parquet")
        kept = len(rows)
        documents_in = kept + sum(dropped.values()) if documents_in is None else documents_in
        key = "input_pages" if stage == "clean" else "input_documents"
        out.commit(
            rows={"documents": counted if counted is not None else kept, "excluded": sum(dropped.values())},
            counters={key: documents_in, "kept": kept, "dropped": dict(dropped)},
            extra=extra,
        )
    return ref


def publish_chain(config, through: str = "decontaminate") -> dict[str, DatasetRef]:
    """clean -> dedup -> classify -> decontaminate, each keeping a prefix of the one before."""
    final = 40
    sizes = {
        "decontaminate": final,
        "classify": final + sum(DECONTAMINATE_DROPS.values()),
    }
    sizes["dedup"] = sizes["classify"] + sum(CLASSIFY_DROPS.values())
    sizes["clean"] = sizes["dedup"] + sum(DEDUP_DROPS.values())
    drops = {
        "clean": CLEAN_DROPS,
        "dedup": DEDUP_DROPS,
        "classify": CLASSIFY_DROPS,
        "decontaminate": DECONTAMINATE_DROPS,
    }
    refs: dict[str, DatasetRef] = {}
    previous: list[DatasetRef] = []
    for stage in ("clean", "dedup", "classify", "decontaminate"):
        refs[stage] = publish(config, stage, documents(sizes[stage]), drops[stage], previous)
        previous = [refs[stage]]
        if stage == through:
            break
    return refs


def publish_tokens(config, documents_ref: DatasetRef, tokens=(5000, 300)) -> DatasetRef:
    ref = DatasetRef.of(config, "tokenize", SNAPSHOT)
    with StageOutput(ref, config, [documents_ref]) as out:
        (out.path / "tokenizer.json").write_text("{}")
        out.commit(
            rows={"train_documents": 36, "validation_documents": 4, "excluded": 0},
            counters={"tokens": {"train": tokens[0], "validation": tokens[1]}, "dropped": {"empty": 0}},
            extra={
                "vocab_size": 4096,
                "tokenizer": {"name": "default-bpe", "corpus": "sample", "digest": "abc123", "kind": "bpe"},
            },
        )
    return ref


def markdown_table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table under ``## heading``, as strings, header and rule left out."""
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]


def number(cell: str) -> int:
    return int(cell.replace(",", ""))


@pytest.fixture
def root(tmp_path):
    return tmp_path / "data"


def test_the_card_parses_and_its_counts_are_the_manifests(root):
    config = make_config(root)
    refs = publish_chain(config)
    publish_tokens(config, refs["decontaminate"])
    output = refs["decontaminate"]
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])

    parsed = DatasetCard.load(output.path / "README.md")
    data = parsed.data.to_dict()
    manifest = output.manifest()
    table = pq.read_table(output.path / "documents")
    assert table.num_rows == manifest.rows["documents"] == 40
    assert data["dataset_info"]["splits"] == [
        {"name": "train", "num_bytes": data["dataset_info"]["dataset_size"], "num_examples": 40}
    ]
    parquet = sorted((output.path / "documents").glob("*.parquet"))
    assert data["dataset_info"]["download_size"] == sum(p.stat().st_size for p in parquet)
    footers = [pq.read_metadata(p) for p in parquet]
    assert data["dataset_info"]["dataset_size"] == sum(
        f.row_group(i).total_byte_size for f in footers for i in range(f.num_row_groups)
    )
    assert data["size_categories"] == ["n<1K"]
    assert data["license"] == "other" and "TODO (licence)" in parsed.text
    assert data["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "documents/*.parquet"}]}
    ]
    assert data["pretty_name"] == f"sample {SNAPSHOT}" and data["multilinguality"] == "multilingual"

    counted = Counter(table.column("lang").to_pylist())
    assert data["language"] == ["de", "en"]  # "und" names no language; the table still counts it
    assert {row[0]: number(row[1]) for row in markdown_table(parsed.text, "Languages")} == {
        ("(none)" if lang is None else lang): n for lang, n in counted.items()
    }

    funnel = [(row[0], row[1], number(row[2])) for row in markdown_table(parsed.text, "What was removed")]
    clean_in = 40 + sum(
        sum(d.values()) for d in (CLEAN_DROPS, DEDUP_DROPS, CLASSIFY_DROPS, DECONTAMINATE_DROPS)
    )
    assert funnel[0] == ("clean", "input", clean_in) and funnel[-1] == ("decontaminate", "kept", 40)
    dropped = {(stage, reason): n for stage, reason, n in funnel[1:-1]}
    assert dropped == {
        **{("clean", r): n for r, n in CLEAN_DROPS.items()},
        **{("dedup", r): n for r, n in DEDUP_DROPS.items()},
        **{("classify", r): n for r, n in CLASSIFY_DROPS.items()},
        **{("decontaminate", r): n for r, n in DECONTAMINATE_DROPS.items()},
    }
    # The order clean's recipe applies its rules, then dedup's, not the manifest's alphabetical order.
    assert [reason for stage, reason, _ in funnel if stage == "clean"][1:] == [
        "language.not_kept",
        "c4.min_num_sentences",
        "fineweb.empty",
    ]

    recipe = markdown_table(parsed.text, "How it was made")
    assert [(row[0], row[3], row[4]) for row in recipe] == [
        (ref.manifest().stage, ref.manifest().config_hash, ref.manifest().code_version)
        for ref in refs.values()
    ]
    tokens = markdown_table(parsed.text, "Tokens")
    assert [(row[0], row[4], number(row[6])) for row in tokens] == [
        ("default-bpe", "train", 5000),
        ("default-bpe", "validation", 300),
    ]
    assert manifest.digest in parsed.text and manifest.config_hash in parsed.text

    # Beside the output, outside what its manifest lists: every published file still verifies.
    assert "README.md" not in manifest.files
    output.verify()
    assert sorted(p.name for p in output.path.iterdir()) == [
        "README.md",
        "_SUCCESS",
        "documents",
        "excluded",
        "manifest.json",
    ]


def test_the_latest_documents_stage_is_the_default_and_stage_picks_another(root):
    config = make_config(root)
    refs = publish_chain(config, through="dedup")
    publish_tokens(config, refs["dedup"])
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    dedup_card = DatasetCard.load(refs["dedup"].path / "README.md")
    assert dedup_card.data.to_dict()["dataset_info"]["splits"][0]["num_examples"] == 47
    assert [row[1] for row in markdown_table(dedup_card.text, "Tokens")] == ["bpe", "bpe"]

    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}", "--stage", "clean"])
    clean_card = DatasetCard.load(refs["clean"].path / "README.md")
    assert clean_card.data.to_dict()["dataset_info"]["splits"][0]["num_examples"] == 53
    # The tokenize output read dedup's documents, not these.
    assert "## Tokens" not in clean_card.text
    funnel = markdown_table(clean_card.text, "What was removed")
    assert funnel[-1][:3] == ["clean", "kept", "53"]


def test_datasets_loads_a_copy_of_the_folder_by_its_card(root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    datasets = pytest.importorskip("datasets")
    output = publish_chain(make_config(root))["decontaminate"]
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    copy = tmp_path / "handed-on"
    shutil.copytree(output.path, copy)
    loaded = datasets.load_dataset(str(copy), split="train", cache_dir=str(tmp_path / "cache"))
    assert loaded.num_rows == output.manifest().rows["documents"]
    assert sorted(loaded["id"]) == sorted(pq.read_table(output.path / "documents").column("id").to_pylist())


def test_a_rerun_replaces_the_card(root):
    config = make_config(root)
    output = publish_chain(config)["decontaminate"]
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    first = (output.path / "README.md").read_text()
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}", "--license", "odc-by"])
    second = DatasetCard.load(output.path / "README.md")
    assert second.data.license == "odc-by" and "TODO" not in second.text and second.content != first
    assert not [p for p in output.path.iterdir() if p.name.startswith(".README")]
    output.verify()


def test_a_card_is_refused_for_documents_that_do_not_add_up_to_the_manifest(root):
    config = make_config(root)
    output = publish(config, "clean", documents(10), {}, counted=12)
    with pytest.raises(DamagedInputError, match="holds 10 documents, its manifest counts 12"):
        card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    assert not (output.path / "README.md").exists()


def test_a_missing_snapshot_is_one_clear_error(root):
    publish_chain(make_config(root))
    assert_one_line_exit_2(
        pretrain("card", "--snapshot", "nope", root=root), "no complete documents output for snapshot 'nope'"
    )
    assert_one_line_exit_2(
        pretrain("card", "--snapshot", SNAPSHOT, "--stage", "tokenize", root=root),
        "no complete tokenize output for snapshot",
    )
    publish_tokens(make_config(root), DatasetRef.of(make_config(root), "decontaminate", SNAPSHOT))
    assert_one_line_exit_2(
        pretrain("card", "--snapshot", SNAPSHOT, "--stage", "tokenize", root=root), "holds no documents/"
    )


def test_the_quality_report_links_the_card_when_there_is_one(root):
    from pipeline.quality.page import write_page

    config = make_config(root)
    documents = publish_chain(config)["decontaminate"]
    report = DatasetRef.of(config, "quality", SNAPSHOT).path
    report.mkdir(parents=True)
    assert card.card_link(documents, report) is None
    write_page(report / "report.html", SNAPSHOT, {}, [], {}, [], None, card=None)
    assert "href" not in (report / "report.html").read_text()

    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    link = card.card_link(documents, report)
    write_page(report / "report.html", SNAPSHOT, {}, [], {}, [], None, card=link)
    (href,) = re.findall(r"href='([^']+)'", (report / "report.html").read_text())
    assert not href.startswith("/") and (report / href).resolve() == (documents.path / "README.md").resolve()


def test_a_run_writing_the_output_holds_the_card_off(root):
    """The card is written under the output's lock: a stage run that holds it makes `pretrain card` fail at once."""
    output = publish_chain(make_config(root))["decontaminate"]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from pipeline.core.locks import OutputLock\n"
            "with OutputLock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)",
            str(output.path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_one_line_exit_2(
            pretrain("card", "--snapshot", SNAPSHOT, root=root), "being written by another run"
        )
    finally:
        holder.kill()
        holder.wait()
    assert not (output.path / "README.md").exists()


def test_outputs_replaced_since_they_were_read_are_named_or_left_out(root):
    config = make_config(root)
    refs = publish_chain(config)
    publish_tokens(config, refs["decontaminate"])
    # dedup again, with other documents: classify read the earlier one.
    publish(config, "dedup", documents(47, offset=1000), DEDUP_DROPS, [refs["clean"]])
    # decontaminate again, other documents: the tokenize output read the earlier ones (the same bytes again
    # would be the same digest, and the same documents).
    publish(config, "decontaminate", documents(40, offset=2000), DECONTAMINATE_DROPS, [refs["classify"]])
    card.main(["--snapshot", SNAPSHOT, "--set", f"project.data_root={root}"])
    text = DatasetCard.load(refs["decontaminate"].path / "README.md").text
    assert "The dedup output was re-run after classify read it" in text
    assert "The classify output was re-run" not in text
    assert "## Tokens" not in text
