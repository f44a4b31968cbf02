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


# --- one record's fault costs that record only -----------------------------------------------------------


def read_file(path: Path, fmt: str, **overrides) -> list[dict]:
    config = IngestConfig(sources=[str(path)], **{"max_record_bytes": MAX_RECORD_BYTES, **overrides})
    return list(READERS[fmt](str(path), fmt, path.stat().st_size, config, None))


def test_a_deeply_nested_jsonl_line_is_quarantined_alone_and_the_lines_after_it_are_read(tmp_path):
    """The second line an array nested 200,000 deep: it and every line after it were lost, and the file
    counted as one unreadable_file row."""
    path = tmp_path / "deep.jsonl"
    texts = [f"Document {i} has a few words of text." for i in range(4)]
    lines = [json.dumps({"text": texts[0]}).encode(), b"[" * 200_000 + b"]" * 200_000]
    lines += [json.dumps({"text": texts[i]}).encode() for i in (1, 2)]
    lines.append(
        json.dumps({"text": texts[3], "meta": {"a": [[[[[[[[1]]]]]]]]}})
        .encode()
        .replace(b"1", b"[" * 60 + b"1" + b"]" * 60)
    )
    path.write_bytes(b"\n".join(lines) + b"\n")
    rows = read_file(path, "jsonl", max_record_bytes=1 << 20)  # default max_json_depth: 64
    assert [row["source_record"] for row in rows] == [0, 1, 2, 3, 4]
    assert [row["drop_reason"] for row in rows] == [
        None,
        "too_deep: JSON nested more than 64 levels",
        None,
        None,
        "too_deep: JSON nested more than 64 levels",
    ]
    assert rows[2]["text"] == texts[1] and rows[3]["text"] == texts[2]


def test_one_invalid_utf8_url_in_parquet_costs_its_record_only(tmp_path):
    """One invalid UTF-8 value in a Parquet file's url column turned the whole row group (1,000 rows) into
    one quarantine row."""
    import pyarrow.parquet as pq

    from tests.ingest.sources import _strings

    urls = [f"https://site.example/page-{i}".encode() for i in range(1000)]
    urls[517] = b"https://bad.example/\xff\xfe"
    table = pa.table({"text": [f"Record {i} holds a sentence." for i in range(1000)], "url": _strings(urls)})
    path = tmp_path / "urls.parquet"
    pq.write_table(table, path, row_group_size=1000)
    rows = read_file(path, "parquet")
    assert len(rows) == 1000 and [row["source_record"] for row in rows] == list(range(1000))
    bad = [row for row in rows if row["drop_reason"]]
    assert [(row["source_record"], row["drop_reason"]) for row in bad] == [
        (517, "invalid_utf8: column url: byte 20")
    ]
    assert rows[518]["url"] == "https://site.example/page-518" and rows[518]["drop_reason"] is None


def test_symlinks_leading_out_of_a_source_folder_are_refused_and_counted(tmp_path):
    """File symlinks inside a source folder were followed anywhere (an outside document, /etc/passwd)."""
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"text": "a document from elsewhere"}) + "\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "own.jsonl").write_text(json.dumps({"text": "our document"}) + "\n")
    (corpus / "elsewhere.jsonl").symlink_to(outside)
    (corpus / "passwd.json").symlink_to("/etc/passwd")
    (corpus / "alias.jsonl").symlink_to(corpus / "own.jsonl")  # inside the folder: fine
    refused = []
    listed = list_sources([str(corpus)], refused=refused)
    assert sorted(Path(entry.path).name for entry in listed) == ["alias.jsonl", "own.jsonl"]
    assert sorted((Path(r.link).name, r.target) for r in refused) == [
        ("elsewhere.jsonl", str(outside)),
        ("passwd.json", "/etc/passwd"),
    ]
    # A glob is held to its fixed part; the setting follows links on purpose.
    refused.clear()
    globbed = list_sources([str(corpus / "*.jsonl")], refused=refused)
    assert [Path(e.path).name for e in globbed] == ["own.jsonl"]  # alias.jsonl is own.jsonl
    assert [r.target for r in refused] == [str(outside)]
    followed = list_sources([str(corpus)], follow_symlinks=True)
    assert len(followed) == 4
    with pytest.raises(ConfigError, match="1 symbolic link"):
        list_sources([str(corpus / "passwd*.json")])
