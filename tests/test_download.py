"""Compute nodes without internet: what the download lists == what the jobs open; the mirror read offline by
the real mteb task classes; the check before compute names what is missing."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from omegaconf import OmegaConf

from lmk.config.data import DataConfig
from lmk.config.eval import EvalConfig
from lmk.hub import artifacts, mirror
from lmk.hub import fetch as hub_fetch
from lmk.hub.artifacts import Artifact, MissingArtifactsError, check_available, required_artifacts
from lmk.hub.offline import is_hub_id
from lmk.sweep import scale_artifacts as download_cmd

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "experiments" / "table2" / "spec.yaml")
CONF = ROOT / "conf"


@pytest.fixture()
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline, with an empty Hugging Face cache and no mirror (what a fresh compute node sees)."""
    import datasets
    from huggingface_hub import constants

    hf = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LMK_HUB_MIRROR", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(hf))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf / "datasets")
    return hf


# ------------------------------------------------------------------ listing == what the job opens
class _Opened(BaseException):
    """Raised by the recorders once a hub load is recorded: nothing is downloaded or built. A BaseException,
    so the loaders' own `except Exception` wrappers let it through."""


@contextlib.contextmanager
def record_hub_loads():
    """Record every hub repo the real loading code asks for (datasets, mteb's loader, transformers)."""
    import datasets
    import mteb.abstasks.retrieval_dataset_loaders as loaders
    import transformers

    opened: set[tuple[str, str, str | None]] = set()

    def hit(kind: str, path: Any, revision: Any = None) -> None:
        if is_hub_id(str(path)):
            opened.add((kind, str(path), revision))
        raise _Opened(path)

    def load_dataset(path: str, name: str | None = None, *args: Any, revision: str | None = None, **kw: Any) -> Any:
        if not is_hub_id(path):  # the offline set's own json/parquet reads
            return real_load_dataset(path, name, *args, revision=revision, **kw)
        hit("dataset", path, revision)

    def mteb_load_dataset(path: str, *args: Any, revision: str | None = None, **kw: Any) -> Any:
        hit("dataset", path, revision)  # mteb's per-config reads (corpus, queries, ...) of one repo

    def mteb_config_names(path: str, revision: str | None = None, *args: Any, **kw: Any) -> Any:
        hit("dataset", path, revision)

    def from_pretrained(ident: Any, *args: Any, revision: str | None = None, **kw: Any) -> Any:
        hit("model", ident, revision)  # a local model is not built either: nothing to fetch

    real_load_dataset = datasets.load_dataset
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets, "load_dataset", load_dataset)
        mp.setattr(loaders, "load_dataset", mteb_load_dataset)
        mp.setattr(loaders, "get_dataset_config_names", mteb_config_names)
        for cls_name in ("AutoModel", "AutoTokenizer", "AutoConfig"):
            mp.setattr(getattr(transformers, cls_name), "from_pretrained", from_pretrained)
        yield opened


def _open_everything(cfg: Any) -> None:
    """Run the job's own loading code for encoder, training data and eval tasks, up to the first hub read."""
    from lmk.config.data import DataConfig
    from lmk.data.pairs import load_pairs
    from lmk.eval.suites import build_tasks
    from lmk.model.backbone import load_backbone

    if str(cfg.get("model")) in ("None", "null", ""):
        with contextlib.suppress(_Opened):
            load_backbone(cfg.encoder)
    if cfg.get("data") is not None:
        for src in DataConfig.coerce(cfg.data).sources:
            if (src.get("path", "local") if isinstance(src, dict) else src) == "local":
                continue  # the offline default set: built from installed packages, never the hub
            with contextlib.suppress(_Opened):
                load_pairs(src, max_rows=1)
    if "train" in cfg:  # a training job evaluates through its eval callback (its `eval.in_training` part)
        from lmk.eval.callback import build_eval_callback

        callback = build_eval_callback(cfg.eval, "/nonexistent-run-dir")
        tasks = callback._build_tasks() if callback is not None else []
    else:
        tasks = build_tasks(EvalConfig.from_cfg(cfg.eval))
    for task in tasks:
        for leaf in artifacts._leaves(task):
            with contextlib.suppress(_Opened):
                leaf.load_data()  # local tasks load from memory: nothing is recorded


