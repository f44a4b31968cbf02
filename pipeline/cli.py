"""`pretrain`: one subcommand per stage, plus the demo and config helpers.

Each stage subcommand forwards its arguments to that stage's own entrypoint
(`python -m pipeline.<package>`), so `pretrain clean --help` shows the stage's options.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.core.arguments import ArgumentParser
from pipeline.stages import STAGES

# Commands that are not stages: subcommand -> (module with main(argv), one-line help)
TOOLS: dict[str, tuple[str, str]] = {
    "tokenizer": (
        "pipeline.tokenization.tokenizer_cli",
        "store a tokenizer for every snapshot to share: train a BPE on snapshots of one or more corpora, "
        "import a tokenizer.json / transformers folder, list the stored ones",
    ),
    "ship-logs": (
        "pipeline.logshipping.log_shipper",
        "send the ECS log files to Elasticsearch (spools while it is unreachable; --follow to keep going)",
    ),
    "tensorboard": (
        "pipeline.tracking.tensorboard",
        "start TensorBoard on a training snapshot's event files",
    ),
    "generate": (
        "pipeline.evaluate.generate",
        "sample text from a training run's checkpoint (KV cache, temperature/top-k/top-p, stops at end of text)",
    ),
    "ablate": (
        "pipeline.ablate.__main__",
        "data ablations: train the same proxy model on variants of a corpus recipe at equal tokens and seeds, "
        "compare held-out loss against the seed spread",
    ),
    "card": (
        "pipeline.quality.card",
        "write a Hugging Face dataset card (README.md) beside a snapshot's documents: languages, counts, "
        "the drop funnel, the recipe, tokens",
    ),
    "spark-server": (
        "pipeline.core.spark_connect",
        "start a warm Spark Connect server on 127.0.0.1 that Spark stages attach to (SPARK_REMOTE or "
        "spark.remote) instead of starting a JVM each; Ctrl-C stops it",
    ),
    "config": ("pipeline.config_cli", "print the resolved, validated config and its hash"),
    "demo": ("pipeline.demo", "run the whole pipeline through Airflow on the bundled sample site"),
}

# Every subcommand: the registered stages in pipeline order, then the tools.
COMMANDS: dict[str, tuple[str, str]] = {
    **{
        stage.name: (
            stage.entrypoint,
            stage.help + (f" [reads {', '.join(stage.reads)}]" if stage.reads else ""),
        )
        for stage in STAGES
    },
    **TOOLS,
}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="pretrain",
        description="From raw web pages to a trained language model. The stages, in order, each read the "
        "outputs named in [reads ...] and write <data_root>/<corpus>/<stage>/<snapshot>/.",
        epilog="run `pretrain <command> --help` for a command's options",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        parser.parse_args(argv[:1])  # prints the usage error and exits 2
    module_name, _ = COMMANDS[argv[0]]
    module = importlib.import_module(module_name)
    from pipeline.core.cli import run_cli

    return run_cli(module.main, argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
