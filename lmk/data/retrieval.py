"""`RetrievalCorpus`: one retrieval split as `datasets` objects (corpus / queries / qrels).

The eval package turns these into mteb tasks; the generators in `longembed`, `longdocs` and
`offline_pairs` build them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets


@dataclass
class RetrievalCorpus:
    name: str
    split: str
    corpus: datasets.Dataset  # "id", "text" (+ metadata columns)
    queries: datasets.Dataset  # "id", "text" (+ "depth", "length" for synthetic tasks)
    qrels: dict[str, dict[str, int]]

    @classmethod
    def from_records(
        cls,
        name: str,
        split: str,
        corpus: Sequence[Mapping[str, Any]],
        queries: Sequence[Mapping[str, Any]],
        qrels: Mapping[str, Mapping[str, int]],
    ) -> RetrievalCorpus:
        """Build from lists of dicts (each with "id" and "text") and check the result."""
        out = cls(
            name=name,
            split=split,
            corpus=datasets.Dataset.from_list([dict(r) for r in corpus]),
            queries=datasets.Dataset.from_list([dict(r) for r in queries]),
            qrels={str(q): {str(d): int(s) for d, s in docs.items()} for q, docs in qrels.items()},
        )
        out.validate()
        return out

    def validate(self) -> None:
        """Ids unique, texts are strings, every query judged, every judged doc in the corpus."""
        for what, ds in (("corpus", self.corpus), ("queries", self.queries)):
            missing = {"id", "text"} - set(ds.column_names)
            if missing:
                raise ValueError(f"{self.name}/{self.split}: {what} lacks column(s) {sorted(missing)}")
            ids = ds["id"]
            if len(set(ids)) != len(ids):
                raise ValueError(f"{self.name}/{self.split}: duplicate ids in {what}")
        doc_ids = set(self.corpus["id"])
        query_ids = set(self.queries["id"])
        if set(self.qrels) != query_ids:
            raise ValueError(f"{self.name}/{self.split}: qrels and queries name different query ids")
        for qid, docs in self.qrels.items():
            unknown = set(docs) - doc_ids
            if unknown:
                raise ValueError(f"{self.name}/{self.split}: query {qid} judges unknown docs {sorted(unknown)[:3]}")

    def relevant(self, query_id: str) -> list[str]:
        """Ids of the documents judged relevant (score > 0) for a query."""
        return [d for d, s in self.qrels[query_id].items() if s > 0]

    def __repr__(self) -> str:
        return (
            f"RetrievalCorpus(name={self.name!r}, split={self.split!r}, corpus={self.corpus.num_rows} docs, "
            f"queries={self.queries.num_rows})"
        )
