"""Crawl stage: polite Scrapy crawls written as WARC plus a Parquet fetch index."""
