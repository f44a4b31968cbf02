"""A local HTTP server speaking the Kubernetes REST protocol for two resources: kubeflow.org/v1 PyTorchJobs and
Kubeflow Trainer v2 trainer.kubeflow.org/v1alpha1 TrainJobs.

This is a protocol test double, NOT a cluster (no Kubernetes API server can run on these machines). It
implements, with the paths, status codes and `Status` bodies of the real API server:

- POST/GET/DELETE ``/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs[/{name}]`` and
  ``/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs[/{name}]`` (201, 200, 404, 409, 422, 401
  without the bearer token of the kubeconfig it writes);
- GET ``/api/v1/namespaces/{ns}/pods?labelSelector=...`` and ``.../pods/{name}/log``.

It also plays the controllers, deterministically: each GET of a job advances its status one step through a
script. A PyTorchJob's conditions go Created -> Running -> ... -> Succeeded or Failed, as the
training-operator sets them, and its Master pod exists once the job runs. A TrainJob has conditions only at
the end (Complete or Failed, copied from its JobSet, or Suspended), and `jobsStatus` says its child Job is
active while it runs; its node-0 pod carries the JobSet's labels (jobset-name, replicatedjob-name=node,
job-index, job-completion-index). Either pod has a fixed log. Deletion takes one more GET to finish, as finalizers make it on a cluster.
No step depends on time. Every request is recorded for the tests to assert on.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

TOKEN = "protocol-test-token"
JOBS = re.compile(
    r"^/apis/(kubeflow\.org/v1|trainer\.kubeflow\.org/v1alpha1)/namespaces/([^/]+)/(pytorchjobs|trainjobs)"
    r"(?:/([^/]+))?$"
)
KINDS = {  # plural -> (apiVersion, kind, group)
    "pytorchjobs": ("kubeflow.org/v1", "PyTorchJob", "kubeflow.org"),
    "trainjobs": ("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainer.kubeflow.org"),
}
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class StoredJob:
    body: dict[str, Any]
    script: list[str]
    step: int = 0
    deleting: bool = False

    @property
    def plural(self) -> str:
        return "trainjobs" if self.body.get("kind") == "TrainJob" else "pytorchjobs"

    @property
    def state(self) -> str:
        return self.script[min(self.step, len(self.script) - 1)]


@dataclass
class ProtocolServer:
    """Start with ``with ProtocolServer() as server:``; ``server.kubeconfig(path)`` writes a kubeconfig."""

    script: list[str] = field(default_factory=lambda: ["Created", "Running", "Succeeded"])
    trainjob_script: list[str] = field(default_factory=lambda: ["Created", "Running", "Complete"])
    """A TrainJob's steps: Created (no status yet), Running (its Job active), Suspended, Complete, Failed."""
    master_log: str = "rank0: step 1 loss 5.0\nrank0: step 2 loss 4.0\ntraining done"
    jobs: dict[tuple[str, str], StoredJob] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    fail_next_gets: int = 0
    """Answer this many following job GETs with 500, as an overloaded API server would."""
    hide_next_gets: int = 0
    """Answer this many following job GETs with 404 although the job exists: another client creates it
    between a reader's GET and its POST."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ProtocolServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "protocol-test", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": TOKEN}}],
                    "contexts": [
                        {
                            "name": "protocol-test",
                            "context": {"cluster": "protocol-test", "user": "tester", "namespace": namespace},
                        }
                    ],
                    "current-context": "protocol-test",
                }
            )
        )
        return path

    def seed(self, body: dict[str, Any], script: list[str] | None = None, step: int = 0) -> None:
        """Store a job as if an earlier try had created it."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        default = self.trainjob_script if body.get("kind") == "TrainJob" else self.script
        self.jobs[key] = StoredJob(self._stamped(body), list(script or default), step=step)

    def live(self) -> dict[tuple[str, str], StoredJob]:
        """The jobs not being deleted."""
        return {key: job for key, job in self.jobs.items() if not job.deleting}

    def count(self, method: str, kind: str = "pytorchjobs") -> int:
        return sum(1 for m, path in self.requests if m == method and kind in path)

    # --- the protocol ---------------------------------------------------------------------------------

    @staticmethod
    def _stamped(body: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        meta = body.setdefault("metadata", {})
        meta.update(
            {"uid": str(uuid.uuid4()), "resourceVersion": "1", "creationTimestamp": _now(), "generation": 1}
        )
        body["status"] = {}
        return body

    @staticmethod
    def _with_status(job: StoredJob) -> dict[str, Any]:
        if job.plural == "trainjobs":
            return ProtocolServer._with_trainjob_status(job)
        body = json.loads(json.dumps(job.body))
        done = job.state in ("Succeeded", "Failed")
        conditions = []
        for state in job.script[: min(job.step, len(job.script) - 1) + 1]:
            # As the training-operator does: a finished or restarting job is no longer Running.
            superseded = {"Succeeded": "Running", "Failed": "Running", "Restarting": "Running"}.get(state)
            if state == "Running":
                superseded = "Restarting"
            for condition in conditions:
                if condition["type"] == superseded:
                    condition["status"] = "False"
            conditions.append(
                {
                    "type": state,
                    "status": "True",
                    "reason": f"PyTorchJob{state}",
                    "message": f"PyTorchJob {body['metadata']['name']} is {state.lower()}.",
                    "lastTransitionTime": _now(),
                    "lastUpdateTime": _now(),
                }
            )
        body["status"] = {"conditions": conditions, "startTime": _now()}
        if done:
            body["status"]["completionTime"] = _now()
        if job.deleting:
            body["metadata"]["deletionTimestamp"] = _now()
        return body

    @staticmethod
    def _with_trainjob_status(job: StoredJob) -> dict[str, Any]:
        """As the Trainer reports a TrainJob: a terminal condition copied from the JobSet's (reason and
        message as the JobSet controller writes them), and the child Jobs' counts in jobsStatus."""
        body = json.loads(json.dumps(job.body))
        state = job.state
        counts = {"ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        conditions = []
        if state == "Running":
            counts.update(active=1, ready=1)
        elif state == "Suspended":
            counts["suspended"] = 1
            conditions.append(("Suspended", "Suspended", "TrainJob is suspended"))
        elif state == "Complete":
            counts["succeeded"] = 1
            conditions.append(("Complete", "AllJobsCompleted", "jobset completed successfully"))
        elif state == "Failed":
            counts["failed"] = 1
            conditions.append(
                ("Failed", "FailedJobs", "jobset failed due to reaching max number of restarts")
            )
        body["status"] = {
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": _now(),
                    "observedGeneration": 1,
                }
                for kind, reason, message in conditions
            ],
            "jobsStatus": [] if state == "Created" else [{"name": "node", **counts}],
        }
        if job.deleting:
            body["metadata"]["deletionTimestamp"] = _now()
        return body

    def _handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if match := JOBS.match(path):
            api_version, namespace, plural, name = match.groups()
            if KINDS[plural][0] != api_version:
                return 404, status_body(
                    404, "NotFound", f"the server could not find the requested resource ({path})"
                )
            return self._jobs(method, namespace, plural, name, body)
        if (match := PODS.match(path)) and method == "GET":
            return 200, self._pod_list(match.group(1), query.get("labelSelector", [""])[0])
        if (match := POD_LOG.match(path)) and method == "GET":
            namespace, pod = match.groups()
            owners = [
                (name, job)
                for (ns, name), job in self.jobs.items()
                if ns == namespace and pod == self._pod_name(name, job)
            ]
            if not owners:
                return 404, status_body(404, "NotFound", f'pods "{pod}" not found')
            container = self._pod_labels(*owners[0])[1]
            asked = query.get("container", [container])[0]
            if asked != container:
                return 400, status_body(400, "BadRequest", f"container {asked} is not valid for pod {pod}")
            return 200, self.master_log
        return 404, status_body(404, "NotFound", f"the server could not find the requested resource ({path})")

    def _jobs(self, method: str, namespace: str, plural: str, name: str | None, body: Any) -> tuple[int, Any]:
        api_version, kind, group = KINDS[plural]
        if method == "POST" and name is None:
            if not isinstance(body, dict) or body.get("kind") != kind:
                return 400, status_body(400, "BadRequest", f"body is not a {kind}")
            if body.get("apiVersion") != api_version:
                return 400, status_body(400, "BadRequest", f"apiVersion must be {api_version}")
            meta = body.get("metadata") or {}
            if not meta.get("name"):
                return 422, status_body(422, "Invalid", "metadata.name: Required value")
            if meta.get("namespace", namespace) != namespace:
                return 400, status_body(
                    400, "BadRequest", "the namespace of the object does not match the path"
                )
            key = (namespace, meta["name"])
            if key in self.jobs:
                return 409, status_body(
                    409, "AlreadyExists", f'{plural}.{group} "{meta["name"]}" already exists'
                )
            script = self.trainjob_script if plural == "trainjobs" else self.script
            self.jobs[key] = StoredJob(
                self._stamped({**body, "metadata": {**meta, "namespace": namespace}}), list(script)
            )
            return 201, self.jobs[key].body
        if name is None:
            return 405, status_body(405, "MethodNotAllowed", "method not allowed")
        key = (namespace, name)
        job = self.jobs.get(key)
        if job is not None and job.plural != plural:  # the same name under the other resource
            job = None
        missing = status_body(404, "NotFound", f'{plural}.{group} "{name}" not found')
        if method == "GET":
            if self.fail_next_gets > 0:
                self.fail_next_gets -= 1
                return 500, status_body(500, "InternalError", "etcdserver: request timed out")
            if job is None or self.hide_next_gets > 0:
                self.hide_next_gets = max(0, self.hide_next_gets - 1)
                return 404, missing
            if job.deleting:  # the finalizers have run by the next read
                del self.jobs[key]
                return 200, self._with_status(job)
            answer = self._with_status(job)
            job.step += 1
            return 200, answer
        if method == "DELETE":
            if job is None or job.deleting:
                return 404, missing
            job.deleting = True
            return 200, status_body(200, "", "") | {"details": {"name": name, "kind": plural}}
        return 405, status_body(405, "MethodNotAllowed", "method not allowed")

    @staticmethod
    def _pod_name(name: str, job: StoredJob) -> str:
        # A JobSet's pod: <jobset>-<replicated job>-<job index>-<completion index>-<suffix>
        return f"{name}-node-0-0-x7k2p" if job.plural == "trainjobs" else f"{name}-master-0"

    @staticmethod
    def _pod_labels(name: str, job: StoredJob) -> tuple[dict[str, str], str]:
        """(labels, training container) of a job's first pod, as the controllers label it."""
        if job.plural == "trainjobs":
            labels = {
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": "0",
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            }
            return labels, "node"
        labels = {
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/job-role": "master",
            "training.kubeflow.org/replica-type": "master",
            "training.kubeflow.org/replica-index": "0",
        }
        return labels, "pytorch"

    def _pod_list(self, namespace: str, selector: str) -> dict[str, Any]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = []
        for (ns, name), job in self.jobs.items():
            if ns != namespace or job.step == 0:  # no pods before the controller reconciled the job
                continue
            labels, container = self._pod_labels(name, job)
            if all(labels.get(k) == v for k, v in wanted.items()):
                items.append(
                    {
                        "metadata": {
                            "name": self._pod_name(name, job),
                            "namespace": ns,
                            "labels": labels,
                            "creationTimestamp": _now(),
                        },
                        "spec": {"containers": [{"name": container, "image": "pretrain-pipeline"}]},
                        "status": {
                            "phase": "Succeeded" if job.state in ("Succeeded", "Complete") else "Running"
                        },
                    }
                )
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _serve(self, method: str) -> None:
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with server._lock:
                    server.requests.append((method, parsed.path))
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        code, answer = 401, status_body(401, "Unauthorized", "Unauthorized")
                    else:
                        body = json.loads(raw) if raw else None
                        code, answer = server._handle(method, parsed.path, parse_qs(parsed.query), body)
                is_text = isinstance(answer, str)
                payload = answer.encode() if is_text else json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if is_text else "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        return Handler
