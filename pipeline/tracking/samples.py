"""Sample generations from a checkpoint (greedy, through ``GPT.generate``), for the MLflow record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.model import GPTConfig
from pipeline.model.gpt import GPT


def load_model(state: dict[str, Any]) -> GPT:
    """A GPT in eval mode from a checkpoint dict holding ``model_config`` and ``model`` (a state dict)."""
    model = GPT(GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def greedy_generate(
    model: GPT, prompt_ids: list[int], max_new_tokens: int, stop_id: int | None = None
) -> list[int]:
    """Greedy continuation through ``GPT.generate``, cut at ``stop_id``; returns only the new ids.

    A prompt longer than the context keeps its end; the continuation stops at the context length.
    """
    window = model.config.max_position_embeddings
    prompt = list(prompt_ids)[-(window - 1) :]
    budget = min(max_new_tokens, window - len(prompt))
    device = model.lm_head.weight.device  # the trainer calls this with a model still on its GPU
    prompt_tensor = torch.tensor([prompt], dtype=torch.long, device=device)
    new = model.generate(prompt_tensor, budget, temperature=0, stop_token=stop_id)[0, len(prompt) :].tolist()
    return new[: new.index(stop_id)] if stop_id in new else new


def generations(
    model: GPT, tokenizer, prompts: list[str], max_new_tokens: int, stop_id: int | None
) -> list[dict]:
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


def sample_generations(
    checkpoint: Path, tokenizer_file: Path, prompts: list[str], max_new_tokens: int, eos_token: str
) -> list[dict[str, Any]]:
    from tokenizers import Tokenizer

    from pipeline.train.pipeline_parallel import whole_model_checkpoint

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    model = load_model(whole_model_checkpoint(checkpoint))
    return generations(model, tokenizer, prompts, max_new_tokens, tokenizer.token_to_id(eos_token))


def format_samples(samples: list[dict[str, Any]]) -> str:
    blocks = [f"### prompt: {s['prompt']!r}\n{s['prompt']}{s['completion']}\n" for s in samples]
    return "\n".join(blocks)
