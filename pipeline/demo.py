"""`make demo` / `pretrain demo`: run the pretrain_pipeline DAG through Airflow on the bundled sample site.

Uses `airflow dags test` with an AIRFLOW_HOME under the project and a SQLite metadata database, so
no server has to be started. Airflow's own logging goes to a file it names; the terminal gets one line
per task as it finishes (its name, seconds, and what its output kept, read from the stage's manifest),
then where the results are, ending with the data-quality report.

The Spark tasks attach to a warm Spark Connect server the demo starts beside Airflow and stops at the end
(``pipeline.core.spark_connect``), as an Airflow deployment's workers would: each task then starts no JVM of
its own. ``--cold`` runs them in local mode instead, each with its own JVM; a configured ``spark.remote`` or
``$SPARK_REMOTE`` is used as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

from pipeline.config import PipelineConfig, load_config
from pipeline.core.arguments import ArgumentParser
from pipeline.core.config import PROJECT_ROOT
from pipeline.core.manifest import Manifest
from pipeline.core.proc import run_streaming
from pipeline.core.spark import remote_url
from pipeline.core.spark_cluster import free_port
from pipeline.core.spark_connect import ConnectServer
from pipeline.core.storage import DatasetRef
from pipeline.stages import BY_NAME, downstream

DAG_ID = "pretrain_pipeline"

# What `airflow dags test` (airflow.sdk.definitions.dag.test / _run_task) logs around each task it runs,
# one task at a time, and the state the execution API records for it in between.
_TIMESTAMP = r"^(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?)\s"
TASK_START = re.compile(
    _TIMESTAMP + r".*\[DAG TEST\] starting task_id=(?P<task>\S+) map_index=(?P<index>-?\d+)"
)
TASK_END = re.compile(
    _TIMESTAMP + r".*\[DAG TEST\] end task task_id=(?P<task>\S+) map_index=(?P<index>-?\d+)"
)
TASK_STATE = re.compile(r"Task instance state updated\b.*\bnew_state=(?P<state>\w+)")


@dataclass(frozen=True)
class TaskFinished:
    task: str  # the task id, with [map index] for a mapped task
    state: str  # the state Airflow recorded last ("success", "failed", "up_for_retry", ...), or "unknown"
    seconds: float  # from the start line to the end line, by Airflow's own timestamps


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class TaskProgress:
    """Reads `airflow dags test` output line by line; ``on_finished`` gets each task as it ends."""

    def __init__(self, on_finished: Callable[[TaskFinished], None]) -> None:
        self.on_finished = on_finished
        self.finished: list[TaskFinished] = []
        self._started: datetime | None = None
        self._state = "unknown"

    def feed(self, line: str) -> None:
        if match := TASK_START.search(line):
            self._started, self._state = _timestamp(match["at"]), "unknown"
        elif match := TASK_STATE.search(line):
            self._state = match["state"]
        elif (match := TASK_END.search(line)) and self._started is not None:
            index = int(match["index"])
            task = match["task"] + (f"[{index}]" if index >= 0 else "")
            seconds = (_timestamp(match["at"]) - self._started).total_seconds()
            done = TaskFinished(task, self._state, seconds)
            self._started = None
            self.finished.append(done)
            try:
                self.on_finished(done)
            except Exception as exc:  # a summary that cannot be made must not stop the log being written
                print(f"  {task}: {done.state} ({type(exc).__name__}: {exc})", flush=True)


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def kept(manifest: Manifest) -> str:
    """What an output kept, in a few words, from its manifest: its row counts, the drops by reason (the
    largest first), the tokens per split, a training's steps and loss."""
    parts = [f"{_count(count)} {name}" for name, count in manifest.rows.items()]
    dropped = manifest.counters.get("dropped")
    if isinstance(dropped, dict) and dropped:
        largest = sorted(dropped.items(), key=lambda item: (-int(item[1]), item[0]))
        shown = ", ".join(f"{reason} {_count(count)}" for reason, count in largest[:3])
        more = f", +{len(largest) - 3} more" if len(largest) > 3 else ""
        parts.append(f"dropped {_count(sum(int(c) for c in dropped.values()))} ({shown}{more})")
    tokens = manifest.counters.get("tokens")
    if isinstance(tokens, dict) and tokens:
        parts.append("tokens " + ", ".join(f"{split} {_count(count)}" for split, count in tokens.items()))
    first, final = manifest.extra.get("first_loss"), manifest.extra.get("final_loss")
    if isinstance(final, int | float):
        parts.append(
            f"loss {first:.3f} -> {final:.3f}" if isinstance(first, int | float) else f"loss {final:.3f}"
        )
    return "; ".join(parts) or "(no rows)"


