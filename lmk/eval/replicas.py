"""Small offline replicas of the paper's eval datasets, in the hub repos' own layout and columns.

`python -m lmk.eval.replicas --mirror DIR` writes, under `DIR/datasets/<owner>/<name>/`, a folder that the
REAL mteb task classes (`mteb.get_tasks([...])`) load unchanged under `HF_HUB_OFFLINE=1` once the mirror is
active (`hub.mirror=DIR` or `LMK_HUB_MIRROR=DIR`, see `lmk.hub.mirror`): a README.md whose `configs:` block
names each config's parquet files, as on the hub. The content is the project's offline text, so the scores
mean nothing about the paper; what they exercise is the exact path a cluster user takes offline.

Layouts (how mteb 2.26 reads each repo):
- `beir` (`RetrievalDatasetLoader`: SciFact `mteb/scifact`, MSMARCO `mteb/msmarco`, ArguAna `mteb/arguana`,
  CQADupstackUnixRetrieval `mteb/cqadupstack-unix`, the COIR task AppsRetrieval `CoIR-Retrieval/apps`,
  LEMBPasskeyRetrieval `mteb/LEMBPasskeyRetrieval`): configs `corpus` (`_id`, `title`, `text`), `queries` (`_id`, `text`) and
  `default` (qrels: `query-id`, `corpus-id`, `score`), split per eval split (one shared `corpus` / `queries`
  split when the task has a single eval split);
- `beir-lang` (MultiLongDocRetrieval `mteb/MultiLongDocRetrieval`, subset `en`): the same with configs
  `en-corpus`, `en-queries`, `en-qrels`;
- `longembed` (`dwzhu/LongEmbed`, read by the LEMB task classes with `datasets.load_dataset(path,
  name=<task>)["queries"|"corpus"|"qrels"]`): one config per task with splits `corpus` (`doc_id`, `text`),
  `queries` (`qid`, `text`) and `qrels` (`qid`, `doc_id`), plus `context_length` for needle; `datasets`
  needs one schema per config, so each split carries all three columns (the unused one empty).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import mteb
import numpy as np
import yaml
from datasets import Dataset

from lmk.data.longdocs import build_longdoc_corpus
from lmk.data.longembed import generate_needle, generate_passkey, split_name
from lmk.data.offline_pairs import offline_short_corpus
from lmk.data.retrieval import RetrievalCorpus
from lmk.eval.tasks import corpus_fingerprint
from lmk.hub import mirror

if TYPE_CHECKING:
    from lmk.data.retrieval import RetrievalCorpus

log = logging.getLogger(__name__)

LAYOUTS = ("beir", "beir-lang", "longembed")
DEFAULT_LENGTHS = (256, 512)


@dataclass(frozen=True)
class Sizes:
    n_queries: int = 8
    n_docs: int = 24
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    seed: int = 0


@dataclass(frozen=True)
class Replica:
    task: str                 # the mteb task name
    layout: str               # one of LAYOUTS
    splits: Callable[[Sizes], dict[str, RetrievalCorpus]]
    config: str | None = None  # beir-lang: the language subset; longembed: the task's config name


def _short(seed: int) -> Callable[[Sizes], dict[str, RetrievalCorpus]]:
    def build(s: Sizes) -> dict[str, RetrievalCorpus]:
        return {"_": offline_short_corpus(n_queries=s.n_queries, seed=s.seed + seed, n_docs=s.n_docs)}
    return build


def _long(seed: int) -> Callable[[Sizes], dict[str, RetrievalCorpus]]:
    def build(s: Sizes) -> dict[str, RetrievalCorpus]:
        return {"_": build_longdoc_corpus(n_docs=s.n_docs, n_queries=s.n_queries, seed=s.seed + seed)}
    return build


def _code(seed: int) -> Callable[[Sizes], dict[str, RetrievalCorpus]]:
    """Text-to-code retrieval (the COIR shape): query = a standard-library function's docstring summary,
    document = that function's source without its docstring."""
    def build(s: Sizes) -> dict[str, RetrievalCorpus]:
        pool = _code_pool(max(4 * s.n_docs, 64))
        if len(pool) < s.n_docs:
            raise ValueError(f"code replica: only {len(pool)} documented stdlib functions found, {s.n_docs} asked")
        rng = np.random.default_rng(s.seed + seed)
        pick = sorted(int(i) for i in rng.choice(len(pool), size=s.n_docs, replace=False))
        corpus = [{"id": f"code{i}", "text": pool[i][1]} for i in pick]
        queries = [{"id": f"q{i}", "text": pool[i][0]} for i in pick[:s.n_queries]]
        qrels = {f"q{i}": {f"code{i}": 1} for i in pick[:s.n_queries]}
        return {"_": RetrievalCorpus.from_records("CodeReplica", "test", corpus, queries, qrels)}
    return build


