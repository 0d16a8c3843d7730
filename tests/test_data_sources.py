"""One path for every training source: named sources (`local`, `replica:bge-full-data`), local copies of hub
repos (subset / split / data_files), the cfli/bge-full-data replica, empty sources, skipped-row counts."""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402

from lmk.data import pairs, replica  # noqa: E402
from lmk.data.datamodule import PairDataModule  # noqa: E402
from lmk.data.hub import BGE_COLUMNS  # noqa: E402
from lmk.data.pairs import PairDataError, load_pairs, read_source, resolve_source, source_fingerprint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ROWS = 400  # a small offline build (about 360 training rows), cached per test module
ROWS = 16  # replica rows per subset


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lmk_cache")


@pytest.fixture(scope="module")
def bge_clone(cache) -> Path:
    """A local clone of cfli/bge-full-data (the replica) with ROWS rows per subset."""
    return replica.build_bge_full_data_replica(cache / "bge-full-data", rows_per_subset=ROWS, offline_rows=OFFLINE_ROWS,
                                               cache_dir=cache)


def _write(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _good(i: int) -> dict:
    return {"query": f"query {i}", "pos": [f"positive {i}"], "neg": [f"negative {i}"]}


# ------------------------------------------------------------------------------------------ imports
def _data_modules() -> list[str]:
    return sorted(f"lmk.data.{p.stem}" for p in (ROOT / "lmk" / "data").glob("*.py") if p.stem != "__init__")


def test_lmk_data_import_graph_has_no_cycle():
    # Lazy (function-level) imports count too: they are how the old pairs <-> offline_pairs circle hid.
    graph: dict[str, set[str]] = {}
    for mod in _data_modules():
        tree = ast.parse((ROOT / "lmk" / "data" / f"{mod.rsplit('.', 1)[1]}.py").read_text())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps |= {n for n in names if n in _data_modules() and n != mod}
        graph[mod] = deps

    def visit(mod: str, path: tuple[str, ...]) -> None:
        assert mod not in path, f"import circle: {' -> '.join((*path, mod))}"
        for dep in graph[mod]:
            visit(dep, (*path, mod))

    for mod in graph:
        visit(mod, ())


# One fresh interpreter for every order: the sorted one first, as a fresh start; before each next order lmk's own
# modules are dropped from sys.modules, so each is imported again from its first line in the new order (an import
# circle is between lmk's modules: the third-party libraries they load stay loaded, as they do not take part).
# Beyond the two orders, each module is imported first once.
_IMPORT_ORDERS = """
import importlib, json, sys, traceback
for name, mods in json.loads(sys.argv[1]).items():
    for m in [m for m in sys.modules if m == 'lmk' or m.startswith('lmk.')]:
        del sys.modules[m]
    try:
        for m in mods:
            importlib.import_module(m)
        print('ORDER', json.dumps([name, None]), flush=True)
    except BaseException:
        print('ORDER', json.dumps([name, traceback.format_exc()[-2000:]]), flush=True)
"""


@pytest.fixture(scope="module")
def import_orders() -> dict[str, str | None]:
    """Order name -> None where every data module imported, else the traceback."""
    mods = _data_modules()
    orders = {"sorted": mods, "reversed": mods[::-1], **{f"{m} first": [m, *mods] for m in mods}}
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ORDERS, json.dumps(orders)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = dict(json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("ORDER "))
    assert list(results) == list(orders), proc.stdout[-2000:] + proc.stderr[-2000:]
    return results


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_each_data_module_imports_in_a_fresh_interpreter(order, import_orders):
    assert import_orders[order] is None, import_orders[order]
    if order == "sorted":  # and each module imported first, in the same interpreter
        assert not {o: e for o, e in import_orders.items() if e is not None}, import_orders


# ---------------------------------------------------------------------------------------- local set
def test_local_is_a_bge_layout_folder_read_like_any_folder(cache, monkeypatch):
    folder = Path(resolve_source("local", max_rows=OFFLINE_ROWS, cache_dir=str(cache)).path)
    assert folder.parent.name == "offline_pairs"
    assert sorted(p.name for p in (folder / "data").iterdir()) == [
        "test-00000-of-00001.parquet", "train-00000-of-00001.parquet"]
    assert datasets.load_dataset(str(folder), split="test").column_names == list(BGE_COLUMNS)
    calls = []
    real = pairs.load_hub_dataset
    monkeypatch.setattr(pairs, "load_hub_dataset", lambda s, **kw: calls.append(s) or real(s, **kw))
    by_name = load_pairs({"path": "local"}, max_rows=OFFLINE_ROWS, cache_dir=str(cache))
    by_path = load_pairs({"path": str(folder), "split": "train"}, max_rows=OFFLINE_ROWS, cache_dir=str(cache / "hf2"))
    assert [(c.path, c.split, c.data_files) for c in calls] == [(str(folder), "train", None)] * 2
    assert by_name["query"] == by_path["query"] and by_name["neg"] == by_path["neg"] and by_name.num_rows > 300
    stream = load_pairs({"path": "local"}, max_rows=OFFLINE_ROWS, cache_dir=str(cache), streaming=True)
    assert [r["query"] for r in stream] == by_name["query"] and len(calls) == 3


# ------------------------------------------------------------------------------------------- replica
def test_replica_layout_columns_and_card(bge_clone, cache):
    files = sorted(p.relative_to(bge_clone).as_posix() for p in (bge_clone / "data").iterdir())
    assert all(re.fullmatch(r"data/[a-z_]+-\d{5}-of-\d{5}\.parquet", f) for f in files)
    assert [f for f in files if "msmarco_passage" in f] == [
        "data/msmarco_passage-00000-of-00002.parquet", "data/msmarco_passage-00001-of-00002.parquet"]
    assert {f.split("/")[1].split("-")[0] for f in files} == {"msmarco_passage", "msmarco_document", "nq", "hotpotqa"}
    import pyarrow.parquet as pq
    import yaml

    assert pq.read_schema(bge_clone / files[0]).names == list(BGE_COLUMNS)
    card = yaml.safe_load((bge_clone / "README.md").read_text().split("---")[1])
    assert [f["name"] for f in card["dataset_info"]["features"]] == list(BGE_COLUMNS)
    (config,) = card["configs"]
    assert config["data_files"] == [{"split": s, "path": f"data/{s}-*"} for s in replica.SUBSETS]
    assert {s["name"]: s["num_examples"] for s in card["dataset_info"]["splits"]} == dict.fromkeys(replica.SUBSETS, ROWS)
    # every subset's split through the card, as the hub repo exposes them; disjoint subsets
    queries = {}
    for subset in replica.SUBSETS:
        ds = datasets.load_dataset(str(bge_clone), split=subset, streaming=True)
        rows = list(ds)
        assert len(rows) == ROWS
        for r in rows:
            assert len(r["pos_scores"]) == len(r["pos"]) and len(r["neg_scores"]) == len(r["neg"]) > 0
            assert r["prompt"] == replica.PROMPTS[subset] and r["type"] and r["category"]
        queries[subset] = {r["query"] for r in rows}
    assert sum(map(len, queries.values())) == len(set().union(*queries.values()))
    # the teacher is BM25 of the query against each passage: recompute one row
    r = rows[0]
    again = replica.bm25_teacher_scores([x["query"] for x in rows], [x["pos"] + x["neg"] for x in rows])[0]
    assert again == pytest.approx(r["pos_scores"] + r["neg_scores"], abs=1e-3)


def test_replica_is_deterministic_idempotent_and_rebuilt_when_corrupt(bge_clone, cache, tmp_path):
    other = replica.build_bge_full_data_replica(tmp_path / "again", rows_per_subset=ROWS, offline_rows=OFFLINE_ROWS,
                                                cache_dir=cache)
    for f in (bge_clone / "data").iterdir():
        assert pq_rows(f) == pq_rows(other / "data" / f.name)
    stamp = (other / "meta.json").stat().st_mtime_ns
    assert replica.build_bge_full_data_replica(other, rows_per_subset=ROWS, offline_rows=OFFLINE_ROWS, cache_dir=cache) == other
    assert (other / "meta.json").stat().st_mtime_ns == stamp  # intact: kept
    shard = other / "data" / "nq-00000-of-00001.parquet"
    good = shard.read_bytes()
    shard.write_bytes(good[:100])
    replica.build_bge_full_data_replica(other, rows_per_subset=ROWS, offline_rows=OFFLINE_ROWS, cache_dir=cache)
    assert shard.read_bytes() == good


def pq_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_replica_cli(cache, tmp_path):
    env = {**os.environ, "LMK_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "lmk.data.replica", "--out", str(tmp_path / "r"), "--rows-per-subset", "8",
         "--offline-rows", str(OFFLINE_ROWS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "msmarco_passage" in proc.stdout and (tmp_path / "r" / "data" / "hotpotqa-00000-of-00001.parquet").exists()


# --------------------------------------------------------------------- local clone of a hub dataset
def test_local_clone_honours_data_files_split_and_subset(bge_clone, cache):
    hf = str(cache / "hf")
    only = load_pairs({"path": str(bge_clone), "data_files": "data/msmarco_passage-*.parquet"}, cache_dir=hf)
    direct = datasets.load_dataset(str(bge_clone), data_files="data/msmarco_passage-*.parquet", split="train")
    assert only.num_rows == ROWS and only["query"] == direct["query"]
    assert only[0]["pos_scores"] and only[0]["neg_scores"]  # teacher scores come through
    nq = load_pairs({"path": str(bge_clone), "split": "nq"}, cache_dir=hf)
    assert nq.num_rows == ROWS and not set(nq["query"]) & set(only["query"])
    with pytest.raises(PairDataError, match="msmarco_passage"):  # the card's splits are named in the error
        load_pairs({"path": str(bge_clone), "split": "train"}, cache_dir=hf)
    with pytest.raises(PairDataError, match="subset=nope"):
        load_pairs({"path": str(bge_clone), "subset": "nope"}, cache_dir=hf)
    fps = {source_fingerprint({"path": str(bge_clone), "data_files": f"data/{s}-*.parquet"}) for s in replica.SUBSETS}
    assert len(fps) == 4
    assert source_fingerprint({"path": str(bge_clone), "split": "nq"}) != source_fingerprint(
        {"path": str(bge_clone), "split": "hotpotqa"})


def test_replica_config_differs_from_the_paper_config_only_by_path(cache, monkeypatch):
    from omegaconf import OmegaConf

    from lmk.config.data import DataConfig

    paper = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/data/msmarco-passage.yaml"))
    rep = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/data/bge-full-data-replica.yaml"))
    assert rep["sources"][0].pop("path") == "replica:bge-full-data" and paper["sources"][0].pop("path")
    assert rep == paper
    # built on demand: a fresh cache needs no manual step (sizes shrunk for the test)
    monkeypatch.setattr(replica, "ROWS_PER_SUBSET", ROWS)
    monkeypatch.setattr(replica, "OFFLINE_ROWS", OFFLINE_ROWS)
    cfg = DataConfig.coerce(OmegaConf.load(ROOT / "conf/data/bge-full-data-replica.yaml"))
    dm = PairDataModule(sources=cfg.sources, cache_dir=str(cache), group_size=4, batch_size=4)
    dm.setup()
    assert len(dm.train_set) == ROWS and dm.datasets[0][0]["neg_scores"]
    assert (cache / "replicas" / "bge-full-data" / "data" / "msmarco_passage-00001-of-00002.parquet").exists()
    with pytest.raises(ValueError, match="replica:bge-full-data"):
        DataConfig(sources=[{"path": "replica:nope"}])


# ------------------------------------------------------------------------------ empty / skipped rows
def test_empty_source_is_named_with_the_reason(tmp_path):
    empty = _write(tmp_path / "empty.jsonl", [])
    with pytest.raises(PairDataError, match=r"empty\.jsonl.*has no usable rows: it holds no rows"):
        load_pairs(empty, cache_dir=str(tmp_path / "hf"))
    bad = _write(tmp_path / "bad.jsonl", [{"query": "q"}, {"query": "q", "pos": []}, "{oops"])
    with pytest.raises(PairDataError, match=r"bad\.jsonl.*all 3 row\(s\) were skipped.*bad\.jsonl:1.*no 'pos'"):
        load_pairs(bad, skip_bad_rows=True, cache_dir=str(tmp_path / "hf"))
    dm = PairDataModule(sources=[{"path": bad, "name": "mine"}], skip_bad_rows=True, cache_dir=str(tmp_path / "hf"))
    with pytest.raises(PairDataError, match="'mine'"):
        dm.setup()


def test_skipped_rows_are_recorded_and_survive_a_cached_rerun(tmp_path, caplog):
    path = _write(tmp_path / "some-bad.jsonl", [_good(0), {"query": "q"}, _good(1), {"query": 3, "pos": ["p"]}, _good(2)])
    hf = str(tmp_path / "hf")
    with caplog.at_level(logging.WARNING, logger="lmk.data.pairs"):
        first = read_source(path, skip_bad_rows=True, cache_dir=hf)
        cached = read_source(path, skip_bad_rows=True, cache_dir=hf)  # from the Arrow cache: the reader does not run
    for got in (first, cached):
        assert (got.stats.rows, got.stats.skipped) == (3, 2) and "some-bad.jsonl:2" in got.stats.reasons[0]
    assert sum("skipped 2 bad row(s)" in r.getMessage() for r in caplog.records) == 1  # one line per process
    # a rerun (a new process) finds the Arrow copy and still reports the counts
    code = ("import logging; logging.basicConfig(); from lmk.data.pairs import read_source; "
            f"s = read_source({path!r}, skip_bad_rows=True, cache_dir={hf!r}).stats; print(s.rows, s.skipped)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["3", "2"] and "skipped 2 bad row(s)" in proc.stderr, proc.stderr[-2000:]
    assert "Generating" not in proc.stderr  # read from the cache, not regenerated
    dm = PairDataModule(sources=[{"path": path, "name": "some"}], skip_bad_rows=True, cache_dir=hf)
    before = dm.fingerprint
    dm.setup()
    rep = dm.report["some"]
    assert (rep["rows"], rep["skipped"]) == (3, 2) and "some-bad.jsonl:2" in rep["skip_reasons"][0]
    assert dm.fingerprint != before
    clean = _write(tmp_path / "clean.jsonl", [_good(0), _good(1), _good(2)])
    dm2 = PairDataModule(sources=[{"path": clean, "name": "some"}], skip_bad_rows=True, cache_dir=hf)
    dm2.setup()
    assert dm2.report["some"]["skipped"] == 0


def test_streaming_with_max_epochs_is_rejected_at_config_time():
    from hydra import compose, initialize_config_dir

    from lmk.config import ConfigError
    from lmk.train.trainer_args import validate_training

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["run_dir=/tmp/lmk-test-run", "data.streaming=true",
                                                      "trainer.max_steps=-1", "+trainer.max_epochs=1"])
        with pytest.raises(ConfigError, match="stream has no length.*trainer.max_steps"):
            validate_training(cfg)
        ok = compose(config_name="train", overrides=["run_dir=/tmp/lmk-test-run", "data.streaming=true",
                                                     "trainer.max_steps=5"])
        assert validate_training(ok).data.streaming
