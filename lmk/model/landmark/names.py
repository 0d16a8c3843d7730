"""The names this package registers and what each declares, as plain Python (standard library only).

Config validation (`lmk.config`, torch-free) imports this module to learn the poolers, the tokenization strategies
and the sentence splitters; the implementations take their declarations from here too (`register_pooler`,
`layouts.py`, `sentences.py`), so there is one table per concept and nothing reads source files.

DECLARED_POOLERS: {pooler name: its needs}. A pooler class registers under its `name` (`@register_pooler`); a name declared
here gives the class its needs, and a pooler defined anywhere else (a user's module, a test) declares its own name
and needs from its class attributes when it registers, so config validation accepts it from then on.
  needs_pool_mask: it pools the positions a strategy marks (pool_mask);
  needs_hidden_size: it is built with the backbone's hidden size;
  trainable: it has weights (saved with the model);
  attention_rows: whose attention rows the position-bias probe reads: "cls" (the first token), "mean" (every
    token), "lmk" (the pooled positions); None: the probe does not apply.
STRATEGY_TRAITS: {strategy: traits}. marks_pooled: its pool_mask selects positions (the lmk pooler needs that);
chunked: its output depends on the chunk size (the run name carries it); inserts_landmarks: it inserts landmarks
(>= 1 must survive truncation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

POOLER_NEEDS: dict[str, Any] = {"needs_pool_mask": False, "needs_hidden_size": False, "trainable": False,
                                "attention_rows": None}  # the needs a pooler that declares none has

DECLARED_POOLERS: dict[str, dict[str, Any]] = {
    "cls": {**POOLER_NEEDS, "attention_rows": "cls"},
    "mean": {**POOLER_NEEDS, "attention_rows": "mean"},
    "lmk": {**POOLER_NEEDS, "needs_pool_mask": True, "attention_rows": "lmk"},
    "latent_attention": {**POOLER_NEEDS, "needs_hidden_size": True, "trainable": True},
    "last_token": {**POOLER_NEEDS},
}

STRATEGY_TRAITS: Mapping[str, Mapping[str, bool]] = {
    "none": {"marks_pooled": False, "chunked": False, "inserts_landmarks": False},
    "fixed": {"marks_pooled": True, "chunked": True, "inserts_landmarks": True},
    "variable": {"marks_pooled": True, "chunked": True, "inserts_landmarks": True},
    "sentence": {"marks_pooled": True, "chunked": False, "inserts_landmarks": True},
    "every_k": {"marks_pooled": True, "chunked": True, "inserts_landmarks": False},
    "multi_cls": {"marks_pooled": True, "chunked": True, "inserts_landmarks": False},
}

# Where the landmarks of the fixed and variable strategies go: "after" each chunk, the last one included (lmk's:
# under causal attention the last landmark has seen the whole text), or "authors": before each chunk and none after
# the last (the authors' decoder code, `insert_lmk_tokens`: no landmark sees the last chunk)
PLACEMENTS = ("after", "authors")
PLACED_STRATEGIES = ("fixed", "variable")

# Which states a multi-vector (MaxSim) query is: its landmark states or every token's (a document: its landmarks). The
# one tuple of the option: `eval.maxsim_query` (lmk.config.eval re-exports it), `LandmarkVectorMask(queries=...)`
MAXSIM_QUERIES: tuple[str, ...] = ("landmarks", "tokens")

# The sentence splitters of the `sentence` strategy (sentences.py)
SPLITTERS = ("koehn", "multilingual", "sentencex")
DEFAULT_LANGUAGE = "en"
DEFAULT_SPLITTER = "koehn"


def declare_pooler(name: str, **needs: Any) -> dict[str, Any]:
    """Declare pooler `name` with `needs` (keys of POOLER_NEEDS; the rest keep their defaults) and return its
    declaration; declaring a name again with other needs is an error (two poolers would share one name)."""
    unknown = sorted(set(needs) - set(POOLER_NEEDS))
    if unknown:
        raise ValueError(f"pooler {name!r}: unknown needs {unknown}; allowed: {', '.join(POOLER_NEEDS)}")
    declared = {**POOLER_NEEDS, **needs}
    if name in DECLARED_POOLERS and DECLARED_POOLERS[name] != declared:
        raise ValueError(f"pooler {name!r} is declared twice with different needs ({DECLARED_POOLERS[name]} and {declared}); "
                         "give the new pooler its own name")
    DECLARED_POOLERS[name] = declared
    return declared
