"""mteb custom retrieval tasks over in-memory `RetrievalCorpus` data (the offline suite).

Each task is an `AbsTaskRetrieval` subclass with full `TaskMetadata`, so retrieval, metrics and
result files follow exactly mteb's own code path, as for hub tasks. The passkey and needle tasks
subclass mteb's `LEMBPasskeyRetrieval` / `LEMBNeedleRetrieval` and keep their metadata (main score
ndcg_at_1 = Acc@1 with one relevant document, splits `test_<L>`); only the data is local.

Each split carries a hash of its data (`split_fingerprints`); the runner drops a cached split whose
data has changed (other sizes or seed), so regenerated data is never scored from a stale cache
entry, while adding a split (another length) reuses the splits already computed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.tasks.retrieval.eng.lemb_needle_retrieval import LEMBNeedleRetrieval
from mteb.tasks.retrieval.eng.lemb_passkey_retrieval import LEMBPasskeyRetrieval

from lmk.config.eval import LOCAL_TASK_NAMES, EvalConfig
from lmk.data import longdocs, longembed, offline_pairs, prose, ruler
from lmk.data.retrieval import RetrievalCorpus

logger = logging.getLogger(__name__)

_LOCAL_PATH = "lmk/local"  # dataset "path" of local tasks: never loaded from the hub
LOCAL_REVISION = "lmk-local-1"


def corpus_fingerprint(rc: RetrievalCorpus) -> str:
    """A content hash of one split (ids, texts, qrels): detects regenerated data in the cache."""
    h = hashlib.sha256()
    for part in (rc.corpus, rc.queries):
        for ident, text in zip(part["id"], part["text"], strict=True):
            h.update(f"{ident}\t{text}\n".encode())
        h.update(b"--\n")
    for qid in sorted(rc.qrels):
        h.update(f"{qid}:{sorted(rc.qrels[qid].items())}\n".encode())
    return h.hexdigest()[:16]


def _text_columns(ds: Dataset) -> Dataset:
    keep = [c for c in ("id", "title", "text") if c in ds.column_names]
    if "id" not in keep or "text" not in keep:
        raise ValueError(f"a retrieval dataset needs 'id' and 'text' columns, got {ds.column_names}")
    ds = ds.select_columns(keep)
    # mteb joins ids as strings (qrels keys); cast so integer ids never silently miss.
    if ds.features["id"].dtype != "string":
        ds = ds.map(lambda r: {"id": str(r["id"])})
    return ds


class _InMemoryRetrieval(AbsTaskRetrieval):
    """Shared logic: data comes from `split -> RetrievalCorpus`; metadata gets this data's revision."""

    metadata: ClassVar[TaskMetadata]

    def __init__(self, corpora: Mapping[str, RetrievalCorpus], **kwargs: Any) -> None:
        if not corpora:
            raise ValueError(f"{type(self).__name__}: no splits given (corpora is empty)")
        for split, rc in corpora.items():
            n_missing = sum(1 for qid in rc.queries["id"] if not rc.qrels.get(str(qid)))
            if n_missing:
                raise ValueError(f"{type(self).__name__} split {split!r}: {n_missing} queries have no relevant document")
        self._corpora = dict(corpora)
        self.split_fingerprints = {split: corpus_fingerprint(rc) for split, rc in corpora.items()}
        base = type(self).metadata
        # Instance metadata: same task, this data's splits (mteb reads self.metadata). The revision is
        # constant: mteb refuses to merge cached splits across revisions, and staleness is checked
        # per split by the runner instead.
        self.metadata = base.model_copy(
            update={
                "dataset": {"path": f"{_LOCAL_PATH}/{base.name}", "revision": LOCAL_REVISION},
                "eval_splits": list(corpora),
            }
        )
        super().__init__(**kwargs)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        if self.data_loaded:
            return
        splits = {}
        for split, rc in self._corpora.items():
            splits[split] = RetrievalSplitData(
                queries=_text_columns(rc.queries),
                corpus=_text_columns(rc.corpus),
                relevant_docs={str(q): {str(d): int(s) for d, s in docs.items()} for q, docs in rc.qrels.items()},
                top_ranked=None,
            )
        self.dataset = {"default": splits}
        self.data_loaded = True

    def unload_data(self) -> None:
        # mteb's unload drops instance metadata (restoring the published one); ours describes this
        # data (splits, revision) and must survive so the task can be reloaded and re-evaluated.
        metadata = self.metadata
        super().unload_data()
        self.metadata = metadata

    @property
    def corpora(self) -> dict[str, RetrievalCorpus]:
        return dict(self._corpora)

    def data_info(self) -> dict[str, Any]:
        """What the results should say about this task's generated data (the eval section's "data"); {}: nothing."""
        return {}

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        """The task's data, regenerated at the sizes of suite `cfg`: {split: RetrievalCorpus}."""
        raise NotImplementedError


