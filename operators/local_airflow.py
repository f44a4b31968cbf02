"""A local Airflow 3 for this checkout (`make airflow`): the api-server, scheduler, dag-processor and triggerer,
with SQLite and the LocalExecutor, every port on 127.0.0.1.

What differs from `airflow standalone`:
- no log servers: the scheduler and triggerer would each open one on every interface (8793, 8794), and
  on one machine the api-server reads task logs from the log folder directly;
- the SQLite database runs in WAL mode, so the api-server and the CLI read while the scheduler writes,
  instead of meeting "database is locked" on a busy machine (see ``use_wal``).

The environment (AIRFLOW_HOME, the DAGs folder, the database URL, the api-server's host and port) comes from
the caller; `make airflow` sets it. Stop with Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

# component -> its `airflow` arguments
COMPONENTS: dict[str, list[str]] = {
    "api-server": ["api-server"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}


def airflow_executable() -> str:
    return str(Path(sys.executable).parent / "airflow")


def sqlite_path(sql_alchemy_conn: str) -> Path | None:
    """The database file of a ``sqlite:///...`` URL (query string dropped); None for other databases."""
    prefix = "sqlite:///"
    if not sql_alchemy_conn.startswith(prefix):
        return None
    return Path(sql_alchemy_conn[len(prefix) :].split("?", 1)[0])


def use_wal(database: Path) -> str:
    """Switch a SQLite database to write-ahead logging (it stays so: the mode is stored in the file).

    In SQLite's default rollback journal a reader blocks a writer's commit, and a transaction that read
    first and then writes gets SQLITE_BUSY at once, whatever the busy timeout, when another connection is
    already writing. With Airflow's scheduler, dag-processor, api-server and CLI in separate processes that is
    what a loaded machine meets. In WAL mode readers never block the writer and writers queue on the timeout.
    """
    with sqlite3.connect(database) as connection:
        return connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]


def prepare(env: dict[str, str]) -> None:
    """Create or upgrade the metadata database, in WAL mode when it is SQLite."""
    subprocess.run([airflow_executable(), "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    database = sqlite_path(env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""))
    if database is not None:
        use_wal(database)


def start(env: dict[str, str], logs: Path | None = None) -> dict[str, subprocess.Popen]:
    """Start every component in a session of its own; output goes to ``logs/<component>.log`` or ours."""
    processes = {}
    for name, arguments in COMPONENTS.items():
        output = open(logs / f"{name}.log", "w") if logs else None  # noqa: SIM115 - closed with the process
        processes[name] = subprocess.Popen(
            [airflow_executable(), *arguments],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=True,
        )
    return processes


def stop(processes: dict[str, subprocess.Popen], grace_s: float = 30.0) -> None:
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdout:
            process.stdout.close()


def main() -> int:
    env = dict(os.environ)
    home = Path(env.setdefault("AIRFLOW_HOME", str(Path.cwd() / ".airflow")))
    home.mkdir(parents=True, exist_ok=True)
    prepare(env)
    processes = start(env)
    url = env.get("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8080")
    passwords = home / "simple_auth_manager_passwords.json.generated"
    print(f"Airflow is starting on {url} (Ctrl-C stops it)", flush=True)
    shown = False
    try:
        while all(process.poll() is None for process in processes.values()):
            if not shown and passwords.is_file():  # the api-server writes it on its first start
                print(f"login: {passwords.read_text().strip()} (kept in {passwords})", flush=True)
                shown = True
            time.sleep(1)
        ended = [name for name, process in processes.items() if process.poll() is not None]
        print(f"airflow {', '.join(ended)} exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(processes)


if __name__ == "__main__":
    raise SystemExit(main())
