"""One typed config tree for every stage.

Precedence, lowest first: defaults in these models, a YAML file, environment variables
(``PRETRAIN__TRAIN__STEPS=10``), then CLI overrides (``--set train.steps=10``). The tree is
validated before any work starts, and every error names the dotted key at fault.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "PRETRAIN__"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """A config value is missing, unknown or invalid; the message names the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectConfig(Section):
    corpus: str = Field("sample", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    data_root: str = Field(str(PROJECT_ROOT / "data"), description="local folder or fsspec URI")
    seed: int = 1234


class CrawlConfig(Section):
    seeds: list[str] = Field(
        default_factory=list,
        description="start URLs (spider=seed) or sitemap/robots.txt URLs (spider=sitemap); "
        "empty crawls the bundled sample site",
    )
    sample_site: bool | None = Field(
        None, description="serve and crawl the bundled site; default: when no seeds"
    )
    spider: Literal["seed", "sitemap"] = Field(
        "seed", description="seed: follow same-site links from the seeds; sitemap: fetch what sitemaps list"
    )
    max_pages: int = Field(200, gt=0, description="pages requested per shard, at most")
    max_depth: int = Field(3, ge=0, description="link hops from a seed (seed spider)")
    num_shards: int = Field(1, gt=0, description="shards by registered domain; one crawl process each")
    user_agent: str = "pretrain-pipeline/0.1 (+https://github.com/pretrain-pipeline)"
    download_delay: float = Field(0.5, ge=0, description="seconds between requests to one site (minimum)")
    autothrottle: bool = Field(
        True, description="adapt the delay to each site's latency (Scrapy AutoThrottle)"
    )
    autothrottle_target_concurrency: float = Field(2.0, gt=0)
    autothrottle_max_delay: float = Field(30.0, gt=0)
    max_crawl_delay: float = Field(
        30.0, ge=0, description="robots.txt Crawl-delay is honoured up to this many seconds per request"
    )
    concurrent_requests: int = Field(32, gt=0, description="in flight over all sites")
    concurrent_requests_per_domain: int = Field(4, gt=0)
    download_timeout: float = Field(15.0, gt=0)
    download_maxsize: int = Field(5 * 1024 * 1024, gt=0, description="bytes; larger pages are dropped")
    retry_times: int = Field(2, ge=0, description="retries on 429/5xx, timeouts and connection errors")
    retry_http_codes: list[int] = Field(default_factory=lambda: [429, 500, 502, 503, 504, 522, 524, 408])
    retry_backoff_s: float = Field(1.0, ge=0, description="first retry waits this long, doubling after")
    retry_backoff_max_s: float = Field(60.0, ge=0, description="cap on one backoff, Retry-After included")
    max_redirects: int = Field(10, ge=0)
    allowed_content_types: list[str] = Field(
        default_factory=lambda: ["text/html", "application/xhtml+xml"],
        description="media types stored as pages; others are stopped after the headers",
    )
    allowed_private_hosts: list[str] = Field(
        default_factory=list,
        description="hosts, IPs or CIDR networks exempt from the private/loopback/link-local refusal",
    )
    host_addresses: dict[str, str] = Field(
        default_factory=dict,
        description="pin host names to IP addresses, like curl --resolve; the address refusal still applies",
    )
    resume: bool = Field(True, description="continue a killed crawl of the same snapshot and shard")
    warc_max_bytes: int = Field(1 << 30, gt=0, description="start a new WARC file beyond this size")

    @field_validator("seeds")
    @classmethod
    def _valid_seeds(cls, seeds: list[str]) -> list[str]:
        from pipeline.crawl.urls import InvalidURL, canonical_url

        for seed in seeds:
            try:
                canonical_url(seed)
            except InvalidURL as exc:
                raise ValueError(f"seed {seed!r} is not a crawlable http(s) URL ({exc.reason})") from None
        return seeds

    @field_validator("allowed_private_hosts")
    @classmethod
    def _valid_hosts(cls, hosts: list[str]) -> list[str]:
        from pipeline.crawl.safety import parse_allow_list

        parse_allow_list(hosts)
        return hosts

    @field_validator("host_addresses")
    @classmethod
    def _pinned_addresses(cls, pinned: dict[str, str]) -> dict[str, str]:
        import ipaddress

        for host, address in pinned.items():
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ValueError(f"{host!r} is pinned to {address!r}, which is not an IP address") from None
        return pinned

    @field_validator("allowed_content_types")
    @classmethod
    def _media_types(cls, types: list[str]) -> list[str]:
        bad = [t for t in types if "/" not in t or ";" in t]
        if bad:
            raise ValueError(f"media types look like text/html, without parameters; got {bad}")
        return [t.strip().lower() for t in types]

    @property
    def use_sample_site(self) -> bool:
        return self.sample_site if self.sample_site is not None else not self.seeds


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


class GopherRepetitionConfig(Section):
    """Gopher (Rae et al. 2021, table A1) repetition limits; datatrove's GopherRepetitionFilter. null disables."""

    enabled: bool = True
    max_dup_para_frac: float | None = Field(0.3, ge=0)
    max_dup_para_char_frac: float | None = Field(0.2, ge=0)
    max_dup_line_frac: float | None = Field(0.3, ge=0)
    max_dup_line_char_frac: float | None = Field(0.2, ge=0)
    max_top_2_gram_char_frac: float | None = Field(0.20, ge=0)
    max_top_3_gram_char_frac: float | None = Field(0.18, ge=0)
    max_top_4_gram_char_frac: float | None = Field(0.16, ge=0)
    max_dup_5_gram_char_frac: float | None = Field(0.15, ge=0)
    max_dup_6_gram_char_frac: float | None = Field(0.14, ge=0)
    max_dup_7_gram_char_frac: float | None = Field(0.13, ge=0)
    max_dup_8_gram_char_frac: float | None = Field(0.12, ge=0)
    max_dup_9_gram_char_frac: float | None = Field(0.11, ge=0)
    max_dup_10_gram_char_frac: float | None = Field(0.10, ge=0)


class GopherQualityConfig(Section):
    """Gopher quality heuristics; datatrove's GopherQualityFilter. null disables a rule."""

    enabled: bool = True
    min_doc_words: int | None = Field(50, ge=0)
    max_doc_words: int | None = Field(100_000, gt=0)
    min_avg_word_length: float | None = Field(3, ge=0)
    max_avg_word_length: float | None = Field(10, gt=0)
    max_symbol_word_ratio: float | None = Field(0.1, ge=0, description="for '#' and for ellipses")
    max_bullet_lines_ratio: float | None = Field(0.9, ge=0)
    max_ellipsis_lines_ratio: float | None = Field(0.3, ge=0)
    min_alpha_words_ratio: float | None = Field(0.8, ge=0, le=1)
    min_stop_words: int | None = Field(2, ge=0)
    stop_words: list[str] | None = Field(
        ["the", "be", "to", "of", "and", "that", "have", "with"],
        description="distinct ones a document must hold; null: no stop-word rule for the language",
    )


class C4Config(Section):
    """C4 line and document rules (Raffel et al. 2020); datatrove's C4QualityFilter.

    FineWeb's own run set filter_no_terminal_punct=false; the C4 paper's default is kept here.
    """

    enabled: bool = True
    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    end_punctuation: list[str] = Field([".", "?", "!", '"', "'"], min_length=1)
    min_num_sentences: int | None = Field(5, ge=0)
    min_words_per_line: int | None = Field(3, ge=0)
    max_word_length: int | None = Field(1000, gt=0)
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True


class FineWebConfig(Section):
    """FineWeb's own rules (Penedo et al. 2024); datatrove's FineWebQualityFilter."""

    enabled: bool = True
    min_line_punct_ratio: float | None = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    max_short_line_ratio: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    max_char_dup_ratio: float | None = Field(0.01, ge=0)
    max_newline_word_ratio: float | None = Field(0.3, ge=0)


class PiiConfig(Section):
    enabled: bool = True
    email_placeholder: str = "<EMAIL>"
    ip_placeholder: str = "<IP_ADDRESS>"
    phone_placeholder: str = "<PHONE_NUMBER>"


FILTER_SECTIONS = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def _chinese_overrides() -> dict[str, dict[str, Any]]:
    # jieba words average under two characters; Chinese has no Gopher stop-word list and ends
    # sentences with full-width punctuation.
    return {
        "zh": {
            "gopher_quality": {"min_avg_word_length": 1, "max_avg_word_length": 5, "stop_words": None},
            "c4": {"end_punctuation": [".", "?", "!", '"', "'", "。", "！", "？", "”", "」"]},
        }
    }


class CleanConfig(Section):
    min_chars: int = Field(100, ge=0, description="shorter (normalised) texts are dropped before the filters")
    max_chars: int = Field(1_000_000, gt=0, description="longer raw texts are quarantined before any work")
    languages: list[str] = Field(["en"], min_length=1, description="language codes kept (py3langid labels)")
    min_language_score: float = Field(0.65, ge=0, le=1)
    langid_max_chars: int = Field(10_000, gt=0, description="language id reads this many leading characters")
    gopher_repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig)
    gopher_quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig)
    c4: C4Config = Field(default_factory=C4Config)
    fineweb: FineWebConfig = Field(default_factory=FineWebConfig)
    language_overrides: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=_chinese_overrides,
        description="per language, filter fields that replace the defaults above: {zh: {c4: {...}}}",
    )
    pii: PiiConfig = Field(default_factory=PiiConfig)

    @field_validator("language_overrides", mode="before")
    @classmethod
    def _keep_default_overrides(cls, value: Any) -> Any:
        """Setting clean.language_overrides.de.* must not silently drop the Chinese defaults."""
        if not isinstance(value, dict):
            return value
        merged = _chinese_overrides()
        for lang, sections in value.items():
            if not isinstance(sections, dict):
                merged[lang] = sections
                continue
            target = merged.setdefault(lang, {})
            for section, fields in sections.items():
                if isinstance(fields, dict) and isinstance(target.get(section), dict):
                    target[section] = {**target[section], **fields}
                else:
                    target[section] = fields
        return merged

    @model_validator(mode="after")
    def _bounds(self) -> CleanConfig:
        if self.min_chars >= self.max_chars:
            raise ValueError("min_chars must be below max_chars")
        from pipeline.clean.language import LANGID_LABELS

        unknown = sorted(set(self.languages) - LANGID_LABELS)
        if unknown:
            raise ValueError(f"languages {unknown} are not py3langid labels; known: {sorted(LANGID_LABELS)}")
        for lang in self.language_overrides:
            self.for_language(lang)  # fails here, naming the language, if an override is invalid
        return self

    def for_language(self, lang: str | None) -> CleanConfig:
        """This config with ``language_overrides[lang]`` applied to the filter sections."""
        overrides = self.language_overrides.get(lang or "", {})
        if not overrides:
            return self
        unknown = sorted(set(overrides) - set(FILTER_SECTIONS))
        if unknown:
            raise ValueError(
                f"language_overrides.{lang}: unknown section(s) {unknown}; known: {FILTER_SECTIONS}"
            )
        update = {}
        for section, fields in overrides.items():
            current = getattr(self, section)
            try:
                update[section] = type(current).model_validate({**current.model_dump(), **fields})
            except ValidationError as exc:
                raise ValueError(f"language_overrides.{lang}.{section}: {exc.errors()[0]['msg']}") from None
        return self.model_copy(update=update)


