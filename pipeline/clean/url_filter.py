"""URL blocklists, the first thing the clean stage checks, before a page is read from its WARC record.

What can drop a page, in this order (an allow-list entry that covers the URL wins over all of them):

* ``url.domain:<category>``: its host is a listed domain or below one (``example.com`` covers
  ``www.example.com`` and ``a.b.example.com``, not ``notexample.com``);
* ``url.url:<category>``: host and path start with a listed URL (``example.com/forum`` covers
  ``https://www.example.com/forum/t/1``, not ``/forums``; a leading ``www.`` is ignored on both sides);
* ``url.banned_word``: a word of the URL (its runs of letters and digits, lower-cased) is a banned word;
* ``url.soft_banned_words``: at least ``soft_banned_threshold`` distinct soft-banned words are words of it;
* ``url.banned_subword``: a banned subword occurs in the URL with everything but letters and digits removed.

The last three are datatrove's ``URLFilter`` rules (which do not lower-case; we do). Lists are files the user
names: the UT1 layout (``<root>/<category>/domains`` and ``urls``, as a folder or the ``blacklists.tar.gz``
archive, categories chosen by ``categories``), or plain lists (one entry a line; an entry with a ``/`` is a
URL, else a domain; ``#`` starts a comment); the category of a plain list is its file name. None ships
with the project.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
from pydantic import Field

from pipeline.core.config import Section

_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
UT1_FILES = ("domains", "urls")


class UrlList(Section):
    path: str = Field(
        description="a UT1 folder or .tar.gz (<category>/domains, <category>/urls), or a plain list file"
    )
    categories: list[str] | None = Field(None, description="UT1: the categories to read (null: all of them)")


class UrlFilterConfig(Section):
    """clean.url_filter: nothing is checked until a list is named."""

    blocklists: list[UrlList] = Field(default_factory=list)
    allowlists: list[UrlList] = Field(
        default_factory=list, description="entries here are never dropped by a URL rule"
    )
    banned_words: list[str] = Field(default_factory=list, description="files of words, one a line")
    soft_banned_words: list[str] = Field(default_factory=list, description="files of words, one a line")
    soft_banned_threshold: int = Field(2, ge=1, description="distinct soft-banned words that drop a URL")
    banned_subwords: list[str] = Field(default_factory=list, description="files of subwords, one a line")

    @property
    def enabled(self) -> bool:
        return bool(self.blocklists or self.banned_words or self.soft_banned_words or self.banned_subwords)


def _entries(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        entry = line.split("#", 1)[0].strip().lower()
        if entry:
            yield entry


def _strip_www(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def _parse_url_entry(entry: str) -> tuple[str, str]:
    """(host, path prefix) of a list entry such as ``example.com/forum`` or ``http://example.com/a``."""
    if "://" in entry:
        entry = entry.split("://", 1)[1]
    host, _, path = entry.partition("/")
    return _strip_www(host.split(":", 1)[0]), "/" + path.rstrip("/") if path else "/"


@dataclass
class UrlLists:
    """Domains and URL prefixes, each with the category (list) that named it."""

    domains: dict[str, str] = field(default_factory=dict)
    urls: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # host -> [(path prefix, category)]

    def add(self, kind: str, entries: Iterable[str], category: str) -> None:
        for entry in entries:
            if kind == "urls" or (kind == "plain" and "/" in entry):
                host, path = _parse_url_entry(entry)
                self.urls.setdefault(host, []).append((path, category))
            else:
                self.domains.setdefault(_strip_www(entry.split(":", 1)[0].rstrip(".")), category)

    def __len__(self) -> int:
        return len(self.domains) + sum(len(v) for v in self.urls.values())

    def domain_hit(self, host: str) -> tuple[str, str] | None:
        """(listed domain, category) covering ``host`` or one of its parent domains."""
        labels = host.split(".")
        for start in range(len(labels)):
            suffix = ".".join(labels[start:])
            category = self.domains.get(suffix)
            if category is not None:
                return suffix, category
        return None

    def url_hit(self, host: str, path: str) -> tuple[str, str] | None:
        for prefix, category in self.urls.get(_strip_www(host), ()):
            if (
                prefix == "/"
                or path == prefix
                or path.startswith(prefix + "/")
                or path.startswith(prefix + "?")
            ):
                return prefix, category
        return None


