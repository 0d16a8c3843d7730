"""The scoring classes (`eval.scoring`): one mteb encoder class per scoring, registered with `@register_scoring`.

A scoring is declared once in `lmk.config.scorings.DECLARED_SCORINGS` (plain Python: config validation reads its
needs without torch) and implemented by one class that registers under its `name`: `single` is
`lmk.eval.encoder.LmkEncoder` (one vector per text, cosine), `maxsim` `lmk.eval.maxsim.LmkMaxSimEncoder` (landmark
states, MaxSim). A declared name gives the class its needs (class attributes, read instead of its name); a class
registered from outside lmk declares its own name and needs from its class attributes when it registers, so
`eval.scoring=<its name>` validates from then on. A scoring class is built from the eval config by `from_eval` and
says what its scores need recorded (`record`) and what its index holds (`index_size`).

Nothing outside the registries tests a scoring's or a pooler's name: `refusal(scoring, model)` answers from the
declared needs whether a model can be scored so.
"""

from __future__ import annotations

import importlib
from typing import Any

from lmk.config import registry
from lmk.config.scorings import DECLARED_SCORINGS, SCORING_NEEDS, declare_scoring

SCORING_CLASSES: dict[str, type] = {}  # scoring name -> its class (an mteb encoder over lmk's EmbeddingModel)
_DECLARED_BY_CLASS = tuple(k for k in SCORING_NEEDS if k != "module")  # the needs a class carries as attributes


def register_scoring(cls: type) -> type:
    """Class decorator: register `cls` under `cls.name`. A name declared in DECLARED_SCORINGS gives the class its
    needs; another name is declared from the class's attributes (`needs_landmarks`, `multi_vector`, `describe`,
    `settings`, `summed`). A second class under a registered name is an error."""
    name = getattr(cls, "name", "")
    if not name or not isinstance(name, str):
        raise ValueError(f"{cls.__qualname__}: a scoring class needs a `name` (what eval.scoring= selects)")
    if name in DECLARED_SCORINGS:
        declared = DECLARED_SCORINGS[name]
        for need in ("needs_landmarks", "multi_vector"):
            if need in vars(cls) and vars(cls)[need] != declared[need]:
                raise ValueError(f"scoring {cls.__qualname__} sets {need}={vars(cls)[need]!r} but DECLARED_SCORINGS "
                                 f"declares {declared[need]!r} for {name!r}; change the declaration, not the class")
    else:
        declared = declare_scoring(name, module=cls.__module__,
                                   **{k: getattr(cls, k, SCORING_NEEDS[k]) for k in _DECLARED_BY_CLASS})
    for key in _DECLARED_BY_CLASS:
        setattr(cls, key, declared[key])
    old = SCORING_CLASSES.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"scoring {name!r} is registered twice ({old.__module__}.{old.__qualname__} and "
                         f"{cls.__module__}.{cls.__qualname__}); give the new scoring its own name")
    SCORING_CLASSES[name] = cls
    return cls


def scoring_class(name: str) -> type:
    """The class of scoring `name`, its declared module imported on first use."""
    if name not in SCORING_CLASSES:
        module = registry.scoring_needs(name)["module"]  # an undeclared name: ValueError naming the declared ones
        if module:
            importlib.import_module(module)
    if name not in SCORING_CLASSES:
        raise ValueError(f"eval.scoring={name!r} is declared but no class registers it (@register_scoring in "
                         f"{registry.scoring_needs(name)['module'] or 'its module'})")
    return SCORING_CLASSES[name]


def refusal(scoring: str, model: Any) -> str | None:
    """Why `model` (an EmbeddingModel) cannot be scored by `scoring`, from the scoring's declared needs and the
    model's pooler and strategy (one line); None when it can."""
    if not registry.scoring_needs(scoring)["needs_landmarks"]:
        return None
    from lmk.model.multi_vector import no_landmarks  # torch: only where a model is at hand

    return no_landmarks(model, scoring)
