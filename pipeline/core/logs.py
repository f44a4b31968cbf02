"""ECS JSON log files per process, plus a readable console.

Files land in ``<data_root>/_runs/<run>/logs/<component>-rank<r>-<pid>.ecs.json`` so a shipper
(Filebeat, or our own Elasticsearch shipper) can pick every process's lines up from one folder.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import ecs_logging

from pipeline.core.config import CoreConfig
from pipeline.core.lineage import Lineage
from pipeline.core.storage import local_path

SERVICE_NAME = "pretrain-pipeline"
_HANDLER_MARK = "_pretrain_handler"


class _ContextFilter(logging.Filter):
    """Stamp every record with the ECS fields that tie it to a DAG run, task and rank."""

    def __init__(self, component: str, lineage: Lineage, rank: int | None) -> None:
        super().__init__()
        self.fields: dict[str, str | int] = {
            "service.name": SERVICE_NAME,
            "event.dataset": f"pretrain.{component}",
            "labels.component": component,
        }
        for key, value in lineage.to_dict().items():
            if value is not None:
                self.fields[f"labels.{key}"] = value
        if rank is not None:
            self.fields["labels.rank"] = rank

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            setattr(record, key, value)
        return True


def run_folder(config: CoreConfig, lineage: Lineage | None = None) -> Path:
    lineage = lineage or Lineage.from_env()
    return local_path(config.project.data_root) / "_runs" / lineage.run_folder_name


def setup_logging(
    config: CoreConfig,
    component: str,
    rank: int | None = None,
    lineage: Lineage | None = None,
) -> Path:
    """Configure the root logger once per process; returns the ECS log file path."""
    lineage = lineage or Lineage.from_env()
    if rank is None and "RANK" in os.environ:
        rank = int(os.environ["RANK"])
    log_dir = run_folder(config, lineage) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{component}-rank{rank if rank is not None else 0}-{os.getpid()}.ecs.json"

    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(config.logging.level)
    context = _ContextFilter(component, lineage, rank)

    file_handler = logging.FileHandler(log_file, encoding="utf-8")
    file_handler.setFormatter(ecs_logging.StdlibFormatter())
    file_handler.addFilter(context)
    setattr(file_handler, _HANDLER_MARK, True)
    root.addHandler(file_handler)

    if config.logging.console:
        console = logging.StreamHandler(sys.stderr)
        prefix = f"[{component}{'' if rank is None else f' rank{rank}'}]"
        console.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)-7s {prefix} %(name)s: %(message)s", "%H:%M:%S")
        )
        setattr(console, _HANDLER_MARK, True)
        root.addHandler(console)

    quiet_libraries(config.logging.level)
    return log_file


NOISY_LIBRARIES = ("py4j", "urllib3", "filelock", "matplotlib", "alembic", "scrapy.core.scraper")
# Retry warnings with a full traceback each while a server is down; the caller reports the outcome once.
RETRYING_CLIENTS = ("elastic_transport",)


def quiet_libraries(level: str) -> None:
    """Libraries log what they do, not what happened: keep them to warnings (clients' retries to errors)
    unless the configured level is DEBUG."""
    debug = level == "DEBUG"
    for name in NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
    for name in RETRYING_CLIENTS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.ERROR)
