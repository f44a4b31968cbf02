"""Tokenizers as artifacts of their own: trained once (or brought) and stored by name under the data root.

    <data_root>/<corpus>/tokenizer/<name>/     tokenizer.json, tokenizer_config.json, manifest.json, _SUCCESS
    <data_root>/<corpus>/tokenizer/default     -> <name>: the corpus's first stored tokenizer

A stored tokenizer is published like any stage output (``StageOutput``: staging folder, atomic rename, one
writer) and never replaced: a name, once stored, always means the same ids. Its **digest** is a hash of the
sha256 of its two files (``pipeline.data.tokenizer_files``, shared with the training side); the tokenize stage copies both files into its own output, so a
tokenize output's digest can be checked from its manifest alone, also for outputs written before tokenizers
were stored (the files' checksums are in every manifest).

``tokenize.tokenizer`` picks one per snapshot (``resolve_for_snapshot`` in the stage): ``default`` (the
corpus's default, trained on the first snapshot tokenized when there is none yet), a name (``NAME``, or
``CORPUS/NAME`` for another corpus's), or ``snapshot`` (a BPE of this snapshot's own, as before).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import CoreConfig
from pipeline.core.locks import lock_path
from pipeline.core.manifest import Manifest
from pipeline.core.snapshots import complete_snapshots
from pipeline.core.storage import DatasetRef, MissingInputError, StageOutput, local_path
from pipeline.data.tokenizer_files import (
    DIGEST_FILES,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TokenizerError,
    folder_digest,
    manifest_digest,
)
from pipeline.tokenization.bpe import write_tokenizer_config

log = logging.getLogger(__name__)

TOKENIZER_STAGE = "tokenizer"  # <corpus>/tokenizer/<name>/: the stage-like folder tokenizers live in
DEFAULT_POINTER = "default"
DEFAULT_CHOICE = "default"  # tokenize.tokenizer: the corpus's default
SNAPSHOT_CHOICE = "snapshot"  # tokenize.tokenizer: a BPE trained on the snapshot alone
RESERVED_NAMES = (DEFAULT_CHOICE, SNAPSHOT_CHOICE, "latest")
# End-of-text tokens of well-known tokenizers, tried in this order when an imported file names none:
# GPT-2 and most BPEs, Llama 3, Llama 2 / Mistral / T5, Gemma.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def validate_name(name: str) -> str:
    """A tokenizer name: a snapshot-like name that is not one of the reserved choices."""
    from pipeline.core.storage import SNAPSHOT_PATTERN

    if not SNAPSHOT_PATTERN.fullmatch(name or "") or name in RESERVED_NAMES:
        raise TokenizerError(
            f"tokenizer name {name!r} must match {SNAPSHOT_PATTERN.pattern} and not be one of {list(RESERVED_NAMES)}"
        )
    return name


@dataclass(frozen=True)
class StoredTokenizer:
    """One stored tokenizer: where it is and what its manifest says."""

    ref: DatasetRef
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.ref.snapshot

    @property
    def corpus(self) -> str:
        return self.ref.corpus

    @property
    def path(self) -> Path:
        return self.ref.path

    @property
    def digest(self) -> str:
        return self.manifest.extra["tokenizer"]["digest"]

    @property
    def facts(self) -> dict[str, Any]:
        """vocab_size, eos/pad tokens and ids, split_cjk: what the tokenize manifest repeats."""
        return self.manifest.extra["tokenizer"]

    def describe(self) -> dict[str, Any]:
        """How a tokenize manifest names the tokenizer it used."""
        return {
            "name": self.name,
            "corpus": self.corpus,
            "digest": self.digest,
            "kind": self.facts["kind"],
            "path": str(self.path),
        }

    def copy_into(self, folder: Path) -> None:
        for name in DIGEST_FILES:
            shutil.copyfile(self.path / name, Path(folder) / name)


def tokenizer_ref(root: str, corpus: str, name: str) -> DatasetRef:
    return DatasetRef(root, corpus, TOKENIZER_STAGE, validate_name(name))


def parse_reference(reference: str, corpus: str) -> tuple[str, str]:
    """(corpus, name) of ``NAME`` (this corpus's) or ``CORPUS/NAME``."""
    owner, sep, name = reference.rpartition("/")
    return (owner if sep else corpus), name


def stored_names(root: str, corpus: str) -> list[str]:
    return [name for name in complete_snapshots(root, corpus, TOKENIZER_STAGE) if name not in RESERVED_NAMES]


def load_stored(root: str, corpus: str, name: str) -> StoredTokenizer:
    """The stored tokenizer ``corpus/name``; a clear error, listing what is stored, when there is none."""
    ref = tokenizer_ref(root, corpus, name)
    if not ref.is_complete():
        known = stored_names(root, corpus)
        raise MissingInputError(
            f"no stored tokenizer {corpus}/{name} at {ref.path}; {corpus} has "
            f"{known or 'none'} (`pretrain tokenizer list`, `pretrain tokenizer train` or `import`)"
        )
    return StoredTokenizer(ref, ref.manifest())


def default_name(root: str, corpus: str) -> str | None:
    """The name the corpus's ``default`` pointer holds, if any."""
    try:
        return os.readlink(local_path(root) / corpus / TOKENIZER_STAGE / DEFAULT_POINTER)
    except OSError:
        return None


def default_tokenizer(root: str, corpus: str) -> StoredTokenizer | None:
    name = default_name(root, corpus)
    return None if name is None else load_stored(root, corpus, name)


def resolve_reference(config: CoreConfig, reference: str) -> StoredTokenizer:
    """``NAME`` or ``CORPUS/NAME`` (``default`` or ``CORPUS/default``: that corpus's default)."""
    corpus, name = parse_reference(reference, config.project.corpus)
    if name == DEFAULT_CHOICE:
        found = default_tokenizer(config.project.data_root, corpus)
        if found is None:
            raise MissingInputError(f"corpus {corpus} has no default tokenizer yet")
        return found
    return load_stored(config.project.data_root, corpus, name)


def _point_default_if_unset(root: str, corpus: str, name: str) -> bool:
    """Make ``name`` the corpus's default unless one is set; True if it now is. ``symlink`` fails when the
    pointer exists, so two writers cannot both set it."""
    pointer = local_path(root) / corpus / TOKENIZER_STAGE / DEFAULT_POINTER
    pointer.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(name, pointer)
    except FileExistsError:
        return False
    log.info("%s/%s is now the corpus's default tokenizer", corpus, name)
    return True


@contextlib.contextmanager
def default_lock(root: str, corpus: str) -> Iterator[None]:
    """Held while a corpus's default tokenizer is chosen: a second first-time tokenize waits here (logging
    who it waits for) and then uses the tokenizer the first one stored."""
    folder = local_path(root) / corpus / TOKENIZER_STAGE
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(folder / DEFAULT_POINTER), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace") or "another run"
            log.info("waiting for %s to store corpus %s's default tokenizer", holder, corpus)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid()}).encode(), 0)
        yield
    finally:
        os.close(fd)


