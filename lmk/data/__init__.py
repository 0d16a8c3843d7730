"""Data: training pairs (BGE format) and retrieval corpora (long-context, offline and hub).

Submodules are imported lazily by their users (`lmk.data.datamodule`, `lmk.data.longembed`, ...) so that
importing `lmk.data` stays cheap.
"""

from lmk.config.data import DataConfig, SourceConfig
from lmk.data.retrieval import RetrievalCorpus

__all__ = ["DataConfig", "SourceConfig", "RetrievalCorpus"]