class QualityConfig(Section):
    sample_docs: int = Field(2000, gt=0, description="documents embedded for the diversity statistics")
    max_seq_length: int = Field(256, gt=0, le=512, description="embedding model's token limit per document")
    clusters: int = Field(8, gt=0, description="k-means clusters for the topic-spread entropy")


class DedupConfig(Section):
    """Exact, near-duplicate (MinHash LSH) and URL de-duplication; see docs/dedup.md."""

    url_dedup: bool = Field(True, description="keep only the newest fetch of each canonical URL")
    exact: bool = Field(True, description="drop documents whose normalised text equals a smaller id's")
    near: bool = Field(True, description="drop near-duplicates found by MinHash LSH")
    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard similarity of shingle sets")
    ngram_size: int = Field(5, ge=1, le=64, description="words per shingle")
    cjk_ngram_size: int = Field(5, ge=1, le=64, description="characters per shingle in CJK text")
    num_perm: int = Field(128, ge=1, le=1024, description="most permutations bands x rows may use")
    bands: int | None = Field(None, ge=1, description="set with rows to skip the threshold search")
    rows: int | None = Field(None, ge=1)
    false_positive_weight: float = Field(0.05, ge=0)
    false_negative_weight: float = Field(0.95, ge=0)
    verify: bool = Field(True, description="keep only candidate pairs whose true Jaccard >= threshold")
    max_iterations: int = Field(64, gt=0, description="rounds of connected components before giving up")

    @model_validator(mode="after")
    def _banding(self) -> DedupConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both bands and rows, or neither (then they come from threshold)")
        if self.bands is not None and self.bands * self.rows > 4096:
            raise ValueError(f"bands x rows = {self.bands * self.rows} permutations; at most 4096")
        if self.false_positive_weight + self.false_negative_weight == 0:
            raise ValueError("false_positive_weight and false_negative_weight cannot both be 0")
        return self


