"""Airflow operators for pretrain-pipeline. They launch stages; the data logic lives in ``pipeline``."""

from operators.crawl import CrawlOperator
from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator
from operators.train_operator import TrainOperator

__all__ = ["CrawlOperator", "PipelineSparkSubmitOperator", "PipelineStageOperator", "TrainOperator"]
