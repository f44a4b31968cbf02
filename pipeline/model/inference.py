"""A trained model in use: loaded from its checkpoint, and continuing text greedily or by sampling.

Every reader of a trained model goes through here (generate, evaluate, the MLflow report, the trainer's
sample generations): ``load_model`` reads the on-disk format of ``pipeline.model.checkpoint``, and
``generations`` is the one list of prompt continuations the trainer, the evaluate stage and the report record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.model.checkpoint import load_weights, model_from_state, whole_model_checkpoint
from pipeline.model.gpt import GPT


def load_model(path: Path, sha256: str | None = None) -> GPT:
    """A GPT in eval mode from a checkpoint file or checkpoints folder (checksums verified, a pipeline run's
    shards merged), or from a ``save_weights`` file when the digest recorded with it is given."""
    if sha256 is not None:
        return model_from_state(load_weights(path, sha256))
    return model_from_state(whole_model_checkpoint(path))


@dataclass(frozen=True)
class Continuation:
    new_ids: list[int]  # the continuation, without the prompt and cut before the stop token
    stopped: bool  # whether it ended at the stop token (rather than at the budget or the context)


@torch.no_grad()
def continue_ids(
    model: GPT,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_id: int | None = None,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Continuation:
    """Continue one prompt through ``GPT.generate`` (KV cache): greedy at temperature 0, else sampled.

    A prompt longer than the context keeps its end; the continuation stops at the context length.
    """
    window = model.config.max_position_embeddings
    prompt = list(prompt_ids)[-(window - 1) :]
    budget = min(max_new_tokens, window - len(prompt))
    device = model.lm_head.weight.device  # the trainer calls this with a model still on its GPU
    prompt_tensor = torch.tensor([prompt], dtype=torch.long, device=device)
    out = model.generate(prompt_tensor, budget, temperature, top_k, generator, top_p, stop_id)
    new = out[0, len(prompt) :].tolist()
    stopped = stop_id in new
    return Continuation(new[: new.index(stop_id)] if stopped else new, stopped)


def greedy_generate(
    model: GPT, prompt_ids: list[int], max_new_tokens: int, stop_id: int | None = None
) -> list[int]:
    """The greedy continuation's new ids, cut at ``stop_id``."""
    return continue_ids(model, prompt_ids, max_new_tokens, stop_id).new_ids


def generations(
    model: GPT, tokenizer, prompts: list[str], max_new_tokens: int, stop_id: int | None
) -> list[dict[str, Any]]:
    """Each prompt's greedy continuation (ids and text), cut at ``stop_id``; an empty prompt starts from it."""
    samples = []
    for prompt in prompts:
        prompt_ids = tokenizer.encode(prompt).ids or ([stop_id] if stop_id is not None else [0])
        new_ids = greedy_generate(model, prompt_ids, max_new_tokens, stop_id)
        samples.append(
            {
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "generated_ids": new_ids,
                "completion": tokenizer.decode(new_ids),
            }
        )
    return samples


def checkpoint_generations(
    checkpoint: Path, tokenizer_file: Path, prompts: list[str], max_new_tokens: int, eos_token: str
) -> list[dict[str, Any]]:
    """``generations`` of the model in a checkpoint, with the tokenizer it was trained with."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    model = load_model(checkpoint)
    return generations(model, tokenizer, prompts, max_new_tokens, tokenizer.token_to_id(eos_token))


def format_samples(samples: list[dict[str, Any]]) -> str:
    blocks = [f"### prompt: {s['prompt']!r}\n{s['prompt']}{s['completion']}\n" for s in samples]
    return "\n".join(blocks)