class TokenizerConfig(Section):
    vocab_size: int = Field(2048, ge=300, le=1 << 20)
    sample_docs: int = Field(20_000, gt=0)
    min_frequency: int = Field(2, ge=1)
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|pad|>"
    reserved_tokens: int = Field(4, ge=0)
    split_cjk: bool = Field(
        False, description="isolate each CJK ideograph before BPE (like BERT's tokenize_chinese_chars)"
    )


class TokenizeConfig(Section):
    validation_fraction: float = Field(0.05, ge=0, lt=1)
    max_tokens_per_shard: int = Field(
        50_000_000, gt=0, description="a shard file rolls over to the next one at this many tokens"
    )
    num_shards: int = Field(2, gt=0, description="minimum number of writer tasks (shard files per split)")
    chunk_chars: int = Field(
        100_000, ge=1000, description="documents longer than this are encoded in pieces of this size"
    )
    threads_per_task: int | None = Field(
        None, gt=0, description="tokenizer threads per Spark task; default: spark.task.cpus"
    )


class DataConfig(Section):
    """How the trainer batches token shards (pipeline.data)."""

    batching: Literal["packed", "token_budget"] = Field(
        "packed",
        description="packed: fixed [batch_size, seq_len] windows over the token stream; token_budget: one "
        "document per row, rows of similar length batched up to max_tokens_per_batch (dynamic batching)",
    )
    max_tokens_per_batch: int | None = Field(
        None, gt=1, description="token_budget: padded tokens per rank batch; default batch_size * seq_len"
    )


