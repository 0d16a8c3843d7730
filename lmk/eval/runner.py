"""One model through one eval suite with mteb, resumable, into the results "eval" section, in three stages:

    encode_suite(Prepared) -> Encoded   every task through `mteb.evaluate` (the model encodes, mteb retrieves
                                        and measures), cached splits reused; each task's summary and per-query scores
    score_suite(Encoded) -> Scored      the group means and the encoder's figures: the "eval" section
    record_suite(Scored) -> section     per_query.json and the loggers

`run_suite` (the training callback, tests) runs the three in turn; `lmk.eval.evaluation.evaluate` calls them
between its own prepare and record stages.

- mteb owns retrieval and metrics (`mteb.evaluate`); this module only wires tasks, the encoder
  adapter, an explicit per-run `mteb.ResultCache` and the summaries.
- The cache key is the model's name (encoder + pooling + weights fingerprint) plus the per-side max
  lengths (and a tag such as the training step), per task and split: a re-run after a crash only
  computes the missing splits, a finished task is never recomputed, two variants never share scores.
- Per-query scores: each retrieval task's `task_specific_scores` hook receives mteb's per-query
  pytrec_eval scores; they are saved next to the cache (so they survive a resume) and gathered into
  `per_query.json` ({task: {split: {query_id: score}}}) for paired t-tests.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mteb
from mteb.abstasks.abstask import AbsTask
from mteb.abstasks.aggregated_task import AbsTaskAggregate

from lmk.config.eval import EvalConfig
from lmk.data.landmarks import flat_summary
from lmk.eval.compressed_maxsim import LmkCompressedMaxSimEncoder
from lmk.eval.encoder import LmkEncoder
from lmk.eval.maxsim import LmkMaxSimEncoder
from lmk.eval.prepared import reading
from lmk.eval.score_stats import group_scores, metric_key, per_query_scores, split_key, summarize_scores
from lmk.eval.suites import build_tasks
from lmk.run.quiet_logging import quiet_progress_bars
from lmk.run.umask_files import write_json

if TYPE_CHECKING:
    from lmk.model.embedding import EmbeddingModel

log = logging.getLogger(__name__)
detail = logging.getLogger("lmk.eval.detail")  # the run's log file only (lmk.run.quiet_logging.FILE_ONLY_LOGGERS)

PER_QUERY_FILE = "per_query.json"


def _write_json(path: Path, data: Any) -> None:
    write_json(path, data, indent=1)  # atomic, umask permissions


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = _parse(path)
    if data is None:  # corrupt: moved aside; the caller recomputes what it held
        quarantine(path)
        return {}
    return data


def _parse(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None when it is not one (truncated write, disk error, hand edit)."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def quarantine(path: Path) -> Path:
    """Move a corrupt cache file aside (`<name>.corrupt-<time>`, kept for inspection) and say which."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    os.replace(path, target)
    log.warning("eval cache file %s is corrupt (not a JSON object): moved to %s; its task is recomputed",
                path, target.name)
    return target


def _repair_cache(cache: mteb.ResultCache, task: AbsTask, encoder: LmkEncoder, store: Path) -> list[Path]:
    """Move aside this task's corrupt cache files (mteb's task result, the per-query scores, the split
    fingerprints) and drop the task's cached result and per-query scores, so that mteb recomputes the whole
    task instead of crashing in a bare JSONDecodeError (with any eval.overwrite). Returns the corrupt files."""
    name = task.metadata.name
    result = Path(cache.get_task_result_path(name, encoder.mteb_model_meta))
    files = [result, store / f"{name}.fingerprints.json"]
    files += [store / f"{leaf.metadata.name}.json" for leaf in _leaf_tasks(task)]
    corrupt = [f for f in files if f.is_file() and _parse(f) is None]
    for f in corrupt:
        quarantine(f)
    if corrupt:
        for f in [result, *files[2:]]:
            f.unlink(missing_ok=True)
    return corrupt


def _leaf_tasks(task: AbsTask) -> list[AbsTask]:
    return list(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]


