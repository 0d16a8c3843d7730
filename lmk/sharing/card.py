"""The model card (README.md) of a published LMK model, generated from its run: what LMK is, the pooling and chunk
size, the base model, the training data and its fingerprint, the training config, the Table 2 row with its
provenance, the mteb results, how to load the model with sentence-transformers and with mteb, and the paper.

The metadata block is the hub's (`huggingface_hub.ModelCardData`): `library_name: sentence-transformers`, tags
`sentence-transformers` and `mteb`, `base_model`, `datasets`, `license`, and a `model-index` of the mteb scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mteb
import yaml
from huggingface_hub import EvalResult, ModelCardData

from lmk.config import describe_objective
from lmk.config.registry import declared_scorings, strategies
from lmk.eval.tasks import LOCAL_TASK_CLASSES
from lmk.run.results import Results
from lmk.sharing.mteb_model import PAPER
from lmk.sharing.st_folder import needed_packages

if TYPE_CHECKING:
    from mteb.models.model_meta import ModelMeta
    from mteb.results import TaskResult

    from lmk.model.embedding import EmbeddingModel

@dataclass
class TableRow:
    """One row of a built table (its `<name>.json`): the cells (column label, value x100, ...) and where the table
    came from (its provenance lines)."""

    table: Path
    spec: str
    scale: str
    row: str
    label: str
    cells: list[dict[str, Any]]
    provenance: list[str] = field(default_factory=list)


TAGS = ["sentence-transformers", "mteb", "sentence-similarity", "feature-extraction", "lmk", "landmark-pooling"]


def metric_label(metric: str, task: str = "") -> str:
    """mteb's metric key as people write it: ndcg_at_10 -> nDCG@10; a LongEmbed passkey/needle task's nDCG@1 (one
    relevant document per query) -> Acc@1, the name its paper uses."""
    kind, _, k = metric.partition("_at_")
    if kind == "ndcg" and k == "1" and ("Passkey" in task or "Needle" in task):
        return "Acc@1"
    names = {"ndcg": "nDCG", "map": "MAP", "mrr": "MRR", "recall": "Recall", "precision": "P"}
    return f"{names[kind]}@{k}" if k and kind in names else metric


def is_local(task: str) -> bool:
    """One of lmk's own tasks (regenerated offline, not an mteb task, not on the hub)."""
    return task in LOCAL_TASK_CLASSES


def main_metric(task: str) -> str:
    """The task's main score's metric key (ndcg_at_10, ...)."""
    if is_local(task):
        return str(LOCAL_TASK_CLASSES[task].metadata.main_score)
    return str(mteb.get_task(task).metadata.main_score)


def eval_results(task_results: list[TaskResult]) -> list[EvalResult]:
    """One model-index entry per (mteb task, split, subset): its main score under the metric's name. lmk's local
    tasks have no hub dataset, so they are on the card's table only (`_scores`), not in the model-index."""
    entries = []
    for result in task_results:
        if is_local(result.task_name):
            continue
        task = mteb.get_task(result.task_name)
        metric = str(task.metadata.main_score)
        for split, scores in sorted(result.scores.items()):
            for subset in scores:
                entries.append(EvalResult(
                    task_type="text-retrieval", task_name="Retrieval", dataset_type=str(task.metadata.dataset["path"]),
                    dataset_name=f"MTEB {result.task_name} ({subset.get('hf_subset', 'default')})",
                    dataset_split=split, dataset_revision=result.dataset_revision, dataset_config=subset.get(
                        "hf_subset", "default"), metric_type=metric, metric_name=metric_label(metric, result.task_name),
                    metric_value=round(float(subset["main_score"]), 5), source_name="MTEB (lmk)",
                    source_url="https://github.com/embeddings-benchmark/mteb/"))
    return entries


def _metadata(meta: ModelMeta, results: Results, task_results: list[TaskResult]) -> str:
    hub_sets = [s["path"] for s in results.section("data").get("sources") or []
                if str(s.get("path", "")).count("/") == 1 and ":" not in str(s.get("path"))]
    data = ModelCardData(library_name="sentence-transformers", tags=TAGS, license=meta.license,
                         base_model=meta.adapted_from, datasets=sorted(set(hub_sets)) or None,
                         pipeline_tag="sentence-similarity", model_name=meta.name,
                         eval_results=eval_results(task_results) or None)
    return data.to_yaml().rstrip("\n") + "\n"


