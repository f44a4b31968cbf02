"""The tokenizer a token-shard output was made with: the two files it carries and their digest.

What "the same tokenizer" means wherever ids must mean the same words: the tokenize stage and its stored
tokenizers (``pipeline.tokenization``) write and compare these, a training mixture refuses snapshots whose
digests differ (``pipeline.data.mixture``). It lives here, beside the shard format (``pipeline.data.shards``),
so that the stage writing token shards and the training reading them share it without importing each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from pipeline.core.manifest import Manifest, sha256_file
from pipeline.core.storage import StageFailure

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
DIGEST_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)


class TokenizerError(StageFailure):
    """A tokenizer cannot be stored, found or used; the message says which and what to do."""


def tokenizer_digest(checksums: Mapping[str, str]) -> str:
    """The digest of a tokenizer from the sha256 of its files (``DIGEST_FILES``): what "the same tokenizer"
    means everywhere (the tokenize manifest, a mixture's check, lineage)."""
    missing = [name for name in DIGEST_FILES if name not in checksums]
    if missing:
        raise ValueError(f"no checksum for {missing}: a tokenizer's digest covers {list(DIGEST_FILES)}")
    text = "".join(f"{name}:{checksums[name]}\n" for name in DIGEST_FILES)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def folder_digest(folder: Path) -> str:
    """The digest of the tokenizer files in ``folder``."""
    return tokenizer_digest({name: sha256_file(Path(folder) / name) for name in DIGEST_FILES})


def manifest_digest(manifest: Manifest) -> str:
    """The digest of the tokenizer a stored tokenizer's or a tokenize output's manifest describes."""
    recorded = (manifest.extra.get("tokenizer") or {}).get("digest")
    if recorded:
        return recorded
    try:
        return tokenizer_digest(
            {name: manifest.files[name].sha256 for name in DIGEST_FILES if name in manifest.files}
        )
    except ValueError:
        raise TokenizerError(
            f"{manifest.stage} {manifest.corpus}/{manifest.snapshot} lists no {' / '.join(DIGEST_FILES)}: "
            "no tokenizer to identify"
        ) from None
