"""RULER-style NIAH retrieval (lmk.data.ruler, the RulerNiah* local tasks): deterministic, fingerprinted, needles
where the data say, the right number of needles / keys / values per variant, and the ruler-niah group end to end."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import datasets
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.eval import RULER_VARIANTS, EvalConfig, EvalConfigError  # noqa: E402
from lmk.data import longembed, ruler  # noqa: E402
from lmk.eval.runner import run_suite  # noqa: E402
from lmk.eval.tasks import LOCAL_TASK_CLASSES, build_local_task  # noqa: E402
from lmk.hub import mirror  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
TASKS = {"single": "RulerNiahSingle", "multikey": "RulerNiahMultiKey", "multivalue": "RulerNiahMultiValue",
         "multiquery": "RulerNiahMultiQuery"}
KEY = re.compile(r"The special magic number for (\w+) is (\d{7})\.")


def _small(variant: str, seed: int = 0) -> dict:
    return ruler.generate_ruler(variant, lengths=(256, 1024), n_docs=12, n_queries=8, seed=seed,
                                haystack="lmk-essays", depths=(0.0, 0.5, 1.0))


@pytest.mark.parametrize("variant", RULER_VARIANTS)
def test_same_seed_same_data_other_seed_other_data(variant: str) -> None:
    assert longembed.fingerprint(_small(variant)) == longembed.fingerprint(_small(variant))
    assert longembed.fingerprint(_small(variant, seed=1)) != longembed.fingerprint(_small(variant))
    # each length is seeded on its own: asking for fewer lengths gives the same documents
    alone = ruler.generate_ruler(variant, lengths=(1024,), n_docs=12, n_queries=8, haystack="lmk-essays",
                                 depths=(0.0, 0.5, 1.0))
    assert alone[1024].corpus["text"] == _small(variant)[1024].corpus["text"]


@pytest.mark.parametrize("variant", RULER_VARIANTS)
def test_needles_are_where_the_data_say(variant: str) -> None:
    for length, rc in _small(variant).items():
        docs = {d["id"]: d for d in rc.corpus}
        for d in docs.values():
            assert len(d["text"].split()) <= longembed.word_budget(length)
            for needle, offset in zip(d["needles"], d["needle_offsets"], strict=True):
                assert d["text"][offset:offset + len(needle)] == needle
            assert d["text"][d["offset"]:].startswith(d["needle"]) and d["depth"] == d["needle_depths"][0]
            # the depth is the share of haystack words before the needle (the other needles' words left out)
            before = KEY.sub("", d["text"][:d["offset"]]).split()
            haystack_words = len(KEY.sub("", d["text"]).split())
            assert d["depth"] == pytest.approx(len(before) / haystack_words, abs=1e-6)
            assert abs(d["depth"] - d["target_depth"]) < 0.15  # the nearest sentence boundary to the target
        for q in rc.queries:
            gold = docs[rc.relevant(q["id"])[0]]
            assert (q["depth"], q["offset"], q["length"]) == (gold["depth"], gold["offset"], length)
        assert sorted({d["target_depth"] for d in docs.values()}) == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("variant", RULER_VARIANTS)
def test_every_variant_has_its_needles_keys_and_values(variant: str) -> None:
    rc = _small(variant)[1024]
    all_keys = []
    for d in rc.corpus:
        found = KEY.findall(d["text"])
        assert len(found) == ruler.NEEDLES[variant] == len(d["keys"]) == len(d["values"])
        assert [k for k, _ in found] == sorted(d["keys"], key=lambda k, d=d: d["needle_offsets"][d["keys"].index(k)]) \
            or variant == "multivalue"
        keys, values = {k for k, _ in found}, {v for _, v in found}
        assert len(keys) == (1 if variant == "multivalue" else ruler.NEEDLES[variant])
        assert len(values) == ruler.NEEDLES[variant]
        all_keys += sorted(keys)
    assert len(all_keys) == len(set(all_keys))  # no key in two documents: a query's key names one document
    for q in rc.queries:
        gold = next(d for d in rc.corpus if d["id"] == rc.relevant(q["id"])[0])
        asked = [k for k in gold["keys"] if k in q["text"]]
        assert q["keys"] == (gold["keys"] if variant == "multiquery" else gold["keys"][:1])
        assert set(asked) == set(q["keys"]) and len(rc.qrels[q["id"]]) == 1
    if variant == "multikey":  # the distractor keys of a document are never asked
        asked = {k for q in rc.queries for k in q["keys"]}
        assert not asked & {k for d in rc.corpus for k in d["keys"][1:]}


def test_bad_settings_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="allowed values: single, multikey"):
        ruler.generate_ruler("multi", lengths=(512,))
    with pytest.raises(EvalConfigError, match="ruler_haystack"):
        EvalConfig(ruler_haystack="pg")
    with pytest.raises(EvalConfigError, match="ruler_n_queries"):
        EvalConfig(ruler_n_docs=3, ruler_n_queries=4)
    with pytest.raises(FileNotFoundError, match="eval.ruler_haystack=lmk-essays"):
        ruler.load_haystack("paul-graham")


def test_the_essays_of_the_hub_mirror_are_the_haystack_and_the_results_say_so(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    folder = mirror.repo_dir(tmp_path, "dataset", ruler.PAUL_GRAHAM_REPO)
    (folder / "data").mkdir(parents=True)
    essays = "How to start. " + " ".join(f"Essay sentence number {i} is here." for i in range(400))
    datasets.Dataset.from_list([{"title": "t", "text": essays}]).to_parquet(folder / "data" / "train.parquet")
    mirror.mark_complete(folder, ruler.PAUL_GRAHAM_REPO, "test")
    monkeypatch.setenv(mirror.ENV_VAR, str(tmp_path))
    hay = ruler.load_haystack("auto")
    assert hay.name == "paul-graham" and ruler.PAUL_GRAHAM_REPO in hay.source and hay.words[:3] == ("How", "to", "start.")
    task = build_local_task("RulerNiahSingle", EvalConfig(tasks=["RulerNiahSingle"], ruler_lengths=[256],
                                                          ruler_n_docs=2, ruler_n_queries=1))
    assert task.data_info()["haystack"] == "paul-graham"
    assert "Essay sentence number" in task.corpora["test_256"].corpus[0]["text"]
    monkeypatch.delenv(mirror.ENV_VAR)
    assert ruler.load_haystack("auto").name == "lmk-essays"  # no mirror: lmk's own essays


def test_download_lists_the_essays_only_where_the_tasks_must_read_them() -> None:
    from lmk.hub.artifacts import eval_artifacts

    suite = {"tasks": list(TASKS.values()), "ruler_haystack": "paul-graham"}
    assert [a.repo_id for a in eval_artifacts(suite)] == [ruler.PAUL_GRAHAM_REPO]
    assert eval_artifacts({**suite, "ruler_haystack": "auto"}) == []  # auto: lmk's essays where the mirror has none
    assert eval_artifacts({**suite, "tasks": ["LocalShort"]}) == []


def test_the_ruler_niah_suite_composes() -> None:
    for name in ("ruler-niah", "decoder-tiny", "decoder-mini"):
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(str(CONF / "eval"), version_base=None):
            cfg = EvalConfig.from_cfg(compose(name))
        assert set(TASKS.values()) <= set(cfg.tasks) and cfg.groups["ruler-niah"] == list(TASKS.values())


@pytest.mark.slow  # about 30 s on 2 loaded cores: mteb's per-task overhead, four tasks
def test_the_ruler_group_runs_end_to_end_on_the_tiny_encoder(tmp_path: Path) -> None:
    model = EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
                                 OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"))
    cfg = EvalConfig(name="ruler", tasks=list(TASKS.values()), groups={"ruler-niah": list(TASKS.values())},
                     query_max_length=32, passage_max_length=128, ruler_lengths=[256, 512], ruler_n_docs=3,
                     ruler_n_queries=2, ruler_haystack="lmk-essays", show_progress=False, workers=0)
    section = run_suite(model, cfg, tmp_path / "cache")
    assert 0.0 <= section["groups"]["ruler-niah"] <= 1.0
    pq = json.loads((tmp_path / "per_query.json").read_text())
    for name in TASKS.values():
        entry = section["tasks"][name]
        assert entry["metric"] == "ndcg_at_1" and set(entry["splits"]) == {"test_256", "test_512"}
        data = entry["data"]
        assert data["haystack"] == "lmk-essays" and data["variant"] == LOCAL_TASK_CLASSES[name].variant
        # every per-query score has its needle depth (the length is the split's)
        for split, scores in pq[name].items():
            assert set(scores) == set(data["query_depths"][split])
            assert all(0.0 <= d <= 1.0 for d in data["query_depths"][split].values())
    task = build_local_task("RulerNiahSingle", cfg)
    assert task.metadata.main_score == "ndcg_at_1" and task.eval_splits == ["test_256", "test_512"]


def test_each_variant_is_a_local_task_with_its_splits() -> None:
    cfg = EvalConfig(tasks=list(TASKS.values()), ruler_lengths=[256, 512], ruler_n_docs=3, ruler_n_queries=2,
                     ruler_haystack="lmk-essays")
    for variant, name in TASKS.items():
        task = build_local_task(name, cfg)
        assert type(task).variant == variant and task.metadata.main_score == "ndcg_at_1"
        assert task.eval_splits == ["test_256", "test_512"] and set(task.split_fingerprints) == set(task.eval_splits)
        info = task.data_info()
        assert info["haystack"] == "lmk-essays" and info["needles_per_document"] == ruler.NEEDLES[variant]
        assert set(info["query_depths"]) == {"test_256", "test_512"}
