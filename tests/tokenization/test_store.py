"""Stored tokenizers: import, digests, the corpus default and its one writer, `pretrain tokenizer`."""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from pipeline.core.manifest import Manifest, sha256_file
from pipeline.core.storage import MissingInputError
from pipeline.data import tokenizer_files
from pipeline.tokenization import store
from pipeline.tokenization.bpe import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, save_tokenizer, train_tokenizer
from pipeline.tokenization.config import TokenizerConfig
from pipeline.tokenization.tokenizer_cli import main as tokenizer_cli
from tests.conftest import make_config

TEXTS = [
    "the river turned the mill wheel",
    "flour from the mill went to town",
    "the wheel turned all day",
] * 20


def small_bpe(texts=TEXTS, eos="<|endoftext|>") -> Tokenizer:
    return train_tokenizer(texts, TokenizerConfig(vocab_size=300, min_frequency=1, eos_token=eos))


def bpe_writer(texts, marker: Path | None = None):
    """A stand-in for the tokenize stage's writer: trains on ``texts``, leaves ``marker`` if it ran."""

    def write(folder):
        settings = TokenizerConfig(vocab_size=300, min_frequency=1)
        save_tokenizer(train_tokenizer(texts, settings), folder, settings)
        if marker is not None:
            marker.write_text("trained")
        return {"kind": "trained", "eos_token": settings.eos_token, "pad_token": settings.pad_token}

    return write


def test_an_imported_tokenizer_json_is_stored_once_with_its_digest_and_becomes_the_default(tmp_path):
    config = make_config(tmp_path / "data")
    source = tmp_path / "mine.json"
    small_bpe().save(str(source))
    stored = store.import_tokenizer(config, "mine", source)
    assert (stored.path / TOKENIZER_FILE).read_bytes() == source.read_bytes()  # as brought, byte for byte
    checksums = {name: sha256_file(stored.path / name) for name in tokenizer_files.DIGEST_FILES}
    assert (
        stored.digest
        == tokenizer_files.tokenizer_digest(checksums)
        == tokenizer_files.manifest_digest(stored.manifest)
    )
    # The manifest's own file checksums give the same digest (how outputs without a recorded one are checked).
    bare = Manifest.from_dict(stored.manifest.to_dict())
    bare.extra = {}
    assert tokenizer_files.manifest_digest(bare) == stored.digest
    assert stored.facts["eos_token"] == "<|endoftext|>" and stored.facts["pad_token"] == "<|endoftext|>"
    assert store.default_name(config.project.data_root, config.project.corpus) == "mine"

    with pytest.raises(store.TokenizerError, match="already stored"):
        store.import_tokenizer(config, "mine", source)
    second = store.import_tokenizer(config, "other", source)
    assert second.digest == stored.digest  # the same files: the same tokenizer
    assert store.default_name(config.project.data_root, config.project.corpus) == "mine"  # the first stays
    assert store.resolve_reference(config, "default").name == "mine"
    assert store.resolve_reference(config, f"{config.project.corpus}/other").name == "other"
    with pytest.raises(MissingInputError, match=r"no stored tokenizer sample/gone.*\['mine', 'other'\]"):
        store.resolve_reference(config, "gone")


def test_a_transformers_folder_is_imported_with_its_special_tokens(tmp_path):
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "llama-like"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(
            TEXTS, TokenizerConfig(vocab_size=300, min_frequency=1, eos_token="</s>")
        ),
        eos_token="</s>",
        pad_token="<|pad|>",
    )
    fast.save_pretrained(folder)
    config = make_config(tmp_path / "data")
    stored = store.import_tokenizer(config, "llama-like", folder)
    facts = stored.facts
    assert (facts["eos_token"], facts["pad_token"], facts["kind"]) == ("</s>", "<|pad|>", "imported")
    tokenizer = Tokenizer.from_file(str(stored.path / TOKENIZER_FILE))
    assert facts["eos_id"] == tokenizer.token_to_id("</s>") and facts["pad_id"] == tokenizer.token_to_id(
        "<|pad|>"
    )
    hf_config = json.loads((stored.path / TOKENIZER_CONFIG_FILE).read_text())
    assert hf_config["eos_token"] == "</s>" and "</s>" not in hf_config["additional_special_tokens"]


def test_import_without_an_end_of_text_token_says_how_to_name_one(tmp_path):
    source = tmp_path / "odd.json"
    small_bpe(eos="<|stop|>").save(str(source))
    config = make_config(tmp_path / "data")
    with pytest.raises(store.TokenizerError, match="--eos-token"):
        store.import_tokenizer(config, "odd", source)
    assert (
        store.import_tokenizer(config, "odd", source, eos_token="<|stop|>").facts["eos_token"] == "<|stop|>"
    )
    with pytest.raises(store.TokenizerError, match="no end-of-text token '<x>'"):
        store.import_tokenizer(config, "odd2", source, eos_token="<x>")
    with pytest.raises(store.TokenizerError, match=r"not a tokenizers tokenizer\.json"):
        (tmp_path / "junk.json").write_text("{}")
        store.import_tokenizer(config, "junk", tmp_path / "junk.json")
    for reserved in ("default", "snapshot", "a/b"):
        with pytest.raises(store.TokenizerError, match="must match"):
            store.import_tokenizer(config, reserved, source, eos_token="<|stop|>")


