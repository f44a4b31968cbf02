"""Which files an ingest reads: globs, folders and URIs expanded to files, each with its format.

Listing happens in the driver and touches metadata only; the files are read (and checksummed) in Spark tasks.
"""

from __future__ import annotations

import glob
import itertools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.config import ConfigError

log = logging.getLogger(__name__)

# Longest suffix first: Common Crawl names its WET files *.warc.wet.gz.
SUFFIXES = (
    (".wet.gz", "wet"),
    (".wet", "wet"),
    (".warc.gz", "warc"),
    (".warc", "warc"),
    (".jsonl.gz", "jsonl"),
    (".jsonl", "jsonl"),
    (".ndjson.gz", "jsonl"),
    (".ndjson", "jsonl"),
    (".json.gz", "jsonl"),
    (".json", "jsonl"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),  # a Hugging Face dataset's save_to_disk shards (Arrow IPC streams)
)
# The JSON files Hugging Face's save_to_disk writes beside its .arrow shards (and above a DatasetDict's
# split folders): metadata, not JSON Lines records.
HF_DATASET_MARKERS = ("state.json", "dataset_dict.json")
HF_DATASET_METADATA = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})


@dataclass(frozen=True)
class SourceFile:
    path: str  # absolute local path, or a URI pyarrow opens
    format: str  # warc | wet | jsonl | parquet | arrow
    bytes: int


def format_of(name: str) -> str | None:
    lowered = name.lower()
    for suffix, fmt in SUFFIXES:
        if lowered.endswith(suffix):
            return fmt
    return None


def is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _listed(path: str, size: int, fmt: str) -> SourceFile | None:
    """A file found in a folder: None when its format is unknown (_SUCCESS, README are not sources)."""
    chosen = format_of(path) if fmt == "auto" else fmt
    return SourceFile(path, chosen, size) if chosen is not None else None


def _named(path: str, size: int, fmt: str) -> SourceFile:
    """A file the user named: its format must be known."""
    entry = _listed(path, size, fmt)
    if entry is None:
        raise ConfigError(f"ingest.sources: cannot tell the format of {path!r}; set ingest.format")
    return entry


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _hf_metadata(name: str, siblings: set[str]) -> bool:
    """A save_to_disk folder's own JSON files (its folder holds state.json or dataset_dict.json)."""
    return name in HF_DATASET_METADATA and any(marker in siblings for marker in HF_DATASET_MARKERS)


@dataclass(frozen=True)
class RefusedLink:
    """A file reached through a symbolic link that leads outside the folder (or glob base) named."""

    link: str
    target: str


def list_sources(
    patterns: Iterable[str],
    fmt: str = "auto",
    follow_symlinks: bool = False,
    refused: list[RefusedLink] | None = None,
) -> list[SourceFile]:
    """Every file the patterns name, sorted and once each; a pattern that names nothing is a config error.

    A file found inside a named folder (or matched by a glob) through a symbolic link that leads outside
    that folder (or the glob's fixed part) is refused unless ``follow_symlinks``: a link in a corpus folder
    to /etc/passwd must not become a document. Refused links are logged and appended to ``refused``.
    """
    found: dict[str, SourceFile] = {}
    for pattern in patterns:
        refused_here: list[RefusedLink] = []
        if is_uri(pattern):
            files = _list_uri(pattern, fmt)
        else:
            files = _list_local(_local_path(pattern), fmt, follow_symlinks, refused_here)
        for link in refused_here:
            log.warning(
                "ingest.sources: %s links to %s, outside %s; not read (ingest.follow_symlinks=true reads it)",
                link.link,
                link.target,
                pattern,
            )
        if refused is not None:
            refused.extend(refused_here)
        if not files:
            also = (
                f" ({len(refused_here)} symbolic link(s) leading outside it refused)" if refused_here else ""
            )
            raise ConfigError(f"ingest.sources: {pattern!r} names no readable source file{also}")
        for entry in files:
            found.setdefault(entry.path, entry)
    return [found[path] for path in sorted(found)]


def _glob_base(pattern: str) -> Path:
    """The fixed folder a glob starts from: its path up to the first part with a wildcard."""
    parts = Path(pattern).parts
    fixed = [part for part in itertools.takewhile(lambda part: not glob.has_magic(part), parts)]
    return Path(*fixed[:-1] if len(fixed) == len(parts) else fixed) if fixed else Path(".")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _list_local(
    pattern: str, fmt: str, follow_symlinks: bool, refused: list[RefusedLink]
) -> list[SourceFile]:
    files = []
    pattern = os.path.expanduser(pattern)
    base = _glob_base(pattern).resolve() if glob.has_magic(pattern) else None
    for match in sorted(glob.glob(pattern, recursive=True)):
        path = Path(match).resolve()
        if base is not None and not follow_symlinks and not _inside(path, base):
            refused.append(RefusedLink(os.path.abspath(match), str(path)))
            continue
        if path.is_dir():
            names_by_folder: dict[Path, set[str]] = {}
            for child in sorted(path.rglob("*")):
                if not child.is_file() or _hidden(child.name):
                    continue
                if child.is_symlink() and not follow_symlinks:
                    target = child.resolve()
                    if not _inside(target, path):
                        refused.append(RefusedLink(str(child), str(target)))
                        continue
                if child.parent not in names_by_folder:
                    names_by_folder[child.parent] = {sibling.name for sibling in child.parent.iterdir()}
                if _hf_metadata(child.name, names_by_folder[child.parent]):
                    continue
                entry = _listed(str(child), child.stat().st_size, fmt)
                if entry is not None:
                    files.append(entry)
        elif path.is_file():
            entry = _named(str(path), path.stat().st_size, fmt)
            files.append(entry)
    return files


def _list_uri(uri: str, fmt: str) -> list[SourceFile]:
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(uri)
    scheme = uri.split("://", 1)[0]
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [_named(uri, info.size, fmt)]
    if info.type != pafs.FileType.Directory:
        return []
    children = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    names_by_folder: dict[str, set[str]] = {}
    for child in children:
        names_by_folder.setdefault(child.path.rsplit("/", 1)[0], set()).add(child.base_name)
    files = []
    for child in children:
        siblings = names_by_folder[child.path.rsplit("/", 1)[0]]
        if (
            child.type == pafs.FileType.File
            and not _hidden(child.base_name)
            and not _hf_metadata(child.base_name, siblings)
        ):
            entry = _listed(f"{scheme}://{child.path}", child.size, fmt)
            if entry is not None:
                files.append(entry)
    return sorted(files, key=lambda entry: entry.path)


def open_source(path: str):
    """A binary stream over the file's raw bytes (no transparent decompression: readers handle gzip)."""
    if is_uri(path):
        from pyarrow import fs as pafs

        filesystem, inner = pafs.FileSystem.from_uri(path)
        return filesystem.open_input_file(inner)
    return open(_local_path(path), "rb")
