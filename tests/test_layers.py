"""Which package may import which (docs/development.md#layers), checked on the source of every module.

The picture: ``pipeline.core`` and the stage registry ``pipeline.stages`` import no other pipeline package;
the model imports only core (and the CUDA extension); stage packages build on core, the registry, the config
tree, the entrypoint and the document pieces they share (``pipeline.documents``), never on another stage;
``operators`` and ``dags`` sit on top, and a DAG file reads the config and the registry, never a stage package.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.stages import STAGES
from tests.conftest import PROJECT_ROOT

STAGE_BASE = {
    "pipeline.core",
    "pipeline.stages",
    "pipeline.config",
    "pipeline.entrypoint",
    "pipeline.documents",
}
ALLOWED: dict[str, set[str]] = {
    "pipeline.core": set(),
    "pipeline.stages": set(),
    "pipeline.model": {"pipeline.core", "cuda_ext"},
    "pipeline.embeddings": {"pipeline.core"},
    # Shared by the stages; the config tree only for type hints.
    "pipeline.documents": {"pipeline.core", "pipeline.config"},
    # The token-shard format and its tokenizer's digest, which the tokenize stage writes and training reads.
    "pipeline.data": {"pipeline.core"},
    # The tree's typed fields need the section classes, and those live in each package's config module
    # (SECTION_MODULE): the one thing of a stage package the tree imports.
    "pipeline.config": {"pipeline.core", "pipeline.stages"},
    "pipeline.entrypoint": {
        "pipeline.core",
        "pipeline.stages",
        "pipeline.config",
        "pipeline.logshipping",
        "pipeline.tracking",
    },
    "pipeline.cli": {"pipeline.core", "pipeline.stages"},
    "pipeline.config_cli": {"pipeline.core", "pipeline.entrypoint"},
    "pipeline.demo": {"pipeline.core", "pipeline.stages", "pipeline.config"},
    "pipeline.crawl": STAGE_BASE,
    "pipeline.clean": STAGE_BASE,
    "pipeline.ingest": STAGE_BASE,
    "pipeline.dedup": STAGE_BASE | {"pipeline.embeddings"},
    "pipeline.quality": STAGE_BASE | {"pipeline.embeddings"},
    "pipeline.classify": STAGE_BASE | {"pipeline.embeddings"},
    "pipeline.decontaminate": STAGE_BASE,
    "pipeline.tokenization": STAGE_BASE | {"pipeline.data"},
    "pipeline.tracking": {"pipeline.core", "pipeline.stages", "pipeline.config"},
    "pipeline.logshipping": {"pipeline.core", "pipeline.config"},
    "pipeline.train": STAGE_BASE | {"pipeline.data", "pipeline.model", "pipeline.tracking"},
    "pipeline.export": STAGE_BASE | {"pipeline.model"},
    "pipeline.evaluate": STAGE_BASE | {"pipeline.data", "pipeline.model"},
    "pipeline.report": STAGE_BASE | {"pipeline.model", "pipeline.tracking"},
    # Ablations drive whole stage chains and training, then score the trained models; the reference check
    # applies decontamination's own n-gram rule (its normalisation and short-document rule).
    "pipeline.ablate": STAGE_BASE
    | {
        "pipeline.data",
        "pipeline.decontaminate",
        "pipeline.evaluate",
        "pipeline.model",
        "pipeline.quality",
        "pipeline.tokenization",
        "pipeline.tracking",
        "pipeline.train",
    },
    "operators": {
        "pipeline.ablate",
        "pipeline.core",
        "pipeline.stages",
        "pipeline.config",
        "pipeline.entrypoint",
        "pipeline.crawl",
        "pipeline.quality",
        "pipeline.train",
    },
    "dags": {"operators", "pipeline.core", "pipeline.stages", "pipeline.config"},
    # The kernels and their wrappers sit below the model: torch only, nothing of ours.
    "cuda_ext": set(),
}
OURS = ("pipeline", "operators", "dags", "cuda_ext")
SECTION_MODULE = re.compile(r"^pipeline\.\w+\.config(\.\w+)?$")  # pipeline.train.config(.TrainConfig)


def layer(module: str) -> str:
    """``pipeline.train.trainer`` -> ``pipeline.train``; ``operators.kubeflow.api`` -> ``operators``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" and len(parts) > 1 else parts[0]


@functools.cache  # parsed once for all the tests here (each would otherwise parse every file again)
def imported_modules(path: Path) -> frozenset[str]:
    """Every absolute import of one source file, at any depth (lazy imports inside functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # ``from cuda_ext import moe_routing`` imports a module, not only the package's __init__.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return frozenset(found)


def source_files(root: str):
    for path in sorted((PROJECT_ROOT / root).rglob("*.py")):
        yield ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts), path


def layer_imports() -> dict[str, dict[str, set[str]]]:
    """layer -> imported layer -> the modules importing it."""
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for root in OURS:
        for module, path in source_files(root):
            for name in imported_modules(path):
                if name.split(".")[0] in OURS and layer(name) != layer(module):
                    if layer(module) == "pipeline.config" and SECTION_MODULE.match(name):
                        continue
                    edges[layer(module)][layer(name)].add(module)
    return edges


def installed_packages() -> set[str]:
    """The top-level packages setup.cfg installs (``[options.packages.find] include``), by their folders."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(PROJECT_ROOT / "setup.cfg")
    patterns = parser["options.packages.find"]["include"].split()
    return {pattern.rstrip("*") for pattern in patterns}