def _pooling(model: EmbeddingModel) -> str:
    tok, pool = model.landmark_tokenizer, model.pooling_cfg
    lines = [f"- pooling `{pool.label if pool else '?'}`: strategy `{tok.strategy}`, pooler "
             f"(pooling mode) `{pool.pooler if pool else type(model.pooler).__name__}`"]
    if tok.strategy == "none":
        return "\n".join(lines)
    if strategies()[tok.strategy]["chunked"]:
        lines.append(f"- chunk size (`landmark_interval`) {tok.chunk_size}" + (
            f"; in training drawn per text from {list(tok.train_chunk_sizes)} (`train_landmark_interval`)"
            if tok.strategy == "variable" else ""))
    if tok.strategy == "sentence":
        lines.append(f"- a landmark after each sentence of the `{tok.sentence_splitter}` splitter ({tok.language})")
    lines.append(f"- landmark token (`lmk_token_id`) {tok.landmark_id}, the tokenizer's separator")
    return "\n".join(lines)


def _shown_before(cell: dict) -> str:
    """A cell of a table written before tables kept the printed text (its value is already rounded to 2 places)."""
    return ("—" if cell["value"] is None else f"{cell['value']:.1f}") + ("†" if cell.get("significant") else "")


def card_row(row: TableRow | None) -> str:
    if row is None:
        return "No Table 2 was built over this run's sweep, so the card shows no row."
    labels = [c["column_label"] for c in row.cells]
    values = [c["shown"] if "shown" in c else _shown_before(c) for c in row.cells]
    first = row.cells[0]
    out = [f"Row **{row.label}** of `{row.spec}` at scale `{row.scale}` (`{row.table.name}`), scores x100; † marks a "
           "cell that differs from the table's baseline row (paired t-test over queries, p < 0.05):", "",
           "| " + " | ".join(labels) + " |", "|" + "---:|" * len(labels), "| " + " | ".join(values) + " |", "",
           f"Run `{first.get('run_dir')}`, git commit `{first.get('git_commit')}`, config hash "
           f"`{first.get('config_hash')}`."]
    if row.provenance:
        out += ["", *row.provenance]
    return "\n".join(out)


def _scores(task_results: list[TaskResult], meta: ModelMeta) -> str:
    if not task_results:
        return ("This model has not been evaluated: the card carries no scores. To add them, evaluate the training "
                "run (its scores are recorded in the run) and export it again:\n\n```bash\n"
                "python -m lmk.evaluate model=<run dir> record=true eval=<suite>\n"
                "python -m lmk.export <run dir> --out <folder>\n```")
    lines = ["| task | split | metric | score |", "|---|---|---|---:|"]
    for result in task_results:
        local = is_local(result.task_name)
        name = f"{result.task_name} (lmk's local task)" if local else f"{result.task_name} (MTEB)"
        metric = metric_label(main_metric(result.task_name), result.task_name)
        for split, scores in sorted(result.scores.items()):
            for subset in scores:
                lines.append(f"| {name} | {split} | {metric} | {float(subset['main_score']):.5f} |")
    folder = f"results/{meta.model_name_as_path()}/{meta.revision}/"
    note = ""
    if any(is_local(r.task_name) for r in task_results):
        note = ("\n\nlmk's local tasks are regenerated offline by lmk (`lmk.eval.tasks`); they are not MTEB tasks "
                "and have no dataset on the hub, so only the MTEB tasks are in the card's model-index.")
    return "\n".join(lines) + note + (f"\n\nmteb's `TaskResult` files are in `{folder}` with `model_meta.json` "
                                      "beside them (written by mteb's `ResultCache`: the MTEB results repository's "
                                      "layout).")


def _usage(source: str, meta: ModelMeta, model: EmbeddingModel, length: int) -> str:
    q, p = meta.loader_kwargs.get("query_max_length"), meta.loader_kwargs.get("passage_max_length")
    scored = (f"the length the scores above were computed at; mteb's loader below cuts queries at {q} tokens and "
              f"documents at {p}, as they were scored") if p else "the model's training passage length"
    return f"""With sentence-transformers alone: the folder carries the code of its modules, hence
`trust_remote_code=True` (read the folder's `.py` files first). Texts are cut to {length} tokens after landmark
insertion (`model.max_seq_length`, stored in `landmark_config.json`), {scored}. `lmk.export.load_exported` reads
the same length, so lmk and sentence-transformers give the same embeddings.
{needed_packages(model.landmark_tokenizer)}

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{source}", trust_remote_code=True)
embeddings = model.encode(["What is landmark pooling?", "Landmarks summarise the chunk before them."])
print(model.similarity(embeddings, embeddings))   # cosine: the embeddings are L2-normalised
```

With mteb, as `lmk.evaluate` scored it (queries at {q} tokens, documents at {p}; needs `lmk`):

```python
import mteb
from lmk.sharing import model_meta

model = model_meta("{source}").load_model()   # mteb's ModelMeta with the loader lmk.evaluate uses
results = mteb.evaluate(model, mteb.get_tasks(tasks=["SciFact"]))
```"""


