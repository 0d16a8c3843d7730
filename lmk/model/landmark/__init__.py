"""The landmark code every exported model carries: tokenization, poolers and the sentence-transformers input module.

    layouts.py               where each token of a row goes (numpy), truncation after insertion; STRATEGY_TRAITS
    koehn_splitter.py, sentences.py   the sentence splitters of the `sentence` strategy
    tokenization.py          LandmarkTokenizer (strategies none / fixed / variable / sentence / every_k / multi_cls)
    poolers.py               the pooler contract, its registry (@register_pooler) and cls / mean / lmk
    latent_attention.py      the authors' trainable latent-attention pooler
    landmark_transformer.py  LandmarkTransformer: the sentence-transformers input module (tokenizer + backbone)

lmk trains and encodes with these classes, and `lmk.model.st_folder` copies these files verbatim into every export, so
that `SentenceTransformer(folder, trust_remote_code=True)` runs the same code without lmk. Hence the rules of this
package (tests/test_landmark_package.py checks them): it imports only torch, transformers, sentence-transformers,
numpy, regex and the standard library, and its files import each other relatively (`from .poolers import ...`),
one level deep, as the Hugging Face loader of a model's own code needs. An optional package (sentencex, spaCy) is
imported inside `try`. Every module here is imported below, so a new pooler file registers itself.
"""

import importlib
import pkgutil

from .landmark_transformer import LandmarkTransformer
from .latent_attention import LatentAttentionPooling
from .poolers import (
    POOLERS,
    CLSPooling,
    LMKPooling,
    MeanPooling,
    Pooler,
    build_pooler,
    masked_mean,
    register_pooler,
)
from .tokenization import STRATEGIES, LandmarkTokenizer

for _module in pkgutil.iter_modules(__path__):  # every pooler module registers its classes on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["POOLERS", "STRATEGIES", "CLSPooling", "LMKPooling", "LandmarkTokenizer", "LandmarkTransformer",
           "LatentAttentionPooling", "MeanPooling", "Pooler", "build_pooler", "masked_mean", "register_pooler"]
