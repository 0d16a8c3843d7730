"""The training objectives (`train.objective`): one class each, registered with `@register_objective`.

An objective says what it needs from the model (`embed`: the pooled vector [N, H], or each text's landmark states as
a padded [N, L, H] tensor and a bool mask, lmk.train.embeddings) and computes its loss on the PairCollator layout
(`loss`: in-batch and hard negatives, the cross-device offset, teacher distillation). Its declaration (embedding,
temperature key, label, module) is plain Python in `lmk.config.objectives`, which config validation reads torch-free;
`build_objective` imports a declared module on first use, so a class in a file of its own needs only its declaration
(docs/extending.md, "A training objective"); a class registered from outside lmk declares its own from its class
attributes. ContrastiveModule (lmk.train.module) gathers, caches and backpropagates whatever embedding the objective
gives.

    single   InfoNCE on the pooled vector at `train.tau` (lmk.train.losses.info_nce)
    maxsim   InfoNCE on MaxSim scores at `train.maxsim_tau` (lmk.train.losses.maxsim_info_nce): the query's landmark
             states (or all its token states, `train.maxsim_query=tokens`) against each passage's landmark states
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor

from lmk.config import DECLARED_OBJECTIVES, TrainSection, declare_objective
from lmk.train.embeddings import Embedding
from lmk.train.losses import info_nce, maxsim_info_nce

OBJECTIVE_CLASSES: dict[str, type[Objective]] = {}


class Objective:
    """Base class: `embed` (what the model gives for one side) and `loss` (of the local queries against the passages,
    gathered from every rank or local, with this rank's `offset` into them)."""

    name: ClassVar[str] = ""
    # its declaration (lmk.config.objectives), set by `register_objective`
    embedding: ClassVar[str] = "pooled"
    temperature: ClassVar[str] = "tau"
    label: ClassVar[str] = ""

    def __init__(self, cfg: TrainSection) -> None:
        self.cfg = cfg

    @property
    def tau(self) -> float:
        return float(getattr(self.cfg, self.temperature))

    def embed(self, model: Any, features: Mapping[str, Tensor], side: str) -> Embedding:
        raise NotImplementedError

    def loss(self, q: Embedding, p: Embedding, *, group_size: int, in_batch: bool, teacher_scores: Tensor | None,
             offset: int) -> Tensor:
        raise NotImplementedError


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Register an Objective subclass under its `name`; a name declared in lmk.config.objectives gives the class its
    declaration, any other is declared from the class's attributes. A second class under one name is an error."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: an objective needs a `name` (what train.objective selects)")
    if cls.name in OBJECTIVE_CLASSES and OBJECTIVE_CLASSES[cls.name] is not cls:
        raise ValueError(f"objective {cls.name!r} is registered twice ({OBJECTIVE_CLASSES[cls.name].__name__} and "
                         f"{cls.__name__}); give the new objective its own name")
    declared = DECLARED_OBJECTIVES.get(cls.name) or declare_objective(
        cls.name, embedding=cls.embedding, temperature=cls.temperature, label=cls.label or cls.name,
        module=cls.__module__)
    cls.embedding, cls.temperature, cls.label = declared["embedding"], declared["temperature"], declared["label"]
    OBJECTIVE_CLASSES[cls.name] = cls
    return cls


def build_objective(cfg: TrainSection) -> Objective:
    """The objective `cfg.objective` names, over the train settings `cfg`; its declared `module` is imported on
    first use (a class in a file of its own registers there)."""
    module = DECLARED_OBJECTIVES.get(cfg.objective, {}).get("module")
    if cfg.objective not in OBJECTIVE_CLASSES and module:
        importlib.import_module(module)
    if cfg.objective not in OBJECTIVE_CLASSES:
        raise ValueError(f"train.objective={cfg.objective!r} has no registered class (@register_objective in "
                         f"{module or 'its module'}); registered: {', '.join(sorted(OBJECTIVE_CLASSES))}")
    return OBJECTIVE_CLASSES[cfg.objective](cfg)


@register_objective
class SingleVector(Objective):
    """InfoNCE on the pooler's L2-normalised vector (the paper's objective)."""

    name = "single"

    def embed(self, model: Any, features: Mapping[str, Tensor], side: str) -> Embedding:
        return model(dict(features))

    def loss(self, q: Embedding, p: Embedding, *, group_size: int, in_batch: bool, teacher_scores: Tensor | None,
             offset: int) -> Tensor:
        return info_nce(q, p, tau=self.tau, group_size=group_size, in_batch=in_batch, teacher_scores=teacher_scores,
                        offset=offset, teacher_temperature=self.cfg.teacher_temperature)


@register_objective
class MaxSim(Objective):
    """InfoNCE on MaxSim scores over landmark states (each L2-normalised): what eval MaxSim scores."""

    name = "maxsim"

    def embed(self, model: Any, features: Mapping[str, Tensor], side: str) -> Embedding:
        which = self.cfg.maxsim_query if side == "query" else "landmarks"
        return model.landmark_states(dict(features), which)

    def loss(self, q: Embedding, p: Embedding, *, group_size: int, in_batch: bool, teacher_scores: Tensor | None,
             offset: int) -> Tensor:
        return maxsim_info_nce(q, p, tau=self.tau, group_size=group_size, in_batch=in_batch,
                               teacher_scores=teacher_scores, offset=offset,
                               teacher_temperature=self.cfg.teacher_temperature)