class _SignalWhenWaiting(logging.Handler):
    """Creates ``path`` when default_lock logs that this process waits for the lock."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("waiting for"):
            self.path.write_text("waiting")


def wait_for(signal: Path, limit_s: float = 600) -> None:
    """Until the other process creates ``signal``; the limit only keeps a broken run from hanging."""
    deadline = time.monotonic() + limit_s
    while not signal.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {signal.name} after {limit_s} s")
        time.sleep(0.05)


def _first_tokenize(root: str, snapshot: str, texts: list[str], signals: str, queue) -> None:
    """One 'first-time tokenize' of a snapshot in its own process: ensure_default with its own BPE."""
    signals_path = Path(signals)
    config = make_config(Path(root))
    handler = _SignalWhenWaiting(signals_path / f"{snapshot}.waiting")
    logging.getLogger("pipeline.tokenization.store").addHandler(handler)
    logging.getLogger("pipeline.tokenization.store").setLevel(logging.INFO)
    write = bpe_writer(texts, signals_path / f"{snapshot}.trained")
    if snapshot == "first":

        def write_slowly(folder):
            # Hold the lock until the second run is provably waiting for it (it logs so).
            (signals_path / "first.inside").write_text("inside")
            wait_for(signals_path / "second.waiting")
            return write(folder)

        chosen = store.ensure_default(config, config.project.corpus, "bpe-first", write_slowly, [])
    else:
        wait_for(signals_path / "first.inside")
        chosen = store.ensure_default(config, config.project.corpus, "bpe-second", write, [])
    queue.put((snapshot, chosen.name, chosen.digest))


def test_a_tokenizer_whose_ids_have_gaps_is_sized_by_its_largest_id(tmp_path):
    """4 entries, end-of-text id 70,000: ``get_vocab_size`` says 4, a uint16 shard overflows."""
    from tokenizers import models, pre_tokenizers

    from pipeline.tokenization.encoder import DocumentEncoder

    vocab = {"[UNK]": 0, "mill": 1, "wheel": 2, "<|endoftext|>": 70_000}
    gapped = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    gapped.pre_tokenizer = pre_tokenizers.Whitespace()
    source = tmp_path / "gapped.json"
    gapped.save(str(source))
    stored = store.import_tokenizer(make_config(tmp_path / "data"), "gapped", source)
    assert stored.facts["vocab_size"] == 70_001 and stored.facts["eos_id"] == 70_000

    encoder = DocumentEncoder.for_tokenizer(
        Tokenizer.from_file(str(stored.path / TOKENIZER_FILE)), "<|endoftext|>", 1000
    )
    tokens, lengths = encoder.encode(["mill wheel mill"])
    assert tokens.tolist() == [1, 2, 1, 70_000] and lengths.tolist() == [4]


def test_two_first_time_tokenizations_store_one_default_tokenizer(tmp_path):
    """Two runs find no default at once: the second waits for the first's lock, then uses its tokenizer; it
    never trains one of its own, and the corpus holds one tokenizer."""
    root, signals = tmp_path / "data", tmp_path / "signals"
    signals.mkdir()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    texts = {"first": TEXTS, "second": [text.upper() for text in TEXTS]}  # two different BPEs if both trained
    processes = [
        context.Process(target=_first_tokenize, args=(str(root), name, texts[name], str(signals), queue))
        for name in ("first", "second")
    ]
    for process in processes:
        process.start()
    try:
        results = sorted(queue.get(timeout=600) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    assert [process.exitcode for process in processes] == [0, 0]
    (_, first_name, first_digest), (_, second_name, second_digest) = results
    assert first_name == second_name == "bpe-first" and first_digest == second_digest
    assert (signals / "second.waiting").exists()  # the second really waited on the first
    assert not (signals / "second.trained").exists()  # and never trained its own
    config = make_config(root)
    assert store.stored_names(config.project.data_root, config.project.corpus) == ["bpe-first"]


def test_pretrain_tokenizer_import_and_list(tmp_path, capsys):
    root = tmp_path / "data"
    source = tmp_path / "tokenizer.json"
    small_bpe().save(str(source))
    common = ["--set", f"project.data_root={root}", "--set", "logging.console=false"]
    assert tokenizer_cli(["import", str(source), "--name", "gpt-ish", *common]) == 0
    assert tokenizer_cli(["list", *common]) == 0
    out = capsys.readouterr().out
    assert "sample/gpt-ish (default)" in out and "imported" in out and "vocab 300" in out
    with pytest.raises(store.TokenizerError, match="already stored"):
        tokenizer_cli(["import", str(source), "--name", "gpt-ish", *common])


@pytest.mark.parametrize("command", ["train", "import", "list"])
def test_each_tokenizer_command_has_helpful_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tokenizer_cli([command, "--help"])
    assert exit_info.value.code == 0
    assert "--set" in capsys.readouterr().out