def _code_pool(size: int) -> list[tuple[str, str]]:
    """(docstring summary, function source without its docstring) for the first `size` documented
    functions of the standard library's `json`, `email`, `http` ... packages, in a fixed order."""
    out: list[tuple[str, str]] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("json", "email", "http", "logging", "urllib", "xml", "concurrent", "importlib"):
        for path in sorted((stdlib / package).rglob("*.py")):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
                summary = " ".join(doc.split("\n\n", 1)[0].split()) if doc else ""
                if len(summary.split()) < 4 or len(node.body) < 2:
                    continue
                node.body = node.body[1:]  # the docstring is the query, not part of the document
                out.append((summary, ast.unparse(node)[:2000]))
                if len(out) >= size:
                    return out
    return out


def _passkey(s: Sizes) -> dict[str, RetrievalCorpus]:
    data = generate_passkey(lengths=s.lengths, n_docs=s.n_docs, n_queries=s.n_queries, seed=s.seed)
    return {split_name(length): rc for length, rc in data.items()}


def _needle(s: Sizes) -> dict[str, RetrievalCorpus]:
    data = generate_needle(lengths=s.lengths, n_docs=s.n_docs, n_queries=s.n_queries, seed=s.seed)
    return {split_name(length): rc for length, rc in data.items()}


# Single-split builders return {"_": corpus}: the split name is the task's own eval split.
REPLICAS: dict[str, Replica] = {r.task: r for r in (
    Replica("SciFact", "beir", _short(1)),
    Replica("MSMARCO", "beir", _short(2)),
    Replica("ArguAna", "beir", _short(8)),
    Replica("CQADupstackUnixRetrieval", "beir", _short(9)),
    Replica("AppsRetrieval", "beir", _code(10)),
    Replica("MultiLongDocRetrieval", "beir-lang", _long(3), config="en"),
    Replica("LEMBPasskeyRetrieval", "beir", _passkey),
    Replica("LEMBNeedleRetrieval", "longembed", _needle, config="needle"),
    Replica("LEMBNarrativeQARetrieval", "longembed", _long(4), config="narrativeqa"),
    Replica("LEMBQMSumRetrieval", "longembed", _long(5), config="qmsum"),
    Replica("LEMBSummScreenFDRetrieval", "longembed", _long(6), config="summ_screen_fd"),
    Replica("LEMBWikimQARetrieval", "longembed", _long(7), config="2wikimqa"),
)}


def task_dataset(task_name: str) -> dict[str, Any]:
    """The task's `metadata.dataset` as mteb publishes it (path, revision, maybe name)."""
    return dict(type(mteb.get_task(task_name)).metadata.dataset)


def _eval_split(task_name: str, split: str) -> str:
    if split != "_":
        return split
    splits = type(mteb.get_task(task_name)).metadata.eval_splits
    # MultiLongDocRetrieval lists dev and test; the paper (and our config) evaluates test.
    return "test" if "test" in splits else splits[0]


def _write(folder: Path, config: str, split: str, rows: list[dict[str, Any]], configs: dict[str, dict[str, str]],
           tag: str) -> None:
    # The content tag in the file name: `datasets` caches a local folder's data under a hash of the README's
    # config block (file patterns, not contents), so a rewritten replica with the same names would be read
    # back from the stale cache.
    rel = f"{config}/{split}-{tag}-00000-of-00001.parquet"
    (folder / config).mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows).to_parquet(str(folder / rel))
    configs.setdefault(config, {})[split] = rel


def _readme(folder: Path, configs: dict[str, dict[str, str]], what: str) -> None:
    block = {"configs": [{"config_name": name, "data_files": [{"split": s, "path": p} for s, p in splits.items()]}
                         for name, splits in sorted(configs.items())]}
    folder.joinpath("README.md").write_text(
        "---\n" + yaml.safe_dump(block, sort_keys=False) + "---\n\n"
        f"Offline replica written by `python -m lmk.eval.replicas` ({what}). Same layout and columns as the hub\n"
        "repo; the text is the project's offline text, so scores say nothing about the real benchmark.\n")


def _beir(folder: Path, prefix: str, splits: dict[str, RetrievalCorpus], configs: dict[str, dict[str, str]],
          tag: str, shared: bool) -> None:
    # shared: a single-split task keeps one `corpus` / `queries` split, as on the hub; passkey has one per length
    for split, rc in splits.items():
        corpus = [{"_id": str(r["id"]), "title": "", "text": r["text"]} for r in rc.corpus]
        queries = [{"_id": str(r["id"]), "text": r["text"]} for r in rc.queries]
        qrels = [{"query-id": q, "corpus-id": d, "score": int(s)} for q, docs in rc.qrels.items() for d, s in docs.items()]
        _write(folder, f"{prefix}corpus", "corpus" if shared else split, corpus, configs, tag)
        _write(folder, f"{prefix}queries", "queries" if shared else split, queries, configs, tag)
        _write(folder, f"{prefix}qrels" if prefix else "default", split, qrels, configs, tag)


