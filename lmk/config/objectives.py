"""The training objectives (`train.objective`) and what each declares, as plain Python (torch-free).

Config validation reads these declarations; the implementations (`lmk.train.objectives`, one `@register_objective`
class each) take their declaration from here, and an objective defined outside lmk declares its own when it
registers, so validation accepts it from then on (as the poolers of `lmk.model.landmark.names`).

DECLARED_OBJECTIVES: {objective name: its needs}.
  embedding: what it needs from the model: "pooled" (the pooler's vector [N, H]) or "landmark_states" (each text's
    states at its pooled positions, a padded [N, L, H] tensor and a [N, L] bool mask: what eval MaxSim scores);
  temperature: the `train.*` key of its temperature (each objective has its own scale);
  label: how a model card names it;
  module: where its class lives (imported when the objective is first built: `lmk.train.objectives.build_objective`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmk.config.schema import ConfigError

EMBEDDINGS = ("pooled", "landmark_states")
OBJECTIVE_NEEDS: dict[str, Any] = {"embedding": "pooled", "temperature": "tau", "label": "", "module": ""}

DECLARED_OBJECTIVES: dict[str, dict[str, Any]] = {
    "single": {**OBJECTIVE_NEEDS, "label": "single-vector InfoNCE", "module": "lmk.train.objectives"},
    "maxsim": {**OBJECTIVE_NEEDS, "embedding": "landmark_states", "temperature": "maxsim_tau",
               "label": "MaxSim InfoNCE", "module": "lmk.train.objectives"},
}


def declare_objective(name: str, **needs: Any) -> dict[str, Any]:
    """Declare objective `name` with `needs` (keys of OBJECTIVE_NEEDS) and return its declaration; declaring a name
    again with other needs is an error (two objectives would share one name)."""
    unknown = sorted(set(needs) - set(OBJECTIVE_NEEDS))
    if unknown:
        raise ValueError(f"objective {name!r}: unknown needs {unknown}; allowed: {', '.join(OBJECTIVE_NEEDS)}")
    declared = {**OBJECTIVE_NEEDS, **needs}
    if declared["embedding"] not in EMBEDDINGS:
        raise ValueError(f"objective {name!r}: embedding={declared['embedding']!r}; allowed: {', '.join(EMBEDDINGS)}")
    if name in DECLARED_OBJECTIVES and DECLARED_OBJECTIVES[name] != declared:
        raise ValueError(f"objective {name!r} is declared twice with different needs ({DECLARED_OBJECTIVES[name]} "
                         f"and {declared}); give the new objective its own name")
    DECLARED_OBJECTIVES[name] = declared
    return declared


def declared_objectives() -> dict[str, dict[str, Any]]:
    """{objective name: declared needs} of every declared objective (a copy)."""
    return {name: dict(needs) for name, needs in DECLARED_OBJECTIVES.items()}


def trains_landmark_states(objective: str | None) -> bool:
    """Whether `objective` (a run's `train.objective`; None: a run from before it existed, trained single) trains a
    text's landmark states, not its pooled vector: such a run exports as a multi-vector model by default."""
    return DECLARED_OBJECTIVES.get(objective or "", {}).get("embedding") == "landmark_states"


def describe_objective(train: Mapping[str, Any]) -> str:
    """How a run's `train` section (results.json's config) trained, in words: "single-vector InfoNCE (tau 0.02)",
    "MaxSim InfoNCE (query landmark states, maxsim_tau 0.02)". A run from before `train.objective` trained single."""
    name = train.get("objective") or "single"
    declared = DECLARED_OBJECTIVES.get(name, {**OBJECTIVE_NEEDS, "label": name})
    key = declared["temperature"]
    detail = [f"{key} {train[key]:g}" if isinstance(train.get(key), int | float) else f"{key} not recorded"]
    if declared["embedding"] == "landmark_states":
        query = "all token states" if train.get("maxsim_query") == "tokens" else "landmark states"
        detail.insert(0, f"query {query} against passage landmark states")
    return f"{declared['label'] or name} ({', '.join(detail)})"


def check_pooled_positions(objective: str, pooling: Any, poolers: dict[str, dict[str, Any]],
                           strategies: dict[str, dict[str, bool]]) -> None:
    """An objective that trains on landmark states needs a pooling with pooled positions: a pooler that pools the
    positions a strategy marks (`needs_pool_mask`) and a strategy that marks them (`marks_pooled`); else ConfigError
    in one line naming the fix. Read from the declarations, never from a pooler's name."""
    if DECLARED_OBJECTIVES[objective]["embedding"] != "landmark_states":
        return
    marks = poolers.get(pooling.pooler, {}).get("needs_pool_mask") and strategies[pooling.strategy]["marks_pooled"]
    if not marks:
        raise ConfigError(f"train.objective={objective}: pooling {pooling.label!r} (pooler {pooling.pooler!r}, strategy "
                          f"{pooling.strategy!r}) has no pooled positions, so no landmark states to train on; use an "
                          "LMK pooling (pooling=lmk-fixed, lmk-sentence, lmk-variable) or set train.objective=single")
