"""The config mechanics every stage shares, and the sections that belong to no stage.

One typed tree holds every setting. This module knows how to build and check such a tree and holds the
sections that no stage owns (`project`, `spark`, `logging`); each stage's own sections live next to the stage
(``pipeline/<stage>/config.py``) and the registry (``pipeline.stages``) assembles the whole tree
(``pipeline.config.PipelineConfig``). So this module imports no stage package.

Precedence, lowest first: defaults in the section models, a YAML file, environment variables
(``PRETRAIN__TRAIN__STEPS=10``), then CLI overrides (``--set train.steps=10``). The tree is validated before
any work starts, and every error names the dotted key at fault. Typed values (the Airflow form's fields)
come last, set as given.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "PRETRAIN__"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_ROOT = "data"  # relative: the current directory's ./data
# The Unicode normal forms clean writes text in and the tokenizer normalises to (docs/clean.md says why NFC).
UnicodeForm = Literal["NFC", "NFKC"]


# ``Field(..., json_schema_extra=NAMES_OUTPUT)``: a key that names where an output goes, not how it is made;
# the config hash leaves it out.
NAMES_OUTPUT: dict[str, Any] = {"names_output": True}
# ``Field(..., json_schema_extra=CHOOSES_LAUNCHER)``: a key that says how training is started (torchrun here, a
# Kubernetes job), not what it computes; the config hash leaves it out too, so both launchers of the same settings
# share one hash.
CHOOSES_LAUNCHER: dict[str, Any] = {"chooses_launcher": True}
# ``Field(..., json_schema_extra=FROZEN_INPUTS)``: a key written when a run's config is frozen, recording what
# the run reads as resolved then (``data.resolved_mixture``), not a setting: it travels in the frozen file to
# every process of the run, and the hash, the MLflow params and the resume identity leave it out, as they do
# the snapshot.
FROZEN_INPUTS: dict[str, Any] = {"frozen_inputs": True}


class ConfigError(ValueError):
    """A config value is missing, unknown or invalid; the message names the key."""


class Section(BaseModel):
    # inf and nan are never a sensible setting (train.lr=.inf trained to NaN losses and published).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    # Old key -> the key that replaced it: a config still using the old name is refused naming the new one,
    # rather than with a bare "unknown key".
    renamed_keys: ClassVar[dict[str, str]] = {}

    def tree_problem(self, tree: Any) -> str | None:
        """What is wrong with this section next to the other sections of ``tree`` (naming the keys), or None.

        The checks that span sections, declared by the section that owns them (``train`` checks its
        pipeline split against ``model`` and ``data``), so the tree that assembles the sections needs to
        know none of them. Runs once the whole tree is validated.
        """
        return None


class ProjectConfig(Section):
    corpus: str = Field("sample", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    data_root: str = Field(
        DEFAULT_DATA_ROOT,
        validate_default=True,
        description="local folder (relative to the current directory) or fsspec URI",
    )
    seed: int = 1234

    @field_validator("data_root")
    @classmethod
    def _absolute_root(cls, data_root: str) -> str:
        # Resolved once, where the config is loaded, so child processes started elsewhere agree on it.
        if "://" in data_root:
            return data_root
        root = Path(data_root).expanduser().resolve()
        if problem := _data_root_problem(root):
            raise ValueError(problem)
        return str(root)


# Kernel interfaces, not storage: writing a dataset there fails deep inside a stage, or worse, succeeds.
VIRTUAL_FILESYSTEMS = (Path("/proc"), Path("/sys"))


def _data_root_problem(root: Path) -> str | None:
    """Why ``root`` (absolute, resolved) cannot hold a data root, or None. It need not exist yet."""
    for virtual in VIRTUAL_FILESYSTEMS:
        if root == virtual or virtual in root.parents:
            return f"{root} is inside {virtual}, a kernel interface, not a place to store data"
    existing = next((folder for folder in (root, *root.parents) if folder.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{root} cannot be a folder: {existing} is a file"
    return None


class SparkConfig(Section):
    master: str = "local[2]"
    remote: str | None = Field(
        None,
        pattern=r"^sc://[^/\s]+",
        description="a Spark Connect server (sc://host:port) to attach to instead of starting a JVM; "
        "default: $SPARK_REMOTE, else none (pipeline.core.spark)",
    )
    driver_memory: str = "2g"
    shuffle_partitions: int = Field(8, gt=0)
    min_rows_per_task: int = Field(
        256,
        gt=0,
        description="a Python pass (extraction, language id, scoring) over fewer rows than "
        "shuffle_partitions x this runs in fewer tasks: each Python worker's start (imports, models) costs "
        "more than a few hundred rows' work",
    )
    output_files: int = Field(
        4,
        gt=0,
        description="Parquet files per dataset; fixed so output bytes do not depend on input partitioning",
    )
    extra_conf: dict[str, str] = Field(default_factory=dict)


class LoggingConfig(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    console: bool = True
    elasticsearch_url: str | None = Field(
        None, description="ship ECS logs here (default: $ELASTICSEARCH_URL); credentials only from env"
    )
    data_stream: str = Field("logs-pretrain-default", pattern=r"^logs-pretrain-[a-z0-9][a-z0-9_.]*$")
    elasticsearch_setup: Literal["full", "template", "none"] = Field(
        "full",
        description="what ship-logs installs on first use: full (ILM policy, index template, data stream), "
        "template (the index template only: a server without ILM and data streams), none (installed "
        "elsewhere, e.g. docker/observability/elasticsearch)",
    )
    ship_in_process: bool = Field(False, description="each process also ships logs in a background thread")
    ship_interval_s: float = Field(5.0, gt=0)
    spool_max_bytes: int = Field(
        1 << 30, gt=0, description="stop reading new lines while the spool is this big"
    )
    retention: str = Field("30d", pattern=r"^[0-9]+[dhm]$", description="ILM: delete log indices this old")


class CoreConfig(Section):
    """The sections every process reads; ``pipeline.config.PipelineConfig`` adds each stage's own."""

    project: ProjectConfig = Field(default_factory=ProjectConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _sections_agree(self) -> CoreConfig:
        for name in type(self).model_fields:
            problem = getattr(self, name).tree_problem(self)
            if problem:
                raise ValueError(problem)
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    @property
    def hash(self) -> str:
        """Stable digest of the resolved settings; recorded in every manifest and MLflow run.

        Keys that only name an output (marked ``NAMES_OUTPUT``, such as ``train.run_id``) or choose the
        launcher (``CHOOSES_LAUNCHER``) are left out, as the snapshot is: two runs of the same settings share
        one hash.
        """
        tree = self._tree_without(NAMES_OUTPUT, CHOOSES_LAUNCHER, FROZEN_INPUTS)
        canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    # Stages that keep one output per run: this module knows no stage, so here none does; the pipeline's
    # tree (pipeline.config) answers from the stage registry.

    def keeps_runs(self, stage: str) -> bool:
        """Whether ``stage`` writes ``<stage>/<snapshot>/<run>/`` (one output per run) rather than one."""
        return False

    def named_run(self, stage: str) -> str | None:
        """The run of ``stage``'s output this config names, if any."""
        return None

    def flat(self) -> dict[str, Any]:
        """Dotted keys to the leaf values of the settings, for MLflow params (no ``FROZEN_INPUTS``)."""
        return flatten(self._tree_without(FROZEN_INPUTS))

    def _tree_without(self, *marks: dict[str, Any]) -> dict[str, Any]:
        """``to_dict()`` less the keys whose field carries one of ``marks`` (``json_schema_extra``)."""
        tree = self.to_dict()
        for name in type(self).model_fields:
            section = getattr(self, name)
            for key, field in type(section).model_fields.items():
                if (field.json_schema_extra or {}) in marks:
                    tree[name].pop(key, None)
        return tree

    def with_values(self, values: Mapping[str, Any], source: str) -> Self:
        """This config with dotted keys set to typed values (as the form's ``values`` are), validated again
        without reading the file or the environment a second time; a bad value raises ConfigError naming the
        key and ``source``."""
        tree = self.to_dict()
        for dotted, value in values.items():
            _set_dotted(tree, type(self), dotted, value, source=source)
        _check_values(tree, dict.fromkeys(values, source))
        try:
            return self.model_validate(tree)
        except ValidationError as exc:
            raise ConfigError(_format_validation_error(exc)) from None


Tree = TypeVar("Tree", bound=CoreConfig)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _file_settings(tree: Mapping[str, Any], model: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for each setting of a config file: down through the sections, but a free-form
    mapping (``spark.extra_conf``, whose keys are Spark's dotted names) is one value, set whole."""
    fields = getattr(model, "model_fields", None)
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        field = fields.get(key) if fields is not None else None
        annotation = field.annotation if field is not None else None
        section = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if isinstance(value, Mapping) and value and (field is None or section is not None):
            yield from _file_settings(value, section, dotted + ".")  # a section (or a misspelt one)
        else:
            yield dotted, value


def unknown_key_message(part: str, known: Iterable[str]) -> str:
    """`unknown key 'stpes'; did you mean 'steps'? known: [...]`: the one wording for a misspelt key."""
    close = difflib.get_close_matches(part, list(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {part!r}; {hint}known: {sorted(known)}"


def _set_dotted(tree: dict[str, Any], schema: type[BaseModel], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node: Any = tree
    model: Any = schema
    for depth, part in enumerate(parts):
        is_last = depth == len(parts) - 1
        fields = getattr(model, "model_fields", None)
        if fields is not None:
            if part not in fields:
                where = ".".join(parts[:depth]) or "the top level"
                if renamed := getattr(model, "renamed_keys", {}).get(part):
                    new_key = ".".join([*parts[:depth], renamed, *parts[depth + 1 :]])
                    raise ConfigError(f"{dotted}: renamed to {new_key}; set that key instead (from {source})")
                raise ConfigError(
                    f"{dotted}: {unknown_key_message(part, fields)} under {where} (from {source})"
                )
            annotation = fields[part].annotation
            model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if is_last:
            node[part] = value
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"{dotted}: {'.'.join(parts[: depth + 1])} is not a section (from {source})"
                )


# Deeper than any config needs (section.key plus a free-form mapping or two), and far below the depth at
# which PyYAML's recursive composer (or a walk of the tree) runs out of stack: a document nested a few
# thousand levels deep would end in a RecursionError traceback of ~3,000 lines.
MAX_CONFIG_DEPTH = 32


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader for config text: no anchors and aliases (a few hundred bytes of nested aliases, a "billion
    laughs" document, expand to billions of nodes once something walks the tree; no config needs them), at
    most MAX_CONFIG_DEPTH levels of nesting, and no key twice in one mapping (silently, the last one won)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._path: list[str] = []  # the keys (and [indices]) down to the node being composed
        self._mapping_paths: dict[int, list[str]] = {}  # id(mapping node) -> its path, for errors

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise ConfigError(f"YAML aliases (*name) are not accepted in config (line {mark.line + 1})")
        if isinstance(index, yaml.ScalarNode):
            self._path.append(str(index.value))
        elif isinstance(index, int):
            self._path.append(f"[{index}]")
        else:
            self._path.append("")  # a document root, or a key being composed
        try:
            if len(self._path) > MAX_CONFIG_DEPTH + 1:
                where = _shown_path(self._path)
                raise ConfigError(
                    f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep (line {mark.line + 1}); "
                    "no setting needs that"
                )
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.MappingNode):
                self._mapping_paths[id(node)] = list(self._path)
            return node
        finally:
            self._path.pop()

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise ConfigError(
                        f"{_shown_path([*self._mapping_paths.get(id(node), []), str(key)])}: duplicate key {key!r} at line "
                        f"{seen[key]} and line {line}; keep one"
                    )
                seen[key] = line
            except TypeError:  # an unhashable key: SafeConstructor names it below
                continue
        return super().construct_mapping(node, deep=deep)


def _shown_path(path: list[str]) -> str:
    keys = [part for part in path if part]
    text = ".".join(keys).replace(".[", "[") or "the top level"
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(keys)} levels)"


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)


def _parse_scalar(text: str, key: str, source: str) -> Any:
    """`--set train.steps=10` gives an int, `=[a, b]` a list, `=null` None: YAML scalar rules."""
    try:
        return _load_yaml(text)
    except yaml.YAMLError:
        return text
    except ConfigError as exc:  # too deep, an alias, a duplicate key: name the setting it was meant for
        raise ConfigError(f"{key} (from {source}): {exc}") from None


# scheme://user:password@host: the userinfo part of a URL
URL_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]*@")


def redact_url(url: str) -> str:
    """``url`` without its userinfo (``https://user:secret@host`` -> ``https://***@host``), for messages."""
    return URL_USERINFO.sub(lambda match: match.group(0).split("://", 1)[0] + "://***@", url)


def _check_values(tree: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """What no section type can check in free-form values (``model.overrides``, ``spark.extra_conf``) as
    well as in typed ones: every number finite, and no credentials inside a URL (the config is recorded in
    manifests, MLflow params and artifacts and logs; credentials come from the environment only)."""
    stack: list[tuple[str, Any]] = [(key, value) for key, value in tree.items()]
    while stack:
        key, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: {value} is not a finite number{_from(key, sources)}")
        elif isinstance(value, str) and URL_USERINFO.match(value):
            raise ConfigError(
                f"{key}: {redact_url(value)} carries credentials (user:password@) inside the URL"
                f"{_from(key, sources)}; the config is recorded in manifests, MLflow and logs, so credentials "
                "come from the environment only (e.g. ELASTICSEARCH_USERNAME/ELASTICSEARCH_PASSWORD, "
                "ELASTICSEARCH_API_KEY, MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD)"
            )


def _from(key: str, sources: Mapping[str, str]) -> str:
    """`` (from --set)``: where the setting at ``key`` (or the section above it) came from."""
    while key:
        if key in sources:
            return f" (from {sources[key]})"
        key = key.rpartition(".")[0]
    return ""


MAX_SHOWN_CHARS = 200  # an error echoes at most this much of a bad value
MAX_SHOWN_ERRORS = 10


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} chars)"


