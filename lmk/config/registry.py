"""The names (and declared needs) of registered components, as config validation reads them, torch-free.

They come from the landmark package's plain-Python declarations (`lmk.model.landmark.names`): importing that module
loads no torch, and the implementations take their declarations from the same tables. A pooler registered at run
time (`@register_pooler` on a class outside lmk) declares itself there, so it counts here from then on. The training
objectives are declared in this layer (`lmk.config.objectives`), read the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

from lmk.config import objectives
from lmk.model.landmark import names

# The sentence splitters of the `sentence` strategy (lmk.model.landmark.sentences)
SPLITTERS: tuple[str, ...] = tuple(names.SPLITTERS)
DEFAULT_LANGUAGE: str = names.DEFAULT_LANGUAGE
DEFAULT_SPLITTER: str = names.DEFAULT_SPLITTER
# Where the landmarks of a chunked strategy go, and the strategies that take a placement
PLACEMENTS: tuple[str, ...] = tuple(names.PLACEMENTS)
PLACED_STRATEGIES: tuple[str, ...] = tuple(names.PLACED_STRATEGIES)


def declared_poolers() -> dict[str, dict[str, Any]]:
    """{pooler name: declared needs} of every declared pooler (names.DECLARED_POOLERS), those registered at run time
    included: a copy, torch-free. The classes are `lmk.model.landmark.POOLER_CLASSES`."""
    return {name: dict(needs) for name, needs in names.DECLARED_POOLERS.items()}


def poolers() -> dict[str, dict[str, Any]]:
    """The old name of `declared_poolers`, kept working."""
    warnings.warn("lmk.config.registry.poolers() is deprecated: use declared_poolers()",  # deprecated alias
                  DeprecationWarning, stacklevel=2)
    return declared_poolers()


def strategies() -> dict[str, dict[str, bool]]:
    """{strategy name: traits} of every tokenization strategy (lmk.model.landmark.names.STRATEGY_TRAITS)."""
    return {name: dict(traits) for name, traits in names.STRATEGY_TRAITS.items()}


def declared_objectives() -> dict[str, dict[str, Any]]:
    """{objective name: declared needs} of every training objective (lmk.config.objectives.DECLARED_OBJECTIVES), those
    registered at run time included: a copy, torch-free. The classes are `lmk.train.objectives.OBJECTIVE_CLASSES`."""
    return objectives.declared_objectives()