# ---- the registry: every local task class, by its mteb task name ------------------------------------
LOCAL_TASK_CLASSES: dict[str, type[_InMemoryRetrieval]] = {}


def local_task(cls: type[_InMemoryRetrieval]) -> type[_InMemoryRetrieval]:
    """Class decorator: register a local task under its `metadata.name` (a duplicate name is an error)."""
    name = cls.metadata.name
    if name not in LOCAL_TASK_NAMES:
        raise ValueError(f"local task {name!r} ({cls.__qualname__}) is not declared: add its name to "
                         "lmk.config.eval.LOCAL_TASK_NAMES (config checks read task names from there, before mteb loads)")
    if name in LOCAL_TASK_CLASSES:
        raise ValueError(f"local task {name!r} is registered twice ({LOCAL_TASK_CLASSES[name].__qualname__} and "
                         f"{cls.__qualname__}); give each task its own metadata name")
    LOCAL_TASK_CLASSES[name] = cls
    return cls


@local_task
class LocalPasskey(_InMemoryRetrieval, LEMBPasskeyRetrieval):
    """Regenerated LongEmbed passkey task (Acc@1 = nDCG@1 per `test_<L>` split)."""

    metadata = LEMBPasskeyRetrieval.metadata.model_copy(
        update={
            "name": "LocalPasskey",
            "description": "LongEmbed passkey retrieval regenerated offline by lmk.data.longembed "
            "(same protocol: one relevant document per query, Acc@1 per length split).",
            "sample_creation": "created",
        }
    )

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        by_length = longembed.generate_passkey(lengths=tuple(cfg.lengths), n_docs=cfg.n_docs, n_queries=cfg.n_queries,
                                               seed=cfg.seed)
        return {f"test_{length}": by_length[length] for length in cfg.lengths}


@local_task
class LocalNeedle(_InMemoryRetrieval, LEMBNeedleRetrieval):
    """Regenerated LongEmbed needle task (Acc@1 = nDCG@1 per `test_<L>` split)."""

    metadata = LEMBNeedleRetrieval.metadata.model_copy(
        update={
            "name": "LocalNeedle",
            "description": "LongEmbed needle retrieval regenerated offline by lmk.data.longembed "
            "(same protocol: one relevant document per query, Acc@1 per length split).",
            "sample_creation": "created",
        }
    )

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        by_length = longembed.generate_needle(lengths=tuple(cfg.lengths), n_docs=cfg.n_docs, n_queries=cfg.n_queries,
                                              seed=cfg.seed)
        return {f"test_{length}": by_length[length] for length in cfg.lengths}


def _local_metadata(name: str, description: str, domains: list[str]) -> TaskMetadata:
    return TaskMetadata(
        name=name,
        description=description,
        dataset={"path": f"{_LOCAL_PATH}/{name}", "revision": "local"},
        reference=None,
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score="ndcg_at_10",
        date=None,
        domains=domains,
        task_subtypes=None,
        license=None,
        annotations_creators="derived",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )


@local_task
class LocalLongDoc(_InMemoryRetrieval):
    """Offline long-document task (an MLDR stand-in): summary -> whole module source, nDCG@10."""

    metadata = _local_metadata(
        "LocalLongDoc",
        "Offline long-document retrieval built by lmk.data.longdocs: a module's summary retrieves the "
        "module's whole source file.",
        ["Programming", "Written"],
    )

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        return {"test": longdocs.build_longdoc_corpus(n_docs=cfg.longdoc_n_docs, seed=cfg.seed)}