class ModelSection(Section):
    preset: str = "tiny"
    overrides: dict[str, Any] = Field(default_factory=dict, description="fields of pipeline.model.GPTConfig")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        from pipeline.model import PRESETS

        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return preset

    @field_validator("overrides")
    @classmethod
    def _known_fields(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        from pipeline.model import GPTConfig

        known = set(GPTConfig.__dataclass_fields__)
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown model field(s) {unknown}; known: {sorted(known)}")
        return overrides

    @model_validator(mode="after")
    def _buildable(self) -> ModelSection:
        from pipeline.model import model_config

        try:
            model_config(self.preset, **self.overrides)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model.overrides do not give a valid {self.preset!r} model: {exc}") from None
        return self


class TrainConfig(Section):
    """The trainer (pipeline.train); docs/training.md explains each group of keys."""

    steps: int = Field(40, gt=0, description="optimizer steps")
    batch_size: int = Field(8, gt=0, description="sequences per rank per micro-step")
    seq_len: int = Field(64, gt=1)
    grad_accum: int = Field(1, gt=0, description="micro-steps per optimizer step")
    lr: float = Field(3e-3, gt=0, description="peak learning rate (AdamW)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="the cosine decays to lr x this")
    warmup_steps: int = Field(5, ge=0, description="linear warm-up steps before the cosine")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay of matrices; norms and biases get none")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas")
    grad_clip: float = Field(1.0, ge=0, description="clip the global gradient norm to this; 0 disables")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16: autocast; fp16: autocast + dynamic loss scaling (GradScaler)"
    )
    data_parallel: Literal["ddp", "zero1"] = Field(
        "ddp", description="zero1: DDP plus ZeroRedundancyOptimizer (optimizer state sharded over ranks)"
    )
    grad_compression: Literal["none", "fp16", "bf16", "powersgd", "int8"] = Field(
        "none", description="DDP communication hook for the gradient all-reduce"
    )
    powersgd_rank: int = Field(1, ge=1, description="PowerSGD matrix approximation rank")
    powersgd_start_step: int = Field(
        10, ge=2, description="PowerSGD: plain all-reduce for the steps before this one"
    )
    bucket_cap_mb: float = Field(25.0, gt=0, description="DDP gradient bucket size")
    document_masking: bool = Field(
        True, description="attend only within each packed document (the loader's document_ids)"
    )
    compile: bool = Field(False, description="torch.compile the model")
    keep_host_memory: bool = Field(
        True,
        description="CPU training on glibc: keep memory freed after a step for the next one instead of "
        "returning it to the OS and page-faulting it back (pins malloc's mmap and trim thresholds)",
    )
    log_every: int = Field(1, gt=0, description="log metrics every N steps (and the last)")
    eval_every: int = Field(0, ge=0, description="validation loss every N steps; 0: only at the end")
    eval_sequences: int = Field(64, gt=0, description="validation windows per evaluation (all ranks)")
    histogram_every: int = Field(
        20, ge=0, description="TensorBoard weight and gradient histograms every N steps; 0 disables"
    )
    checkpoint_every: int = Field(20, gt=0, description="also on SIGTERM and at the end")
    keep_checkpoints: int = Field(3, ge=1, description="keep the newest K checkpoints")
    resume: bool = Field(
        True,
        description="continue from the newest checkpoint of this snapshot's unfinished run; "
        "false discards it and starts over",
    )
    peak_flops: float | None = Field(
        None,
        gt=0,
        description="peak FLOP/s of one device for MFU; default: known GPUs in bf16/fp16, else no MFU",
    )
    nproc_per_node: int = Field(2, gt=0, description="processes torchrun starts on each node")
    nnodes: int = Field(1, gt=0, description="nodes (torchrun agents); above 1 they meet at rdzv_endpoint")
    min_nnodes: int | None = Field(
        None, gt=0, description="elastic: keep going with as few as this many nodes (--nnodes=min:max)"
    )
    max_restarts: int = Field(
        3, ge=0, description="torchrun restarts the worker group this often after a failure"
    )
    threads_per_rank: int | None = Field(
        None,
        gt=0,
        description="torch intra-op threads (and OMP_NUM_THREADS) of each rank; default: OMP_NUM_THREADS "
        "when set, else the process's usable cores (CPU affinity) / nproc_per_node, at least 1",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {list(self.betas)}")
        if self.min_nnodes is not None and self.min_nnodes > self.nnodes:
            raise ValueError(f"min_nnodes ({self.min_nnodes}) must not exceed nnodes ({self.nnodes})")
        return self


class DistributedConfig(Section):
    """torch.distributed process group; under torchrun the env:// defaults need no change."""

    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on GPU, gloo on CPU")
    init_method: str = Field("env://", description="env://, tcp://host:port or file:///path")
    world_size: int | None = Field(None, gt=0, description="taken from torchrun's WORLD_SIZE when unset")
    rank: int | None = Field(None, ge=0, description="taken from torchrun's RANK when unset")
    timeout_s: float = Field(1800.0, gt=0, description="collective timeout")
    rdzv_endpoint: str | None = Field(
        None, description="host:port of the c10d rendezvous when nnodes > 1 (default 127.0.0.1:29400)"
    )
    rdzv_id: str | None = Field(None, description="rendezvous id; default <corpus>-<snapshot>")

    @model_validator(mode="after")
    def _rank_in_world(self) -> DistributedConfig:
        if (self.world_size is None) != (self.rank is None):
            raise ValueError("set distributed.world_size and distributed.rank together, or neither")
        if self.rank is not None and self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size}")
        if self.init_method != "env://" and self.rank is None:
            raise ValueError(f"init_method {self.init_method!r} needs distributed.world_size and rank")
        return self


