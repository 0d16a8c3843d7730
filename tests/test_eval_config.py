"""Eval config schema, suite YAMLs (task lists of docs/method.md section 4), name and offline checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lmk.config.eval import LENGTHS, EvalConfig, EvalConfigError
from lmk.eval.callback import build_eval_callback
from lmk.eval.suites import build_tasks
from lmk.eval.task_names import UnknownTaskError, check_task_names

CONF = Path(__file__).resolve().parents[1] / "conf" / "eval"

MTEB_V2 = ["ArguAna", "FiQA2018", "SCIDOCS", "CQADupstackUnixRetrieval", "CQADupstackGamingRetrieval",
           "ClimateFEVERHardNegatives", "FEVERHardNegatives", "HotpotQAHardNegatives", "TRECCOVID",
           "Touche2020Retrieval.v3"]
BEIR15 = ["NFCorpus", "NQ", "HotpotQA", "Touche2020", "CQADupstackRetrieval", "QuoraRetrieval", "DBPedia", "FEVER",
          "ClimateFEVER", "SciFact", "TRECCOVID", "FiQA2018", "ArguAna", "SCIDOCS", "MSMARCO"]
LONGEMBED6 = ["LEMBPasskeyRetrieval", "LEMBNeedleRetrieval", "LEMBNarrativeQARetrieval", "LEMBQMSumRetrieval",
              "LEMBSummScreenFDRetrieval", "LEMBWikimQARetrieval"]
COIR = ["AppsRetrieval", "CodeFeedbackMT", "CodeFeedbackST", "CodeTransOceanContest", "CodeTransOceanDL", "CosQA",
        "SyntheticText2SQL", "StackOverflowQA", "COIRCodeSearchNetRetrieval", "CodeSearchNetCCRetrieval"]
SUITES = ["beir15", "mteb-v2-retrieval", "msmarco-dev", "mldr-eng", "mldr-13", "longembed6", "coir", "miracl-hn",
          "local", "none"]


def load(name: str) -> EvalConfig:
    return EvalConfig.from_cfg(OmegaConf.load(CONF / f"{name}.yaml"))


@pytest.mark.parametrize("name", SUITES)
def test_every_suite_loads_and_names_real_tasks(name: str) -> None:
    cfg = load(name)
    assert cfg.name == name
    check_task_names(cfg.tasks)  # every name is an mteb or local task
    for members in cfg.groups.values():
        assert set(members) <= set(cfg.tasks)


def test_suite_task_lists_match_the_paper() -> None:
    assert load("mteb-v2-retrieval").tasks == MTEB_V2
    assert load("beir15").tasks == BEIR15
    assert load("longembed6").tasks == LONGEMBED6
    assert load("longembed6").groups["longembed6"] == LONGEMBED6
    assert load("coir").tasks == COIR
    assert load("msmarco-dev").tasks == ["MSMARCO"]
    assert load("mldr-eng").task_options["MultiLongDocRetrieval"] == {"eval_splits": ["test"], "hf_subsets": ["en"]}
    assert len(load("mldr-13").task_options["MultiLongDocRetrieval"]["hf_subsets"]) == 13
    for long_suite in ("mldr-eng", "mldr-13", "longembed6", "local"):
        cfg = load(long_suite)
        assert (cfg.query_max_length, cfg.passage_max_length) == (8192, 8192)
    local = load("local")
    assert local.tasks == ["LocalPasskey", "LocalNeedle", "LocalLongDoc", "LocalShort"]
    assert local.lengths == list(LENGTHS)


def test_hub_task_filters_are_applied_without_data() -> None:
    (mldr,) = build_tasks(load("mldr-eng"))
    assert list(mldr.eval_splits) == ["test"] and mldr.hf_subsets == ["en"]
    (mldr13,) = build_tasks(load("mldr-13"))
    assert len(mldr13.hf_subsets) == 13


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"batch_size": 0}, "eval.batch_size"),
        ({"query_max_length": -1}, "eval.query_max_length"),
        ({"lengths": [300]}, "allowed lengths"),
        ({"every_n_steps": 0}, "eval.every_n_steps"),
        ({"overwrite": "sometimes"}, "only-missing"),
        ({"tasks": ["LocalShort"], "groups": {"g": ["LocalShort", "LocalPasskey"]}}, "eval.groups.g"),
        ({"n_docs": 5, "n_queries": 10}, "eval.n_queries"),
        ({"tasks": ["LocalShort"], "task_options": {"LocalShort": {"splits": ["x"]}}}, "unknown keys"),
        ({"bogus": 1}, "unknown key eval.bogus"),
    ],
)
def test_bad_values_name_the_key(override: dict, fragment: str) -> None:
    with pytest.raises(EvalConfigError, match=None) as err:
        EvalConfig.from_cfg({"name": "x", **override})
    assert fragment in str(err.value)


def test_unknown_task_lists_close_names() -> None:
    with pytest.raises(UnknownTaskError) as err:
        check_task_names(["SciFacts", "LocalPaskey", "ArguAna"])
    msg = str(err.value)
    assert "'SciFacts'" in msg and "SciFact" in msg
    assert "'LocalPaskey'" in msg and "LocalPasskey" in msg
    assert "'ArguAna'" not in msg  # valid names are not reported


def test_unknown_task_fails_before_any_data_or_model() -> None:
    cfg = EvalConfig(name="x", tasks=["NotATaskAtAll"])
    with pytest.raises(UnknownTaskError, match="NotATaskAtAll"):
        build_tasks(cfg)


def test_hub_task_offline_fails_fast_naming_the_offline_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Offline with nothing on disk: the check before compute names what is missing and the fixes
    # (the download, a local copy in the mirror, the offline suite); it never asks whether the network is up.
    from lmk.hub.artifacts import MissingArtifactsError, check_available

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.delenv("LMK_HUB_MIRROR", raising=False)
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    with pytest.raises(MissingArtifactsError) as err:
        check_available({"eval": load("longembed6")})
    msg = str(err.value)
    assert "eval=local" in msg and "local copy" in msg and "lmk.download" in msg
    assert "LEMBPasskeyRetrieval" in msg and "mteb/LEMBPasskeyRetrieval" in msg and "dwzhu/LongEmbed" in msg
    assert "network" not in msg.replace("internet", "")  # the fix is data on disk, not a network probe


def test_none_suite_gives_no_callback(tmp_path: Path) -> None:
    assert build_eval_callback(OmegaConf.load(CONF / "none.yaml"), tmp_path) is None
    assert build_eval_callback(load("local"), tmp_path) is not None


def test_task_subset_drops_groups_without_tasks() -> None:
    cfg = EvalConfig(tasks=["LocalShort"], groups={"short": ["LocalShort"], "long": ["LocalPasskey", "LocalNeedle"]})
    assert cfg.groups == {"short": ["LocalShort"]}


def test_local_task_names_are_declared_before_mteb_loads_and_each_has_its_class():
    """lmk.config.eval.LOCAL_TASK_NAMES (torch- and mteb-free: config checks read it) is exactly the registered
    @local_task classes, in order; a class whose name is not declared is refused at registration."""
    from lmk.config.eval import LOCAL_TASK_NAMES
    from lmk.eval.tasks import LOCAL_TASKS, LocalShort, local_task

    assert LOCAL_TASKS == LOCAL_TASK_NAMES

    class Undeclared(LocalShort):
        metadata = LocalShort.metadata.model_copy(update={"name": "LocalUndeclared"})

    with pytest.raises(ValueError, match="'LocalUndeclared'.*add its name to lmk.config.eval.LOCAL_TASK_NAMES"):
        local_task(Undeclared)


_NAMES_WITHOUT_MTEB = """
import json, sys
from lmk.hub.task_registry import hub_task_names
names = hub_task_names()
print(json.dumps({"n": len(names), "has": "ArguAna" in names, "mteb": "mteb" in sys.modules}))
"""


def test_mteb_task_names_are_read_from_the_cache_without_loading_mteb(tmp_path):
    """The first check loads mteb's registry and keeps its names in lmk's cache (per mteb version); the next
    process reads them from there and never imports mteb, with the same names."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "LMK_CACHE": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _NAMES_WITHOUT_MTEB], env=env, capture_output=True,
                                      text=True, timeout=300, check=True).stdout) for _ in range(2)]
    assert runs[0]["mteb"] and not runs[1]["mteb"]
    assert runs[0]["n"] == runs[1]["n"] > 100 and runs[1]["has"]
    (cached,) = (tmp_path / "mteb-task-names").glob("*.json")
    from importlib.metadata import version

    assert cached.name == f"{version('mteb')}.json"
