"""The root config of `python -m lmk.train` and `validate(cfg)`, which runs before any compute.

The root schema composes the group schemas (`lmk.config.model` EncoderConfig / PoolingConfig,
`lmk.config.data` DataConfig, `lmk.config.eval` EvalConfig) with the sections defined here (train / trainer /
logger / launcher / hub). A typo'd key or a bad value raises ConfigError naming the key, the bad value and the
allowed values or keys. Nothing here imports torch. Checks against this machine (data paths exist, task names
resolve, hub data on disk) are the entry points' preflight (`lmk.eval.preflight`), run after this.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

from omegaconf import OmegaConf, open_dict

from lmk.config import registry
from lmk.config.data import DataConfig
from lmk.config.eval import MAXSIM_QUERIES, EvalConfig
from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.config.objectives import check_pooled_positions
from lmk.config.paths import PACKAGE_DIR, repo_root
from lmk.config.schema import (
    Coercible,
    ConfigError,
    above,
    at_least,
    build_section,
    check_bound,
    choice,
    get_key,
    hash_neutral,
    neutral_defaults,
    to_container,
)

# `ckpt_path` values: the resume rule (the newest checkpoint of the run folder that loads and carries this config's
# hash, else a fresh start; `last` is the older spelling), a fresh start, or else a checkpoint file.
CKPT_AUTO = ("auto", "last")
CKPT_FRESH = (None, "", "null", "none")

# The Hydra config groups (conf/): every module that composes a config outside Hydra's own entry points.
# Outside a checkout (a wheel) there is none: Hydra then names the missing folder when a command composes.
CONF_DIR = (repo_root() or PACKAGE_DIR.parent) / "conf"


def group_options(group: str, conf_dir: Path | None = None) -> list[str]:
    """The options of a config group (conf/<group>/<option>.yaml), sorted; a `_`-prefixed file (`_base`) is what
    the options extend, not one of them."""
    folder = (CONF_DIR if conf_dir is None else Path(conf_dir)) / group
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))


def group_file(group: str, name: str, conf_dir: Path | None = None) -> Any:
    """One option of a config group read without Hydra, as Hydra composes it from its own defaults list: its
    `_`-prefixed bases (`_base`, the schema's defaults) merged first, then the file (a DictConfig, no `defaults`).
    FileNotFoundError for an option that does not exist."""
    folder = (CONF_DIR if conf_dir is None else Path(conf_dir)) / group
    node = OmegaConf.load(folder / f"{name}.yaml")
    own = OmegaConf.create({k: v for k, v in node.items() if k != "defaults"})
    order = [d for d in node.get("defaults") or [] if isinstance(d, str) and d.startswith("_")]
    if "_self_" not in order:
        order.append("_self_")
    return OmegaConf.merge(*(own if d == "_self_" else group_file(group, d, conf_dir) for d in order))


# ---- sections owned here -----------------------------------------------------------------------
@dataclass
class TrainSection(Coercible):
    """Loss, optimiser and checkpoint settings (`train.*`). The step budget is `trainer.max_steps`."""

    section: ClassVar[str] = "train"

    tau: float = above(0, 0.02)
    lr: float = above(0, 2e-5)
    weight_decay: float = at_least(0, 0.0)  # the authors never set it (HF TrainingArguments' default)
    warmup_steps: int = at_least(0, 250)
    # DeepSpeed WarmupDecayLR's warm-up curve (the authors' scheduler; log is its default), then linear decay
    warmup_shape: Literal["log", "linear"] = "log"
    # loss multiplier for backward only (1.0: gradient of the global-batch mean; see docs/method.md)
    grad_scale: float = above(0, 1.0)
    grad_cache: bool = False
    grad_cache_chunk: int = at_least(1, 32)
    # the most tokens (rows x the chunk's own longest row) per mini-batch of a step: rows sorted by length, each chunk
    # padded only to its own longest (lmk.train.chunks); grad cache on: its chunks (instead of grad_cache_chunk rows),
    # off: sub-batches embedded with graphs. 0: off (every row padded to the step's longest). The loss and gradients
    # are the padded step's up to float rounding. (added after runs were hashed: hash-neutral at its default)
    grad_cache_tokens: int = hash_neutral(0, ge=0)
    gather_across_devices: bool = True
    in_batch_negatives: bool = True
    use_teacher_scores: bool = True
    teacher_temperature: float = above(0, 1.0)
    # The metric the best checkpoint and the sweep optimise (an eval metric name, or train/loss).
    monitor: str = "train/loss"
    monitor_mode: Literal["min", "max"] = "min"
    checkpoint_every_n_steps: int = at_least(0, 0)  # 0 = only at the end of fit (last.ckpt is always written)
    export: bool = True
    # The training objective (lmk.train.objectives; declared in lmk.config.objectives): single = InfoNCE on the
    # pooled vector at `tau`; maxsim = InfoNCE on MaxSim scores (a query's landmark states, or all its token states
    # with maxsim_query=tokens, against each passage's landmark states, each vector L2-normalised) at `maxsim_tau`.
    # MaxSim scores are sums over the query's vectors, not cosines in [-1, 1], so that objective has its own
    # temperature: at 0.02 (tau's) while an LMK query has one landmark (MaxSim is then its best cosine); with
    # maxsim_query=tokens the sum runs over every token, and a scale near 1 (ColBERT's; sentence-transformers' and
    # PyLate's default scale 1) fits. (added after runs were hashed: hash-neutral at their defaults)
    objective: str = hash_neutral("single")
    maxsim_query: str = hash_neutral("landmarks")
    maxsim_tau: float = hash_neutral(0.02, gt=0)

    def __post_init__(self) -> None:
        choice("train.objective", self.objective, tuple(registry.declared_objectives()))
        choice("train.maxsim_query", self.maxsim_query, MAXSIM_QUERIES)
        self.check_fields()


# The `trainer` section is the keyword arguments of Lightning's Trainer (Hydra instantiates it from `_target_`), checked
# against Lightning's own signature. This layer does not import Lightning (torch-free), so `validate` takes that check
# from its caller (lmk.train.trainer_args.trainer_arguments): it returns every argument, Lightning's defaults filled.
TRAINER_TARGET = "lightning.pytorch.Trainer"
TrainerArguments = Callable[[dict[str, Any]], dict[str, Any]]
# Lightning's defaults of the Trainer arguments lmk's own rules read (tests/test_config.py holds them to the
# signature): with them every rule runs once before Lightning loads, so a wrong setting that needs no signature
# fails in about a second; the signature check (a typo in `trainer:`) comes after, and the rules run again on its
# values.
RULES_READ_DEFAULTS: dict[str, Any] = {"max_steps": -1, "max_epochs": None, "accumulate_grad_batches": 1,
                                       "devices": "auto", "num_nodes": 1, "precision": None, "strategy": "auto"}


def _rules_view(section: dict[str, Any]) -> dict[str, Any]:
    """The section as lmk's rules read it, Lightning's defaults for the keys it does not set; no Lightning."""
    return {**RULES_READ_DEFAULTS, **section}


def _trainer(section: Any, arguments: TrainerArguments) -> SimpleNamespace:
    """The trainer's arguments (`trainer.max_steps`, ...), checked by Lightning's signature, then lmk's own rules."""
    if section is None:
        raise ConfigError("trainer is missing: select one with `trainer=<option>` (see conf/trainer/)")
    if not isinstance(section, dict):
        raise ConfigError(f"trainer={section!r} is not valid; allowed values: a mapping of Lightning Trainer arguments")
    section = dict(section)
    target = section.pop("_target_", TRAINER_TARGET)
    if target != TRAINER_TARGET:  # lmk hands it its callbacks, logger and plugins
        raise ConfigError(f"trainer._target_={target!r} is not valid; allowed values: {TRAINER_TARGET}")
    t = SimpleNamespace(**arguments(section))
    if t.max_steps == 0 or t.max_steps < -1:
        raise ConfigError(f"trainer.max_steps={t.max_steps!r} is not valid; allowed values: an int >= 1 (or -1 with max_epochs)")
    if t.max_steps == -1 and not t.max_epochs:
        raise ConfigError("trainer.max_steps=-1 needs trainer.max_epochs (the lr schedule needs a length)")
    for key in ("num_nodes", "accumulate_grad_batches"):  # lmk counts ranks and the effective batch with them
        check_bound(f"trainer.{key}", getattr(t, key), int, ge=1)
    return t


@dataclass
class LoggerSection(Coercible):
    """`logger.*`: W&B (offline fallback, never fatal) + CSV, CSV only, or nothing."""

    section: ClassVar[str] = "logger"
    name: Literal["wandb", "csv", "none"] = "csv"
    project: str = "lmk"
    entity: str | None = None
    group: str | None = None  # None: the multirun sweep folder's name (one group per sweep)
    tags: list[str] = field(default_factory=list)
    run_name: str | None = None
    notes: str | None = None
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # auto: offline without credentials
    log_model: bool = False
    # Seconds W&B may take to reach its server before the run goes offline: W&B's own default. A busy cluster
    # network can take tens of seconds; where the nodes have no network, WANDB_MODE=offline skips the wait.
    init_timeout: float = above(0, 90.0)
    csv: bool = True  # also write <run_dir>/metrics.csv (always on for wandb: results never only in W&B)


@dataclass
class LauncherSection(Coercible):
    """`launcher.*`: where jobs run; submitit_slurm feeds these into hydra.launcher."""

    section: ClassVar[str] = "launcher"
    name: Literal["local", "submitit_slurm", "submitit_local"] = "local"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = at_least(1, 1)
    gpus_per_node: int = at_least(0, 1)
    cpus_per_task: int = 8
    mem_gb: int | None = None
    timeout: int = at_least(1, 240)  # minutes
    # Memory of one GPU: the dry run compares each job's memory estimate (lmk.sweep.cost) with it; null = no check.
    gpu_memory_gb: float | None = above(0, None)
    tasks_per_node: int | None = None  # processes per node (submitit); None = gpus_per_node
    max_requeues: int = at_least(0, 3)  # SLURM: time limits a job is requeued after (hydra.launcher.max_num_timeout)
    signal_delay_s: int = at_least(1, 120)  # SLURM: the warning signal before the time limit (a checkpoint is saved then)


@dataclass
class HubSection:
    """`hub.*`: where jobs find Hugging Face hub repos without internet (`lmk.hub.mirror`, `lmk.hub.artifacts`)."""

    mirror: str | None = None  # a mirror folder (<mirror>/datasets/<owner>/<name>, ...); null: $LMK_HUB_MIRROR


@dataclass
class RootConfig(Coercible):
    """The composed `conf/train.yaml` (after `validate`)."""

    seed: int = at_least(0, 0)
    run_dir: str = "outputs/run"
    ckpt_path: str | None = "auto"  # auto (the resume rule) | null (fresh) | a checkpoint path
    overwrite: bool = False  # start a finished run folder over
    name: str = "train"
    row: str | None = None  # the table row id the row sweeper sets (`++row=...`)
    encoder: Any = None
    pooling: Any = None
    data: Any = None
    eval: Any = None
    train: TrainSection = field(default_factory=TrainSection)
    trainer: Any = None  # Lightning Trainer's arguments, every one (`_trainer`)
    logger: LoggerSection = field(default_factory=LoggerSection)
    launcher: LauncherSection = field(default_factory=LauncherSection)
    hub: HubSection = field(default_factory=HubSection)


# ---- the groups -------------------------------------------------------------------------------
GROUP_SCHEMAS: dict[str, type] = {"encoder": EncoderConfig, "pooling": PoolingConfig, "data": DataConfig,
                                  "eval": EvalConfig}


def hash_neutral_keys() -> dict[str, Any]:
    """{"<section>.<key>": default}: the group schemas' and the train section's `hash_neutral` keys that a run's config
    hash leaves out while they hold their default (lmk.run.results.config_hash_of), read from the fields' own
    declarations."""
    return {f"{group}.{name}": default for group, cls in {**GROUP_SCHEMAS, "train": TrainSection}.items()
            for name, default in neutral_defaults(cls, config_hash=True).items()}


def build_group(path: str, node: Any) -> Any:
    """A group section through its schema; a schema message that does not start with the group is prefixed."""
    try:
        return GROUP_SCHEMAS[path].coerce(node, path)
    except (ValueError, TypeError) as err:
        if isinstance(err, ConfigError) and str(err).startswith(f"{path}"):
            raise
        raise ConfigError(f"{path}: {err}") from err


SEEDED_PARTS = ("encoder", "data")  # `<part>.seed: null` = the root seed


def derive_seeds(cfg: Any) -> Any:
    """A copy of `cfg` whose null per-part seeds (encoder.seed: random init, data.seed: data order, negatives
    and variable chunk draws) are the root `seed`. The root seed also seeds dropout (seed_everything).

    One `seed` key then varies every random stream; a part's own seed, when set, overrides it. The
    config hash is taken before this (nulls hashed as such), so a sweep and its jobs agree on it.
    """
    out = copy.deepcopy(cfg)
    seed = OmegaConf.select(out, "seed", default=0)
    with open_dict(out):
        for part in SEEDED_PARTS:
            if OmegaConf.select(out, part) is not None and OmegaConf.select(out, f"{part}.seed") is None:
                out[part]["seed"] = seed
    return out


def validate(cfg: Any, trainer_arguments: TrainerArguments | None) -> RootConfig:
    """The typed, checked root config; raises ConfigError on the first bad key or value. It reads nothing from
    this machine (the entry points' preflight does, after this). `trainer_arguments` checks the trainer section
    against Lightning's signature (lmk.train.trainer_args; called after every rule has run on the section as written,
    so a wrong setting elsewhere fails before Lightning loads); None: the rules alone, Lightning never loads."""
    plain = to_container(cfg)
    plain.pop("hydra", None)
    for part in SEEDED_PARTS:  # as `derive_seeds`: the typed sections carry the seeds the run uses
        if isinstance(plain.get(part), dict) and plain[part].get("seed") is None:
            plain[part]["seed"] = plain.get("seed", 0)
    local = plain.pop("local", None)
    if local:  # conf/local/*.yaml must be `# @package _global_` (first line) to set real keys
        raise ConfigError(f"local={local!r}: the local config landed under a `local:` key; make "
                          "`# @package _global_` the first line of conf/local/<file>.yaml")
    groups = {k: plain.pop(k) for k in list(GROUP_SCHEMAS) if k in plain}
    trainer = plain.pop("trainer", None)
    root = build_section(RootConfig, plain, "")
    for key, node in groups.items():
        setattr(root, key, build_group(key, node))
    for key in ("encoder", "pooling", "data"):
        if getattr(root, key) is None:
            raise ConfigError(f"{key} is missing: select one with `{key}=<option>` (see conf/{key}/)")
    try:  # every rule first, on the section as written: no Lightning import before a rule can refuse
        root.trainer = _trainer(trainer, _rules_view)
        _cross_checks(root)
    except ConfigError:
        raise
    except (TypeError, ValueError, AttributeError):
        pass  # a value of the wrong type: Lightning's signature check names it
    if trainer_arguments is not None:
        root.trainer = _trainer(trainer, trainer_arguments)
        _cross_checks(root)
    return root


def _devices(value: Any) -> int | None:
    """How many devices a Trainer `devices` value names per node; None when it is "auto"/-1 (unknown here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, list | tuple):
        return len(value)
    if isinstance(value, str):
        value = value.strip()
        if "," in value:
            return len([v for v in value.split(",") if v.strip()])
        if not value.lstrip("-").isdigit():
            return None
        value = int(value)
    if isinstance(value, int) and value > 0:
        return value
    return None


def effective_batch(cfg: Any) -> dict[str, Any]:
    """Queries per optimiser step over all devices, from a composed config (before anything launches).

    {"queries": per_device x devices x nodes x accumulation (None when `trainer.devices` is auto),
     "per_device", "devices", "nodes", "accumulation"}. With grad cache the per-device batch is the whole
    per-device batch (cached chunks are not micro-batches).
    """
    plain = to_container(cfg)
    data, trainer = plain.get("data") or {}, plain.get("trainer") or {}
    per_device = int(data.get("batch_size") or 16)  # 16: DataConfig's default
    devices = _devices(trainer.get("devices", 1))
    nodes = int(trainer.get("num_nodes", 1) or 1)
    accumulation = int(trainer.get("accumulate_grad_batches", 1) or 1)
    queries = None if devices is None else per_device * devices * nodes * accumulation
    return {"queries": queries, "per_device": per_device, "devices": devices, "nodes": nodes,
            "accumulation": accumulation}


def _check_ranks(launcher: LauncherSection, trainer: SimpleNamespace) -> None:
    """Under a submitit launcher the launcher starts the ranks: Lightning's devices x num_nodes must be its
    tasks per node x nodes (else every job fails at start in Lightning)."""
    if not launcher.name.startswith("submitit") or not isinstance(trainer.devices, int) or isinstance(
            trainer.devices, bool):
        return
    tasks = launcher.tasks_per_node if launcher.tasks_per_node is not None else launcher.gpus_per_node
    if (trainer.devices, trainer.num_nodes) != (tasks, launcher.nodes):
        raise ConfigError(f"trainer.devices={trainer.devices} x trainer.num_nodes={trainer.num_nodes} do not match "
                          f"the launcher's launcher.tasks_per_node={tasks} x launcher.nodes={launcher.nodes}; set "
                          "launcher.tasks_per_node / launcher.nodes only (the trainer configs read them)")


def _cross_checks(root: RootConfig) -> None:
    if root.ckpt_path is not None and not isinstance(root.ckpt_path, str):
        raise ConfigError(f"ckpt_path={root.ckpt_path!r} is not valid; allowed values: auto, null, a file path")
    t = root.trainer
    _check_ranks(root.launcher, t)
    if root.data.streaming and t.max_steps == -1:
        # A stream repeats forever: an epoch never ends, and the lr schedule (sized by max_steps) would sit at 0.
        raise ConfigError("data.streaming=true with trainer.max_steps=-1: a stream has no length, so max_epochs "
                          "never ends an epoch; set trainer.max_steps=<N> (and drop trainer.max_epochs)")
    if root.train.grad_cache and t.accumulate_grad_batches != 1:
        raise ConfigError("train.grad_cache=true with trainer.accumulate_grad_batches>1: grad cache already "
                          "reaches large batches; set trainer.accumulate_grad_batches=1")
    _check_monitor(root.train.monitor, root.eval)
    if root.eval is not None and root.eval.enabled:
        # the fit-end evaluation would fail after training: say it now (the scoring's declared needs)
        why = registry.scoring_refusal(root.eval.scoring, root.pooling.label, root.pooling.pooler, root.pooling.strategy)
        if why is not None:
            raise ConfigError(why)
    check_pooled_positions(root.train.objective, root.pooling, registry.declared_poolers(), registry.strategies())
    _check_half_weights(root)
    _check_eval_under_ddp(root)


# Half-precision weights without a float32 master copy: AdamW's update (lr 2e-5 x ~1) is below half an ulp of most
# bf16 weights, so it rounds away (in a check, 20% of the weights changed at all after 10 steps).
HALF_TRUE = ("16-true", "bf16-true")
HALF_DTYPES = ("bfloat16", "float16")


def _check_half_weights(root: RootConfig) -> None:
    fix = ("use trainer.precision=bf16-mixed with encoder.dtype=float32 (float32 weights, bf16 compute); to fit a "
           "large batch add train.grad_cache=true")
    if str(root.trainer.precision) in HALF_TRUE:
        raise ConfigError(f"trainer.precision={root.trainer.precision} trains half-precision weights without a "
                          f"float32 master copy, so most AdamW updates round away; {fix}")
    dtype = get_key(root.encoder, "dtype", "float32")
    # with LoRA the half-precision base weights are frozen and only the adapters train, which peft keeps in float32
    if dtype in HALF_DTYPES and get_key(root.encoder, "lora", None) is None:
        raise ConfigError(f"encoder.dtype={dtype} trains {dtype} weights without a float32 master copy, so most "
                          f"AdamW updates round away (it is for evaluation: lmk.evaluate); {fix}")


def processes(root: RootConfig) -> int | None:
    """Training processes (ranks) of a run: devices per node x nodes; None when `trainer.devices` is auto under a
    distributed strategy (unknown before the job runs)."""
    devices = _devices(root.trainer.devices)
    if devices is None:
        return None if "ddp" in str(root.trainer.strategy) or root.trainer.num_nodes > 1 else 1
    return devices * root.trainer.num_nodes


def _check_eval_under_ddp(root: RootConfig) -> None:
    """In-training evaluation runs on rank 0 while every other rank waits at a barrier under the process group's
    30-minute timeout: a paper suite there times the run out. Multi-process runs evaluate in the eval stage."""
    if root.eval is None:
        return
    view = root.eval.training_view()
    if not view.enabled or (view.every_n_steps is None and not view.at_fit_end):
        return
    ranks = processes(root)
    if ranks == 1:
        return
    what = "an unknown number of" if ranks is None else f"{ranks}"
    raise ConfigError(
        f"eval={root.eval.name} evaluates during training on rank 0 while the other ranks of {what} training "
        f"processes (trainer.devices={root.trainer.devices} x trainer.num_nodes={root.trainer.num_nodes}) wait at "
        "a barrier with a 30-minute timeout; set eval.in_training=none and evaluate the run in the eval stage "
        "(python -m lmk.sweep <spec> --stage eval, or python -m lmk.evaluate model=<run dir>), or train on one "
        "device (trainer.devices=1)")


def _check_monitor(monitor: str, eval_cfg: Any) -> None:
    """An `eval/...` monitor needs an evaluation that logs it: else no best.ckpt is ever written."""
    if not monitor.startswith("eval/"):
        return
    def get(key: str, default: Any) -> Any:
        return get_key(eval_cfg, key, default)

    tasks = list(get("tasks", None) or []) if eval_cfg is not None else []
    groups = dict(get("groups", None) or {}) if eval_cfg is not None else {}
    runs = eval_cfg is not None and (get("every_n_steps", None) is not None or get("at_fit_end", True))
    if not tasks or not runs:
        raise ConfigError(f"train.monitor={monitor!r} is an eval metric but no evaluation runs during training "
                          "(eval=none or no eval.every_n_steps/at_fit_end): set eval=<suite> (e.g. eval=local) "
                          "or train.monitor=train/loss train.monitor_mode=min")
    logged = [f"eval/group/{g}" for g in groups] + [f"eval/{t}" for t in tasks]
    if monitor not in logged and not any(monitor.startswith(f"eval/{t}/") for t in tasks):
        raise ConfigError(f"train.monitor={monitor!r} is not logged by eval={get('name', '?')}; "
                          f"allowed values: {', '.join(logged)} (or eval/<task>/<split>), or train/loss")