def _scales() -> list[Any]:
    import yaml

    # mini regenerates its local tasks (about 10 s) and paper composes every job of the paper sweep (about 20 s):
    # slow; the others take seconds
    return [pytest.param(s, marks=pytest.mark.slow) if s in ("mini", "paper") else s
            for s in yaml.safe_load(Path(SPEC).read_text())["scales"]]


@pytest.mark.parametrize("scale", _scales())
def test_download_list_equals_what_every_job_loads(scale: str, empty_hf_cache: Path) -> None:
    jobs = download_cmd.scale_jobs(SPEC, scale)
    assert jobs, f"scale {scale} has no jobs"
    seen: set[str] = set()
    union: dict[tuple, Artifact] = {}  # download_cmd.scale_artifacts's union, from the compositions made here
    for job in jobs:
        label, cfg = f"{job.block}/{job.id}", job.compose()
        for art in required_artifacts(cfg):
            union.setdefault(art.key, art)
        # rows differ in pooling only; jobs with the same encoder / data / eval / model open the same things
        model_set = str(cfg.get("model")) not in ("None", "null", "")
        parts = [k for k in ("data", "eval") if k in cfg] + ([] if model_set else ["encoder"])
        key = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, parts)) + str(model_set)
        if key in seen:
            continue
        seen.add(key)
        # compared per repo and revision (the unit the download fetches and the check looks for); the configs
        # read inside a repo (mteb's corpus/queries/qrels, CodeSearchNet's per-language ones) come with it
        listed = {(a.kind, a.repo_id, a.revision) for a in required_artifacts(cfg)}
        with record_hub_loads() as opened:
            _open_everything(cfg)
        assert listed == opened, f"{scale} {label}: listed but not opened {listed - opened}; opened but not " \
                                 f"listed {opened - listed}"
        if scale == "paper" and label.startswith("train/"):
            repos = {r for _, r, _ in listed}
            assert "answerdotai/ModernBERT-base" in repos and "cfli/bge-full-data" in repos
            assert not any(r.startswith("mteb/") for r in repos)  # paper training evaluates nothing
    if scale == "paper":  # the eval stage's jobs read the suite's datasets, and only those
        stage = {(a.kind, a.repo_id) for a in union.values() if a.task}
        assert ("dataset", "mteb/scifact") in stage and ("dataset", "dwzhu/LongEmbed") in stage


def test_required_artifacts_of_the_paper_suite() -> None:
    cfg = {"encoder": OmegaConf.load(CONF / "encoder" / "modernbert-base.yaml"),
           "data": OmegaConf.load(CONF / "data" / "msmarco-passage.yaml"),
           "eval": OmegaConf.load(CONF / "eval" / "table2-paper.yaml")}
    arts = {a.key: a for a in required_artifacts(cfg)}
    assert arts[("model", "answerdotai/ModernBERT-base", None)].what.startswith("encoder")
    data = arts[("dataset", "cfli/bge-full-data", None)]
    assert data.data_files == "data/msmarco_passage-*.parquet"  # only the MS MARCO files, not the whole repo
    assert arts[("dataset", "mteb/scifact", None)].revision == "d56462d0e63a25450459c4f213e49ffdb866f7f9"
    assert ("dataset", "dwzhu/LongEmbed", "needle") in arts and ("dataset", "dwzhu/LongEmbed", "qmsum") in arts
    # CQADupstackRetrieval is an aggregate: each sub-forum's dataset is listed
    assert sum("CQADupstack" in a.what for a in arts.values()) >= 12
    # offline-only jobs load nothing from the hub
    tiny = {"encoder": OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
            "data": OmegaConf.load(CONF / "data" / "local.yaml"), "eval": OmegaConf.load(CONF / "eval" / "table2-tiny.yaml")}
    assert required_artifacts(tiny) == []
    # evaluating a saved model needs only the eval data, not the encoder config's weights
    saved = {**cfg, "model": "/some/run"}
    assert all(a.kind == "dataset" for a in required_artifacts(saved))