def read_lists(specs: Iterable[UrlList]) -> tuple[UrlLists, dict[str, int]]:
    """Every list named, and how many entries each category brought."""
    lists = UrlLists()
    sizes: dict[str, int] = {}
    for spec in specs:
        path = Path(spec.path).expanduser()
        wanted = None if spec.categories is None else set(spec.categories)
        if path.is_dir():
            for file in sorted(path.glob("*/*")):
                category = file.parent.name
                if file.name in UT1_FILES and (wanted is None or category in wanted):
                    entries = list(_entries(file.read_text(encoding="utf-8", errors="replace").splitlines()))
                    lists.add(file.name, entries, category)
                    sizes[category] = sizes.get(category, 0) + len(entries)
        elif path.name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(path) as archive:
                for member in archive.getmembers():
                    parts = Path(member.name).parts
                    if not member.isfile() or len(parts) < 2 or parts[-1] not in UT1_FILES:
                        continue
                    category = parts[-2]
                    if wanted is not None and category not in wanted:
                        continue
                    extracted = archive.extractfile(member)
                    assert extracted is not None  # a regular file, checked above
                    text = extracted.read().decode("utf-8", errors="replace")
                    entries = list(_entries(text.splitlines()))
                    lists.add(parts[-1], entries, category)
                    sizes[category] = sizes.get(category, 0) + len(entries)
        elif path.is_file():
            category = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.name.split(".", 1)[0]) or "list"
            entries = list(_entries(path.read_text(encoding="utf-8", errors="replace").splitlines()))
            lists.add("plain", entries, category)
            sizes[category] = sizes.get(category, 0) + len(entries)
        else:
            from pipeline.core.config import ConfigError

            raise ConfigError(f"clean.url_filter: no list at {spec.path}")
    return lists, sizes


def _word_file(paths: Iterable[str]) -> frozenset[str]:
    words: set[str] = set()
    for name in paths:
        words.update(
            _entries(Path(name).expanduser().read_text(encoding="utf-8", errors="replace").splitlines())
        )
    return frozenset(words)


@dataclass
class UrlFilter:
    """The loaded lists; built once in the driver, shared with the workers (``pipeline.core.spark.share``)."""

    blocked: UrlLists
    allowed: UrlLists
    banned_words: frozenset[str] = frozenset()
    soft_banned_words: frozenset[str] = frozenset()
    soft_banned_threshold: int = 2
    banned_subwords: re.Pattern | None = None
    sizes: dict[str, int | dict[str, int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: UrlFilterConfig) -> UrlFilter | None:
        if not config.enabled:
            return None
        blocked, sizes = read_lists(config.blocklists)
        allowed, allowed_sizes = read_lists(config.allowlists)
        subwords = sorted(_word_file(config.banned_subwords), key=len, reverse=True)
        banned, soft = _word_file(config.banned_words), _word_file(config.soft_banned_words)
        return cls(
            blocked=blocked,
            allowed=allowed,
            banned_words=banned,
            soft_banned_words=soft,
            soft_banned_threshold=config.soft_banned_threshold,
            banned_subwords=re.compile("|".join(map(re.escape, subwords))) if subwords else None,
            sizes={
                "blocklists": sizes,
                "allowlists": allowed_sizes,
                "banned_words": len(banned),
                "soft_banned_words": len(soft),
                "banned_subwords": len(subwords),
            },
        )

    def check(self, url: str | None) -> tuple[str, str] | None:
        """(rule, reason) when the URL is dropped, else None."""
        if not url:
            return None
        lowered = url.strip().lower()
        try:
            parts = urlsplit(lowered if "://" in lowered else f"//{lowered}")
            host = (parts.hostname or "").rstrip(".")
        except ValueError:
            host, parts = "", None
        path = (parts.path or "/") if parts is not None else "/"
        if host and (self.allowed.domain_hit(host) or self.allowed.url_hit(host, path)):
            return None
        if host:
            hit = self.blocked.domain_hit(host)
            if hit:
                return f"url.domain:{hit[1]}", f"url.domain:{hit[1]}: {host} is under listed domain {hit[0]}"
            hit = self.blocked.url_hit(host, path)
            if hit:
                return (
                    f"url.url:{hit[1]}",
                    f"url.url:{hit[1]}: {_strip_www(host)}{path} starts with listed {hit[0]}",
                )
        words = set(_WORD_SPLIT.split(lowered))
        banned = sorted(words & self.banned_words)
        if banned:
            return "url.banned_word", f"url.banned_word: {', '.join(banned[:5])}"
        soft = sorted(words & self.soft_banned_words)
        if len(soft) >= self.soft_banned_threshold:
            return "url.soft_banned_words", (
                f"url.soft_banned_words: {len(soft)} ({', '.join(soft[:5])}) >= {self.soft_banned_threshold}"
            )
        if self.banned_subwords is not None:
            found = self.banned_subwords.search(_NOT_ALNUM.sub("", lowered))
            if found:
                return "url.banned_subword", f"url.banned_subword: {found.group(0)}"
        return None


URL_MARKED_FIELDS = [pa.field("url_rule", pa.string()), pa.field("url_reason", pa.string())]


def mark_batches(batches: Iterator[pa.RecordBatch], url_filter) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: each batch with ``url_rule`` and ``url_reason`` (null when the URL passes);
    ``url_filter`` is a shared ``UrlFilter`` (``pipeline.core.spark.share``)."""
    checker = url_filter.value
    for batch in batches:
        results = [checker.check(url) for url in batch.column("url").to_pylist()]
        yield pa.RecordBatch.from_arrays(
            [
                *batch.columns,
                pa.array([r[0] if r else None for r in results], pa.string()),
                pa.array([r[1][:500] if r else None for r in results], pa.string()),
            ],
            schema=pa.schema([*batch.schema, *URL_MARKED_FIELDS]),
        )