class TrackingConfig(Section):
    mlflow_tracking_uri: str | None = Field(
        None, description="default: $MLFLOW_TRACKING_URI, else a SQLite store under the data root"
    )
    experiment: str | None = Field(None, description="default: pretrain-<corpus>-<model preset>")
    stage_runs: bool = Field(True, description="record every stage execution as a nested MLflow run")
    required: bool = Field(
        False, description="fail a stage when recording it in MLflow fails (default: log an error, go on)"
    )
    register_model: bool = Field(True, description="register the trained model in the MLflow Model Registry")
    registered_model: str | None = Field(
        None, description="Model Registry name; default: pretrain-<corpus>-<model preset>"
    )
    checkpoint_artifact: Literal["weights", "pointer"] = Field(
        "weights", description="log the final weights as an artifact, or only a pointer to the checkpoint"
    )
    sample_prompts: list[str] = Field(
        default_factory=lambda: ["The", "Bees", "In the garden"],
        description="prompts for the sample generations logged with a trained model",
    )
    sample_tokens: int = Field(32, ge=0, description="greedy tokens per sample generation; 0 disables")
    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="trainer /metrics port; each local rank serves port + local rank"
    )
    prometheus_addr: str = "0.0.0.0"
    tensorboard: bool = Field(
        True, description="trainer writes TensorBoard events under <train output>/tensorboard"
    )


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


