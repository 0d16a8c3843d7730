"""Config layer (torch-free): the schemas of every config group, their validation and the shared checks.

Everything here runs before any compute and imports neither torch nor any other lmk layer (only the landmark
package's plain-Python names): a typo in a key or a value fails in about a second, naming the key and what is
allowed. The trainer section is Lightning's Trainer signature: its check is passed in (lmk.train.trainer_args).

    schema.py   ConfigError, build_section / Coercible (typed dataclasses from mappings), call_arguments (a
                section checked against a callable's signature), hash_neutral (an option that keeps old hashes
                at its default), get_key, plain
    root.py     the root config (train / trainer / logger / launcher / hub sections), validate(cfg, trainer check),
                seeds
    model.py    EncoderConfig, PoolingConfig (groups encoder/, pooling/)
    data.py     DataConfig, SourceConfig (group data/)
    eval.py     EvalConfig (group eval/)
    device.py   eval device / precision specs
    registry.py the names of registered components (poolers, strategies, splitters), from lmk.model.landmark.names,
                and the scorings' (scorings.py); what a scoring needs of a pooling (scoring_refusal); the training
                objectives
    scorings.py the scorings (eval.scoring) and their needs, declared in plain Python
    objectives.py  the training objectives' declarations (train.objective), describe_objective (a card's line)
"""

from lmk.config import registry, scorings
from lmk.config.data import LOCAL_SOURCE, REPLICA_PREFIX, DataConfig, SourceConfig, is_named_source
from lmk.config.device import check_device, check_precision
from lmk.config.eval import (
    LENGTHS,
    LOCAL_TASK_NAMES,
    MAXSIM_QUERIES,
    RULER_DEPTHS,
    RULER_ESSAYS_REPO,
    RULER_HAYSTACKS,
    RULER_VARIANTS,
    EvalConfig,
    EvalConfigError,
    no_landmarks_message,
)
from lmk.config.model import (
    EncoderConfig,
    PoolingConfig,
    check_lora,
    koehn_languages,
    pooling_label,
    validate_splitter,
)
from lmk.config.objectives import (
    DECLARED_OBJECTIVES,
    check_pooled_positions,
    declare_objective,
    describe_objective,
    trains_landmark_states,
)
from lmk.config.paths import in_repo, repo_root
from lmk.config.root import (
    CKPT_AUTO,
    CKPT_FRESH,
    CONF_DIR,
    RULES_READ_DEFAULTS,
    RootConfig,
    TrainSection,
    derive_seeds,
    effective_batch,
    group_file,
    group_options,
    hash_neutral_keys,
    validate,
)
from lmk.config.schema import (
    Coercible,
    ConfigError,
    UserError,
    above,
    at_least,
    call_arguments,
    choice,
    get_key,
    hash_neutral,
    is_user_error,
    neutral_defaults,
    plain,
    to_container,
)

__all__ = [
    "CKPT_AUTO", "CKPT_FRESH", "CONF_DIR", "DECLARED_OBJECTIVES", "LENGTHS", "LOCAL_TASK_NAMES", "MAXSIM_QUERIES",
    "RULES_READ_DEFAULTS", "RULER_DEPTHS",
    "RULER_ESSAYS_REPO", "RULER_HAYSTACKS",
    "RULER_VARIANTS", "LOCAL_SOURCE", "REPLICA_PREFIX", "Coercible", "ConfigError", "DataConfig", "EncoderConfig",
    "EvalConfig", "EvalConfigError", "PoolingConfig", "RootConfig", "SourceConfig", "TrainSection", "UserError",
    "above", "at_least", "call_arguments", "check_device", "check_pooled_positions", "declare_objective", "describe_objective", "trains_landmark_states", "check_lora", "check_precision", "choice",
    "derive_seeds", "effective_batch", "get_key", "group_file", "group_options", "hash_neutral", "hash_neutral_keys", "in_repo",
    "is_named_source", "is_user_error", "koehn_languages", "neutral_defaults", "no_landmarks_message", "plain",
    "pooling_label", "registry", "repo_root", "scorings", "to_container", "validate", "validate_splitter",
]
