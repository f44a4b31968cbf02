"""The stage registry: every stage of the pipeline, declared once, in pipeline order.

A stage reads the outputs of the stages it names in ``reads`` under ``<data_root>/<corpus>/<stage>/<snapshot>/``
(``.../<snapshot>/<run>/`` for the per-run training stages) and writes its own. It imports no stage package (its config sections are named by where they live), so anything may read it.
Everything that needs the pipeline's shape reads it from here: `pretrain --help` and its
subcommands, each ``python -m pipeline.<package>`` entrypoint (its default inputs and the run function it
calls), the ablation runner (the same run functions, in-process), the config tree (each
stage's sections), the Airflow operators (how a stage runs) and the DAGs (which tasks, in which order).
Adding a stage is one entry below.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Runner = Literal["python", "spark", "torchrun"]
Group = Literal["corpus", "training"]


@dataclass(frozen=True)
class Stage:
    """One stage: what it is called, where its code is, what it reads, how it runs."""

    name: str  # the `pretrain` subcommand and the output folder's name
    package: str  # `python -m <package>` runs it; spark-submit runs <package>/__main__.py
    reads: tuple[str, ...]  # stages whose outputs (same snapshot) it reads, the first one by default
    runner: Runner  # python: a process of its own; spark: a Spark application; torchrun: distributed training
    group: (
        Group  # corpus: made from a crawl (corpus_crawl) or files (corpus_from_files); training: by pretrain
    )
    help: str
    # Its ``run(config, inputs, output) -> Manifest``, by where it lives ("package.module:function"): the
    # entrypoint, the ablation runner and anything else that runs a stage in-process read it from here.
    run: str
    # The config sections it owns, by where their classes live ("package.module:Class"): the registry names
    # them without importing any stage package; pipeline.config imports them to assemble the tree.
    sections: Mapping[str, str] = field(default_factory=dict)
    report: bool = False  # read by people, not by a later stage: backfills and the demo leave it out
    # One output per training run, <stage>/<snapshot>/<run>/ with a `latest` pointer, named by train.run_id;
    # so a second training of a snapshot (and its report) never replaces the first.
    per_run: bool = False
    # Files and folders of its output that its MLflow run keeps as artifacts, beside the manifest.
    artifacts: tuple[str, ...] = ()

    @property
    def entrypoint(self) -> str:
        return f"{self.package}.__main__"

    @property
    def default_input(self) -> str | None:
        return self.reads[0] if self.reads else None

    def run_function(self) -> Callable[..., Any]:
        """The stage's ``run(config, inputs, output) -> Manifest``, imported on first use."""
        module, _, name = self.run.partition(":")
        function: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return function

    def application_file(self) -> str:
        """The file spark-submit runs: the stage's ``__main__.py``."""
        spec = importlib.util.find_spec(self.entrypoint)
        if spec is None or spec.origin is None:
            raise ValueError(f"stage {self.name!r}: no module {self.entrypoint}")
        return spec.origin