class PipelineConfig(Section):
    project: ProjectConfig = Field(default_factory=ProjectConfig)
    crawl: CrawlConfig = Field(default_factory=CrawlConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainConfig = Field(default_factory=TrainConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @field_validator("project")
    @classmethod
    def _absolute_root(cls, project: ProjectConfig) -> ProjectConfig:
        if "://" not in project.data_root:
            project.data_root = str(Path(project.data_root).expanduser().resolve())
        return project

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    @property
    def hash(self) -> str:
        """Stable digest of the full resolved tree; recorded in every manifest and MLflow run."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def flat(self) -> dict[str, Any]:
        """Dotted keys to leaf values, for MLflow params."""
        return flatten(self.to_dict())


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node: Any = tree
    model: Any = PipelineConfig
    for depth, part in enumerate(parts):
        is_last = depth == len(parts) - 1
        fields = getattr(model, "model_fields", None)
        if fields is not None:
            if part not in fields:
                where = ".".join(parts[:depth]) or "the top level"
                raise ConfigError(
                    f"{dotted}: unknown key {part!r} under {where} (from {source}); known: {sorted(fields)}"
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


def _parse_scalar(text: str) -> Any:
    """`--set train.steps=10` gives an int, `=[a, b]` a list, `=null` None: YAML scalar rules."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


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
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        shown = item.get("input")
        suffix = f" (got {shown!r})" if shown is not None and not isinstance(shown, dict) else ""
        lines.append(f"{key}: {message}{suffix}")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> PipelineConfig:
    """Build and validate the config tree; raises ConfigError naming the bad key."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        for dotted, value in flatten(loaded).items():
            _set_dotted(tree, dotted, value, source=str(path))
    environ = os.environ if environ is None else environ
    for dotted, value in env_overrides(environ):
        _set_dotted(tree, dotted, value, source=f"env {ENV_PREFIX}{dotted.upper().replace('.', '__')}")
    for dotted, value in parse_overrides(overrides):
        _set_dotted(tree, dotted, value, source="--set")
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def config_from_dict(tree: Mapping[str, Any]) -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(dict(tree))
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None
