"""Data: training pairs (BGE format) and retrieval corpora (long-context, offline and hub).

    pairs.py          one reader for every training source (files, folders, hub ids, named sources), validated
    sampling.py       groups, the seeded epoch order over weighted sources, streams
    datamodule.py     PairDataModule (LightningDataModule); collator.py: PairCollator (no `datasets` needed)
    offline_pairs.py  the offline default set (docstrings of the installed packages), cached in the hub layout
    replica.py        a local replica of cfli/bge-full-data in its real layout
    hub.py            hub loaders (LongEmbed, MLDR) and the BGE repo layout
    longembed.py      passkey + needle generators; longdocs.py / prose.py: the offline long-document tasks (code / prose)
    ruler.py          RULER-style needle-in-a-haystack retrieval (single, multi-key, multi-value, multi-query)
    retrieval.py      RetrievalCorpus; stats.py: `python -m lmk.data.stats`
    landmarks.py      landmark statistics of texts, counted by the model's own landmark tokenizer (any object)
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.config.data": ("DataConfig", "SourceConfig"),
    "lmk.data.collator": ("PairCollator",),
    "lmk.data.datamodule": ("PairDataModule",),
    "lmk.data.hub": ("BGE_COLUMNS",),
    "lmk.data.longdocs": ("build_longdoc_corpus",),
    "lmk.data.longembed": ("generate_needle", "generate_passkey", "split_name"),
    "lmk.data.offline_pairs": ("offline_short_corpus",),
    "lmk.data.prose": ("build_prose_corpus",),
    "lmk.data.pairs": ("PairDataError", "count_skipped", "load_pairs", "precheck_rows", "read_source",
                       "resolve_source", "source_fingerprint"),
    "lmk.data.retrieval": ("RetrievalCorpus",),
    "lmk.data.sampling": ("EpochSampler", "PairDataset", "sample_group"),
}, modules=("hub", "landmarks", "longdocs", "longembed", "offline_pairs", "pairs", "prose", "replica", "ruler", "stats"))
