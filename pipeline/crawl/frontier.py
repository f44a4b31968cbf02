"""The set of URLs a shard will request: canonical de-duplication, same-site, depth and page limits."""

from __future__ import annotations

import contextlib
from collections import Counter

from pipeline.crawl.journal import Entry, Journal, JournalState
from pipeline.documents.urls import InvalidURL, canonical_url, fetchable_url, registered_domain


class Frontier:
    """Admits each canonical URL once, journaling it, and says why it refused the others."""

    def __init__(
        self,
        sites: set[str],
        max_pages: int,
        max_depth: int,
        journal: Journal | None = None,
        state: JournalState | None = None,
    ) -> None:
        self.sites = set(sites)
        self.max_pages = max_pages
        self.max_depth = max_depth
        self.journal = journal
        self.seen: set[str] = set()
        self.pages = 0
        self.skipped: Counter[str] = Counter()
        if state is not None:
            for entry in state.entries.values():
                self.seen.add(entry.key)
                self.pages += entry.kind == "page"
            for event in state.done.values():  # a redirect's final URL counts as seen too
                self._see(event["row"]["url"])

    def _see(self, url: str) -> None:
        with contextlib.suppress(InvalidURL):
            self.seen.add(canonical_url(url))

    def admit(
        self, url: str, depth: int, kind: str = "page", check_depth: bool = True
    ) -> tuple[Entry | None, str]:
        """(entry, "queued") for a new URL, else (None, why): invalid_url, off_site, duplicate, ..."""
        try:
            key = canonical_url(url)
            fetch = fetchable_url(url)
        except InvalidURL as exc:
            return self._skip(exc.reason)
        if registered_domain(key) not in self.sites:
            return self._skip("off_site")
        if key in self.seen:
            return self._skip("duplicate")
        if kind == "page":
            if check_depth and depth > self.max_depth:
                return self._skip("beyond_depth")
            if self.pages >= self.max_pages:
                return self._skip("page_limit")
            self.pages += 1
        self.seen.add(key)
        entry = Entry(key, fetch, depth, kind)
        if self.journal is not None:
            self.journal.enqueue(entry)
        return entry, "queued"

    def claim_redirect(self, url: str) -> str | None:
        """Let a redirect fetch ``url`` (and mark it seen), or say why not."""
        try:
            key = canonical_url(url)
        except InvalidURL as exc:
            return f"redirect_{exc.reason}"
        if registered_domain(key) not in self.sites:
            return "redirect_off_site"
        if key in self.seen:
            return "duplicate_redirect"
        self.seen.add(key)
        return None

    def _skip(self, reason: str) -> tuple[None, str]:
        self.skipped[reason] += 1
        return None, reason