def publish(
    config: CoreConfig,
    corpus: str,
    name: str,
    write: Callable[[Path], dict[str, Any]],
    inputs: Sequence[DatasetRef] = (),
) -> StoredTokenizer:
    """Store a new tokenizer: ``write(folder)`` puts ``tokenizer.json`` and ``tokenizer_config.json`` into
    ``folder`` and returns its facts (``kind``, ``eos_token``, ``pad_token``, ...); the manifest gets them with
    the digest. A name already stored is refused: a stored tokenizer is never replaced."""
    ref = tokenizer_ref(config.project.data_root, corpus, name)
    if ref.is_complete():
        raise TokenizerError(
            f"tokenizer {corpus}/{name} is already stored (digest {manifest_digest(ref.manifest())}); a stored "
            "tokenizer is never replaced, so token ids keep their meaning: choose another name"
        )
    with StageOutput(ref, config, list(inputs)) as out:
        if ref.is_complete():  # stored by another run between the check above and taking the lock
            raise TokenizerError(f"tokenizer {corpus}/{name} was stored by another run meanwhile")
        facts = write(out.path)
        facts = {**facts, **special_token_facts(out.path, facts["eos_token"], facts.get("pad_token"))}
        facts["digest"] = folder_digest(out.path)
        manifest = out.commit(rows={"vocab_size": facts["vocab_size"]}, extra={"tokenizer": facts})
    log.info(
        "stored tokenizer %s/%s (digest %s, %d tokens)", corpus, name, facts["digest"], facts["vocab_size"]
    )
    _point_default_if_unset(config.project.data_root, corpus, name)
    return StoredTokenizer(ref, manifest)


def special_token_facts(folder: Path, eos_token: str, pad_token: str | None) -> dict[str, Any]:
    """Vocabulary size and the ids of the end-of-text and padding tokens, checked against the file."""
    from tokenizers import Tokenizer

    from pipeline.tokenization.encoder import vocabulary_size

    tokenizer = Tokenizer.from_file(str(Path(folder) / TOKENIZER_FILE))
    eos_id = tokenizer.token_to_id(eos_token)
    if eos_id is None:
        raise TokenizerError(f"the tokenizer has no end-of-text token {eos_token!r}")
    pad_id = tokenizer.token_to_id(pad_token) if pad_token is not None else None
    if pad_token is not None and pad_id is None:
        raise TokenizerError(f"the tokenizer has no padding token {pad_token!r}")
    return {
        "vocab_size": vocabulary_size(tokenizer),
        "eos_token": eos_token,
        "eos_id": eos_id,
        "pad_token": pad_token,
        "pad_id": pad_id,
    }