def _install_per_query_hook(task: AbsTask, store: Path) -> None:
    """Save mteb's per-query scores of the main metric for every split/subset evaluated."""
    for leaf in _leaf_tasks(task):
        if getattr(leaf, "_lmk_per_query_store", None) == store:
            continue  # already hooked (tasks reused by the callback)
        original = leaf.task_specific_scores
        main, name = leaf.metadata.main_score, leaf.metadata.name

        def hook(scores: Any, qrels: Any, results: Any, hf_split: str, hf_subset: str,
                 _orig: Any = original, _main: str = main, _name: str = name) -> dict[str, float]:
            path = store / f"{_name}.json"
            data = _read_json(path)
            data[split_key(hf_split, hf_subset)] = per_query_scores(scores, _main)
            _write_json(path, data)
            return _orig(scores, qrels, results, hf_split=hf_split, hf_subset=hf_subset)

        # An instance attribute: mteb calls self.task_specific_scores(...) from _evaluate_subset.
        leaf.task_specific_scores = hook
        leaf._lmk_per_query_store = store


def _task_per_query(task: AbsTask, store: Path) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The task's per-query scores for its requested splits, and the split keys that are missing."""
    leaves = _leaf_tasks(task)
    out: dict[str, dict[str, float]] = {}
    missing: list[str] = []
    for leaf in leaves:
        data = _read_json(store / f"{leaf.metadata.name}.json")
        for split in leaf.eval_splits:
            for subset in leaf.hf_subsets:
                key = split_key(split, subset)
                if key not in data:
                    missing.append(f"{leaf.metadata.name}:{key}")
                    continue
                # Aggregates (CQADupstack) pool their sub-tasks' queries: prefix ids with the sub-task.
                prefix = f"{leaf.metadata.name}/" if len(leaves) > 1 else ""
                out.setdefault(key, {}).update({prefix + q: s for q, s in data[key].items()})
    return out, missing


def _task_landmarks(name: str, splits: Sequence[str], encoder: LmkEncoder, store: Path) -> dict[str, Any]:
    """The task's landmark statistics per split and side: this evaluation's, kept next to the cache so that a task
    read back from the cache (a resume) still has them."""
    path = store / f"{name}.landmarks.json"
    data = _read_json(path)
    fresh = encoder.landmarks.pop(name)
    if fresh:
        data.update(fresh)
        _write_json(path, data)
    return {split: data[split] for split in splits if split in data}


def _log_summary(logger: Any, values: Mapping[str, Any]) -> None:
    """Final figures (landmark statistics) into the summary of the loggers that keep one (W&B)."""
    for lg in _loggers(logger) if values else []:
        if not hasattr(lg, "log_summary"):
            continue
        try:
            lg.log_summary(values)
        except Exception as err:  # as for metrics: a logger failure must never lose the eval results
            log.warning("eval: logger %s failed to log its summary: %s", type(lg).__name__, err)


def _drop_stale_cache(cache: mteb.ResultCache, task: AbsTask, encoder: LmkEncoder, store: Path) -> None:
    """Never score changed data from the cache.

    Local tasks: each split's data hash is recorded next to the cache; a cached split whose data
    changed (regenerated with other sizes / seed) is removed from the cached result, so mteb
    recomputes exactly that split. Hub tasks: a cached result of another dataset revision is
    dropped (mteb itself skips that check when every split is cached).
    """
    if isinstance(task, AbsTaskAggregate):
        return
    meta = encoder.mteb_model_meta
    name = task.metadata.name
    path = cache.get_task_result_path(name, meta)
    cached = cache.load_task_result(name, meta)
    fingerprints = getattr(task, "split_fingerprints", None)
    if fingerprints is None:
        if cached is not None and cached.dataset_revision != task.metadata.revision:
            log.warning("eval %s: cached results are for dataset revision %s, data is now %s: recomputing",
                        name, cached.dataset_revision, task.metadata.revision)
            path.unlink(missing_ok=True)
            (store / f"{name}.json").unlink(missing_ok=True)
        return
    sidecar = store / f"{name}.fingerprints.json"
    known = _read_json(sidecar)
    if cached is not None:
        stale = [s for s in cached.scores if s in fingerprints and known.get(s) != fingerprints[s]]
        if stale:
            log.warning("eval %s: data of splits %s changed since they were cached: recomputing them", name, stale)
            for split in stale:
                del cached.scores[split]
            if cached.scores:
                cached.to_disk(path)
            else:
                path.unlink(missing_ok=True)
            per_query = _read_json(store / f"{name}.json")
            per_query = {k: v for k, v in per_query.items() if k.split("/", 1)[0] not in stale}
            _write_json(store / f"{name}.json", per_query)
    known.update(fingerprints)
    _write_json(sidecar, known)


