"""The export stage: a training run's final checkpoint as a Hugging Face model folder."""
