"""One registry per concept: the plain-Python declarations lmk.config reads torch-free (lmk.model.landmark.names)
are the ones the classes take, duplicates are refused, a pooler registered outside lmk's tree validates, and the
declared needs match what the classes do."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from components import CONF, POOLER_NAMES, POOLING_CONFIGS, STRATEGY_NAMES
from omegaconf import OmegaConf
from torch import Tensor

import lmk.model.landmark
from lmk.config import ConfigError, PoolingConfig, registry
from lmk.eval.tasks import LOCAL_TASK_CLASSES, local_task
from lmk.model.landmark import POOLER_CLASSES, Pooler, build_pooler, masked_mean, register_pooler
from lmk.model.landmark import names as declared_names
from lmk.model.landmark.layouts import STRATEGY_TRAITS

TRAITS = ("needs_pool_mask", "needs_hidden_size", "trainable", "attention_rows")


def test_the_torch_free_view_equals_the_runtime_registries() -> None:
    declared = registry.declared_poolers()
    assert sorted(declared) == sorted(POOLER_CLASSES) and POOLER_CLASSES, "a pooler class is missing from one view"
    for name, cls in POOLER_CLASSES.items():
        assert cls.name == name and declared[name] == {t: getattr(cls, t) for t in TRAITS}, name
    assert registry.strategies() == {k: dict(v) for k, v in STRATEGY_TRAITS.items()}


def test_config_validation_imports_no_torch() -> None:
    code = ("import sys\nfrom lmk.config import PoolingConfig, registry\n"
            "PoolingConfig.coerce({'name': 'x', 'strategy': 'fixed', 'pooler': 'lmk'})\n"
            "assert registry.declared_poolers() and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def registries() -> Iterator[None]:
    """The registries as they were after the test (a test's pooler must not leak into other tests)."""
    runtime, declared = dict(POOLER_CLASSES), {k: dict(v) for k, v in declared_names.DECLARED_POOLERS.items()}
    yield
    POOLER_CLASSES.clear()
    POOLER_CLASSES.update(runtime)
    declared_names.DECLARED_POOLERS.clear()
    declared_names.DECLARED_POOLERS.update(declared)


def test_a_pooler_registered_outside_lmk_is_accepted_by_config_validation(registries: None) -> None:
    with pytest.raises(ConfigError, match="pooler='test_max' is not valid"):
        PoolingConfig.coerce({"name": "x", "strategy": "fixed", "pooler": "test_max"})

    @register_pooler
    class TestMaxPooling(Pooler):  # defined in this test module, not in lmk/model/landmark
        name = "test_max"
        needs_pool_mask = True

        def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
            return masked_mean(token_embeddings, attention_mask if pool_mask is None else pool_mask & attention_mask)

    assert PoolingConfig.coerce({"name": "x", "strategy": "fixed", "pooler": "test_max"}).pooler == "test_max"
    assert registry.declared_poolers()["test_max"]["needs_pool_mask"]  # its declared needs are checked like lmk's own
    with pytest.raises(ConfigError, match="needs a strategy that marks pooled positions"):
        PoolingConfig.coerce({"name": "x", "strategy": "none", "pooler": "test_max"})
    assert type(build_pooler("test_max")) is TestMaxPooling


def test_a_duplicate_pooler_name_is_refused(registries: None) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        @register_pooler
        class AnotherMean(Pooler):  # noqa: F841 - the decorator refuses it
            name = "mean"
    with pytest.raises(ValueError, match="declared twice with different needs"):
        declared_names.declare_pooler("mean", trainable=True)


def test_a_class_cannot_contradict_its_declaration(registries: None) -> None:
    del POOLER_CLASSES["lmk"]  # as if the class were defined again (the name is declared in names.DECLARED_POOLERS)
    with pytest.raises(ValueError, match="change the declaration, not the class"):
        @register_pooler
        class LMKAgain(Pooler):  # noqa: F841 - the decorator refuses it
            name = "lmk"
            needs_pool_mask = False


def test_a_duplicate_local_task_is_refused() -> None:
    name = next(iter(LOCAL_TASK_CLASSES))
    with pytest.raises(ValueError, match="registered twice"):
        local_task(type("Again", (LOCAL_TASK_CLASSES[name],), {}))


@pytest.mark.parametrize("name", POOLER_NAMES)
def test_declared_needs_match_the_class(name: str) -> None:
    cls = POOLER_CLASSES[name]
    if cls.needs_hidden_size:
        with pytest.raises(ValueError, match="hidden_size"):
            build_pooler(name)
    pooler = build_pooler(name, hidden_size=128)
    assert cls.trainable == any(True for _ in pooler.parameters()), "trainable must say whether it has weights"
    h, mask = torch.randn(2, 5, 128), torch.ones(2, 5, dtype=torch.long)
    if cls.needs_pool_mask:
        with pytest.raises(ValueError, match="pool_mask"):
            pooler(h, mask)
    out = pooler(h, mask, torch.ones(2, 5, dtype=torch.bool))
    assert out.shape == (2, 128) and torch.allclose(out.norm(dim=-1), torch.ones(2))


@pytest.mark.parametrize("name", POOLING_CONFIGS)
def test_every_pooling_yaml_names_a_registered_pooler_and_strategy(name: str) -> None:
    cfg = PoolingConfig.coerce(OmegaConf.load(CONF / "pooling" / f"{name}.yaml"))
    assert cfg.name == name and cfg.pooler in POOLER_NAMES and cfg.strategy in STRATEGY_NAMES


def test_a_pooler_that_needs_marked_positions_refuses_a_strategy_without_them() -> None:
    needs = [n for n in POOLER_NAMES if POOLER_CLASSES[n].needs_pool_mask]
    unmarked = [s for s in STRATEGY_NAMES if not STRATEGY_TRAITS[s]["marks_pooled"]]
    assert needs and unmarked
    with pytest.raises(ConfigError, match="needs a strategy that marks pooled positions"):
        PoolingConfig.coerce({"name": "x", "strategy": unmarked[0], "pooler": needs[0]})


def test_the_old_registry_names_still_work_with_a_deprecation() -> None:
    """`lmk.model.landmark.POOLERS` (now POOLER_CLASSES) and `registry.poolers()` (now declared_poolers()) keep
    working, each with a DeprecationWarning naming the new name."""
    with pytest.warns(DeprecationWarning, match="POOLER_CLASSES"):
        assert lmk.model.landmark.POOLERS is POOLER_CLASSES
    with pytest.warns(DeprecationWarning, match="declared_poolers"):
        assert registry.poolers() == registry.declared_poolers()