STAGES: tuple[Stage, ...] = (
    Stage(
        name="crawl",
        package="pipeline.crawl",
        reads=(),
        runner="python",
        group="corpus",
        help="crawl seed URLs (default: the bundled sample site) into WARC + fetch index",
        run="pipeline.crawl.stage:run",
        sections={"crawl": "pipeline.crawl.config:CrawlConfig"},
    ),
    Stage(
        name="ingest",
        package="pipeline.ingest",
        reads=(),
        runner="spark",
        group="corpus",
        help="Spark: existing corpora (WARC/WET, JSONL, Parquet, Arrow) into clean's input; then clean --input-stage ingest",
        run="pipeline.ingest.job:run",
        sections={"ingest": "pipeline.ingest.config:IngestConfig"},
    ),
    Stage(
        name="clean",
        package="pipeline.clean",
        reads=("crawl",),
        runner="spark",
        group="corpus",
        help="Spark: extract main text, normalise, language id, FineWeb-recipe filters, PII redaction",
        run="pipeline.clean.job:run",
        sections={"clean": "pipeline.clean.config:CleanConfig"},
    ),
    Stage(
        name="dedup",
        package="pipeline.dedup",
        reads=("clean",),
        runner="spark",
        group="corpus",
        help="Spark: URL, exact and MinHash-LSH near-duplicate removal",
        run="pipeline.dedup.job:run",
        sections={"dedup": "pipeline.dedup.config:DedupConfig"},
    ),
    Stage(
        name="train_classifier",
        package="pipeline.classify.training",
        reads=(),
        runner="spark",
        group="corpus",
        help="Spark + fastText: train a quality classifier from reference text against a corpus sample "
        "(or labelled scores); --snapshot names the model",
        run="pipeline.classify.training.job:run",
        sections={"classifier_training": "pipeline.classify.config:ClassifierTrainingConfig"},
        artifacts=("model.bin", "model.json", "metrics.json", "plots"),
    ),
    Stage(
        name="classify",
        package="pipeline.classify",
        reads=("dedup",),
        runner="spark",
        group="corpus",
        help="Spark: a score column per classifier (any fastText .bin, or a trained one), keep a threshold or top fraction",
        run="pipeline.classify.job:run",
        sections={"classify": "pipeline.classify.config:ClassifyConfig"},
    ),
    Stage(
        name="decontaminate",
        package="pipeline.decontaminate",
        reads=("classify",),
        runner="spark",
        group="corpus",
        help="Spark: drop (or cut) documents sharing a 13-gram with evaluation sets (held-out, lm-eval, files)",
        run="pipeline.decontaminate.job:run",
        sections={"decontaminate": "pipeline.decontaminate.config:DecontaminateConfig"},
    ),
    Stage(
        name="quality",
        package="pipeline.quality",
        reads=("decontaminate",),
        runner="spark",
        group="corpus",
        help="data-quality report on the finished documents: report.html, metrics.json, plots",
        run="pipeline.quality.report:run",
        sections={"quality": "pipeline.quality.config:QualityConfig"},
        report=True,
        artifacts=("report.html", "metrics.json", "plots"),
    ),
    Stage(
        name="tokenize",
        package="pipeline.tokenization",
        reads=("decontaminate",),
        runner="spark",
        group="corpus",
        help="encode the finished documents into token shards with the corpus's shared tokenizer",
        run="pipeline.tokenization.job:run",
        sections={
            "bpe": "pipeline.tokenization.config:TokenizerConfig",
            "tokenize": "pipeline.tokenization.config:TokenizeConfig",
        },
    ),
    Stage(
        name="train",
        package="pipeline.train",
        reads=("tokenize",),
        runner="torchrun",
        group="training",
        help="train the model on token shards with torchrun (DDP / ZeRO-1); launches torchrun for you",
        run="pipeline.train.launcher.launch:run",
        per_run=True,
        sections={
            "data": "pipeline.data.config:DataConfig",
            "model": "pipeline.model.config:ModelSection",
            "train": "pipeline.train.config:TrainConfig",
            "distributed": "pipeline.train.config:DistributedConfig",
        },
    ),
    Stage(
        name="export",
        package="pipeline.export",
        reads=("train",),
        runner="python",
        group="training",
        help="the trained model as a Hugging Face folder (safetensors, config, tokenizer, model card)",
        run="pipeline.export.job:run",
        per_run=True,
        sections={"export": "pipeline.export.config:ExportConfig"},
    ),
    Stage(
        name="evaluate",
        package="pipeline.evaluate",
        reads=("train", "export"),
        runner="python",
        group="training",
        help="held-out loss by host and language, greedy continuations, lm-evaluation-harness on the export",
        run="pipeline.evaluate.job:run",
        per_run=True,
        sections={"evaluate": "pipeline.evaluate.config:EvaluateConfig"},
    ),
    Stage(
        name="report",
        package="pipeline.report",
        reads=("train", "export", "evaluate"),
        runner="python",
        group="training",
        help="complete the training run in MLflow (metrics, plots, samples) and register the exported model",
        run="pipeline.report.mlflow_report:run",
        per_run=True,
        sections={"tracking": "pipeline.tracking.config:TrackingConfig"},
    ),
)


# The stages a corpus starts from. Each writes the clean stage's input, so a stage that reads "crawl" can
# read "ingest" instead (`--input-stage ingest`; the corpus_from_files DAG wires it so).
CORPUS_SOURCES = ("crawl", "ingest")


def _checked(stages: tuple[Stage, ...]) -> dict[str, Stage]:
    """Names are unique and every stage reads only stages declared before it (so the order is a valid run order)."""
    by_name: dict[str, Stage] = {}
    for entry in stages:
        if entry.name in by_name:
            raise ValueError(f"stage {entry.name!r} is declared twice")
        unknown = [name for name in entry.reads if name not in by_name]
        if unknown:
            raise ValueError(f"stage {entry.name!r} reads {unknown}, which are not declared before it")
        by_name[entry.name] = entry
    return by_name


BY_NAME: dict[str, Stage] = _checked(STAGES)


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; the stages are {[s.name for s in STAGES]}") from None


def config_sections() -> dict[str, str]:
    """Every stage's config sections (name -> "module:Class"), in pipeline order; each section has one owner."""
    sections: dict[str, str] = {}
    for entry in STAGES:
        for name, section in entry.sections.items():
            if name in sections:
                raise ValueError(f"config section {name!r} is declared by two stages")
            sections[name] = section
    return sections


def downstream(of: str, stages: Iterable[Stage] = STAGES) -> list[Stage]:
    """The stages that read ``of``'s output, directly or through others, in pipeline order."""
    reached = {of}
    found = []
    for entry in stages:
        if reached.intersection(entry.reads):
            reached.add(entry.name)
            found.append(entry)
    return found


def group(name: Group, *, reports: bool = True) -> list[Stage]:
    """A group's stages in pipeline order, with or without the reports that no later stage reads."""
    return [entry for entry in STAGES if entry.group == name and (reports or not entry.report)]


def training_input() -> Stage:
    """The corpus stage whose output training reads: the token shards corpus_crawl announces."""
    (name, *_) = group("training")[0].reads
    return stage(name)