def _scoring(results: Results, multi_vector: bool) -> str:
    """Which scoring the card's scores used (results.json's eval record), and what the folder's vectors are."""
    scored = results.eval.scoring if results.eval.tasks else None
    declared = declared_scorings().get(scored) if scored else None
    how = f"`eval.scoring={scored}`: {declared['describe']}" if declared else repr(scored)
    query = results.eval.extra.get("maxsim_query")
    lines = [f"Scores computed with {how}" + (f" (`eval.maxsim_query={query}`)." if query else ".")] if scored else []
    if multi_vector:
        lines.append("This folder is a multi-vector model (sentence-transformers `MultiVectorEncoder`): it gives "
                     "each text's landmark states, scored by MaxSim.")
        if declared is not None and not declared["multi_vector"]:
            lines.append("Its MaxSim scores: `python -m lmk.evaluate model=<run> eval.scoring=maxsim record=true`, "
                         "then export again.")
    return " ".join(lines)


def _mv_usage(source: str, model: EmbeddingModel, length: int) -> str:
    return f"""With sentence-transformers alone (>= 6): the folder carries the code of its modules, hence
`trust_remote_code=True` (read the folder's `.py` files first). Texts are cut to {length} tokens after landmark
insertion. A text is its landmark states, each L2-normalised; `lmk.export.load_exported` reads the folder as the
LMK model of the same states (`python -m lmk.evaluate model=<folder> eval.scoring=maxsim`).
{needed_packages(model.landmark_tokenizer)}

```python
from sentence_transformers import MultiVectorEncoder

model = MultiVectorEncoder("{source}", trust_remote_code=True)
docs = model.encode_document(["Landmarks summarise the chunk before them.", "Bananas are yellow."])
queries = model.encode_query(["What is landmark pooling?"])
print(model.similarity(queries, docs))   # MaxSim
```"""


def _what(model: EmbeddingModel, evaluated: bool) -> str:
    pool = model.pooling_cfg
    label = pool.label if pool else model.name
    kind = "it pools with landmarks" if model.landmark_tokenizer.strategy != "none" else \
        "one of the paper's comparison rows, without landmarks"
    done = "fine-tuned and evaluated" if evaluated else "fine-tuned (not evaluated)"
    return f"This model was {done} with `lmk`, which reproduces the paper:\npooling `{label}` ({kind})."


def model_card(*, meta: ModelMeta, model: EmbeddingModel, results: Results, config: dict[str, Any],
               row: TableRow | None, task_results: list[TaskResult], source: str,
               length: int | None = None, multi_vector: bool = False) -> str:
    """The card's text: the metadata block, then the sections of the module doc."""
    enc = model.encoder_cfg
    base = meta.adapted_from or (f"`{enc.name}` ({enc.source} encoder)" if enc else "unknown")
    data = results.data
    data_lines = "\n".join(f"- `{name}`: {entry.get('rows')} rows from `{entry.get('path')}`"
                           + (f", {entry.get('skipped')} skipped" if entry.get("skipped") else "")
                           for name, entry in data.items()) or "- not recorded"
    fingerprint = results.data_fingerprint or "not recorded"
    licence = "" if meta.license != "other" else f" (the licence of the base model {base} applies)"
    length = length or model.passage_max_length
    usage = _mv_usage(source, model, length) if multi_vector else _usage(source, meta, model, length)
    return f"""---
{_metadata(meta, results, task_results)}---

# {meta.name}

**LMK (landmark) pooling** inserts a landmark token after every chunk of a text and embeds the text as the mean
of the landmark states ([LMK > CLS: Landmark Pooling for Dense Embeddings]({PAPER})).
{_what(model, bool(task_results))}

## Model

{_pooling(model)}
- trained with: {describe_objective(results.section("train"))} (`train.objective`)
- base model: {base}; embedding size {meta.embed_dim}, {meta.n_parameters:,} parameters, up to \
{int(meta.max_tokens or 0)} positions
- weights fingerprint (the mteb revision) `{meta.revision}`; licence `{meta.license}`{licence}

## Training data

{data_lines}

Data fingerprint `{fingerprint}` (the content hash of the training rows; `lmk/resources/data_fingerprints.json`
pins the expected ones).

## Training config

```yaml
{yaml.safe_dump(config, sort_keys=True, default_flow_style=False).strip()}
```

## Table 2

{card_row(row)}

## Scores

{_scoring(results, multi_vector)}

{_scores(task_results, meta)}

## Use

{usage}

## Citation

```bibtex
{meta.citation}
```
"""
