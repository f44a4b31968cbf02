"""The registered model: a text generator over the exported Hugging Face folder, as an MLflow pyfunc.

MLflow logs this file itself ("models from code") with the folder as the ``hf_model`` artifact, so
``mlflow.pyfunc.load_model("models:/<name>/<version>")`` works wherever mlflow, torch and transformers are
installed, without this project; the folder itself loads with ``from_pretrained`` from
``artifacts/hf_model``. Self-contained on purpose: it imports nothing from ``pipeline``.

    model.predict(["In the garden"], params={"max_new_tokens": 32, "temperature": 0})  # -> [completion]
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel

ARTIFACT = "hf_model"
DEFAULTS = {"max_new_tokens": 64, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}


class TextGenerator(PythonModel):
    def load_context(self, context) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = context.artifacts[ARTIFACT]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()

    def predict(self, context, model_input, params=None) -> list[str]:
        """Prompts (a list of strings, or a DataFrame whose first column holds them) -> their continuations,
        stopping at the end-of-text token. temperature 0 (the default) decodes greedily."""
        import torch

        settings = {**DEFAULTS, **(params or {})}
        prompts = model_input.iloc[:, 0].tolist() if hasattr(model_input, "iloc") else list(model_input)
        torch.manual_seed(int(settings["seed"]))
        sampling = float(settings["temperature"]) > 0
        options: dict[str, Any] = {"do_sample": sampling, "max_new_tokens": int(settings["max_new_tokens"])}
        if sampling:
            options |= {
                "temperature": float(settings["temperature"]),
                "top_k": int(settings["top_k"]) or None,
                "top_p": float(settings["top_p"]),
            }
        completions = []
        for prompt in prompts:
            ids = self.tokenizer(prompt, return_tensors="pt")
            if ids["input_ids"].shape[1] == 0:  # an empty prompt starts from the end-of-text token
                ids = {"input_ids": torch.tensor([[self.tokenizer.eos_token_id]])}
                ids["attention_mask"] = torch.ones_like(ids["input_ids"])
            with torch.no_grad():
                out = self.model.generate(**ids, **options, pad_token_id=self.tokenizer.pad_token_id)
            new = out[0, ids["input_ids"].shape[1] :]
            completions.append(str(self.tokenizer.decode(new, skip_special_tokens=True)))
        return completions


mlflow.models.set_model(TextGenerator())