def _loggers(logger: Any) -> list[Any]:
    """One logger, a sequence of them or None, as a list."""
    return [] if logger is None else list(logger) if isinstance(logger, Sequence) else [logger]


def _log_metrics(logger: Any, metrics: Mapping[str, float], step: int | None) -> None:
    for lg in _loggers(logger) if metrics else []:
        try:
            lg.log_metrics(dict(metrics), step=step)
        except Exception as err:  # a logger failure must never lose the eval results
            log.warning("eval: logger %s failed to log metrics: %s", type(lg).__name__, err)


def suite_metrics(section: Mapping[str, Any]) -> dict[str, float]:
    """Flat logger metrics from an eval section: eval/<task>, eval/<task>/<split>, eval/group/<group>."""
    metrics: dict[str, float] = {}
    for task, entry in section.get("tasks", {}).items():
        metrics[metric_key("eval", task)] = entry["main_score"]
        for split, value in entry.get("splits", {}).items():
            metrics[metric_key("eval", task, split)] = value
    for group, value in section.get("groups", {}).items():
        if value is not None:
            metrics[metric_key("eval", "group", group)] = value
    return metrics


def _evaluate_task(task: AbsTask, encoder: LmkEncoder, cache: mteb.ResultCache, store: Path, cfg: EvalConfig
                   ) -> tuple[dict[str, Any], dict[str, Any], float]:
    """One task through mteb (cached splits reused): its summary, its per-query scores and its seconds."""
    name = task.metadata.name
    _repair_cache(cache, task, encoder, store)
    _drop_stale_cache(cache, task, encoder, store)
    _install_per_query_hook(task, store)
    calls_before, texts_before, start = encoder.n_encode_calls, encoder.n_texts, time.perf_counter()
    result = mteb.evaluate(
        encoder,
        task,
        cache=cache,
        overwrite_strategy=cfg.overwrite,
        # mteb's own bars off ("Searching corpus chunks" around each encode): with eval.show_progress lmk's
        # encoder shows one bar per encode phase
        encode_kwargs={"batch_size": cfg.batch_size, "show_progress_bar": False},
        show_progress_bar=False,
        co2_tracker=False,
        raise_error=True,
    )
    seconds = round(time.perf_counter() - start, 3)
    if not result.task_results:
        raise RuntimeError(f"eval {name}: mteb returned no result ({result.exceptions})")
    summary = summarize_scores(result.task_results[0].scores, task.metadata.main_score, task.eval_splits,
                               task.hf_subsets)
    texts = encoder.n_texts - texts_before
    speed = f", {texts / seconds:.0f} texts/s" if texts and seconds > 0 else ""
    log.info("eval %s: %s=%.4f %s in %.1fs%s", name, summary["metric"], summary["main_score"],
             {k: round(v, 4) for k, v in summary["splits"].items()}, seconds,
             " (from cache)" if encoder.n_encode_calls == calls_before else speed)
    info = task.data_info() if hasattr(task, "data_info") else {}
    if info:
        summary["data"] = info  # e.g. a RULER task's haystack and each query's needle depth
    if isinstance(encoder, LmkMaxSimEncoder) and encoder.index_size(name):
        summary["index"] = encoder.index_size(name)  # what a landmark index of these documents holds
    landmarks = _task_landmarks(name, list(summary["splits"]), encoder, store)
    if landmarks:
        summary["landmarks"] = landmarks
    pq, missing = _task_per_query(task, store)
    if missing:
        log.warning("eval %s: no per-query scores for %s (cached before per-query saving?)", name, missing)
    return summary, pq, seconds