def test_the_picture_covers_every_package():
    """Every installed package and the DAGs are scanned, and every layer found in them has a row in ALLOWED
    (a new package is placed in the picture, not let through unchecked)."""
    assert installed_packages() | {"dags"} <= set(OURS)
    layers = {layer(module) for root in OURS for module, _ in source_files(root)}
    layers = {name.removesuffix(".__init__") for name in layers}
    missing = sorted(layers - set(ALLOWED) - {"pipeline"})
    assert not missing, f"packages missing from the layer picture: {missing}"


def stage_packages() -> set[str]:
    """The packages of the stages the registry names (``pipeline.classify.training`` is classify's)."""
    return {layer(entry.package) for entry in STAGES}


def test_no_stage_package_imports_another():
    """A stage shares code through ``pipeline.documents`` (or core, data, model), never by importing another
    stage's package: each can then be read, tested and changed alone."""
    stages = stage_packages()
    allowed_by_picture = {
        source: sorted(ALLOWED[source] & stages) for source in stages if ALLOWED[source] & stages
    }
    assert not allowed_by_picture, allowed_by_picture
    breaches = {
        f"{source} -> {target}": sorted(modules)
        for source, targets in layer_imports().items()
        if source in stages
        for target, modules in targets.items()
        if target in stages
    }
    assert not breaches, breaches


def test_every_layer_imports_only_what_the_picture_allows():
    edges = layer_imports()
    unknown = sorted(set(edges) - set(ALLOWED))
    assert not unknown, f"packages missing from the layer picture: {unknown}"
    breaches = {
        f"{source} -> {target}": sorted(modules)
        for source, targets in edges.items()
        for target, modules in targets.items()
        if target not in ALLOWED[source]
    }
    assert not breaches, breaches


def module_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (lazy imports included; a package import means its __init__)."""
    paths = {}
    for root in OURS:
        for module, path in source_files(root):
            paths[module.removesuffix(".__init__")] = path

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    return {
        module: {found for name in imported_modules(path) if (found := resolve(name)) not in (None, module)}
        for module, path in paths.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_import_circle_crosses_a_layer():
    """A circle between packages (tracking <-> entrypoint, over run_cli, was one) means neither can be read,
    tested or moved alone. Within one package a lazy import for typing may close one."""
    crossing = [group for group in import_cycles(module_graph()) if len({layer(m) for m in group}) > 1]
    assert not crossing, crossing


def package_cycles(edges: dict[str, set[str]] | dict[str, dict[str, set[str]]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {source: set(targets) for source, targets in edges.items()}
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    return import_cycles(graph)


def test_no_two_packages_import_each_other():
    """Packages are layers: no circle of packages, in the picture or in the code, even where no module circle
    closes (pipeline.data and pipeline.tokenization imported each other, over the tokenizer's digest one way
    and the shard writer the other), so each package reads without the ones above it. The config tree's
    section modules are the one exception (``layer_imports`` skips them)."""
    assert not package_cycles(ALLOWED), "the picture allows a circle of packages"
    assert not package_cycles(layer_imports())


@pytest.mark.parametrize("module", ["pipeline.core", "pipeline.stages"])
def test_importing_a_bottom_layer_loads_no_stage_package(module):
    """In a fresh interpreter: importing all of pipeline.core, or the registry, pulls in no other package."""
    script = (
        "import importlib, pkgutil, sys\n"
        f"top = importlib.import_module({module!r})\n"
        "for info in pkgutil.iter_modules(getattr(top, '__path__', [])):\n"
        f"    importlib.import_module({module!r} + '.' + info.name)\n"
        f"print(sorted(m for m in sys.modules if m.startswith('pipeline.') and layer(m) != {module!r}))\n"
    )
    prelude = "def layer(m):\n    parts = m.split('.')\n    return '.'.join(parts[:2])\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + script], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT
    )
    assert result.stdout.strip() == "[]", result.stdout


def torch_file_calls(path: Path) -> list[str]:
    """``torch.load`` / ``torch.save`` calls (and pickle imports) in one file, as ``name:line``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("load", "save"):
            if isinstance(node.value, ast.Name) and node.value.id == "torch":
                found.append(f"torch.{node.attr}:{node.lineno}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            if "pickle" in names:
                found.append(f"pickle:{node.lineno}")
    return found


def test_only_the_model_package_opens_checkpoint_files():
    """The checkpoint format has one home (pipeline/model/checkpoint.py); everyone else goes through it."""
    offenders = {
        module: calls
        for root in ("pipeline", "operators")
        for module, path in source_files(root)
        if not module.startswith("pipeline.model.")
        if (calls := torch_file_calls(path))
    }
    assert not offenders, offenders
