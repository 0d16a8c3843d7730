"""Named poolers: token embeddings [B, T, H] -> L2-normalised sentence embeddings [B, H].

`POOLERS` holds every class of this package decorated with `@register_pooler` (each module here is imported
below, so a new file is picked up by itself; lmk.config reads the same classes torch-free). The paper's:
  - ``cls``: the first non-pad token (position 0 with right padding).
  - ``mean``: masked mean over all non-pad tokens ([CLS] and [SEP] included).
  - ``lmk``: mean over `pool_mask & attention_mask` (landmarks, or every-k / multi-CLS positions); a row
    with no pooled position falls back to the masked mean.
  - ``latent_attention``: the authors' trainable latent-attention pooler (tokens attend to learnable
    latents, GEGLU feed-forward, masked mean); needs `hidden_size`.
How to add one: docs/extending.md.
"""

import importlib
import pkgutil

from lmk.model.pooling.base import POOLERS, Pooler, build_pooler, masked_mean, register_pooler
from lmk.model.pooling.basic import CLSPooling, LandmarkPooling, MeanPooling
from lmk.model.pooling.latent_attention import LatentAttentionPooling

for _module in pkgutil.iter_modules(__path__):  # every pooler module registers its classes on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["POOLERS", "CLSPooling", "LandmarkPooling", "LatentAttentionPooling", "MeanPooling", "Pooler",
           "build_pooler", "masked_mean", "register_pooler"]