def ensure_default(
    config: CoreConfig,
    corpus: str,
    name: str,
    write: Callable[[Path], dict[str, Any]],
    inputs: list[DatasetRef],
) -> StoredTokenizer:
    """The corpus's default tokenizer, storing ``write``'s as ``name`` when the corpus has none yet.

    Under ``default_lock``: of two runs that both find no default, the first stores one and the second waits,
    then uses it, so a corpus never gets two defaults. A tokenizer ``name`` left stored without the pointer
    (a run killed between the two) is adopted rather than trained again.
    """
    root = config.project.data_root
    with default_lock(root, corpus):
        current = default_name(root, corpus)
        if current is not None:
            return load_stored(root, corpus, current)
        if tokenizer_ref(root, corpus, name).is_complete():
            log.warning("adopting the stored tokenizer %s/%s as the corpus's default", corpus, name)
            _point_default_if_unset(root, corpus, name)
            return load_stored(root, corpus, name)
        return publish(config, corpus, name, write, inputs)


# --- importing a tokenizer the user has -------------------------------------------------------------------


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json write it: a string or {content}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _declared_special_tokens(folder: Path) -> dict[str, str]:
    """eos/pad tokens named by a transformers folder's tokenizer_config.json or special_tokens_map.json."""
    found: dict[str, str] = {}
    for file_name in ("special_tokens_map.json", TOKENIZER_CONFIG_FILE):  # the latter wins
        path = folder / file_name
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{path} is not valid JSON: {exc}") from None
            for key in ("eos_token", "pad_token"):
                if (token := _token_text(data.get(key))) is not None:
                    found[key] = token
    return found


def _load_for_import(source: Path):
    """(tokenizers.Tokenizer, eos/pad declared by the files, raw tokenizer.json bytes or None)."""
    from tokenizers import Tokenizer

    if source.is_file():
        try:
            return Tokenizer.from_file(str(source)), {}, source.read_bytes()
        except Exception as exc:
            raise TokenizerError(f"{source} is not a tokenizers tokenizer.json: {exc}") from None
    if not source.is_dir():
        raise TokenizerError(
            f"{source} does not exist: give a tokenizer.json or a transformers tokenizer folder"
        )
    declared = _declared_special_tokens(source)
    if (source / TOKENIZER_FILE).is_file():
        tokenizer, _, raw = _load_for_import(source / TOKENIZER_FILE)
        return tokenizer, declared, raw
    # A folder without tokenizer.json (a "slow" vocab.json + merges.txt tokenizer): transformers converts it,
    # from these files only.
    try:
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(str(source), local_files_only=True, use_fast=True)
        backend = loaded.backend_tokenizer
    except Exception as exc:
        raise TokenizerError(
            f"{source} has no tokenizer.json and transformers could not load it offline: {exc}"
        ) from None
    declared = {
        key: value
        for key, value in (("eos_token", loaded.eos_token), ("pad_token", loaded.pad_token))
        if isinstance(value, str)
    }
    return backend, declared, None


def import_tokenizer(
    config: CoreConfig,
    name: str,
    source: Path,
    eos_token: str | None = None,
    pad_token: str | None = None,
    corpus: str | None = None,
) -> StoredTokenizer:
    """Store a tokenizer the user has (a ``tokenizer.json``, or a transformers tokenizer folder: nothing is
    downloaded) as ``name``. The end-of-text token is ``eos_token``, else the one the folder declares, else
    a well-known one the vocabulary holds; padding likewise, else the end-of-text token (padding positions
    are never predicted, so any id serves)."""
    source = Path(source).expanduser()
    tokenizer, declared, raw = _load_for_import(source)
    eos = eos_token or declared.get("eos_token")
    if eos is None:
        eos = next((token for token in EOS_CANDIDATES if tokenizer.token_to_id(token) is not None), None)
    if eos is None or tokenizer.token_to_id(eos) is None:
        specials = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)
        raise TokenizerError(
            f"{source}: no end-of-text token "
            + (f"{eos!r} in the vocabulary" if eos else f"among {list(EOS_CANDIDATES)}")
            + f"; name one with --eos-token (special tokens there: {specials[:20]})"
        )
    pad = pad_token or declared.get("pad_token") or eos
    specials = [
        token.content
        for _, token in sorted(tokenizer.get_added_tokens_decoder().items())
        if token.special and token.content not in (eos, pad)
    ]

    def write(folder: Path) -> dict[str, Any]:
        if raw is not None:
            (folder / TOKENIZER_FILE).write_bytes(raw)  # as brought, byte for byte
        else:
            tokenizer.save(str(folder / TOKENIZER_FILE))
        write_tokenizer_config(folder, eos, pad, specials)
        return {
            "kind": "imported",
            "imported_from": str(source.resolve()),
            "eos_token": eos,
            "pad_token": pad,
            "split_cjk": None,
        }

    return publish(config, corpus or config.project.corpus, validate_name(name), write)
