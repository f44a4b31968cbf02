"""The config mechanics every stage shares, and the sections that belong to no stage.

One typed tree holds every setting. This module knows how to build and check such a tree and holds the
sections that no stage owns (`project`, `spark`, `logging`); each stage's own sections live next to the stage
(``pipeline/<stage>/config.py``) and the registry (``pipeline.stages``) assembles the whole tree
(``pipeline.config.PipelineConfig``). So this module imports no stage package.

Precedence, lowest first: defaults in the section models, a YAML file, environment variables
(``PRETRAIN__TRAIN__STEPS=10``), then CLI overrides (``--set train.steps=10``). The tree is validated before
any work starts, and every error names the dotted key at fault.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "PRETRAIN__"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_ROOT = "data"  # relative: the current directory's ./data


# ``Field(..., json_schema_extra=NAMES_OUTPUT)``: a key that names where an output goes, not how it is made;
# the config hash leaves it out.
NAMES_OUTPUT: dict[str, Any] = {"names_output": True}


class ConfigError(ValueError):
    """A config value is missing, unknown or invalid; the message names the key."""


class Section(BaseModel):
    # inf and nan are never a sensible setting (train.lr=.inf trained to NaN losses and published).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


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
        return str(Path(data_root).expanduser().resolve())


class SparkConfig(Section):
    master: str = "local[2]"
    driver_memory: str = "2g"
    shuffle_partitions: int = Field(8, gt=0)
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

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    @property
    def hash(self) -> str:
        """Stable digest of the resolved settings; recorded in every manifest and MLflow run.

        Keys that only name an output (marked ``NAMES_OUTPUT``, such as ``train.run_id``) are left out, as
        the snapshot is: two runs of the same settings share one hash.
        """
        tree = self.to_dict()
        for name in type(self).model_fields:
            section = getattr(self, name)
            for key, field in type(section).model_fields.items():
                if (field.json_schema_extra or {}) == NAMES_OUTPUT:
                    tree[name].pop(key, None)
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
        """Dotted keys to leaf values, for MLflow params."""
        return flatten(self.to_dict())


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


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases: a few hundred bytes of nested aliases (a "billion laughs"
    document) expand to billions of nodes once something walks the tree. No config needs them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(f"YAML aliases (*name) are not accepted in config (line {mark.line + 1})")
        return super().compose_node(parent, index)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_NoAliasLoader)


def _parse_scalar(text: str) -> Any:
    """`--set train.steps=10` gives an int, `=[a, b]` a list, `=null` None: YAML scalar rules."""
    try:
        return _load_yaml(text)
    except yaml.YAMLError:
        return text


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
            raise ConfigError(f"override {pair!r} must look like section.key=value")
        parsed.append((key.strip(), _parse_scalar(raw)))
    return parsed


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any]]:
    pairs = []
    for name, raw in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            pairs.append((dotted, _parse_scalar(raw)))
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
    return "invalid config:\n  " + "\n  ".join(lines)


def _read_yaml_file(path: Path) -> dict[str, Any]:
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
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return loaded


def load_tree(
    schema: type[Tree],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Tree:
    """Build and validate a config tree of type ``schema``; raises ConfigError naming the bad key.

    Callers want ``pipeline.config.load_config``, which passes the whole pipeline's tree.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        for dotted, value in flatten(_read_yaml_file(path)).items():
            _set_dotted(tree, schema, dotted, value, source=str(path))
    environ = os.environ if environ is None else environ
    for dotted, value in env_overrides(environ):
        source = f"env {ENV_PREFIX}{dotted.upper().replace('.', '__')}"
        _set_dotted(tree, schema, dotted, value, source=source)
    for dotted, value in parse_overrides(overrides):
        _set_dotted(tree, schema, dotted, value, source="--set")
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None