@local_task
class LocalProse(_InMemoryRetrieval):
    """Offline long-document task of natural prose: a sentence -> its part of Python's reference topics, nDCG@10."""

    metadata = _local_metadata(
        "LocalProse",
        "Offline long-document retrieval over prose built by lmk.data.prose: a sentence of Python's reference "
        "documentation (pydoc_data.topics, shipped with the interpreter) retrieves the topic part it is in.",
        ["Programming", "Written"],
    )

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        return {"test": prose.build_prose_corpus(n_docs=cfg.longdoc_n_docs, seed=cfg.seed)}


@local_task
class LocalShort(_InMemoryRetrieval):
    """Offline short retrieval task: held-out docstring summary -> docstring body, nDCG@10."""

    metadata = _local_metadata(
        "LocalShort",
        "Offline short retrieval built by lmk.data.offline_pairs: a held-out docstring summary line "
        "retrieves its docstring body.",
        ["Programming", "Written"],
    )

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        return {"test": offline_pairs.offline_short_corpus(n_queries=cfg.short_n_queries, seed=cfg.seed,
                                                           n_docs=cfg.short_n_docs)}


class _RulerNiah(_InMemoryRetrieval):
    """RULER-style needle-in-a-haystack retrieval (lmk.data.ruler), one variant per class: Acc@1 (= nDCG@1, one
    relevant document) per `test_<L>` split. The results name the haystack and every query's needle depth."""

    variant: ClassVar[str]

    @classmethod
    def splits(cls, cfg: EvalConfig) -> dict[str, RetrievalCorpus]:
        by_length = ruler.generate_ruler(cls.variant, lengths=cfg.ruler_lengths, n_docs=cfg.ruler_n_docs,
                                         n_queries=cfg.ruler_n_queries, seed=cfg.seed, haystack=cfg.ruler_haystack,
                                         depths=cfg.ruler_depths)
        return {rc.split: rc for rc in by_length.values()}

    def data_info(self) -> dict[str, Any]:
        first = next(iter(self._corpora.values()))
        hay = ruler.load_haystack(first.corpus[0]["haystack"])
        return {"haystack": hay.name, "haystack_source": hay.source, "variant": self.variant,
                "needles_per_document": ruler.NEEDLES[self.variant],
                "query_depths": ruler.query_depths({int(s.rsplit("_", 1)[1]): rc for s, rc in self._corpora.items()})}


def _ruler_metadata(name: str, what: str) -> TaskMetadata:
    meta = _local_metadata(
        name,
        f"RULER-style needle-in-a-haystack retrieval generated by lmk.data.ruler ({what}); documents are windows of "
        "an essay haystack (Paul Graham's where the hub mirror holds them, else lmk's own essays); Acc@1 per length.",
        ["Non-fiction", "Written"],
    )
    return meta.model_copy(update={"main_score": "ndcg_at_1", "sample_creation": "created",
                                   "eval_splits": ["test_512"]})


@local_task
class RulerNiahSingle(_RulerNiah):
    variant = "single"
    metadata = _ruler_metadata("RulerNiahSingle", "one needle per document, the query asks for its key")


@local_task
class RulerNiahMultiKey(_RulerNiah):
    variant = "multikey"
    metadata = _ruler_metadata("RulerNiahMultiKey", "four needles with four keys per document, the query asks one")


@local_task
class RulerNiahMultiValue(_RulerNiah):
    variant = "multivalue"
    metadata = _ruler_metadata("RulerNiahMultiValue", "four values of one key per document, the query asks all")


@local_task
class RulerNiahMultiQuery(_RulerNiah):
    variant = "multiquery"
    metadata = _ruler_metadata("RulerNiahMultiQuery", "four keys per document, the query asks all four at once")


LOCAL_TASKS: tuple[str, ...] = tuple(LOCAL_TASK_CLASSES)


def build_local_task(name: str, cfg: EvalConfig) -> _InMemoryRetrieval:
    """Regenerate the data of local task `name` at the sizes in `cfg` and wrap it as an mteb task."""
    if name not in LOCAL_TASK_CLASSES:
        raise ValueError(f"unknown local task {name!r}; local tasks are {list(LOCAL_TASK_CLASSES)}")
    cls = LOCAL_TASK_CLASSES[name]
    task = cls(cls.splits(cfg))
    logger.info("built local task %s: splits %s", name, task.split_fingerprints)
    return task
