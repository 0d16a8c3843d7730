"""The names configs may use, importable without torch so a config typo fails in well under a second.

`lmk.model.tokenization` and `lmk.model.pooling` own the implementations and check at import that their
registries match these tuples.
"""

STRATEGIES = ("none", "fixed", "variable", "sentence", "every_k", "multi_cls")
POOLER_NAMES = ("cls", "mean", "lmk", "latent_attention")
