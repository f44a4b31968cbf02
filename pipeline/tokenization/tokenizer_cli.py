"""`pretrain tokenizer`: store a tokenizer once, under a name, for every snapshot of a corpus to share.

    pretrain tokenizer train --name web-32k --source web:all --source books:2026-11-*   # one BPE, many sources
    pretrain tokenizer import --name gpt2 ~/models/gpt2            # a transformers folder or a tokenizer.json
    pretrain tokenizer list                                         # names, digests, which is the default

A tokenizer is stored at <data_root>/<corpus>/tokenizer/<name>/ (project.corpus) and never replaced. The first
one a corpus stores becomes its default, which `pretrain tokenize` uses (tokenize.tokenizer: default); name
another with --set tokenize.tokenizer=NAME (or CORPUS/NAME). Training settings are tokenizer.* (vocab_size,
sample_docs, min_frequency, split_cjk, eos/pad tokens); the sample is seeded by project.seed. See
docs/token-shards.md.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from pipeline.config import PipelineConfig, load_config
from pipeline.core.config import ConfigError
from pipeline.core.snapshots import SnapshotSelection, complete_snapshots
from pipeline.core.storage import DatasetRef, MissingInputError
from pipeline.stages import stage as registered_stage
from pipeline.tokenization.store import (
    StoredTokenizer,
    default_name,
    import_tokenizer,
    load_stored,
    publish,
    stored_names,
    validate_name,
)

DEFAULT_INPUT_STAGE = registered_stage("tokenize").default_input  # the documents the tokenize stage reads


def parse_source(text: str, corpus: str) -> tuple[str, SnapshotSelection]:
    """``CORPUS:SELECTION``, ``CORPUS`` (all its snapshots) or ``:SELECTION`` (this corpus)."""
    owner, sep, selection = text.partition(":")
    owner = owner or corpus
    try:
        return owner, SnapshotSelection.parse(selection if sep else "all")
    except ValueError as exc:
        raise ConfigError(f"--source {text!r}: {exc}") from None


def source_refs(config: PipelineConfig, sources: list[str], input_stage: str) -> list[DatasetRef]:
    """The complete ``input_stage`` outputs the sources select, every one named, in (corpus, name) order."""
    root = config.project.data_root
    refs: list[DatasetRef] = []
    for text in sources or [config.project.corpus]:
        corpus, selection = parse_source(text, config.project.corpus)
        available = complete_snapshots(root, corpus, input_stage)
        missing = selection.missing(available)
        if missing:
            raise MissingInputError(
                f"--source {text}: no complete {input_stage} output for {missing} in corpus {corpus} "
                f"(complete: {available or 'none'})"
            )
        chosen = selection.select(available)
        if not chosen:
            raise MissingInputError(
                f"--source {text}: selects no complete {input_stage} snapshot of corpus {corpus} "
                f"(complete: {available or 'none'})"
            )
        refs += [DatasetRef(root, corpus, input_stage, snapshot) for snapshot in chosen]
    return sorted(set(refs), key=lambda ref: (ref.corpus, ref.snapshot))


def sample_of_sources(config: PipelineConfig, refs: list[DatasetRef]) -> list[str]:
    """``bpe.sample_docs`` documents with text from all ``refs`` together, the smallest by a seeded hash
    of (corpus, snapshot, id), each cut to ``tokenize.chunk_chars``; documents the tokenize stage would put in
    validation (the same seeded hash of the id) are left out, so the BPE never learns from held-out text."""
    from functools import reduce

    from pyspark.sql import functions as F

    from pipeline.core.spark import spark_session
    from pipeline.tokenization.job import BUCKETS, WHITESPACE

    seed = config.project.seed
    spark = spark_session(config, f"tokenizer-{config.project.corpus}")
    frames = [
        spark.read.parquet(str(ref.path / "documents"))
        .select("id", "text")
        .withColumns({"corpus": F.lit(ref.corpus), "snapshot": F.lit(ref.snapshot)})
        for ref in refs
    ]
    docs = reduce(lambda a, b: a.unionByName(b), frames)
    held_out = int(config.tokenize.validation_fraction * BUCKETS)
    sample = (
        docs.where(F.col("text").isNotNull() & (F.length(F.btrim("text", F.lit(WHITESPACE))) > 0))
        .where(F.pmod(F.xxhash64(F.lit(seed), "id"), F.lit(BUCKETS)) >= held_out)
        .withColumn("order", F.xxhash64(F.lit(seed + 1), "corpus", "snapshot", "id"))
        .orderBy("order", "corpus", "snapshot", "id")
        .limit(config.bpe.sample_docs)
        .select(F.substring("text", 1, config.tokenize.chunk_chars).alias("text"))
    )
    return [row.text for row in sample.collect()]


def train(config: PipelineConfig, name: str, sources: list[str], input_stage: str) -> StoredTokenizer:
    from pipeline.tokenization.job import bpe_writer

    validate_name(name)
    refs = source_refs(config, sources, input_stage)
    write = bpe_writer(functools.partial(sample_of_sources, config, refs), config)

    def write_with_sources(folder: Path) -> dict:
        return {**write(folder), "sources": [f"{ref.corpus}/{ref.stage}/{ref.snapshot}" for ref in refs]}

    return publish(config, config.project.corpus, name, write_with_sources, refs)


def print_stored(stored: StoredTokenizer, is_default: bool) -> None:
    facts = stored.facts
    mark = " (default)" if is_default else ""
    print(
        f"{stored.corpus}/{stored.name}{mark}  digest {stored.digest}  {facts['kind']}  "
        f"vocab {facts['vocab_size']}  eos {facts['eos_token']!r}  pad {facts['pad_token']!r}  {stored.path}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pretrain tokenizer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", metavar="YAML", help="config file (default: built-in defaults)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    trainer = commands.add_parser(
        "train",
        parents=[common],
        help="train a byte-level BPE on a seeded sample of one or more corpora's snapshots",
    )
    trainer.add_argument("--name", required=True, help="the name to store it under (in project.corpus)")
    trainer.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="CORPUS[:SNAPSHOTS]",
        help="documents to sample (repeatable): a corpus and a snapshot selection (all, names, last:N, FROM..TO, "
        "a glob); default: every complete snapshot of project.corpus",
    )
    trainer.add_argument(
        "--input-stage",
        default=DEFAULT_INPUT_STAGE,
        help=f"stage whose documents/ to sample (default: {DEFAULT_INPUT_STAGE})",
    )
    importer = commands.add_parser(
        "import", parents=[common], help="store a tokenizer.json or a transformers tokenizer folder you have"
    )
    importer.add_argument(
        "path", type=Path, help="tokenizer.json, or a folder with one (or vocab.json + merges)"
    )
    importer.add_argument("--name", required=True, help="the name to store it under (in project.corpus)")
    importer.add_argument(
        "--eos-token", help="end-of-text token (default: the folder's, or a well-known one)"
    )
    importer.add_argument(
        "--pad-token", help="padding token (default: the folder's, else the end-of-text token)"
    )
    commands.add_parser("list", parents=[common], help="the stored tokenizers of project.corpus")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_config(args.config, args.overrides)
    root, corpus = config.project.data_root, config.project.corpus
    if args.command == "list":
        default = default_name(root, corpus)
        names = stored_names(root, corpus)
        if not names:
            print(f"corpus {corpus} has no stored tokenizer under {root}", file=sys.stderr)
        for name in names:
            print_stored(load_stored(root, corpus, name), name == default)
        return 0
    from pipeline.entrypoint import start_logging

    start_logging(config, "tokenizer")
    if args.command == "train":
        stored = train(config, args.name, args.source, args.input_stage)
    else:
        stored = import_tokenizer(config, args.name, args.path, args.eos_token, args.pad_token)
    print_stored(stored, default_name(root, corpus) == stored.name)
    return 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