def build_encoder(model: EmbeddingModel, cfg: EvalConfig, tag: str | None = None) -> LmkEncoder:
    """The mteb model of `cfg.scoring`: one vector per text (single) or lmk's landmark states under MaxSim."""
    kwargs: dict[str, Any] = dict(show_progress=cfg.show_progress, tag=tag, max_tokens_per_batch=cfg.max_tokens_per_batch,
                                  precision=cfg.precision, workers=cfg.workers, prefetch=cfg.prefetch,
                                  query_prompts=cfg.query_prompts)
    if cfg.scoring == "maxsim":
        kwargs.update(query_states=cfg.maxsim_query, block_mb=cfg.maxsim_block_mb)
        return LmkMaxSimEncoder(model, cfg.query_max_length, cfg.passage_max_length, cfg.batch_size, **kwargs)
    if cfg.scoring == "maxsim-compressed":
        kwargs.update(query_states=cfg.maxsim_query, block_mb=cfg.maxsim_block_mb, bits=cfg.maxsim_bits,
                      centroids=cfg.maxsim_centroids or None, rerank=cfg.maxsim_rerank, seed=cfg.seed)
        return LmkCompressedMaxSimEncoder(model, cfg.query_max_length, cfg.passage_max_length, cfg.batch_size,
                                          **kwargs)
    return LmkEncoder(model, cfg.query_max_length, cfg.passage_max_length, cfg.batch_size, **kwargs)


@dataclass
class Prepared:
    """The encode stage's input: the model where it runs, the suite, its tasks, the mteb cache, where results go.

    data_root: hub.prepared, the folder the hub tasks read their prepared data from (`lmk.eval.prepared`); out_dir:
    where `per_query_file` is written (None: skipped); tag: extra cache identity (e.g. "step500" for mid-training
    evals of changing weights); logger: None, a Lightning-style logger (log_metrics) or a list of them."""

    model: EmbeddingModel
    cfg: EvalConfig
    tasks: list[AbsTask]
    cache_dir: Path
    out_dir: Path
    data_root: str | None = None
    per_query_file: str | None = PER_QUERY_FILE
    tag: str | None = None
    logger: Any = None
    step: int | None = None


@dataclass
class Encoded:
    """The encode stage's output: every task through mteb with one encoder (each task's summary, per-query scores
    and seconds, in the suite's order); no encoder for a disabled suite."""

    prepared: Prepared
    encoder: LmkEncoder | None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_query: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Scored:
    """The score stage's output: the results.json "eval" section (groups, the encoder's figures) and what the
    record stage writes beside it."""

    encoded: Encoded
    section: dict[str, Any]


@quiet_progress_bars()  # mteb's per-task dataset maps: one bar each, seconds of work
def encode_suite(prepared: Prepared) -> Encoded:
    """Every task of the suite through mteb (`mteb.evaluate`: the model encodes, mteb retrieves and measures), the
    cached splits reused; the model is in eval mode meanwhile."""
    cfg, model = prepared.cfg, prepared.model
    if not cfg.enabled:
        return Encoded(prepared, None)
    # the model is already where it runs (lmk.evaluate / the callback put it there); precision "auto"
    # resolves against that device
    encoder = build_encoder(model, cfg, prepared.tag)
    meta = encoder.mteb_model_meta
    cache = mteb.ResultCache(cache_path=prepared.cache_dir)
    store = prepared.cache_dir / "per_query" / meta.model_name_as_path() / str(meta.revision) / (meta.experiment_name or "")
    encoded = Encoded(prepared, encoder)
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with reading(prepared.tasks, prepared.data_root) as folders:
            if folders:
                log.info("eval data of %d hub tasks read from %s", len(folders), prepared.data_root)
            for i, task in enumerate(prepared.tasks, 1):
                detail.info("eval [%d/%d] %s (%s), splits %s, model %s", i, len(prepared.tasks), task.metadata.name,
                            task.metadata.main_score, list(task.eval_splits), meta.name)
                name = task.metadata.name
                encoded.tasks[name], encoded.per_query[name], encoded.timings[name] = _evaluate_task(
                    task, encoder, cache, store, cfg)
    finally:
        model.train(was_training)
    return encoded


