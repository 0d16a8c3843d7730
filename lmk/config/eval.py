"""`EvalConfig`: the schema of the `eval/` config group (one YAML per suite in `conf/eval/`).

A suite is data: task names, groups of tasks averaged into one number, per-side max lengths and the
sizes of the regenerated offline tasks. Every value is checked here, before any model is loaded or
any text encoded, and a bad value raises `EvalConfigError` naming the key and the allowed values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from lmk.config import registry
from lmk.config.device import check_device, check_precision
from lmk.config.registry import no_landmarks_message as no_landmarks_message  # its old home
from lmk.config.schema import Coercible, ConfigError, at_least, hash_neutral, plain

# The LongEmbed lengths (in "tokens" = words / 0.75) the synthetic tasks are regenerated at (lmk.data.longembed).
LENGTHS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# RULER-style needle-in-a-haystack retrieval (lmk.data.ruler): its variants, haystacks and default needle depths
# (the authors' grid: 0, 0.1, ..., 1).
RULER_VARIANTS: tuple[str, ...] = ("single", "multikey", "multivalue", "multiquery")
RULER_HAYSTACKS: tuple[str, ...] = ("auto", "lmk-essays", "paul-graham")
RULER_DEPTHS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
RULER_ESSAYS_REPO = "emozilla/PaulGrahamEssays"  # Paul Graham's essays (RULER's haystack) as a hub dataset, "text"
OVERWRITE_STRATEGIES: tuple[str, ...] = ("only-missing", "always")
# How a retrieval task scores a query against a document (`eval.scoring`): declared in lmk.config.scorings (the
# built-in ones here; `registry.declared_scorings()` has those registered at run time too); and which states a
# MaxSim query is (the one tuple, also `train.maxsim_query`'s).
SCORINGS: tuple[str, ...] = tuple(registry.declared_scorings())
MAXSIM_QUERIES: tuple[str, ...] = registry.MAXSIM_QUERIES
MAXSIM_BITS: tuple[int, ...] = (1, 2, 4, 8)  # maxsim-compressed: residual bits per dimension (lmk.eval.residual_codes)
TASK_OPTION_KEYS: tuple[str, ...] = ("eval_splits", "hf_subsets", "languages")
# The local tasks (data made offline), by mteb task name: each is an `@local_task` class of lmk.eval.tasks, which
# refuses a class not declared here; declared torch- and mteb-free, so a misspelt task fails before mteb loads.
LOCAL_TASK_NAMES: tuple[str, ...] = ("LocalPasskey", "LocalNeedle", "LocalLongDoc", "LocalProse", "LocalShort",
                                     "RulerNiahSingle", "RulerNiahMultiKey", "RulerNiahMultiValue",
                                     "RulerNiahMultiQuery")


class EvalConfigError(ConfigError):
    """A bad `eval.*` value; the message names the key, the value and what is allowed."""


@dataclass
class EvalConfig(Coercible):
    _error = EvalConfigError  # not a field (no annotation): the error a bad key or value raises
    section: ClassVar[str] = "eval"

    # accepted from configs written before (they named this dataclass); a suite builds no one class: none in conf/eval
    _target_: str | None = None
    name: str = "none"
    # mteb task names and/or local task names (LocalPasskey, LocalNeedle, LocalLongDoc, LocalShort).
    tasks: list[str] = field(default_factory=list)
    # group name -> task names; the group score is the plain mean of the tasks' main scores.
    groups: dict[str, list[str]] = field(default_factory=dict)
    # per-task mteb filters, e.g. {MultiLongDocRetrieval: {eval_splits: [test], hf_subsets: [en]}}.
    task_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    query_max_length: int = at_least(1, 512)
    passage_max_length: int = at_least(1, 512)
    batch_size: int = at_least(1, 32)
    # Tokens per encode batch, padding counted (rows x longest row); null: batch_size rows per batch.
    max_tokens_per_batch: int | None = at_least(1, 32768)
    # auto|cpu|cuda|cuda:N (auto: cuda when available) and auto|bf16|fp16|fp32 (auto: bf16 on GPUs, fp32 on
    # CPU). The fit-end eval uses the trainer's device; precision is an autocast, the weights are not cast.
    device: str = "auto"
    precision: str = "auto"
    # Tokenization processes of the encode pipeline (lmk.model.pipeline): auto (from the cores and the device),
    # or a count, 0 = in the model's thread (debugging); each keeps `prefetch` batches ready.
    workers: Any = "auto"
    prefetch: int = at_least(1, 2)  # batches each tokenization worker keeps ready
    # task name -> an instruction put before that task's queries (not its documents), without landmarks in it
    query_prompts: dict[str, str] = field(default_factory=dict)
    # Callback schedule: every N optimizer steps (None = only at fit end) and at the end of fit.
    every_n_steps: int | None = at_least(1, None)
    at_fit_end: bool = True
    # Local tasks: which passkey/needle lengths and how many documents / queries to regenerate.
    lengths: list[int] = field(default_factory=lambda: list(LENGTHS))
    n_docs: int = at_least(1, 100)
    n_queries: int = at_least(1, 50)
    longdoc_n_docs: int = at_least(1, 100)
    short_n_queries: int = at_least(1, 200)
    short_n_docs: int | None = None  # None: every held-out docstring is a candidate
    # RULER NIAH tasks (RulerNiah*): lengths, documents (the first n_queries are asked for), haystack (auto: Paul
    # Graham's essays where the hub mirror holds them, else lmk's own) and the needle depths cycled over documents.
    ruler_lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])
    ruler_n_docs: int = at_least(1, 100)
    ruler_n_queries: int = at_least(1, 50)
    ruler_haystack: str = "auto"
    ruler_depths: list[float] = field(default_factory=lambda: list(RULER_DEPTHS))
    seed: int = 0
    # Folder of the mteb ResultCache; None = <run dir>/mteb_cache.
    cache_dir: str | None = None
    overwrite: str = "only-missing"
    show_progress: bool = True
    # single: one vector per text (the pooler's), cosine. maxsim: a document is its landmark states (the positions
    # the lmk pooler averages, L2-normalised each), a query its landmark states (maxsim_query=landmarks) or all its
    # token states (tokens); score = sum over query vectors of the max over document vectors (needs a landmark
    # pooler). The scorings and their needs: lmk.config.scorings.
    # (added after runs were hashed: hash-neutral at their defaults)
    scoring: str = hash_neutral("single")
    maxsim_query: str = hash_neutral("landmarks")
    # MiB of working memory one MaxSim block may take (similarities + the block's vectors); the scores do not depend
    # on it (exact search)
    maxsim_block_mb: int = hash_neutral(256, ge=1)
    # maxsim-compressed: residual bits per dimension, k-means centroids (0: auto, 2^floor(log2(16 sqrt(vectors)))),
    # and the candidates per query re-scored over their decoded vectors (lmk.eval.compressed_maxsim)
    maxsim_bits: int = hash_neutral(2)
    maxsim_centroids: int = hash_neutral(0, ge=0)
    maxsim_rerank: int = hash_neutral(100, ge=1)
    # What the training job itself evaluates (the eval callback): "all" the suite, "none" (the sweep's eval
    # stage evaluates the trained model as separate jobs, lmk.sweep.eval_stage), or a list of group names (a small
    # dev subset).
    in_training: Any = "all"

    def __post_init__(self) -> None:
        self.tasks = list(self.tasks)
        self.lengths = [int(x) for x in self.lengths]
        self.ruler_lengths = [int(x) for x in self.ruler_lengths]
        self.ruler_depths = [float(x) for x in self.ruler_depths]
        self.groups = {str(k): list(v) for k, v in dict(self.groups).items()}
        self.task_options = {str(k): dict(v) for k, v in dict(self.task_options).items()}
        prompts = plain(self.query_prompts) or {}
        if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
            raise ConfigError(f"eval.query_prompts={self.query_prompts!r} must map task names to instructions "
                              "(strings), e.g. {NFCorpus: 'Instruct: ...\\nQuery: '}")
        self.query_prompts = {str(k): v for k, v in prompts.items()}
        self.check()

    def check(self) -> None:
        self.check_fields()
        if self.workers != "auto" and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                       or self.workers < 0):
            raise EvalConfigError(f"eval.workers={self.workers!r}: must be auto or an integer >= 0 (tokenization "
                                  "processes; 0 tokenizes in the model's thread)")
        try:
            check_device(self.device, "eval.device")
            check_precision(self.precision, "eval.precision")
        except ValueError as err:
            raise EvalConfigError(str(err)) from None
        if self.short_n_docs is not None and (isinstance(self.short_n_docs, bool) or not isinstance(
                self.short_n_docs, int) or self.short_n_docs < self.short_n_queries):
            raise EvalConfigError(f"eval.short_n_docs={self.short_n_docs!r}: must be null or an integer "
                                  f">= eval.short_n_queries ({self.short_n_queries})")
        if self.n_queries > self.n_docs:
            raise EvalConfigError(
                f"eval.n_queries={self.n_queries} > eval.n_docs={self.n_docs}: each passkey/needle query "
                "needs its own document; lower n_queries or raise n_docs"
            )
        bad = [x for x in self.lengths if x not in LENGTHS]
        if bad or not self.lengths:
            raise EvalConfigError(f"eval.lengths={self.lengths!r}: allowed lengths are {list(LENGTHS)} (non-empty)")
        if len(set(self.lengths)) != len(self.lengths):
            raise EvalConfigError(f"eval.lengths={self.lengths!r}: lengths repeat")
        self._check_ruler()
        if len(set(self.tasks)) != len(self.tasks):
            raise EvalConfigError(f"eval.tasks={self.tasks!r}: a task is listed twice")
        scorings = registry.declared_scorings()  # registered at run time too
        if self.scoring not in scorings:
            raise EvalConfigError(f"eval.scoring={self.scoring!r}: allowed {list(scorings)}")
        if self.maxsim_query not in MAXSIM_QUERIES:
            raise EvalConfigError(f"eval.maxsim_query={self.maxsim_query!r}: allowed {list(MAXSIM_QUERIES)}")
        if self.maxsim_bits not in MAXSIM_BITS:
            raise EvalConfigError(f"eval.maxsim_bits={self.maxsim_bits!r}: allowed {list(MAXSIM_BITS)}")
        if self.overwrite not in OVERWRITE_STRATEGIES:
            raise EvalConfigError(f"eval.overwrite={self.overwrite!r}: allowed {list(OVERWRITE_STRATEGIES)}")
        # `eval.tasks=[...]` on the command line runs a subset of a suite: groups with none of their tasks
        # left are dropped; a group with only some of them would average the wrong thing, so it fails.
        self.groups = {g: m for g, m in self.groups.items() if not m or any(t in self.tasks for t in m)}
        for group, members in self.groups.items():
            missing = [t for t in members if t not in self.tasks]
            if missing or not members:
                raise EvalConfigError(
                    f"eval.groups.{group}={members!r}: tasks {missing} are not in eval.tasks {self.tasks} "
                    "(a group averages tasks of this suite; list at least one)"
                )
        if isinstance(self.in_training, str):
            if self.in_training not in ("all", "none"):
                raise EvalConfigError(f"eval.in_training={self.in_training!r}: allowed 'all', 'none' or a list of "
                                      f"group names of this suite {sorted(self.groups)}")
        else:
            self.in_training = [str(g) for g in self.in_training]
            unknown = [g for g in self.in_training if g not in self.groups]
            if unknown:
                raise EvalConfigError(f"eval.in_training: groups {unknown} are not groups of this suite "
                                      f"{sorted(self.groups)}")
        for task, opts in self.task_options.items():
            unknown = [k for k in opts if k not in TASK_OPTION_KEYS]
            if unknown:
                raise EvalConfigError(
                    f"eval.task_options.{task}: unknown keys {unknown}; allowed {list(TASK_OPTION_KEYS)}"
                )

        # A subset of the suite (`eval.tasks=[...]`, an eval-stage shard) keeps only its tasks' options; the
        # option names themselves are checked against mteb's registry before compute (lmk.eval.preflight).
        self.task_options = {t: o for t, o in self.task_options.items() if t in self.tasks}

    def _check_ruler(self) -> None:
        bad = [x for x in self.ruler_lengths if x not in LENGTHS]
        if bad or not self.ruler_lengths or len(set(self.ruler_lengths)) != len(self.ruler_lengths):
            raise EvalConfigError(f"eval.ruler_lengths={self.ruler_lengths!r}: allowed distinct lengths of "
                                  f"{list(LENGTHS)} (non-empty)")
        if self.ruler_n_queries > self.ruler_n_docs:
            raise EvalConfigError(f"eval.ruler_n_queries={self.ruler_n_queries} > eval.ruler_n_docs="
                                  f"{self.ruler_n_docs}: each query asks for its own document; lower ruler_n_queries")
        if self.ruler_haystack not in RULER_HAYSTACKS:
            raise EvalConfigError(f"eval.ruler_haystack={self.ruler_haystack!r}: allowed {list(RULER_HAYSTACKS)}")
        if not self.ruler_depths or any(not 0.0 <= d <= 1.0 for d in self.ruler_depths):
            raise EvalConfigError(f"eval.ruler_depths={self.ruler_depths!r}: allowed fractions in [0, 1] (non-empty)")

    @property
    def enabled(self) -> bool:
        return bool(self.tasks)

    def training_view(self) -> EvalConfig:
        """The part of the suite the training job evaluates (`in_training`); all of it by default."""
        if self.in_training == "all":
            return self
        groups = [] if self.in_training == "none" else list(self.in_training)
        tasks = [t for t in self.tasks if any(t in self.groups[g] for g in groups)]
        return EvalConfig.from_cfg({**{f.name: getattr(self, f.name) for f in fields(self)}, "tasks": tasks,
                                    "groups": {g: self.groups[g] for g in groups}, "in_training": "all",
                                    "task_options": {t: o for t, o in self.task_options.items() if t in tasks}})

    @classmethod
    def _prepare(cls, cfg: Any) -> Any:
        if cfg is None:
            return {}
        if not isinstance(cfg, Mapping):
            raise EvalConfigError(f"eval config must be a mapping, got {type(cfg).__name__}")
        return dict(cfg)

    @classmethod
    def from_cfg(cls, cfg: Any) -> EvalConfig:
        """Build from a DictConfig / mapping / EvalConfig; unknown keys are an error naming the known ones."""
        return cls.coerce(cfg)
