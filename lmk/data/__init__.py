"""Data: training pairs (BGE format) and retrieval corpora (long-context, offline and hub).

    pairs.py          one reader for every training source (files, folders, hub ids, named sources), validated
    sampling.py       groups, the seeded epoch order over weighted sources, streams
    datamodule.py     PairDataModule (LightningDataModule); collator.py: PairCollator (no `datasets` needed)
    offline_pairs.py  the offline default set (docstrings of the installed packages), cached in the hub layout
    replica.py        a local replica of cfli/bge-full-data in its real layout
    hub.py            hub loaders (LongEmbed, MLDR) and the BGE repo layout
    longembed.py      passkey + needle generators; longdocs.py: the offline long-document task
    retrieval.py      RetrievalCorpus; stats.py: `python -m lmk.data.stats`
"""

from lmk.config.data import DataConfig, SourceConfig

__all__ = ["DataConfig", "SourceConfig", "RetrievalCorpus"]


def __getattr__(name: str) -> object:
    if name == "RetrievalCorpus":
        # lazy: the training collator (lmk.data.collator) is imported without `datasets`, which retrieval.py loads
        from lmk.data.retrieval import RetrievalCorpus

        return RetrievalCorpus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
