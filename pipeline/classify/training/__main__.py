"""`python -m pipeline.classify.training` / `pretrain train_classifier`: train a quality classifier and
write it as train_classifier/<name>/ (--snapshot names the model), with held-out precision, recall, ROC AUC
and a calibration plot.

Examples come from the `classifier_training` config section: positives (reference text: JSONL, Parquet, a folder of
.txt files, or a stage's output) against negatives (e.g. a sample of a corpus snapshot), or labelled
documents with a score. kind: fasttext (DCLM's recipe) or embedding (logistic regression over sentence
embeddings, FineWeb-Edu style). The classify stage then uses it with `classify.models=[{name: q, trained: NAME,
top_fraction: 0.1}]`. See docs/filtering.md.

Example:
  pretrain train_classifier --snapshot wiki-v1 \\
    --set 'classifier_training.positives=[{path: /data/reference.jsonl}]' \\
    --set 'classifier_training.negatives=[{stage: dedup, snapshot: 2026-11-29}]'
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="train_classifier", description=__doc__)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
