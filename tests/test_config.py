"""Config composition + validation (lmk.config.validate, the trainer by Lightning's signature): every experiment composes; typos and bad values fail fast and clearly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from lmk.config import ConfigError, RootConfig, TrainSection, group_options
from lmk.config.schema import Coercible, above, at_least
from lmk.train.trainer_args import validate_training

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="train", overrides=["run_dir=/tmp/lmk-test-run", *overrides])


def test_default_config_validates():
    typed = validate_training(_compose())
    assert isinstance(typed, RootConfig) and isinstance(typed.train, TrainSection)
    assert typed.encoder.name == "minilm-l6" and typed.pooling.name == "lmk-fixed"
    assert typed.trainer.accelerator == "cpu" and typed.logger.name == "csv" and typed.seed == 0


@pytest.mark.parametrize("experiment", group_options("experiment", Path(CONF)))
def test_every_experiment_composes_and_validates(experiment):
    validate_training(_compose(f"experiment={experiment}", "++row=test-row"))


# A launcher that starts the ranks itself needs a trainer of as many devices: the option with the trainer it runs.
PAIRED = {("launcher", "submitit_slurm"): ["trainer=ddp-multinode"]}


@pytest.mark.parametrize("group", ["trainer", "logger", "launcher", "pooling", "encoder"])
def test_every_group_option_validates(group):
    for option in group_options(group, Path(CONF)):
        validate_training(_compose(f"{group}={option}", *PAIRED.get((group, option), [])))


def test_the_ranks_a_launcher_starts_must_be_the_trainers_devices():
    """One key for processes per node: launcher.tasks_per_node (hydra.launcher and the trainer read it)."""
    with pytest.raises(ConfigError, match=r"trainer.devices=1 x trainer.num_nodes=1 do not match.*tasks_per_node=8"):
        validate_training(_compose("launcher=submitit_slurm"))  # 8 tasks per node, each a one-device trainer
    typed = validate_training(_compose("launcher=submitit_slurm", "trainer=ddp-multinode", "launcher.tasks_per_node=4",
                              "launcher.nodes=5"))
    assert (typed.trainer.devices, typed.trainer.num_nodes) == (4, 5)


def test_chunk_size_is_one_key():
    assert validate_training(_compose("pooling=lmk-fixed", "pooling.chunk_size=64")).pooling.chunk_size == 64


def test_typo_key_names_the_key_and_allowed_keys():
    with pytest.raises(ConfigError, match=r"trainer\.max_stepz.*did you mean 'max_steps'.*allowed keys"):
        validate_training(_compose("+trainer.max_stepz=3"))
    with pytest.raises(ConfigError, match=r"train\.taus.*allowed keys:.*tau"):
        validate_training(_compose("+train.taus=0.1"))


@pytest.mark.parametrize("override, pattern", [
    ("trainer.precision=bf17", r"trainer\.precision='bf17'.*allowed values:.*bf16-mixed"),
    ("trainer.accelerator=tpuu", r"trainer\.accelerator='tpuu'.*allowed values:.*cpu"),
    ("train.tau=0", r"train\.tau=0.*> 0"),
    ("train.grad_cache=maybe", r"train\.grad_cache='maybe'.*true, false"),
    ("logger.name=tensorboard", r"logger\.name='tensorboard'.*wandb, csv, none"),
    ("pooling.strategy=fixd", r"pooling.*strategy='fixd'.*allowed values:.*fixed"),
    ("seed=-1", r"seed=-1"),
    ("trainer.max_steps=0", r"trainer\.max_steps=0"),
    ("train.warmup_shape=cosine", r"train\.warmup_shape='cosine'.*allowed values: log, linear"),
    ("train.grad_scale=0", r"train\.grad_scale=0.*> 0"),
    ("encoder.rope=maybe", r"encoder.*rope='maybe'.*true, false"),
    ("trainer.deterministic=always", r"trainer\.deterministic='always'.*allowed values: true, false or warn or null"),
    ("trainer.max_steps=many", r"trainer\.max_steps='many'.*allowed values: an integer"),
    ("+trainer.num_nodes=0", r"trainer\.num_nodes=0.*>= 1"),
    ("+trainer.callbacks=[]", r"trainer\.callbacks is set by lmk.*; remove trainer\.callbacks"),
    ("+trainer.logger=false", r"trainer\.logger is set by lmk.*logger=wandb\|csv\|none"),
])
def test_bad_value_names_key_value_and_allowed(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_training(_compose(override))


def test_the_trainer_section_is_lightnings_signature():
    """Every Trainer argument is a key (lmk declares none of them), with Lightning's defaults for those not given."""
    import inspect

    from lightning.pytorch import Trainer

    from lmk.train.trainer_args import SET_BY_LMK

    signature = inspect.signature(Trainer).parameters
    typed = validate_training(_compose("+trainer.detect_anomaly=true", "+trainer.max_time={hours: 1}"))
    assert set(vars(typed.trainer)) == set(signature) - set(SET_BY_LMK)
    assert typed.trainer.detect_anomaly is True and typed.trainer.max_time == {"hours": 1}
    assert typed.trainer.inference_mode == signature["inference_mode"].default  # cpu.yaml does not set it
    assert typed.trainer.max_steps == 20  # conf/trainer/cpu.yaml


