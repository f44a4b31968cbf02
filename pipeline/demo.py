"""`make demo` / `pretrain demo`: run the pretrain_pipeline DAG through Airflow on the bundled sample site.

Uses `airflow dags test` with an AIRFLOW_HOME under the project and a SQLite metadata database, so
no server has to be started. Prints where the results are when it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pipeline.config import load_config
from pipeline.core.config import PROJECT_ROOT
from pipeline.core.proc import run_streaming
from pipeline.core.storage import DatasetRef
from pipeline.stages import downstream

DAG_ID = "pretrain_pipeline"


def airflow_environment(airflow_home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # Airflow starts its parts by running `airflow` from PATH; make it ours.
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
    )
    return env


def airflow_executable() -> str:
    candidate = Path(sys.executable).parent / "airflow"
    return str(candidate) if candidate.exists() else (shutil.which("airflow") or "airflow")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pretrain demo", description=__doc__)
    parser.add_argument("--snapshot", default="demo", help="snapshot name (default: demo)")
    parser.add_argument("--config", "-c", default="", help="config YAML (default: built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--airflow-home", default=str(PROJECT_ROOT / ".airflow"))
    args = parser.parse_args(argv)
    config = load_config(args.config or None, args.overrides)  # fail on a bad config before Airflow starts

    env = airflow_environment(Path(args.airflow_home))
    airflow = airflow_executable()
    started = time.monotonic()
    print(f"==> preparing Airflow metadata database in {args.airflow_home}", flush=True)
    run_streaming([airflow, "db", "migrate"], env=env, on_line=lambda line: None)
    # The tasks resolve the config again; pin the data root so they write where this process looks.
    overrides = [f"project.data_root={config.project.data_root}", *args.overrides]
    conf = {"snapshot": args.snapshot, "config_path": args.config, "overrides": overrides}
    stages = " -> ".join(["crawl", *(stage.name for stage in downstream("crawl") if not stage.report)])
    print(f"==> running DAG {DAG_ID} ({stages}) into {config.project.data_root}", flush=True)
    run_streaming(
        [airflow, "dags", "test", DAG_ID, "--conf", json.dumps(conf)],
        env=env,
        on_line=lambda line: print(line, flush=True),
    )

    report = DatasetRef.of(config, "report", args.snapshot)
    if not report.is_complete():
        print(
            f"error: the DAG finished but {report.path} is incomplete; see the task logs above",
            file=sys.stderr,
        )
        return 1
    manifest = report.manifest()  # the latest report, of the run this DAG trained
    train = DatasetRef.of(config, "train", args.snapshot, run=manifest.extra.get("train_run")).manifest()
    minutes = (time.monotonic() - started) / 60
    print()
    print(f"pretrain-pipeline demo finished in {minutes:.1f} min")
    print(f"  data root      {config.project.data_root}/{config.project.corpus}/<stage>/{args.snapshot}/")
    print(f"  training run   {train.path}")
    print(f"  checkpoint     {manifest.extra['checkpoint']}")
    print(
        f"  loss           {train.extra['first_loss']:.3f} -> {train.extra['final_loss']:.3f} (val {train.extra['val_loss']})"
    )
    run = manifest.extra.get("train_run")
    export = DatasetRef.of(config, "export", args.snapshot, run=run)
    print(
        f"  exported model {export.path}  ({export.manifest().extra['architecture']}, from_pretrained loads it)"
    )
    print(f"  sample         .venv/bin/pretrain generate --snapshot {args.snapshot} --prompt 'In the garden'")
    print(f"  MLflow run     {manifest.extra['mlflow_run_id']}  ({manifest.extra['tracking_uri']})")
    print(f"  browse it      .venv/bin/mlflow ui --backend-store-uri {manifest.extra['tracking_uri']}")
    return 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