def score_suite(encoded: Encoded) -> Scored:
    """The suite's figures from its tasks' scores: the group means and what the encoder counted."""
    cfg, encoder = encoded.prepared.cfg, encoded.encoder
    section: dict[str, Any] = {"suite": cfg.name, "tasks": encoded.tasks, "groups": {}}
    if encoder is None:
        return Scored(encoded, section)
    task_main = {t: e["main_score"] for t, e in section["tasks"].items()}
    section["groups"] = group_scores(task_main, cfg.groups)
    section["group_tasks"] = {g: list(m) for g, m in cfg.groups.items()}  # tables pair per-query scores by group
    for group, value in section["groups"].items():
        log.info("eval group %s: %s", group, "n/a" if value is None else f"{value:.4f}")
    section.update(model=encoder.mteb_model_meta.name, fingerprint=encoder.fingerprint,
                   query_max_length=cfg.query_max_length,
                   device=str(getattr(encoded.prepared.model, "device", "cpu")), precision=encoder.precision,
                   passage_max_length=cfg.passage_max_length, n_truncated=encoder.n_truncated,
                   n_encoded=encoder.n_texts, timings=encoded.timings)
    section["scoring"] = cfg.scoring  # which scoring these results used (tables name the block by it)
    if isinstance(encoder, LmkMaxSimEncoder):
        section.update(maxsim_query=cfg.maxsim_query, maxsim_search_seconds=round(encoder.search_seconds, 3))
    if isinstance(encoder, LmkCompressedMaxSimEncoder):  # the index's settings and its build time (k-means, codes)
        section.update(maxsim_bits=cfg.maxsim_bits, maxsim_centroids=cfg.maxsim_centroids,
                       maxsim_rerank=cfg.maxsim_rerank, maxsim_index_seconds=round(encoder.index_seconds, 3))
    return Scored(encoded, section)


def record_suite(scored: Scored) -> dict[str, Any]:
    """The per-query scores into `per_query_file` and the figures to the loggers; returns the eval section."""
    section, encoded = scored.section, scored.encoded
    prepared = encoded.prepared
    if encoded.encoder is None:
        return section
    if prepared.per_query_file:
        _write_json(prepared.out_dir / prepared.per_query_file, encoded.per_query)
        section["per_query"] = prepared.per_query_file
    _log_metrics(prepared.logger, suite_metrics(section), prepared.step)
    _log_summary(prepared.logger, flat_summary("landmarks/eval", {t: e.get("landmarks") or {}
                                                                  for t, e in section["tasks"].items()}))
    return section


@quiet_progress_bars()  # and the suite's tasks built here
def run_suite(
    model: EmbeddingModel,
    eval_cfg: Any,
    cache_dir: str | os.PathLike,
    logger: Any = None,
    *,
    out_dir: str | os.PathLike | None = None,
    per_query_file: str | None = PER_QUERY_FILE,
    tag: str | None = None,
    step: int | None = None,
    tasks: Sequence[AbsTask] | None = None,
) -> dict[str, Any]:
    """Evaluate `model` on the suite `eval_cfg`; returns the results.json "eval" section: the encode, score and
    record stages in turn (`Prepared` has the arguments; out_dir defaults to the parent of cache_dir, i.e. the run
    dir). tasks: prebuilt tasks (the callback builds them once); by default built from the config (names checked
    first)."""
    cfg = EvalConfig.from_cfg(eval_cfg)
    task_list = [] if not cfg.enabled else list(tasks) if tasks is not None else build_tasks(cfg)
    cache_dir = Path(cache_dir)
    prepared = Prepared(model, cfg, task_list, cache_dir, Path(out_dir) if out_dir is not None else cache_dir.parent,
                        per_query_file=per_query_file, tag=tag, logger=logger, step=step)
    return record_suite(score_suite(encode_suite(prepared)))