def test_a_trainer_typo_fails_before_lightning_loads_when_another_section_is_wrong():
    """The trainer check runs last: a bad value elsewhere fails in about a second, without importing Lightning."""
    import subprocess
    import sys

    code = ("import sys\nfrom hydra import compose, initialize_config_dir\n"
            "from lmk.train.trainer_args import validate_training\n"
            f"with initialize_config_dir(config_dir={CONF!r}, version_base='1.3'):\n"
            "    cfg = compose('train', overrides=['run_dir=/tmp/x', 'train.tau=0', '+trainer.max_stepz=3'])\n"
            "try:\n    validate_training(cfg)\nexcept Exception as err:\n    print(err)\n"
            "assert 'lightning' not in sys.modules and 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "train.tau=0" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_wrong_group_option_is_a_hydra_error_listing_options():
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as info:
        _compose("pooling=lmk-fixd")
    message = str(info.value)
    assert "lmk-fixd" in message and "lmk-fixed" in message and "lmk-variable" in message


def test_seed_zero_is_kept():
    assert validate_training(_compose("seed=0")).seed == 0


def test_launcher_feeds_submitit():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["launcher=submitit_slurm", "launcher.nodes=2",
                                                      "launcher.partition=gpu", "trainer=ddp-multinode"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher.nodes == 2 and cfg.hydra.launcher.partition == "gpu"
    assert "submitit" in cfg.hydra.launcher._target_
    assert cfg.trainer.num_nodes == 2 and cfg.trainer.devices == cfg.launcher.gpus_per_node


def test_effective_batch_counts_every_device_node_and_accumulation() -> None:
    from lmk.config import effective_batch

    def queries(**trainer):
        return effective_batch({"data": {"batch_size": 256}, "trainer": trainer})["queries"]

    assert queries(devices=4, num_nodes=5) == 5120
    assert queries(devices=[0, 1], num_nodes=1, accumulate_grad_batches=3) == 256 * 2 * 3
    assert queries(devices="0,1,2") == 768 and queries(devices="8") == 2048
    assert queries(devices="auto") is None and queries(devices=-1) is None


def test_eval_monitor_without_eval_is_rejected_before_compute():
    # eval=none never logs eval/...: the run would write no best.ckpt and still report done.
    with pytest.raises(ConfigError, match=r"train.monitor='eval/group/local-short'.*eval=<suite>.*train/loss"):
        validate_training(_compose("eval=none", "train.monitor=eval/group/local-short"))
    with pytest.raises(ConfigError, match=r"not logged by eval=local.*eval/group/local-short"):
        validate_training(_compose("eval=local", "train.monitor=eval/group/no-such-group"))
    assert validate_training(_compose("eval=local", "train.monitor=eval/group/local-short")).train.monitor.endswith("short")
    assert validate_training(_compose("eval=local", "train.monitor=eval/LocalShort/test")).eval is not None


def test_one_seed_derives_every_part_unless_a_part_sets_its_own():
    from lmk.config import derive_seeds

    cfg = _compose("experiment=tiny", "seed=7")
    assert cfg.encoder.seed is None and cfg.data.seed is None  # null in the group files: derived
    derived = derive_seeds(cfg)
    assert derived.encoder.seed == 7 and derived.data.seed == 7 and cfg.data.seed is None  # a copy
    pinned = derive_seeds(_compose("experiment=tiny", "seed=7", "data.seed=3"))
    assert pinned.data.seed == 3 and pinned.encoder.seed == 7
    validate_training(cfg)  # null per-part seeds are valid


def test_half_precision_weights_are_refused_for_training():
    """bf16 weights without an fp32 master copy lose most AdamW updates; bf16-mixed is named."""
    for override, key in (("trainer.precision=bf16-true", "trainer.precision=bf16-true"),
                          ("trainer.precision=16-true", "trainer.precision=16-true"),
                          ("encoder.dtype=bfloat16", "encoder.dtype=bfloat16")):
        with pytest.raises(ConfigError, match=rf"{key}.*master copy.*; use trainer.precision=bf16-mixed"):
            validate_training(_compose(override))
    assert validate_training(_compose("trainer.precision=bf16-mixed")).trainer.precision == "bf16-mixed"


def test_in_training_eval_under_ddp_is_refused_naming_the_eval_stage():
    """Rank 0 would run the suite while the other ranks wait at a 30-minute barrier."""
    multi = [("trainer=ddp", "eval=beir15"), ("trainer=ddp-multinode", "launcher=submitit_slurm", "eval=local"),
             ("trainer=ddp-cpu", "eval=local", "launcher=submitit_local", "launcher.tasks_per_node=2")]
    for overrides in multi:
        with pytest.raises(ConfigError, match=r"wait at a barrier.*eval.in_training=none.*--stage eval"):
            validate_training(_compose(*overrides))
    # the paper's way (the eval stage evaluates), and one device evaluating in training, both validate
    assert validate_training(_compose("trainer=ddp-multinode", "launcher=submitit_slurm", "eval=beir15",
                             "eval.in_training=none")).eval is not None
    assert validate_training(_compose("eval=local")).eval is not None


def test_wandb_init_timeout_is_wandbs_own_and_offline_never_waits(monkeypatch):
    """5 s sent runs offline on a slow cluster network; W&B's own default is 90 s."""
    import wandb

    from lmk.run.loggers import resolve_wandb_mode

    default = wandb.Settings().init_timeout
    assert validate_training(_compose("logger=wandb")).logger.init_timeout == default >= 60
    assert validate_training(_compose("logger=csv")).logger.init_timeout == default  # the schema's default too
    # without credentials (or network) a run is offline from the start: the timeout never applies
    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    assert resolve_wandb_mode("auto") == "offline"


def test_slurm_jobs_are_requeued_after_a_time_limit_with_a_warning_first():
    """submitit's default max_num_timeout is 0 (a time limit is never requeued): lmk sets it from
    launcher.max_requeues, the warning signal's lead from launcher.signal_delay_s, and one key for tasks per node."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True,
                      overrides=["run_dir=/tmp/lmk-test-run", "launcher=submitit_slurm", "trainer=ddp-multinode",
                                 "launcher.tasks_per_node=4"])
    hl = cfg.hydra.launcher
    assert (hl.max_num_timeout, hl.signal_delay_s) == (3, 120)
    assert hl.tasks_per_node == 4 and cfg.trainer.devices == 4


@dataclass
class _NewSection(Coercible):
    """A schema as a new section would write it: each setting one annotated line, no checking code."""

    section: ClassVar[str] = "new"
    steps: int = at_least(1, 2)
    rate: float = above(0, 0.5)
    shape: Literal["log", "linear"] = "log"
    limit: int | None = at_least(1, None)


@pytest.mark.parametrize("given, pattern", [
    ({"steps": 0}, r"^new\.steps=0 is not valid; allowed values: an integer >= 1$"),
    ({"steps": True}, r"^new\.steps=True is not valid; allowed values: an integer$"),  # a bool is no integer
    ({"steps": 1.5}, r"^new\.steps=1\.5 is not valid; allowed values: an integer$"),
    ({"rate": 0}, r"^new\.rate=0\.0 is not valid; allowed values: a number > 0$"),
    ({"shape": "cosine"}, r"^new\.shape='cosine' is not valid; allowed values: log, linear$"),
    ({"limit": 0}, r"^new\.limit=0 is not valid; allowed values: an integer >= 1 or null$"),
    ({"limit": "x"}, r"^new\.limit='x' is not valid; allowed values: an integer or null$"),
    ({"steps": "3"}, r"^new\.steps='3' is not valid; allowed values: an integer$"),  # no string read as a number
    ({"stepz": 3}, r"^unknown key new\.stepz \(did you mean 'steps'\?\); allowed keys: limit, rate, shape, steps$"),
])
def test_a_setting_is_one_annotated_line_and_its_errors_are_one_line(given, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _NewSection.coerce(given)
    assert _NewSection.coerce({"steps": 3, "rate": 1, "limit": None}) == _NewSection(steps=3, rate=1.0)
    with pytest.raises(ConfigError, match=r"^new\.steps=0 is not valid"):  # built directly, the bounds hold too
        _NewSection(steps=0)


def test_a_bool_is_not_a_count_and_null_only_where_allowed():
    with pytest.raises(ConfigError, match=r"^data\.batch_size=True is not valid; allowed values: an integer$"):
        validate_training(_compose("data.batch_size=true"))
    with pytest.raises(ConfigError, match=r"^data\.max_rows=0 is not valid; allowed values: an integer >= 1 or null$"):
        validate_training(_compose("data.max_rows=0"))
    with pytest.raises(ConfigError, match=r"^train\.lr=None is not valid; allowed values: a number$"):
        validate_training(_compose("train.lr=null"))
    with pytest.raises(ConfigError, match=r"^encoder\.rope='no' is not valid; allowed values: true, false$"):
        validate_training(_compose("encoder.rope='no'"))  # no word read as a bool


# A fresh interpreter: does validating a job refuse these settings before Lightning (and mteb) load? The settings
# share two: the first validates each (filling its task-name cache, as a first check leaves it), the second validates
# each again and reports what loaded. Each setting has its own cache folder and finds lmk's in-process caches empty
# (they are cleared before it), so it reads only what its own first check left; it is judged only while none of the
# modules is loaded yet (a setting before it that loaded one fails first).
_REFUSES_LIGHT = """
import json, os, sys
from hydra import compose, initialize_config_dir
from lmk.config import ConfigError
from lmk.train.command import validate_job
HEAVY = ("lightning", "mteb", "torch")
for name, cache, overrides in json.loads(sys.argv[2]):
    os.environ["LMK_CACHE"] = cache  # read when used (lmk.run.umask_files.cache_root)
    for module in [m for n, m in sys.modules.items() if n == "lmk" or n.startswith("lmk.")]:
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == module.__name__:
                value.cache_clear()
    out = {"before": sorted(m for m in HEAVY if m in sys.modules), "refused": None}
    with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
        cfg = compose("train", overrides=["run_dir=/tmp/lmk-test-run", *overrides])
    try:
        validate_job(cfg, in_job=True)
    except ConfigError as err:
        out["refused"] = str(err).splitlines()[0]
    out["loaded"] = sorted(m for m in HEAVY if m in sys.modules)
    print("SETTING " + json.dumps([name, out]), flush=True)
"""
_REFUSED_SETTINGS = {
    "streaming": (["data.streaming=true", "trainer.max_steps=-1", "+trainer.max_epochs=1"], "data.streaming=true"),
    "monitor": (["eval=none", "train.monitor=eval/group/local-short"], "train.monitor="),
    "task": (["eval=local", "eval.tasks=[LocalShrt]"], "LocalShrt"),
    "grad-cache": (["train.grad_cache=true", "+trainer.accumulate_grad_batches=2"], "grad_cache"),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, dict]:
    import json
    import os
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("refusals")
    settings = json.dumps([[name, str(folder / name), overrides] for name, (overrides, _) in _REFUSED_SETTINGS.items()])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = [subprocess.run([sys.executable, "-c", _REFUSES_LIGHT, CONF, settings], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]  # the first fills the task-name caches
    assert runs[1].returncode == 0, runs[1].stdout + runs[1].stderr[-2000:]
    return dict(json.loads(line.split(" ", 1)[1]) for line in runs[1].stdout.splitlines()
                if line.startswith("SETTING "))


@pytest.mark.parametrize("setting", list(_REFUSED_SETTINGS))
def test_a_rule_refuses_before_lightning_loads(setting, refusals):
    """A wrong setting that needs no Trainer signature is refused with Lightning, mteb and torch never imported (the
    README's "a typo fails in a second"); mteb's task names come from the cache a first check leaves."""
    out, says = refusals[setting], _REFUSED_SETTINGS[setting][1]
    assert out["before"] == [], f"a setting validated before it in the same interpreter loaded {out['before']}"
    assert out["refused"] is not None and says in out["refused"], out
    assert out["loaded"] == [], out


def test_a_signature_error_still_names_the_trainer_key():
    with pytest.raises(ConfigError, match="trainer.precision"):
        validate_training(_compose("trainer.precision=bogus"))


def test_the_rules_read_lightnings_own_defaults():
    """The defaults the rules use before Lightning loads are the Trainer signature's (a drift would let a rule read
    another value than the Trainer gets)."""
    import inspect

    from lightning.pytorch import Trainer

    from lmk.config.root import RULES_READ_DEFAULTS

    params = inspect.signature(Trainer).parameters
    assert {k: params[k].default for k in RULES_READ_DEFAULTS} == RULES_READ_DEFAULTS