def _longembed(folder: Path, name: str, splits: dict[str, RetrievalCorpus], configs: dict[str, dict[str, str]],
               tag: str) -> None:
    corpus, queries, qrels = [], [], []
    for split, rc in splits.items():
        extra = {"context_length": int(split.rsplit("_", 1)[1])} if split.startswith("test_") else {}
        # `datasets` gives every split of a config one schema: each row carries qid, doc_id and text
        # (the empty one unused), as the LEMB loaders read only the columns they need per split.
        corpus += [{"qid": "", "doc_id": str(r["id"]), "text": r["text"], **extra} for r in rc.corpus]
        queries += [{"qid": str(r["id"]), "doc_id": "", "text": r["text"], **extra} for r in rc.queries]
        qrels += [{"qid": q, "doc_id": d, "text": "", **extra} for q, docs in rc.qrels.items() for d in docs]
    for split, rows in (("corpus", corpus), ("queries", queries), ("qrels", qrels)):
        _write(folder, name, split, rows, configs, tag)


def _content_hash(splits: dict[str, RetrievalCorpus]) -> str:
    return hashlib.sha256(json.dumps({s: corpus_fingerprint(rc) for s, rc in sorted(splits.items())}).encode()
                          ).hexdigest()[:12]


def replica_fingerprint(task: str, built: dict[str, RetrievalCorpus]) -> str:
    """The content hash of a replica's built splits (`REPLICAS[task].splits(sizes)`), under mteb's split names."""
    return _content_hash({_eval_split(task, s): rc for s, rc in built.items()})


def write_replicas(root: str | os.PathLike, tasks: Sequence[str] | None = None, sizes: Sizes | None = None) -> list[dict[str, Any]]:
    """Write the replicas of `tasks` (default: all) under mirror `root`; returns the manifest entries."""
    datasets.disable_progress_bars()
    sizes = sizes or Sizes()
    names = list(tasks) if tasks else list(REPLICAS)
    unknown = [t for t in names if t not in REPLICAS]
    if unknown:
        raise ValueError(f"no replica for {unknown}; replicas exist for {', '.join(REPLICAS)}")
    root = Path(root)
    by_repo: dict[str, list[Replica]] = {}
    for name in names:
        by_repo.setdefault(task_dataset(name)["path"], []).append(REPLICAS[name])
    entries = []
    for repo, replicas in by_repo.items():
        folder = mirror.repo_dir(root, "dataset", repo)
        if folder.exists():
            shutil.rmtree(folder)  # a rewrite with other sizes must not keep stale configs
        folder.mkdir(parents=True)
        mirror.mark_started(folder, repo, None)  # an interrupted write is not a replica
        configs: dict[str, dict[str, str]] = {}
        built = [(rep, rep.splits(sizes)) for rep in replicas]
        digests = [replica_fingerprint(rep.task, b) for rep, b in built]
        revision = "lmk-replica-" + hashlib.sha256("".join(digests).encode()).hexdigest()[:12]
        tag = revision.rsplit("-", 1)[1]
        for rep, b in built:
            splits = {_eval_split(rep.task, s): rc for s, rc in b.items()}
            if rep.layout == "longembed":
                _longembed(folder, str(rep.config), splits, configs, tag)
            else:
                _beir(folder, f"{rep.config}-" if rep.layout == "beir-lang" else "", splits, configs, tag,
                      shared="_" in b)
        _readme(folder, configs, ", ".join(r.task for r in replicas))
        mirror.mark_complete(folder, repo, revision, [task_dataset(r.task).get("name") for r in replicas],
                             source="replica")
        entries.append({"kind": "dataset", "repo_id": repo, "revision": revision, "source": "replica",
                        "path": str(folder.relative_to(root)), "what": [r.task for r in replicas],
                        # per task: the content fingerprint lmk.eval.fingerprints pins ("replica:<task>")
                        "content": {r.task: d for r, d in zip(replicas, digests, strict=True)}})
        log.info("replica %s (%s) -> %s", repo, ", ".join(r.task for r in replicas), folder)
    mirror.record(root, entries)
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write offline replicas of the paper's eval datasets into a hub mirror.")
    parser.add_argument("--mirror", required=True, help="mirror folder (then run jobs with hub.mirror=<it>)")
    parser.add_argument("--tasks", default=None, help=f"comma-separated mteb task names (default: {','.join(REPLICAS)})")
    parser.add_argument("--n-queries", type=int, default=Sizes.n_queries)
    parser.add_argument("--n-docs", type=int, default=Sizes.n_docs)
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="passkey/needle lengths")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = Sizes(args.n_queries, args.n_docs, tuple(int(x) for x in args.lengths.split(",")), args.seed)
    entries = write_replicas(args.mirror, args.tasks.split(",") if args.tasks else None, sizes)
    for e in entries:
        print(f"{e['repo_id']:<32} {e['revision']}  {', '.join(e['what'])}")
    print(f"manifest: {Path(args.mirror) / mirror.MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
