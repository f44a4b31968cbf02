"""pretrain-pipeline: raw web pages to a trained language model."""