# ------------------------------------------------------------------ the consuming side, offline
def test_offline_check_names_whats_missing_then_passes_with_the_mirror(
        tmp_path: Path, empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmk.eval.replicas import Sizes, write_replicas

    cfg = {"eval": OmegaConf.load(CONF / "eval" / "table2-rehearsal.yaml"),
           "encoder": OmegaConf.load(CONF / "encoder" / "modernbert-base.yaml")}
    with pytest.raises(MissingArtifactsError) as err:
        check_available(cfg)
    msg = str(err.value)
    for repo in ("mteb/scifact", "mteb/msmarco", "mteb/MultiLongDocRetrieval", "dwzhu/LongEmbed",
                 "answerdotai/ModernBERT-base"):
        assert repo in msg
    assert "lmk.download" in msg and "hub.mirror" in msg
    check_available(cfg, offline=False)  # online: the job downloads; nothing is probed

    root = tmp_path / "mirror"
    write_replicas(root, ["SciFact", "MSMARCO"], Sizes(n_queries=2, n_docs=4))
    monkeypatch.setenv("LMK_HUB_MIRROR", str(root))
    with pytest.raises(MissingArtifactsError) as err:
        check_available(cfg)
    msg = str(err.value)
    assert "mteb/scifact" not in msg and "mteb/msmarco" not in msg  # found in the mirror
    assert "dwzhu/LongEmbed" in msg and "answerdotai/ModernBERT-base" in msg
    # a model folder in the mirror is found, and the encoder loads from it (resolve_model)
    model_dir = mirror.repo_dir(root, "model", "answerdotai/ModernBERT-base")
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    assert mirror.resolve_model("answerdotai/ModernBERT-base") == str(model_dir)
    assert mirror.resolve_model("other/model") == "other/model"
    # a dataset in the caches counts too (what `download` without --mirror fills): every config of a shared
    # repo on its own (LongEmbed's five configs; a repo snapshot alone vouches for none of them)
    snap = empty_hf_cache / "hub" / "datasets--dwzhu--LongEmbed" / "snapshots" / "6e346642246bfb4928c560ee08640dc84d074e8c"
    snap.mkdir(parents=True)
    for config in LONGEMBED[:-1]:
        _prepared(empty_hf_cache, "dwzhu/LongEmbed", config)
    write_replicas(root, ["MultiLongDocRetrieval", "LEMBPasskeyRetrieval", "ArguAna", "CQADupstackUnixRetrieval",
                          "AppsRetrieval"], Sizes(n_queries=2, n_docs=4))
    with pytest.raises(MissingArtifactsError, match=r"LongEmbed@6e346642246b \[2wikimqa\]"):
        check_available(cfg)
    _prepared(empty_hf_cache, "dwzhu/LongEmbed", LONGEMBED[-1])
    write_replicas(root, ["MultiLongDocRetrieval", "LEMBPasskeyRetrieval", "ArguAna", "CQADupstackUnixRetrieval",
                          "AppsRetrieval"], Sizes(n_queries=2, n_docs=4))
    check_available(cfg)


def test_download_offline_records_whats_there_and_refuses_to_download(
        tmp_path: Path, empty_hf_cache: Path, capsys: pytest.CaptureFixture) -> None:
    from lmk.eval.replicas import Sizes, write_replicas

    root = tmp_path / "mirror"
    write_replicas(root, ["SciFact"], Sizes(n_queries=2, n_docs=4))
    have = Artifact("dataset", "mteb/scifact", "d56462d0e63a25450459c4f213e49ffdb866f7f9", what="eval task SciFact")
    entries = hub_fetch.download([have], root)
    assert entries[0]["status"] == "mirror" and entries[0]["path"] == "datasets/mteb/scifact"
    manifest = json.loads((root / mirror.MANIFEST).read_text())
    assert any(e["repo_id"] == "mteb/scifact" for e in manifest["artifacts"])
    lacking = Artifact("model", "answerdotai/ModernBERT-base", what="encoder")
    dry = hub_fetch.download([have, lacking], root, dry_run=True)
    assert [e["status"] for e in dry] == ["mirror", "missing"]
    with pytest.raises(MissingArtifactsError, match="needs the network"):
        hub_fetch.download([lacking], root)


@pytest.mark.slow  # composes every job of the paper sweep (13 s); the list it prints is checked fast at the tiny and
# rehearsal scales (test_download_list_equals_what_every_job_loads)
def test_download_cli_dry_run_lists_the_paper_sweep(empty_hf_cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert download_cmd.main([SPEC, "--scale", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "answerdotai/ModernBERT-base" in out and "cfli/bge-full-data" in out and "mteb/scifact" in out
    assert "dry run:" in out and "not on disk" in out


# ------------------------------------------------------------------ replicas through the real task classes
@pytest.fixture(scope="module")
def replica_mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lmk.eval.replicas import Sizes, write_replicas

    root = tmp_path_factory.mktemp("mirror")
    write_replicas(root, sizes=Sizes(n_queries=3, n_docs=6, lengths=(256, 512)))
    return root


def test_replicas_have_the_hub_layout(replica_mirror: Path) -> None:
    import datasets

    scifact = replica_mirror / "datasets" / "mteb" / "scifact"
    assert sorted(datasets.get_dataset_config_names(str(scifact))) == ["corpus", "default", "queries"]
    corpus = datasets.load_dataset(str(scifact), "corpus", split="corpus")
    assert corpus.column_names == ["_id", "title", "text"] and corpus.num_rows == 6
    qrels = datasets.load_dataset(str(scifact), "default", split="test")
    assert qrels.column_names == ["query-id", "corpus-id", "score"] and qrels.num_rows == 3
    mldr = replica_mirror / "datasets" / "mteb" / "MultiLongDocRetrieval"
    assert {"en-corpus", "en-queries", "en-qrels"} <= set(datasets.get_dataset_config_names(str(mldr)))
    needle = datasets.load_dataset(str(replica_mirror / "datasets" / "dwzhu" / "LongEmbed"), name="needle")
    assert set(needle) == {"corpus", "queries", "qrels"}
    assert sorted(set(needle["queries"]["context_length"])) == [256, 512]
    # MTEB v2 and COIR: the same beir layout under their own repos (COIR's owner is CoIR-Retrieval)
    for repo in ("mteb/arguana", "mteb/cqadupstack-unix", "CoIR-Retrieval/apps"):
        folder = replica_mirror / "datasets" / repo
        assert sorted(datasets.get_dataset_config_names(str(folder))) == ["corpus", "default", "queries"], repo
        assert datasets.get_dataset_split_names(str(folder), "default") == ["test"], repo
    code = datasets.load_dataset(str(replica_mirror / "datasets" / "CoIR-Retrieval" / "apps"), "corpus", split="corpus")
    assert code.column_names == ["_id", "title", "text"] and code.num_rows == 6
    assert all(text.startswith(("def ", "async def ")) for text in code["text"])  # code documents, NL queries
    passkey = replica_mirror / "datasets" / "mteb" / "LEMBPasskeyRetrieval"
    assert datasets.get_dataset_split_names(str(passkey), "corpus") == ["test_256", "test_512"]


def test_real_mteb_tasks_evaluate_offline_from_the_replicas(replica_mirror: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from lmk.eval.runner import run_suite
    from lmk.eval.suites import build_tasks
    from lmk.model.embedding import EmbeddingModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LMK_HUB_MIRROR", str(replica_mirror))
    cfg = EvalConfig.from_cfg(OmegaConf.load(CONF / "eval" / "table2-rehearsal.yaml"))
    tasks = build_tasks(cfg)
    import mteb

    for task in tasks:  # the real classes, only their dataset path and revision point at the mirror
        assert type(task).__mro__[1] is type(mteb.get_task(task.metadata.name))
        assert Path(task.metadata.dataset["path"]).is_relative_to(replica_mirror)
        assert task.metadata.dataset["revision"].startswith("lmk-replica-")
    enc = OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml")
    enc.config_overrides.update(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=32)
    model = EmbeddingModel.build(enc, OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"))
    section = run_suite(model, cfg, tmp_path / "cache", tasks=tasks)
    assert set(section["tasks"]) == set(cfg.tasks)
    for name, entry in section["tasks"].items():
        assert 0.0 <= entry["main_score"] <= 1.0, name
        assert all(0.0 <= v <= 1.0 for v in entry["splits"].values())
    assert set(section["tasks"]["LEMBNeedleRetrieval"]["splits"]) == {"test_256", "test_512"}
    assert set(section["groups"]) == {"msmarco-dev", "beir15", "mteb-v2-retrieval", "coir", "mldr-eng", "longembed6"}
    assert {"ArguAna", "CQADupstackUnixRetrieval", "AppsRetrieval"} <= set(section["tasks"])
    # unload + reload (mteb drops instance metadata on unload): the mirror path must survive
    task = tasks[0]
    task.unload_data()
    assert Path(task.metadata.dataset["path"]).is_relative_to(replica_mirror)


def test_rewritten_replica_is_never_read_from_a_stale_datasets_cache(tmp_path: Path) -> None:
    # `datasets` caches a local folder under a hash of its README config block: same file names with other
    # contents would come back from the cache. The replica's content tag is in its file names.
    import datasets

    from lmk.eval.replicas import Sizes, write_replicas

    for n_docs in (4, 5):
        root = tmp_path / f"m{n_docs}"
        write_replicas(root, ["SciFact"], Sizes(n_queries=2, n_docs=n_docs))
        corpus = datasets.load_dataset(str(root / "datasets" / "mteb" / "scifact"), "corpus", split="corpus")
        assert corpus.num_rows == n_docs


def test_training_data_in_the_mirror_is_read_from_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = DataConfig.coerce(OmegaConf.load(CONF / "data" / "msmarco-passage.yaml"))
    monkeypatch.setenv("LMK_HUB_MIRROR", str(tmp_path))
    assert mirror.with_mirrored_sources(data).sources[0].path == "cfli/bge-full-data"  # not mirrored: unchanged
    folder = mirror.repo_dir(tmp_path, "dataset", "cfli/bge-full-data") / "data"
    folder.mkdir(parents=True)
    (folder / "msmarco_passage-00000-of-00001.parquet").write_bytes(b"")
    src = mirror.with_mirrored_sources(data).sources[0]
    assert src.path == str(folder.parent) and src.data_files == "data/msmarco_passage-*.parquet"
    assert src.name == "msmarco-passage"  # the source keeps its name (results and fingerprints name it)
    assert data.sources[0].path == "cfli/bge-full-data"  # the job's own config is not modified


def test_download_goes_through_the_proxy_variables(tmp_path: Path) -> None:
    """Where the network is used (the download on a login node), HTTPS_PROXY is honoured: a stand-in proxy sees
    the CONNECT to the hub for a model and for an eval task's dataset (refused here: no hub is reachable)."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            seen.append(conn.recv(4096).split(b"\r\n", 1)[0])
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k.upper() not in
           ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "NO_PROXY")}
    env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT))
    code = ("from lmk.hub.fetch import fetch, Artifact\n"
            "for art in (Artifact('model', 'answerdotai/ModernBERT-base'),\n"
            "            Artifact('dataset', 'mteb/scifact', 'd56462d0e63a25450459c4f213e49ffdb866f7f9', task='SciFact')):\n"
            "    try:\n        fetch(art, None)\n    except Exception as err:\n        print(type(err).__name__, 'proxy' in repr(err).lower() or '403' in repr(err))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    server.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = proc.stdout.split()
    assert errors[1::2] == ["True", "True"], proc.stdout  # both refused by the proxy, not reached directly
    assert seen and all(line.startswith(b"CONNECT huggingface.co:443") for line in seen)


def test_aggregate_task_leaves_read_the_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmk.eval.suites import build_tasks

    monkeypatch.setenv("LMK_HUB_MIRROR", str(tmp_path))
    folder = mirror.repo_dir(tmp_path, "dataset", "mteb/cqadupstack-gaming")
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("---\n---\n")
    (task,) = build_tasks(EvalConfig(name="x", tasks=["CQADupstackRetrieval"]))
    paths = {leaf.metadata.name: leaf.metadata.dataset["path"] for leaf in task.metadata.tasks}
    assert paths["CQADupstackGamingRetrieval"] == str(folder.resolve())
    assert paths["CQADupstackUnixRetrieval"] == "mteb/cqadupstack-unix"  # not mirrored: the hub id


# ------------------------------------------------------------------ availability per (repo, revision, config)
LONGEMBED = ("needle", "narrativeqa", "qmsum", "summ_screen_fd", "2wikimqa")
LONGEMBED_REV = "6e346642246bfb4928c560ee08640dc84d074e8c"


def _longembed_arts() -> list[Artifact]:
    return [Artifact("dataset", "dwzhu/LongEmbed", LONGEMBED_REV, cfg, what=f"eval task {cfg}", task=f"LEMB-{cfg}")
            for cfg in LONGEMBED]


def _prepared(hf: Path, repo: str, config: str) -> Path:
    """What `datasets` leaves in its cache once a config is prepared (its `.incomplete` folder renamed)."""
    from datasets.naming import camelcase_to_snakecase

    owner, name = repo.split("/")
    folder = hf / "datasets" / f"{owner}___{camelcase_to_snakecase(name)}" / config / "0.0.0" / LONGEMBED_REV
    folder.mkdir(parents=True)
    (folder / "dataset_info.json").write_text("{}")
    return folder


def test_one_config_of_a_repo_on_disk_says_nothing_of_the_others(empty_hf_cache: Path) -> None:
    # the fake cache holds LongEmbed's snapshot folder and ONE prepared config, as after downloading needle
    (empty_hf_cache / "hub" / "datasets--dwzhu--LongEmbed" / "snapshots" / LONGEMBED_REV).mkdir(parents=True)
    _prepared(empty_hf_cache, "dwzhu/LongEmbed", "needle")
    arts = _longembed_arts()
    assert artifacts.locate(arts[0]) is not None
    assert [artifacts.locate(a) for a in arts[1:]] == [None] * 4
    dry = hub_fetch.download(arts, dry_run=True)
    assert [e["status"] for e in dry] == ["datasets cache"] + ["missing"] * 4
    # another revision of the same config is another artifact
    assert artifacts.locate(Artifact("dataset", "dwzhu/LongEmbed", "f" * 40, "needle")) is None
    # the job-side check names the four configs that are not there
    cfg = {"eval": {"tasks": ["LEMBNeedleRetrieval", "LEMBNarrativeQARetrieval", "LEMBQMSumRetrieval"]}}
    with pytest.raises(MissingArtifactsError) as err:
        check_available(cfg)
    assert "[narrativeqa]" in str(err.value) and "[qmsum]" in str(err.value) and "[needle]" not in str(err.value)


def test_a_partial_download_into_the_mirror_is_not_there(tmp_path: Path, empty_hf_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from lmk.eval.replicas import Sizes, write_replicas

    root = tmp_path / "mirror"
    monkeypatch.setenv("LMK_HUB_MIRROR", str(root))
    write_replicas(root, ["LEMBNeedleRetrieval"], Sizes(n_queries=2, n_docs=3, lengths=(256,)))
    needle, qmsum = _longembed_arts()[0], _longembed_arts()[2]
    assert artifacts.locate(needle).startswith("mirror:")
    assert artifacts.locate(qmsum) is None  # the replica holds needle only: per config, as in the cache
    # the fault injection (lmk.hub.fetch.interrupt_download): a download of the repo killed midway
    hub_fetch.interrupt_download(needle, root)
    assert mirror.incomplete(mirror.repo_dir(root, "dataset", "dwzhu/LongEmbed")) is not None
    assert artifacts.locate(needle) is None  # not even through the manifest entry of the earlier write
    # a finished copy with a file cut short later is not there either
    write_replicas(root, ["LEMBNeedleRetrieval"], Sizes(n_queries=2, n_docs=3, lengths=(256,)))
    assert artifacts.locate(needle) is not None
    part = next((mirror.repo_dir(root, "dataset", "dwzhu/LongEmbed") / "needle").glob("corpus-*.parquet"))
    part.write_bytes(part.read_bytes()[:20])
    assert "truncated" in mirror.incomplete(part.parent.parent) and artifacts.locate(needle) is None


def test_an_interrupted_download_into_the_cache_is_not_there(empty_hf_cache: Path) -> None:
    model = Artifact("model", "answerdotai/ModernBERT-base", what="encoder")
    snap = empty_hf_cache / "hub" / "models--answerdotai--ModernBERT-base" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    assert artifacts.locate(model) is None  # config.json alone: the weights never came
    (snap / "model.safetensors").write_bytes(b"w")
    assert artifacts.locate(model).startswith("hub cache:")
    hub_fetch.interrupt_download(model)
    assert artifacts.locate(model) is None
    needle = _longembed_arts()[0]
    hub_fetch._record(None, [{**needle.__dict__, "status": "fetched", "path": str(empty_hf_cache)}])
    assert artifacts.locate(needle).startswith("manifest")
    hub_fetch.interrupt_download(needle)
    assert artifacts.locate(needle) is None


def test_the_rehearsal_mirror_gets_every_config_of_a_shared_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from lmk.eval.replicas import Sizes, write_replicas
    from lmk.sweep.hub_mirror import prepare
    from lmk.sweep.spec import load_spec

    root = tmp_path / "mirror"
    write_replicas(root, ["LEMBNeedleRetrieval"], Sizes(n_queries=2, n_docs=3, lengths=(256,)))
    scale = load_spec(SPEC).scale("rehearsal")
    small = {"n_queries": 2, "n_docs": 3, "lengths": [256]}
    scale = dataclasses.replace(scale, hub_mirror={"path": str(root), "replicas": small})
    written: list[list[str]] = []
    # prepare imports the writer when a scale writes replicas (its fast path): the spy stands where it is imported from
    monkeypatch.setattr("lmk.eval.replicas.write_replicas",
                        lambda r, t, s: written.append(list(t)) or write_replicas(r, t, s))
    prepare(scale, tmp_path)
    longembed = [t for t in written[0] if t.startswith("LEMB") and t != "LEMBPasskeyRetrieval"]
    assert len(longembed) == 5  # the repo was there with needle only: every LongEmbed config is written
    for cfg in LONGEMBED:
        assert mirror.find("dataset", "dwzhu/LongEmbed", root, cfg) is not None, cfg
    # the rehearsal's "interrupted download" fault: the next sweep start writes the repo again
    hub_fetch.interrupt_download(_longembed_arts()[1], root)
    assert mirror.find("dataset", "dwzhu/LongEmbed", root, "needle") is None
    prepare(scale, tmp_path)
    assert all(mirror.find("dataset", "dwzhu/LongEmbed", root, cfg) is not None for cfg in LONGEMBED)


# ------------------------------------------------------------------ make download on a login node
def _make(target: str, env_var: str | None, tmp_path: Path, **extra: str) -> str:
    """`make <target>` with a stand-in interpreter that prints the HF_HUB_OFFLINE the recipe sees."""
    import os
    import stat
    import subprocess

    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/sh\necho "HF_HUB_OFFLINE=[${HF_HUB_OFFLINE-unset}]"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MAKEFLAGS", "MFLAGS")}
    if env_var is not None:
        env["HF_HUB_OFFLINE"] = env_var
    args = ["make", "-s", "-o", "install", target, f"PY={fake}", *(f"{k}={v}" for k, v in extra.items())]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_make_download_is_online_on_a_login_node_and_jobs_stay_offline(tmp_path: Path) -> None:
    assert _make("download", None, tmp_path) == "HF_HUB_OFFLINE=[]"  # unset: online (was 1: a refusal)
    assert _make("download", "", tmp_path) == "HF_HUB_OFFLINE=[]"  # the advice, as typed
    assert _make("download", "1", tmp_path) == "HF_HUB_OFFLINE=[1]"  # asked offline: records what is there
    assert _make("reproduce-table2", None, tmp_path) == "HF_HUB_OFFLINE=[1]"  # jobs: offline by default
    assert _make("reproduce-table2", "", tmp_path) == "HF_HUB_OFFLINE=[]"


def test_the_old_command_names_still_download_with_a_deprecation(tmp_path: Path) -> None:
    """`make prefetch` and `python -m lmk.prefetch` (the download's old names; `eval.prefetch` is the encode
    setting) run the same command, online on a login node, and say the new name; so does lmk.hub.fetch.prefetch."""
    assert _make("prefetch", None, tmp_path) == "HF_HUB_OFFLINE=[]"
    # from outside the checkout, forked from the tests' warm interpreter (tests/forked_cli.py): the checkout's lmk is
    # the one imported (an editable install, or PYTHONPATH as the test run has it), and a fork runs it as typed
    proc = forked_cli.run([sys.executable, "-m", "lmk.prefetch", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--mirror" in proc.stdout, proc.stderr[-2000:]
    assert "deprecated: use python -m lmk.download" in proc.stderr, proc.stderr[-2000:]
    with pytest.warns(DeprecationWarning, match="lmk.hub.fetch.download"):
        assert hub_fetch.prefetch([], dry_run=True) == []


def test_download_offline_advice_names_the_variable(empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(MissingArtifactsError, match=r"HF_DATASETS_OFFLINE=1 forbids .*`HF_DATASETS_OFFLINE= make download"):
        hub_fetch.download([Artifact("model", "answerdotai/ModernBERT-base")])


@pytest.mark.slow
def test_make_download_paper_fails_on_the_network_not_offline(tmp_path: Path) -> None:
    """The login node's first command, through make and lmk.download: with no network (HF_ENDPOINT at a closed
    local port) it fails on the download, and with --keep-going tries every config of a shared repo."""
    import os
    import socket
    import subprocess
    import sys

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: every connection is refused at once
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                             "HF_DATASETS_OFFLINE", "MAKEFLAGS", "MFLAGS")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{port}", HTTPS_PROXY="", HTTP_PROXY="")
    proc = subprocess.run(["make", "-s", "-o", "install", "download", "SCALE=paper", f"PY={sys.executable}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "download(s) failed" in out, out[-3000:]
    assert "forbids downloading" not in out and "HF_HUB_OFFLINE" not in out
    code = ("from lmk.hub.fetch import download, Artifact\n"
            f"arts = [Artifact('dataset', 'dwzhu/LongEmbed', {LONGEMBED_REV!r}, c, task=t) for c, t in "
            "[('needle', 'LEMBNeedleRetrieval'), ('qmsum', 'LEMBQMSumRetrieval'), ('2wikimqa', 'LEMBWikimQARetrieval')]]\n"
            "try:\n    download(arts, keep_going=True)\nexcept Exception as err:\n    print('ERR', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("failed")]
    assert len(lines) == 3 and all("dwzhu/LongEmbed" in line for line in lines), proc.stdout + proc.stderr[-2000:]
    assert "ERR 3 download(s) failed" in proc.stdout


@pytest.mark.slow
def test_download_from_a_local_hub_fetches_every_config_and_never_keeps_a_cut_download(tmp_path: Path) -> None:
    """With HF_ENDPOINT at a stand-in hub (tests/hub_server.py) serving LongEmbed's five configs, a cache-mode
    the download fetches each config (before: the first made the others count as present), the jobs then load
    them offline; a mirror download cut mid-file is not taken as present, and the rerun completes it."""
    import os
    import subprocess
    import sys

    from hub_server import HubServer

    from lmk.eval.replicas import Sizes, write_replicas

    tasks = ["LEMBNeedleRetrieval", "LEMBNarrativeQARetrieval", "LEMBQMSumRetrieval", "LEMBSummScreenFDRetrieval",
             "LEMBWikimQARetrieval"]
    write_replicas(tmp_path / "src", tasks, Sizes(n_queries=2, n_docs=3, lengths=(256,)))
    served = mirror.repo_dir(tmp_path / "src", "dataset", "dwzhu/LongEmbed")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                             "HF_DATASETS_OFFLINE", "LMK_HUB_MIRROR")}
    common = ("from lmk.hub.fetch import download, Artifact, FetchError\nfrom lmk.hub.artifacts import locate, "
              "check_available\nimport mteb\n"
              f"tasks = {tasks!r}\n"
              "arts = [Artifact('dataset', 'dwzhu/LongEmbed', type(mteb.get_task(t)).metadata.dataset['revision'], "
              "type(mteb.get_task(t)).metadata.dataset['name'], task=t) for t in tasks]\n")
    online = common + ("print('STATUS', [e['status'] for e in download(arts)])\n"
                       "print('AGAIN', [e['status'] for e in download(arts)])\n")
    into_mirror = common + (f"try:\n    print('MIRROR', [e['status'] for e in download(arts, {str(tmp_path / 'mirror')!r})])\n"
                            "except FetchError as err:\n    print('CUT', err)\nprint('LOCATED', locate(arts[0]))\n")
    offline = common + (
        "check_available({'eval': {'tasks': tasks}})\n"
        "for t in tasks:\n    mteb.get_task(t).load_data()\nprint('OFFLINE OK')\n")

    def python(code: str) -> str:
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        return run.stdout + run.stderr[-3000:]

    with HubServer({("dataset", "dwzhu/LongEmbed"): served}) as hub:
        env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.url, NO_PROXY="127.0.0.1", PYTHONPATH=str(ROOT))
        out = python(online)
        assert "STATUS ['fetched', 'fetched', 'fetched', 'fetched', 'fetched']" in out, out
        assert "AGAIN ['datasets cache', 'datasets cache', 'datasets cache', 'datasets cache', 'datasets cache']" in out
        hub.cut = {next(served.glob("needle/qrels-*.parquet")).name}  # the connection drops mid-file
        env["HF_HOME"] = str(tmp_path / "hf-empty")  # a mirror fill on a machine whose cache is empty
        out = python(into_mirror)
        assert "CUT 1 download(s) failed" in out and "LOCATED None" in out, out
        assert mirror.incomplete(mirror.repo_dir(tmp_path / "mirror", "dataset", "dwzhu/LongEmbed")) is not None
        hub.cut.clear()
        out = python(into_mirror)  # the rerun completes the copy; the other configs come with the whole repo
        assert "MIRROR ['fetched', 'mirror', 'mirror', 'mirror', 'mirror']" in out, out
        env["HF_HOME"] = str(tmp_path / "hf")
    # the hub is gone: the jobs read what the download left, offline
    env["HF_HUB_OFFLINE"] = "1"
    out = python(offline)
    assert "OFFLINE OK" in out, out
