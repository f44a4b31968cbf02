"""The export stage: a training run's final checkpoint as a folder transformers, vLLM and
lm-evaluation-harness load (``from_pretrained``), with the tokenizer and a model card naming its lineage.

    export/<snapshot>/<run>/
      config.json, generation_config.json, model.safetensors   AutoModelForCausalLM
      tokenizer.json, tokenizer_config.json, special_tokens_map.json   AutoTokenizer
      README.md      the model card: architecture, data lineage, training figures, MLflow run
      export.json    what was exported and the logits check below

One folder per training run, like the run itself. Before publishing, the folder is loaded back with
``from_pretrained`` and its logits compared with our model's on random tokens; a difference beyond the
tolerance fails the stage instead of shipping a model that computes something else.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from pipeline.config import PipelineConfig
from pipeline.core.manifest import Manifest
from pipeline.core.storage import DatasetRef, StageFailure, StageOutput
from pipeline.export.hf import ExportError, architecture, build_hf_model
from pipeline.model.trained import TrainedRun

log = logging.getLogger(__name__)
STAGE = "export"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Max |logit difference| after the round trip through the folder. fp32: summation order only (measured
# ~1e-6 on the presets); bf16 weights are compared against our model cast to bf16 the same way.
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
CHECK_TOKENS = (2, 64)


def save_tokenizer_files(
    tokenizer_file: Path,
    eos_token: str,
    pad_token: str | None,
    added: list[str],
    folder: Path,
    max_length: int,
) -> None:
    """tokenizer.json plus the files AutoTokenizer reads, encoding exactly as the tokenize stage does: a
    special token's text inside a document is plain text there, so ``split_special_tokens`` here. Documents
    follow an end-of-text token, so it is the bos token too."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    special: dict[str, Any] = {"bos_token": eos_token, "eos_token": eos_token, "pad_token": pad_token}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tokenizer_file)),
        **special,
        additional_special_tokens=added,
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )
    tokenizer.save_pretrained(folder)
    # The class name transformers 4 also knows (5 writes its new backend's name), and the special tokens
    # file older readers look for.
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config |= {"tokenizer_class": "PreTrainedTokenizerFast", "additional_special_tokens": added}
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    special["additional_special_tokens"] = added
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def logits_difference(model, folder: Path, dtype: torch.dtype, seed: int) -> float:
    """Max |logits| difference between our model (cast to dtype) and the folder loaded by transformers."""
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    batch, length = CHECK_TOKENS
    length = min(length, model.config.max_position_embeddings)
    tokens = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    with torch.no_grad():
        ours = model.to(dtype)(tokens).logits.float()
        theirs = exported(tokens).logits.float()
    return float((ours - theirs).abs().max())


def model_card(trained: TrainedRun, name: str, dtype: str, difference: float) -> str:
    lineage = trained.lineage()
    config = trained.model_config
    digests = "\n".join(f"| {stage} | `{digest}` |" for stage, digest in lineage["dataset_digests"].items())
    inputs = "\n".join(
        f"| {entry.get('source', '-')} | {float(entry.get('weight', 1.0)):.4g} | {entry['corpus']} | "
        f"{entry['snapshot']} | `{entry['digest']}` |"
        for entry in lineage["inputs"]
    )
    corpora = sorted({entry["corpus"] for entry in lineage["inputs"]})
    trained_on = (
        f"the `{lineage['corpus']}` corpus, snapshot `{lineage['snapshot']}`"
        if len(lineage["inputs"]) <= 1
        else f"a mixture of {len(lineage['inputs'])} snapshots of the corpora {', '.join(corpora)} (below)"
    )
    facts = {
        "architecture": name,
        "parameters": trained.manifest.extra.get("parameters"),
        "layers": config.num_hidden_layers,
        "hidden size": config.hidden_size,
        "attention heads (kv)": f"{config.num_attention_heads} ({config.num_key_value_heads})",
        "experts (top-k)": f"{config.num_experts} ({config.moe_top_k})" if config.num_experts else "dense",
        "context": config.max_position_embeddings,
        "weights": dtype,
        "training steps": lineage["steps"],
        "tokens seen": lineage["tokens_seen"],
        "final training loss": lineage["final_loss"],
        "final validation loss": lineage["val_loss"],
        "tokenizer digest": lineage["tokenizer_digest"],
        "MLflow training run": lineage["mlflow_run_id"],
        "code version": lineage["code_version"],
        "config hash": lineage["config_hash"],
    }
    rows = "\n".join(f"| {key} | {value if value is not None else '-'} |" for key, value in facts.items())
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [pretrain-pipeline]
---

