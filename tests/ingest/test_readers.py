"""Each reader on its own, without Spark: documents with stable ids, hostile records with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.core.config import ConfigError
from pipeline.core.manifest import sha256_file
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers import READERS, SKIPPED, byte_ranges, checksum_batches, text_id, url_id
from pipeline.ingest.sources import format_of, list_sources
from tests.ingest.sources import ARTICLES, MAX_RECORD_BYTES, text, url, write_all


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sources")
    return folder, write_all(folder)


def settings(folder) -> IngestConfig:
    return IngestConfig(
        sources=[str(folder)],
        id_column="doc_id",
        metadata_columns=["lang_hint"],
        max_record_bytes=MAX_RECORD_BYTES,
    )


def read(folder, fmt: str, part: int | None = None) -> list[dict]:
    config = settings(folder)
    rows = []
    for source in list_sources(config.sources):
        if source.format == fmt:
            rows += list(READERS[fmt](source.path, fmt, source.bytes, config, part))
    return [row for row in rows if not (row["drop_reason"] or "").startswith(SKIPPED)]


def reasons(rows: list[dict]) -> set[str]:
    return {row["drop_reason"].split(":", 1)[0] for row in rows if row["drop_reason"]}


def expected_ids(expected: dict) -> set[str]:
    ids = set()
    for key in expected["documents"]:
        if key.startswith("https://"):
            ids.add(url_id(key))
        elif key.startswith("text:"):
            ids.add(text_id(text(int(key.split(":")[1]))))
        else:
            ids.add(key)
    return ids


def test_the_listing_expands_folders_and_tells_formats_by_extension(written, tmp_path):
    folder, _ = written
    listed = list_sources([str(folder)])
    assert {source.format for source in listed} == {"warc", "wet", "jsonl", "parquet", "arrow"}
    # A save_to_disk folder: its shards in order, its state.json / dataset_info.json / dataset_dict.json
    # are metadata, not JSON Lines.
    hf = [
        Path(source.path).relative_to(folder / "hf_dataset")
        for source in listed
        if "hf_dataset" in source.path
    ]
    assert [str(path) for path in hf] == [
        "test/data-00000-of-00001.arrow",
        "train/data-00000-of-00002.arrow",
        "train/data-00001-of-00002.arrow",
        "validation/data-00000-of-00001.arrow",
    ]
    assert format_of("data-00000-of-00001.arrow") == "arrow"
    assert format_of("CC-MAIN-2026-00001.warc.wet.gz") == "wet"
    assert format_of("CC-MAIN-2026-00001.warc.gz") == "warc"
    assert format_of("part.jsonl.gz") == "jsonl" and format_of("x.txt") is None
    with pytest.raises(ConfigError, match="names no readable source file"):
        list_sources([str(tmp_path / "nothing-*.jsonl")])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="cannot tell the format"):
        list_sources([str(tmp_path / "notes.txt")])


@pytest.mark.parametrize("fmt", ["warc", "wet", "jsonl", "parquet", "arrow"])
def test_each_format_gives_its_documents_and_quarantines_hostile_records(written, fmt):
    folder, expected = written
    rows = read(folder, fmt)
    documents = [row for row in rows if row["drop_reason"] is None]
    assert {row["id"] for row in documents} == expected_ids(expected[fmt])
    assert reasons(rows) == expected[fmt]["excluded"]
    if "records" in expected[fmt]:
        assert len(rows) == expected[fmt]["records"]
    for row in documents:
        assert row["text"].strip() and row["charset"]
        assert row["source_file"].startswith(str(folder)) and row["source_record"] >= 0


def test_urls_give_the_crawl_paths_ids_and_metadata_is_kept(written):
    folder, _ = written
    by_id = {row["id"]: row for row in read(folder, "jsonl") if row["drop_reason"] is None}
    assert by_id["jsonl-8"]["url"] == url(8) and by_id["jsonl-8"]["domain"] == "articles.example.org"
    assert by_id["jsonl-8"]["metadata"] == '{"lang_hint": "en"}'
    warc = {row["url"]: row for row in read(folder, "warc") if row["drop_reason"] is None}
    assert warc[url(0)]["id"] == url_id(url(0)) and warc[url(0)]["fetch_time"].year == 2026
    # The crawl path's id (clean: substring(sha1(url), 1, 16)).
    import hashlib

    assert url_id(url(0)) == hashlib.sha1(url(0).encode()).hexdigest()[:16]


def test_a_text_hash_id_does_not_depend_on_whitespace_or_normalisation():
    assert text_id("A  line.\n\n\n\nAnother  one.") == text_id("A line.\n\nAnother one.")


def test_a_parquet_row_group_is_read_alone_and_numbered_within_its_file(written):
    folder, _ = written
    config = settings(folder)
    path = str(folder / "with_ids.parquet")
    whole = list(READERS["parquet"](path, "parquet", 0, config))
    parts = [row for group in (0, 1) for row in READERS["parquet"](path, "parquet", 0, config, group)]
    assert parts == whole and [row["source_record"] for row in parts] == [0, 1, 2, 3]


def test_a_large_jsonl_file_read_in_pieces_gives_the_whole_files_records(tmp_path):
    """Pieces of any size, boundaries inside lines, blank lines and an oversized line included: the
    checksum pass numbers the pieces, and their records together are the whole file's, in order."""
    lines = [
        json.dumps({"doc_id": f"d{i}", "text": text(i % len(ARTICLES))[: 40 + 7 * i]}) for i in range(12)
    ]
    lines[3:3] = ["", "   "]
    lines[7] = json.dumps({"doc_id": "huge", "text": "y" * 300})  # over the cap below: skipped in pieces
    lines[9] = "{not json"
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines))  # no newline after the last line
    size = path.stat().st_size
    whole_config = IngestConfig(id_column="doc_id", max_record_bytes=200, split_bytes=0)
    whole = list(READERS["jsonl"](str(path), "jsonl", size, whole_config))
    assert len(whole) == 12 and reasons(whole) == {"too_large", "invalid_json"}
    for split_bytes in (1, 2, 5, 64, 97, 250, size - 1):
        config = whole_config.model_copy(update={"split_bytes": split_bytes})
        listed = pa.RecordBatch.from_pylist([{"path": str(path), "format": "jsonl", "bytes": size}])
        (checked,) = checksum_batches(iter([listed]), config)
        assert checked.column("sha256")[0].as_py() == sha256_file(path)
        pieces = byte_ranges(size, config, checked.column("records_before")[0].as_py())
        assert len(pieces) == -(-size // split_bytes)
        rows = [row for piece in pieces for row in READERS["jsonl"](str(path), "jsonl", size, config, piece)]
        assert rows == whole, split_bytes