def parse_overrides(pairs: Iterable[str]) -> list[tuple[str, Any]]:
    parsed = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {_shown(pair)} must look like section.key=value")
        parsed.append((key.strip(), _parse_scalar(raw, key.strip(), "--set")))
    return parsed


def without_config_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the ``PRETRAIN__`` settings: for a child process that reads a resolved config file,
    which holds them already, so nothing applies twice."""
    return {key: value for key, value in environ.items() if not key.startswith(ENV_PREFIX)}


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any]]:
    pairs = []
    for name, raw in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            pairs.append((dotted, _parse_scalar(raw, dotted, f"env {name}")))
    return pairs


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    errors = error.errors()
    for item in errors[:MAX_SHOWN_ERRORS]:
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        shown = item.get("input")
        suffix = f" (got {_shown(shown)})" if shown is not None and not isinstance(shown, dict) else ""
        lines.append(f"{key}: {message}{suffix}")
    if len(errors) > MAX_SHOWN_ERRORS:
        lines.append(f"... and {len(errors) - MAX_SHOWN_ERRORS} more")
    if len(lines) == 1:  # the common case, one line like every other refusal
        return f"invalid config: {lines[0]}"
    return "invalid config:\n  " + "\n  ".join(lines)


def read_yaml_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = _load_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    except ConfigError as exc:  # nested too deep, an alias, a duplicate key
        raise ConfigError(f"config file {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return loaded


def load_tree(
    schema: type[Tree],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Tree:
    """Build and validate a config tree of type ``schema``; raises ConfigError naming the bad key.

    ``values`` (dotted key -> value) come last and are set as given, typed, not parsed from text: the
    Airflow form's fields.

    Callers want ``pipeline.config.load_config``, which passes the whole pipeline's tree.
    """
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}  # dotted key -> where its value came from, for errors
    if path is not None:
        path = Path(path)
        for dotted, value in _file_settings(read_yaml_file(path), schema):
            _set_dotted(tree, schema, dotted, value, source=str(path))
            sources[dotted] = str(path)
    environ = os.environ if environ is None else environ
    for dotted, value in env_overrides(environ):
        source = f"env {ENV_PREFIX}{dotted.upper().replace('.', '__')}"
        _set_dotted(tree, schema, dotted, value, source=source)
        sources[dotted] = source
    for dotted, value in parse_overrides(overrides):
        _set_dotted(tree, schema, dotted, value, source="--set")
        sources[dotted] = "--set"
    for dotted, value in (values or {}).items():
        _set_dotted(tree, schema, dotted, value, source="the form")
        sources[dotted] = "the form"
    _check_values(tree, sources)
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None
