"""The names (and declared needs) of registered components, as config validation reads them, torch-free.

They come from the landmark package's plain-Python declarations (`lmk.model.landmark.names`): importing that module
loads no torch, and the implementations take their declarations from the same tables. A pooler registered at run
time (`@register_pooler` on a class outside lmk) declares itself there, so it counts here from then on. The scorings
(`eval.scoring`) are declared in this layer (`lmk.config.scorings`, their classes are lmk.eval's); what a scoring needs of
a pooling is answered here from the declarations (`scoring_refusal`), never from a pooler's or a scoring's name. The
training objectives are declared in this layer too (`lmk.config.objectives`), read the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

from lmk.config import objectives, scorings
from lmk.model.landmark import names

# The sentence splitters of the `sentence` strategy (lmk.model.landmark.sentences)
SPLITTERS: tuple[str, ...] = tuple(names.SPLITTERS)
DEFAULT_LANGUAGE: str = names.DEFAULT_LANGUAGE
DEFAULT_SPLITTER: str = names.DEFAULT_SPLITTER
# Where the landmarks of a chunked strategy go, and the strategies that take a placement
PLACEMENTS: tuple[str, ...] = tuple(names.PLACEMENTS)
PLACED_STRATEGIES: tuple[str, ...] = tuple(names.PLACED_STRATEGIES)
# Which states a MaxSim query is (`eval.maxsim_query`, `train.maxsim_query`): the one tuple, the landmark package's
MAXSIM_QUERIES: tuple[str, ...] = names.MAXSIM_QUERIES


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


def declared_scorings() -> dict[str, dict[str, Any]]:
    """{scoring name: declared needs} of every declared scoring (lmk.config.scorings.DECLARED_SCORINGS), those
    registered at run time included: a copy. The classes are `lmk.eval.scorings.SCORING_CLASSES`."""
    return {name: dict(needs) for name, needs in scorings.DECLARED_SCORINGS.items()}


def scoring_needs(scoring: str) -> dict[str, Any]:
    """The declaration of `scoring`; an unknown name raises ValueError naming the declared ones."""
    declared = scorings.DECLARED_SCORINGS.get(scoring)
    if declared is None:
        raise ValueError(f"eval.scoring={scoring!r}: allowed {sorted(scorings.DECLARED_SCORINGS)}")
    return dict(declared)


def has_landmarks(pooler: str, strategy: str | None = None) -> bool:
    """Whether a pooling of `pooler` (and `strategy`, where known) has landmark states: its pooler's declaration
    needs the pool_mask and its strategy marks pooled positions."""
    needs = names.DECLARED_POOLERS.get(pooler) or {}
    marks = strategy is None or bool((names.STRATEGY_TRAITS.get(strategy) or {}).get("marks_pooled"))
    return bool(needs.get("needs_pool_mask")) and marks


def no_landmarks_message(pooling: str, pooler: str, scoring: str = "maxsim") -> str:
    """The one line a scoring that needs landmark states gives for a pooling without them (CLS, mean, latent
    attention)."""
    with_landmarks = ", ".join(p for p, n in names.DECLARED_POOLERS.items() if n.get("needs_pool_mask"))
    return (f"eval.scoring={scoring}: pooling {pooling!r} (pooler {pooler!r}) has no landmarks: it scores the "
            f"landmark states a landmark pooler (pooler {with_landmarks}) averages; evaluate an LMK pooling "
            "(lmk-fixed, lmk-sentence, lmk-variable) or set eval.scoring=single")


def scoring_refusal(scoring: str, pooling: str, pooler: str, strategy: str | None = None) -> str | None:
    """Why `scoring` cannot score pooling `pooling` (its pooler and strategy), from their declared needs; None when
    it can."""
    if scoring_needs(scoring)["needs_landmarks"] and not has_landmarks(pooler, strategy):
        return no_landmarks_message(pooling, pooler, scoring)
    return None


def declared_objectives() -> dict[str, dict[str, Any]]:
    """{objective name: declared needs} of every training objective (lmk.config.objectives.DECLARED_OBJECTIVES), those
    registered at run time included: a copy, torch-free. The classes are `lmk.train.objectives.OBJECTIVE_CLASSES`."""
    return objectives.declared_objectives()
