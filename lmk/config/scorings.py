"""The scorings (`eval.scoring`): each declared once, with its needs, as plain Python (config validation reads them).

DECLARED_SCORINGS: {scoring name: its declaration}. A scoring class registers under its `name`
(`lmk.eval.scorings.register_scoring`); a name declared here gives the class its needs, and a class registered from
outside lmk declares its own name and needs from its class attributes when it registers, as a pooler does.
  needs_landmarks: a text is scored by its landmark states: the pooling's pooler declares `needs_pool_mask` and its
    strategy marks pooled positions (a CLS, mean or latent-attention pooling cannot be scored this way);
  multi_vector: a text is several vectors (its export is a sentence-transformers MultiVectorEncoder, its evaluation
    an index of vectors per document the cost model sizes);
  describe: how the scores are computed, one phrase (the model card says it);
  settings: keys of the eval record that say how it scored (the same in every shard of an eval stage);
  summed: keys of the eval record summed over an eval stage's shards (seconds);
  module: where its class lives (imported when the scoring is first asked for);
  code_bits: the eval key of the bits per dimension its index stores each vector in as residual codes ("": float32
    vectors): the cost model sizes its index from it.
"""

from __future__ import annotations

from typing import Any

SCORING_NEEDS: dict[str, Any] = {"needs_landmarks": False, "multi_vector": False, "describe": "", "settings": (),
                                 "summed": (), "module": "", "code_bits": ""}  # what a scoring that declares none has

DECLARED_SCORINGS: dict[str, dict[str, Any]] = {
    "single": {**SCORING_NEEDS, "describe": "one vector per text (the pooler's), cosine",
               "module": "lmk.eval.encoder"},
    "maxsim": {**SCORING_NEEDS, "needs_landmarks": True, "multi_vector": True,
               "describe": "each text's landmark states (a query's: `eval.maxsim_query`), MaxSim",
               "settings": ("maxsim_query",), "summed": ("maxsim_search_seconds",), "module": "lmk.eval.maxsim"},
    "maxsim-compressed": {**SCORING_NEEDS, "needs_landmarks": True, "multi_vector": True,
                          "describe": "each text's landmark states, MaxSim over a compressed index (each document "
                                      "vector a centroid id and `eval.maxsim_bits`-bit residual codes; the top "
                                      "`eval.maxsim_rerank` candidates re-scored over their decoded vectors)",
                          "settings": ("maxsim_query", "maxsim_bits", "maxsim_centroids", "maxsim_rerank"),
                          "summed": ("maxsim_search_seconds", "maxsim_index_seconds"),
                          "module": "lmk.eval.compressed_maxsim", "code_bits": "maxsim_bits"},
}


def declare_scoring(name: str, **needs: Any) -> dict[str, Any]:
    """Declare scoring `name` with `needs` (keys of SCORING_NEEDS; the rest keep their defaults) and return its
    declaration; declaring a name again with other needs is an error (two scorings would share one name)."""
    unknown = sorted(set(needs) - set(SCORING_NEEDS))
    if unknown:
        raise ValueError(f"scoring {name!r}: unknown needs {unknown}; allowed: {', '.join(SCORING_NEEDS)}")
    declared = {**SCORING_NEEDS, **{k: tuple(v) if k in ("settings", "summed") else v for k, v in needs.items()}}
    if name in DECLARED_SCORINGS and DECLARED_SCORINGS[name] != declared:
        raise ValueError(f"scoring {name!r} is declared twice with different needs ({DECLARED_SCORINGS[name]} and "
                         f"{declared}); give the new scoring its own name")
    DECLARED_SCORINGS[name] = declared
    return declared