# {lineage["corpus"]} / {lineage["snapshot"]} / {lineage["train_run"]}

A decoder-only language model pretrained by pretrain-pipeline on {trained_on}, training run
`{lineage["train_run"]}`. A base model: no chat template, no instruction tuning.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("<this folder>")
model = AutoModelForCausalLM.from_pretrained("<this folder>")
ids = model.generate(**tokenizer("The", return_tensors="pt"), max_new_tokens=32, do_sample=False)
print(tokenizer.decode(ids[0], skip_special_tokens=True))
```

| | |
| --- | --- |
{rows}

On export the logits of this folder, loaded by transformers, were compared with the training code's model on
random tokens: max |difference| {difference:.2e}.

## Training data

The token shards the training read ({len(lineage["inputs"])} input(s)), drawn by the source weights (shares of
the training tokens); every input was tokenized with the tokenizer of digest `{lineage["tokenizer_digest"] or "-"}`:

| source | weight | corpus | snapshot | manifest digest |
| --- | --- | --- | --- | --- |
{inputs}

## Data lineage

Digests of the stage outputs the training read, nearest first (each is the `digest` of that output's
`manifest.json`):

| stage | digest |
| --- | --- |
{digests}
"""


def readable_by_all(folder: Path) -> None:
    """Every file with the mode a new file gets here (0644 under the usual umask): safetensors writes its
    weights through a private temporary file (0600), which a server running as another user cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def export_folder(trained: TrainedRun, folder: Path, dtype_name: str, max_shard_size: str, seed: int) -> dict:
    """Write the whole model folder; returns what export.json records."""
    from transformers import GenerationConfig

    dtype = DTYPES[dtype_name]
    config = trained.model_config
    try:
        name = architecture(config)
    except ExportError as exc:
        raise StageFailure(f"{trained.ref.what}: {exc}") from None
    tokens = trained.special_tokens()
    model = build_hf_model(trained.state["model"], config, tokens, dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokens.bos, eos_token_id=tokens.eos_id, pad_token_id=tokens.pad_id, do_sample=False
    )
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    readable_by_all(folder)
    extra = trained.tokenize.extra
    save_tokenizer_files(
        trained.tokenizer_file,
        extra["eos_token"],
        extra.get("pad_token"),
        trained.added_special_tokens(),
        folder,
        config.max_position_embeddings,
    )
    difference = logits_difference(trained.model(), folder, dtype, seed)
    if difference > TOLERANCE[dtype_name]:
        raise StageFailure(
            f"the exported {name} gives logits {difference:.3g} away from ours "
            f"(tolerance {TOLERANCE[dtype_name]}): not publishing a model that computes something else"
        )
    (folder / "README.md").write_text(model_card(trained, name, dtype_name, difference))
    record = {
        "architecture": name,
        "dtype": dtype_name,
        "max_abs_logit_difference": difference,
        "checkpoint": str(trained.checkpoint),
        "step": trained.state["train_state"]["step"],
        **trained.lineage(),
    }
    (folder / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    log.info(
        "exported %s as %s (%s), logits within %.2e of ours", trained.ref.what, name, dtype_name, difference
    )
    return record


def run(config: PipelineConfig, inputs: list[DatasetRef], output: DatasetRef) -> Manifest:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # per-shard progress bars would flood the task log
    (train_ref,) = inputs
    trained = TrainedRun.of(train_ref)
    with StageOutput(output, config, inputs) as out:
        record = export_folder(
            trained, out.path, config.export.dtype, config.export.max_shard_size, config.project.seed
        )
        extra: dict[str, Any] = {
            key: record[key] for key in ("architecture", "dtype", "max_abs_logit_difference", "step")
        }
        return out.commit(rows={"parameters": trained.manifest.extra.get("parameters", 0)}, extra=extra)
