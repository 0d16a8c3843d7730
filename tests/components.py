"""What the parametrised tests iterate: the registries and the config folders, never a hand-kept list, so a
new pooler class or pooling YAML is built, encoded, exported and probed by the tests on its own."""

from __future__ import annotations

from pathlib import Path

from lmk.config import group_options as config_group_options
from lmk.config import registry

CONF = Path(__file__).resolve().parents[1] / "conf"


def group_options(group: str) -> tuple[str, ...]:
    """The options of a config group (conf/<group>/*.yaml, less the `_base` files they extend)."""
    return tuple(config_group_options(group, CONF))


POOLING_CONFIGS = group_options("pooling")  # every table row's pooling (conf/pooling)
POOLER_NAMES = tuple(sorted(registry.declared_poolers()))  # every registered pooler class (lmk/model/landmark)
STRATEGY_NAMES = tuple(registry.strategies())  # every tokenization strategy (lmk.model.landmark.layouts)
