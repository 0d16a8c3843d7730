"""The landmark code every exported model carries: tokenization, poolers and the sentence-transformers input module.

    names.py                 the registered names: poolers (and their needs), strategies, splitters; plain Python
    capacity.py              what a layout implies for a text's landmark count (most, expected); plain Python
    layouts.py               where each token of a row goes (numpy), truncation after insertion
    koehn_splitter.py, sentences.py   the sentence splitters of the `sentence` strategy
    tokenization.py          LandmarkTokenizer (strategies none / fixed / variable / sentence / every_k / multi_cls)
    poolers.py               the pooler contract, its registry (@register_pooler) and cls / mean / lmk / last_token
    latent_attention.py      the authors' trainable latent-attention pooler
    landmark_transformer.py  LandmarkTransformer: the sentence-transformers input module (tokenizer + backbone)
    landmark_mask.py         which states a multi-vector (MaxSim) text keeps: vector_mask, LandmarkVectorMask
    sliding_window_guard.py  keeps sliding-window attention off fully padded rows
    backbone_inputs.py       what the backbone is called with: where a decoder's inputs differ from an encoder's
    legacy_config.py         what older lmk versions saved under names lmk no longer writes

lmk trains and encodes with these classes, and `lmk.sharing.st_folder` copies these files verbatim into every export, so
that `SentenceTransformer(folder, trust_remote_code=True)` runs the same code without lmk. Hence the rules of this
package (tests/test_landmark_package.py checks them): it imports only torch, transformers, sentence-transformers,
numpy, regex and the standard library, and its files import each other relatively (`from .poolers import ...`),
one level deep, as the Hugging Face loader of a model's own code needs. An optional package (sentencex, spaCy) is
imported inside `try`.

`names.py` declares what the package registers (poolers and their needs, strategies, sentence splitters) in plain
Python, so config validation imports it without torch. Hence importing this package loads nothing else: the names
below load on first use, and with them every module here, so a new pooler file registers itself.
"""

import importlib
import pkgutil
import warnings
from typing import Any

# public name -> the module that defines it (a module's own name: the module itself)
_DEFINED_IN = {
    "CONFIG_FILE": "landmark_transformer", "legacy_config": "legacy_config", "names": "names",
    "LandmarkTransformer": "landmark_transformer", "read_settings": "landmark_transformer",
    "set_rope": "landmark_transformer",
    "backbone_inputs": "backbone_inputs", "LastTokenPooling": "poolers",
    "LatentAttentionPooling": "latent_attention", "STRATEGY_TRAITS": "layouts", "rows_and_local": "layouts",
    "guard_padded_rows": "sliding_window_guard", "has_sliding_window": "sliding_window_guard",
    "no_empty_rows": "sliding_window_guard",
    "POOLER_CLASSES": "poolers", "CLSPooling": "poolers", "LMKPooling": "poolers", "MeanPooling": "poolers",
    "Pooler": "poolers", "build_pooler": "poolers", "masked_mean": "poolers", "register_pooler": "poolers",
    "check_splitter": "sentences", "multilingual_backend": "sentences", "split_sentences": "sentences",
    "koehn_splitter": "koehn_splitter",
    "STRATEGIES": "tokenization", "LandmarkTokenizer": "tokenization",
    "LandmarkVectorMask": "landmark_mask", "MAXSIM_QUERIES": "names", "vector_mask": "landmark_mask",
    "capacity": "capacity", "max_landmarks": "capacity", "expected_landmarks": "capacity",
}
__all__ = sorted(_DEFINED_IN)
_OLD_NAMES = {"POOLERS": "POOLER_CLASSES", "VECTORS": "MAXSIM_QUERIES"}  # old names kept working, each with a DeprecationWarning


def load_all() -> None:
    """Import every module of the package: each pooler file registers its classes on import."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        warnings.warn(f"lmk.model.landmark.{name} is deprecated: use {_OLD_NAMES[name]}", DeprecationWarning,
                      stacklevel=2)
        name = _OLD_NAMES[name]
    if name not in _DEFINED_IN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == _DEFINED_IN[name]:  # a module used as a namespace loads alone: `names` stays torch-free
        return importlib.import_module(f"{__name__}.{name}")
    load_all()
    module = importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}")
    return getattr(module, name)
