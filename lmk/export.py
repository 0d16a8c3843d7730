"""The stable import path of lmk's sentence-transformers modules: every export's modules.json names
`lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling` (the code is `lmk.model.export`)."""

from lmk.model.export import LandmarkPooling, LandmarkTransformer, export_sentence_transformers, load_exported

__all__ = ["LandmarkPooling", "LandmarkTransformer", "export_sentence_transformers", "load_exported"]
