"""`python -m lmk.export`: a trained run -> a shareable model folder (and the hub); the stable import path of lmk's
sentence-transformers modules.

Folders written before the code travelled name `lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling` in
their modules.json: both names resolve here (the input module itself, and the loader of the old pooling folder).
"""

from lmk.model.export import LandmarkPooling, export_sentence_transformers, load_exported
from lmk.model.landmark import LandmarkTransformer

__all__ = ["LandmarkPooling", "LandmarkTransformer", "export_sentence_transformers", "load_exported"]
