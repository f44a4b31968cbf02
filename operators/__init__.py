"""Airflow operators for pretrain-pipeline. They launch stages; the data logic lives in ``pipeline``."""

from operators.crawl import CrawlOperator
from operators.pytorch_job import PyTorchJobOperator
from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator

__all__ = ["CrawlOperator", "PipelineSparkSubmitOperator", "PipelineStageOperator", "PyTorchJobOperator"]
