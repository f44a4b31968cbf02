"""Clean stage: extract main text from WARC, normalise, identify the language, apply the FineWeb recipe's
quality filters and redact PII, in Spark. See docs/clean.md."""