def task_line(config: PipelineConfig, snapshot: str, done: TaskFinished, since: float) -> str:
    """One line for a finished task; what it kept comes from its stage's output, when that was written in
    this run (``since``: a wall-clock time before the DAG started)."""
    head = f"  {done.task:<15} {done.seconds:6.1f} s  "
    if done.state != "success":
        return head + f"{done.state.upper()} (see the Airflow log)"
    stage = BY_NAME.get(done.task)
    if stage is None:
        return head + "done"
    ref = DatasetRef.of(config, stage.name, snapshot)
    if not ref.is_complete() or (ref.path / "_SUCCESS").stat().st_mtime < since:
        return head + f"done; no new output at {ref.path}"
    manifest = ref.manifest()
    pages = [name for name in stage.artifacts if name.endswith(".html") and name in manifest.files]
    if pages:
        return head + f"{kept(manifest)}; {ref.path / pages[0]}"
    return head + kept(manifest)


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


@contextlib.contextmanager
def warm_spark(folder: Path, config: PipelineConfig) -> Iterator[ConnectServer]:
    """A Spark Connect server for the demo's tasks, launched (not yet ready: ``wait_ready``) and stopped on
    exit however the demo ends."""
    server = ConnectServer(folder=folder, host="127.0.0.1", port=free_port())
    try:
        server.launch(config)
        yield server
    finally:
        server.stop()


def airflow_executable() -> str:
    candidate = Path(sys.executable).parent / "airflow"
    return str(candidate) if candidate.exists() else (shutil.which("airflow") or "airflow")


def _logged(log: IO[str], then: Callable[[str], None] | None = None) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        log.write(line + "\n")
        log.flush()
        if then is not None:
            then(line)

    return on_line


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="pretrain demo", description=__doc__)
    parser.add_argument("--snapshot", default="demo", help="snapshot name (default: demo)")
    parser.add_argument("--config", "-c", default="", help="config YAML (default: built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--airflow-home", default=str(PROJECT_ROOT / ".airflow"))
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start no Spark Connect server: each Spark task starts its own JVM (local mode)",
    )
    args = parser.parse_args(argv)
    config = load_config(args.config or None, args.overrides)  # fail on a bad config before Airflow starts

    airflow_home = Path(args.airflow_home)
    airflow_home.mkdir(parents=True, exist_ok=True)
    env = airflow_environment(airflow_home)
    airflow = airflow_executable()
    started, since = time.monotonic(), time.time()
    log_path = airflow_home / f"demo-{args.snapshot}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    print(f"==> Airflow's own log: {log_path}", flush=True)
    with contextlib.ExitStack() as stack, log_path.open("w", encoding="utf-8") as log:
        server = None
        if not (args.cold or remote_url(config)):
            server = stack.enter_context(warm_spark(airflow_home / "spark-connect", config))
        print(f"==> preparing Airflow metadata database in {airflow_home}", flush=True)
        run_streaming([airflow, "db", "migrate"], env=env, on_line=_logged(log))
        if server is not None:  # its JVM started beside the migration
            server.wait_ready(timeout_s=180)
            env["PRETRAIN__SPARK__REMOTE"] = server.url  # the operators run such a task as a plain process
            print(
                f"==> Spark tasks attach to the warm Spark Connect server {server.url} ({server.log})",
                flush=True,
            )
        # The tasks resolve the config again; pin the data root so they write where this process looks.
        overrides = [f"project.data_root={config.project.data_root}", *args.overrides]
        conf = {"snapshot": args.snapshot, "config_path": args.config, "overrides": overrides}
        stages = " -> ".join(["crawl", *(stage.name for stage in downstream("crawl"))])
        print(f"==> running DAG {DAG_ID} ({stages}) into {config.project.data_root}", flush=True)
        progress = TaskProgress(lambda done: print(task_line(config, args.snapshot, done, since), flush=True))
        returncode = run_streaming(
            [airflow, "dags", "test", DAG_ID, "--conf", json.dumps(conf)],
            env=env,
            on_line=_logged(log, progress.feed),
            check=False,
        )

    report = DatasetRef.of(config, "report", args.snapshot)
    quality = DatasetRef.of(config, "quality", args.snapshot)
    incomplete = [ref for ref in (report, quality) if not ref.is_complete()]
    failed = [done.task for done in progress.finished if done.state != "success"]
    if returncode != 0 or incomplete:
        missing = ", ".join(str(ref.path) for ref in incomplete) or "nothing"
        print(
            f"error: the DAG run ended with exit status {returncode} (tasks not successful at their last try: "
            f"{', '.join(failed) or 'none'}; incomplete: {missing}); see {log_path}",
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
    print(f"  Airflow's log  {log_path}")
    print(f"  data quality   {quality.path / 'report.html'}")
    return 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
