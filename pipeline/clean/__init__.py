"""Clean stage: extract main text from WARC, normalise, filter and de-duplicate, in Spark."""
