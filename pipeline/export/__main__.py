"""`python -m pipeline.export` / `pretrain export`: a training run as a Hugging Face model folder.

Reads train/<snapshot>/<run>/ (the latest complete run unless train.run_id names one) and writes
export/<snapshot>/<run>/: config.json, model.safetensors, the tokenizer files and a model card, which
transformers' AutoModelForCausalLM / AutoTokenizer load offline. Models transformers cannot compute exactly
are refused with the difference named.
"""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.core.proc import exit_now
from pipeline.entrypoint import stage_main


def main(argv: list[str] | None = None) -> int:
    return stage_main(argv, stage="export", description=__doc__)


if __name__ == "__main__":
    exit_now(run_cli(main))  # without the interpreter's teardown: see pipeline.core.proc.exit_now
