"""Ingest: existing corpora (Common Crawl WARC/WET, JSONL, Parquet) into the clean stage's input contract."""
