"""A real local Airflow 3 for tests: api-server, scheduler, dag-processor and triggerer on 127.0.0.1.

Each component is the `airflow` command itself, as a deployment (or `airflow standalone`) runs it, with a
SQLite metadata database and the LocalExecutor in a private AIRFLOW_HOME. Tests drive it through the
public REST API (`/api/v2`, JWT from `/auth/token`) and the `airflow` CLI.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from operators import local_airflow

COMPONENTS = tuple(local_airflow.COMPONENTS)
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalAirflow:
    def __init__(
        self, home: Path, extra_env: dict[str, str] | None = None, data_root: Path | None = None
    ) -> None:
        self.home = home
        self.data_root = data_root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: dict[str, subprocess.Popen] = {}
        self._token: str | None = None
        bin_dir = str(Path(sys.executable).parent)
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PRETRAIN__", "_AIRFLOW"))
        }
        self.env = {
            **inherited,
            "PATH": bin_dir + os.pathsep + inherited.get("PATH", ""),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            # SQLite allows one writer at a time; wait for the lock (the CLI, scheduler and API server all write)
            # instead of failing at once with "database is locked".
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=120",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            # Every component must sign and check the same tokens.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "OMP_NUM_THREADS": "1",
            **(extra_env or {}),
        }

    # --- lifecycle ----------------------------------------------------------------------------------

    def airflow(self, *args: str, check: bool = True, attempts: int = 5) -> subprocess.CompletedProcess:
        """Run an `airflow` CLI command against this instance's database.

        Even in WAL mode SQLite refuses at once (no busy wait) a transaction that read and then writes when
        another connection committed in between (SQLITE_BUSY_SNAPSHOT, "database is locked"): the scheduler
        commits every half second. The command's transaction is rolled back then, so it is run again, up to
        ``attempts`` times. A server database (Postgres) has no such case.
        """
        for _ in range(attempts):
            done = subprocess.run(
                [str(Path(sys.executable).parent / "airflow"), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode == 0 or "database is locked" not in done.stderr:
                break
        if check and done.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        return done

    def start(self, deadline_s: float = 600.0) -> LocalAirflow:
        """The components as `make airflow` starts them (operators.local_airflow)."""
        self.home.mkdir(parents=True, exist_ok=True)
        local_airflow.prepare(self.env)
        self.processes = local_airflow.start(self.env, logs=self.home)
        self.wait(self._healthy, "all four components to report healthy", deadline_s)
        return self

    def _healthy(self) -> bool:
        for component, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"airflow {component} exited: {self.log_tail(component)}")
        try:
            health = self.request("GET", "/api/v2/monitor/health", auth=False)
        except (OSError, urllib.error.URLError):
            return False
        return all(
            (health.get(part) or {}).get("status") == "healthy"
            for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
        )

    def stop(self) -> None:
        local_airflow.stop(self.processes)
        self.processes.clear()

    def log_tail(self, component: str, lines: int = 40) -> str:
        path = self.home / f"{component}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    @staticmethod
    def wait(condition, what: str, deadline_s: float = 600.0, every_s: float = 1.0):
        """Poll until condition() returns something truthy; the deadline only stops a hung test."""
        end = time.monotonic() + deadline_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > end:
                raise TimeoutError(f"gave up waiting for {what}")
            time.sleep(every_s)

    # --- REST ---------------------------------------------------------------------------------------

    def token(self) -> str:
        if self._token is None:
            passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
            answer = self.request(
                "POST", "/auth/token", {"username": "admin", "password": passwords["admin"]}, auth=False
            )
            self._token = answer["access_token"]
        return self._token

    def request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def request_error(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, body) of a request expected to fail."""
        try:
            self.request(method, path, body)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")
        raise AssertionError(f"{method} {path} succeeded")

    def wait_for_dags(self, *dag_ids: str, deadline_s: float = 600.0) -> None:
        def parsed() -> bool:
            try:
                found = {d["dag_id"] for d in self.request("GET", "/api/v2/dags?limit=100")["dags"]}
            except urllib.error.HTTPError:
                return False
            return set(dag_ids) <= found

        self.wait(parsed, f"the dag-processor to parse {dag_ids}", deadline_s)

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})

    UNFINISHED_RUN_STATES = ("queued", "running")
    ACTIVE_TASK_STATES = ("queued", "scheduled", "running", "restarting", "deferred", "up_for_retry")

    def cancel_everything(self, deadline_s: float = 900.0) -> None:
        """Cancel every backfill and fail every unfinished DAG run, then wait until no task instance is still
        active: what one test started must not hold the next one up (a backfill left running made the next
        `backfill create` fail with AlreadyRunningBackfill). Each test calls this in its teardown."""
        dag_ids = [dag["dag_id"] for dag in self.request("GET", "/api/v2/dags?limit=100")["dags"]]
        for dag_id in dag_ids:
            for backfill in self.request("GET", f"/api/v2/backfills?dag_id={dag_id}")["backfills"]:
                if not backfill["completed_at"]:
                    self.request("PUT", f"/api/v2/backfills/{backfill['id']}/cancel")
            states = "&".join(f"state={state}" for state in self.UNFINISHED_RUN_STATES)
            for run in self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?{states}&limit=100")["dag_runs"]:
                path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run['dag_run_id'])}"
                self.request("PATCH", path, {"state": "failed"})
        states = "&".join(f"state={state}" for state in self.ACTIVE_TASK_STATES)

        def settled() -> bool:
            return not self.request("GET", f"/api/v2/dags/~/dagRuns/~/taskInstances?{states}")[
                "task_instances"
            ]

        self.wait(settled, "the cancelled runs' tasks to stop", deadline_s, every_s=1.0)

    def create_backfill(
        self, dag_id: str, from_date: str, to_date: str, *extra: str, attempts: int = 5
    ) -> int:
        """`airflow backfill create`, and the new backfill's id. On SQLite a busy database can fail the command
        after it committed the backfill but before it attached every run ("database is locked"): retrying it
        as is fails with AlreadyRunningBackfill, and the partial backfill would skip dates. So a partial one
        is cancelled, its runs failed (``cancel_everything``), and the command runs again, re-running those
        failed runs."""
        for _ in range(attempts):
            before = max((b["id"] for b in self.backfills(dag_id)), default=0)
            done = self.airflow(
                "backfill", "create", "--dag-id", dag_id, "--from-date", from_date, "--to-date", to_date, *extra,
                check=False, attempts=1,
            )  # fmt: skip
            created = [b["id"] for b in self.backfills(dag_id) if b["id"] > before]
            if done.returncode == 0 and created:
                return max(created)
            if "database is locked" not in done.stderr + done.stdout:
                raise RuntimeError(f"backfill create exited {done.returncode}:\n{done.stderr[-3000:]}")
            if created:
                self.cancel_everything()
                if "--reprocess-behavior" not in extra:  # the partial backfill's runs exist now, failed
                    extra = (*extra, "--reprocess-behavior", "failed")
        raise RuntimeError(f"backfill create found the database locked {attempts} times")

    def backfills(self, dag_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/api/v2/backfills?dag_id={dag_id}&limit=100")["backfills"]

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        run = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}")["state"]

    def wait_for_run(self, dag_id: str, run_id: str, deadline_s: float = 2400.0) -> str:
        def finished() -> str | None:
            state = self.run_state(dag_id, run_id)
            return state if state in ("success", "failed") else None

        return self.wait(finished, f"{dag_id} run {run_id} to finish", deadline_s, every_s=2.0)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        answer = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}/taskInstances"
        )
        return {ti["task_id"]: ti for ti in answer["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as the UI shows it, one line per record (Airflow 3 serves records as JSON)."""
        answer = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}/taskInstances/{task_id}"
            f"/logs/{try_number}?full_content=true",
        )
        content = answer["content"]
        return "\n".join(json.dumps(record) if not isinstance(record, str) else record for record in content)
