"""Trim an upstream Kubeflow Trainer CRD to the part our manifests are validated against.

    python docker/k8s/crds/trim_crd.py UPSTREAM.yaml SOURCE-NOTE > trimmed.yaml

The upstream CRDs embed the whole OpenAPI schema of core Kubernetes types (PodSpec, Volume, EnvVar, ...),
hundreds of kB each. As for the PyTorchJob CRD next to them, those subtrees become
`x-kubernetes-preserve-unknown-fields` (the tests and the operator validate the core-typed parts with
kubernetes-validate against the Kubernetes OpenAPI schema instead) and descriptions are dropped; every
Trainer-specific field, type, bound, enum and `required` list stays as upstream.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

# Paths from the openAPIV3Schema root; `[]` steps into array items.
_PATCH_POD = (
    "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec"
)
CORE_TYPED = {
    "TrainJob": [
        "status",  # written by the controller, never by us
        "spec.initializer",  # dataset/model initializers: not used by this pipeline
        "spec.trainer.env[]",
        "spec.trainer.resourcesPerNode",
        f"{_PATCH_POD}.volumes[]",
        f"{_PATCH_POD}.affinity",
        f"{_PATCH_POD}.securityContext",
        f"{_PATCH_POD}.tolerations[]",
        f"{_PATCH_POD}.containers[].env[]",
        f"{_PATCH_POD}.containers[].volumeMounts[]",
        f"{_PATCH_POD}.containers[].securityContext",
        f"{_PATCH_POD}.initContainers[].env[]",
        f"{_PATCH_POD}.initContainers[].volumeMounts[]",
        f"{_PATCH_POD}.initContainers[].securityContext",
    ],
    "ClusterTrainingRuntime": [
        "spec.template.spec.replicatedJobs[].template.spec.template.spec",  # a core/v1 PodSpec
        "spec.template.spec.replicatedJobs[].template.spec.podFailurePolicy",
        "spec.template.spec.replicatedJobs[].template.spec.selector",
        "spec.podGroupPolicy.volcano",
    ],
}


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


def _opaque(schema: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in schema.items() if k in ("type", "required") or k.startswith("x-kubernetes-list")}
    return {**kept, "x-kubernetes-preserve-unknown-fields": True}


def _replace(schema: dict[str, Any], steps: list[str]) -> None:
    step, rest = steps[0], steps[1:]
    items = step.endswith("[]")
    node = schema["properties"][step.removesuffix("[]")]
    if items:
        parent, key, node = node, "items", node["items"]
    else:
        parent, key = schema["properties"], step.removesuffix("[]")
    if rest:
        _replace(node, rest)
    else:
        parent[key] = _opaque(node)


def trim(crd: dict[str, Any]) -> dict[str, Any]:
    crd = _without_descriptions(crd)
    for version in crd["spec"]["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        for path in CORE_TYPED[crd["spec"]["names"]["kind"]]:
            _replace(root, path.split("."))
    return crd


def main(argv: list[str]) -> int:
    upstream, note = argv
    (crd,) = [doc for doc in yaml.safe_load_all(Path(upstream).read_text()) if doc]
    sys.stdout.write(note.rstrip() + "\n---\n")
    yaml.safe_dump(trim(crd), sys.stdout, sort_keys=False, width=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
