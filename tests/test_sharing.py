"""Sharing a run as a user types it: `python -m lmk.train experiment=tiny`, then `python -m lmk.export <run> --out
<folder>` (a card without scores), `lmk.evaluate model=<run> record=true` (the scores become the run's), an export
whose card carries them. One folder, one default: lmk, sentence-transformers and mteb embed it alike. The card says
only what is true; the bytes do not depend on HF_HUB_OFFLINE; a licence travels; a broken folder, a failed export
or a wrong hub token fail in one line and leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import forked_cli
import numpy as np
import pytest
import yaml
from hub_server import HubServer
from hydra import compose, initialize_config_dir

import lmk
import lmk.eval.command as evaluate
from lmk.config import ConfigError
from lmk.eval.tasks import LOCAL_TASK_CLASSES
from lmk.model.exported import ExportFolderError, load_exported
from lmk.sharing.publish import PublishError, write_folder

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = ["The sky is blue. The grass is green. Landmarks summarise the chunk before them. " * 12,
        "A short one.", "word " * 700]
EVAL = ["eval=local", "eval.tasks=[LocalShort,LocalPasskey]", "~eval.groups", "+eval.groups={loc:[LocalShort]}",
        "eval.short_n_queries=20", "eval.short_n_docs=60", "eval.n_docs=10", "eval.n_queries=4", "eval.lengths=[256]",
        "eval.device=cpu", "eval.workers=0", "eval.show_progress=false"]
TOKEN = "hf_stand_in_write_token"


def _env(**extra: str) -> dict[str, str]:
    # An offline command keeps TRANSFORMERS_OFFLINE as it is (HF_HUB_OFFLINE=1 makes it offline either way, and lmk
    # names HF_HUB_OFFLINE first): an unchanged environment lets forked_cli fork the command from its warm process.
    # An online one drops it (lmk.hub.offline would read it). PYTHONPATH is kept where this checkout's lmk is the one
    # imported without it.
    online = extra.get("HF_HUB_OFFLINE", "1") != "1"
    drop = ("HF_HUB_OFFLINE", "HF_TOKEN", *(("TRANSFORMERS_OFFLINE",) if online else ()))
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if Path(lmk.__file__).resolve().parents[1] != ROOT or os.environ.get("PYTHONPATH", str(ROOT)) != str(ROOT):
        env["PYTHONPATH"] = str(ROOT)
    return {**env, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", **extra}


def _lmk(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", *args], cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The README's one training run, as typed (eval=none)."""
    folder = tmp_path_factory.mktemp("train") / "tiny"
    proc = _lmk(["lmk.train", "experiment=tiny", f"hydra.run.dir={folder}"], ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads((folder / "results.json").read_text())["status"] == "done"
    return folder


@pytest.fixture(scope="module")
def scored(run, tmp_path_factory) -> Path:
    """A copy of the run, evaluated with record=true (its own results.json then holds the scores)."""
    folder = tmp_path_factory.mktemp("scored") / "tiny"
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("checkpoints"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"model={folder}", "record=true", *EVAL])
    evaluate.run(cfg, run_dir=folder.parent / "eval")
    return folder


def test_an_unevaluated_run_exports_as_typed(run, tmp_path) -> None:
    proc = _lmk(["lmk.export", str(run), "--out", "shared/tiny"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "shared" / "tiny"
    card = (out / "README.md").read_text()
    assert "has not been evaluated: the card carries no scores" in card
    assert "python -m lmk.evaluate model=<run dir> record=true" in card and "fine-tuned (not evaluated)" in card
    assert "- trained with: single-vector InfoNCE (tau " in card  # the objective (train.objective) that trained it
    assert not (out / "results").exists() and "model-index" not in card
    assert 'SentenceTransformer("shared/tiny", trust_remote_code=True)' in card
    assert str(tmp_path) not in card and str(run) not in card  # no path of this machine on the card
    assert (out / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def test_an_unfinished_run_is_refused_with_the_command_that_fixes_it(run, tmp_path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("checkpoints"))
    record = json.loads((folder / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps({**record, "status": "interrupted"}))
    with pytest.raises(PublishError, match=r"rerun its `python -m lmk.train \.\.\.` command"):
        write_folder(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="record=true"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            evaluate.validate_config(compose(config_name="evaluate",
                                             overrides=[f"model={run / 'export'}", "record=true", *EVAL]))


def test_recorded_scores_reach_the_card_under_their_own_names(scored, tmp_path) -> None:
    section = json.loads((scored / "results.json").read_text())["eval"]
    assert set(section["tasks"]) == {"LocalShort", "LocalPasskey"} and (scored / "per_query.json").is_file()
    out = write_folder(scored, tmp_path / "shared" / "scored").folder
    card = (out / "README.md").read_text()
    head = yaml.safe_load(card.split("---\n")[1])
    assert "model-index" not in head  # lmk's local tasks are no mteb datasets: not in the hub's model-index
    assert "| LocalShort (lmk's local task) | test | nDCG@10 |" in card
    assert "| LocalPasskey (lmk's local task) | test_256 | Acc@1 |" in card
    for wrong in ("MTEB LocalShort", "lmk/LocalShort", "main_score", "MTEB (lmk)"):
        assert wrong not in card
    assert str(tmp_path) not in card.split("## Use")[1]  # the usage lines name no path of this machine
    assert {p.stem for p in (out / "results").glob("*/*/*.json")} >= set(LOCAL_TASK_CLASSES) & set(section["tasks"])


def test_one_folder_one_default(scored, tmp_path) -> None:
    """load_exported, sentence-transformers and mteb's loader (ModelMeta.load_model) embed the published folder alike,
    each with its defaults; the length is longer than the training one, so a second default would show."""
    import mteb
    from sentence_transformers import SentenceTransformer

    from lmk.sharing import model_meta

    out = write_folder(scored, tmp_path / "published").folder
    settings = json.loads((out / "landmark_config.json").read_text())
    assert settings["max_seq_length"] == 512 > 48  # the scored length (clamped to 512 positions), not training's
    assert settings["lmk"]["scored_at"] == {"query_max_length": 512, "passage_max_length": 512}
    lmk_model = load_exported(out)
    st = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    encoder = model_meta(out).load_model(workers=0)  # mteb's ModelMeta with lmk's loader, as the card shows
    task = LOCAL_TASK_CLASSES["LocalShort"].metadata
    by_mteb = encoder.encode([{"text": DOCS}], task_metadata=task, hf_split="test", hf_subset="default",
                             prompt_type=mteb.types.PromptType.document)
    ref = lmk_model.encode(DOCS)
    assert lmk_model.truncation_count >= 1  # the long text is cut: the length matters
    np.testing.assert_allclose(st.encode(DOCS, convert_to_numpy=True), ref, atol=1e-6)
    np.testing.assert_allclose(by_mteb, ref, atol=1e-6)
    queries = st.encode_query(DOCS[:2], convert_to_numpy=True)
    by_mteb_q = encoder.encode([{"text": DOCS[:2]}], task_metadata=task, hf_split="test", hf_subset="default",
                               prompt_type=mteb.types.PromptType.query)
    np.testing.assert_allclose(queries, lmk_model.encode(DOCS[:2], side="query"), atol=1e-6)
    np.testing.assert_allclose(by_mteb_q, queries, atol=1e-6)


@pytest.mark.slow  # two exports in fresh interpreters, one with HF_HUB_OFFLINE and one without
def test_export_bytes_do_not_depend_on_hf_hub_offline(scored, tmp_path) -> None:
    folders = []
    for offline in ("1", "0"):  # offline, and not: lmk's tiny run needs nothing from the hub either way
        cwd = tmp_path / f"offline-{offline}"
        cwd.mkdir()
        proc = _lmk(["lmk.export", str(scored), "--out", "shared/m"], cwd, HF_HUB_OFFLINE=offline)
        assert proc.returncode == 0, proc.stderr[-3000:]
        folders.append(cwd / "shared" / "m")
    files = [sorted(p.relative_to(f) for p in f.rglob("*") if p.is_file()) for f in folders]
    assert files[0] == files[1]
    differ = [str(p) for p in files[0] if (folders[0] / p).read_bytes() != (folders[1] / p).read_bytes()]
    assert differ == []
    tokenizer = json.loads((folders[0] / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local"} & set(tokenizer)


def _break(folder: Path, how: str) -> str:
    """Damage an export as a user's copy could be damaged; returns the file the error must name."""
    if how == "missing weights":
        (folder / "model.safetensors").unlink()
        return "model.safetensors is missing"
    if how == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
        return "model.safetensors is truncated"
    if how == "unknown module":
        modules = json.loads((folder / "modules.json").read_text())
        modules[1]["type"] = "poolers.NoSuchPooling"
        (folder / "modules.json").write_text(json.dumps(modules))
        return "modules.json"
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    return "config.json does not match model.safetensors"


@pytest.mark.parametrize("how", ["missing weights", "truncated weights", "unknown module", "wrong shape"])
def test_a_broken_folder_fails_in_one_line(run, tmp_path, how) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(run / "export", folder)
    named = _break(folder, how)
    with pytest.raises(ExportFolderError) as err:
        load_exported(folder)
    message = str(err.value)
    assert "\n" not in message and named in message and "python -m lmk.export" in message
    if how != "truncated weights":
        return
    # the command says the same in its two lines (what, fix), no traceback
    proc = _lmk(["lmk.evaluate", f"model={folder}", *EVAL, f"hydra.run.dir={tmp_path / 'eval'}"], ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and named in proc.stderr, proc.stderr[-2000:]


def test_a_failed_export_leaves_no_folder(scored, tmp_path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(scored, folder)
    record = json.loads((folder / "results.json").read_text())
    record["eval"]["cache_dir"] = str(folder / "mteb_cache")
    (folder / "results.json").write_text(json.dumps(record))
    shutil.rmtree(folder / "mteb_cache")  # its scores' files are gone: found only once the model is written
    with pytest.raises(PublishError, match="no mteb result"):
        write_folder(folder, tmp_path / "shared" / "m")
    assert list((tmp_path / "shared").iterdir()) == []  # neither the folder nor a partial one


def test_a_wrong_token_is_refused_before_the_model_loads(run, tmp_path) -> None:
    with HubServer(root=tmp_path / "hub", token=TOKEN) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "hf_not_the_right_one"}
        proc = _lmk(["lmk.export", str(run), "--push-to-hub", "lmk-test/wrong-token"], tmp_path, **env)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "refused the token (HTTP 401)" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2
        assert hub.log == [("GET", "/api/whoami-v2")] and hub.commits == []


def test_only_mteb_tasks_enter_the_model_index(scored) -> None:
    """A real MTEB task keeps its hub dataset id and its metric by name; lmk's local task stays out."""
    import mteb
    from mteb.results import TaskResult

    from lmk.sharing.card import eval_results

    local = TaskResult.from_disk(next((scored / "mteb_cache").rglob("LocalShort.json")))
    real = local.model_copy(update={"task_name": "SciFact"})
    entries = eval_results([local, real])
    assert [e.dataset_name for e in entries] == ["MTEB SciFact (default)"]
    assert entries[0].dataset_type == mteb.get_task("SciFact").metadata.dataset["path"]
    assert (entries[0].metric_type, entries[0].metric_name) == ("ndcg_at_10", "nDCG@10")


OLD_PATHS = [("lmk.eval.publish", "write_folder", "lmk.sharing.publish"),
             ("lmk.eval.card", "eval_results", "lmk.sharing.card"),
             ("lmk.eval.mteb_model", "model_meta", "lmk.sharing.mteb_model"),
             ("lmk.eval.export_command", "main", "lmk.sharing.command"),
             ("lmk.sweep.publish", "publish_rows", "lmk.sharing.push_rows"),
             ("lmk.model.st_folder", "export_sentence_transformers", "lmk.sharing.st_folder"),
             ("lmk.model.st_folder", "load_exported", "lmk.model.exported"),
             ("lmk.eval", "model_meta", "lmk.sharing"),
             ("lmk.model", "export_sentence_transformers", "lmk.sharing")]


@pytest.mark.parametrize(("old", "name", "new"), OLD_PATHS, ids=[f"{o}.{n}" for o, n, _ in OLD_PATHS])
def test_an_old_sharing_path_still_resolves_with_a_deprecation(old, name, new) -> None:
    """Sharing moved to lmk.sharing (the reader of a folder to lmk.model.exported): a user's old import still gets
    the same object, with one DeprecationWarning naming where it lives now."""
    import importlib

    with pytest.warns(DeprecationWarning, match=rf"^{old}\.{name} is deprecated: use {new}\.{name}$") as caught:
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(new), name) and len(caught) == 1
    with pytest.raises(AttributeError):
        importlib.import_module(old).no_such_name  # noqa: B018 - only moved names resolve


def test_the_legacy_pooling_name_is_the_loader_of_old_folders_only() -> None:
    """`lmk.export.LandmarkPooling` (what old exports' modules.json names) is the loader of their pooling module,
    with no warning: it is not the LMK pooler and not one of lmk.export's names."""
    import importlib
    import warnings

    from lmk.model.exported import LegacyPoolerLoader
    from lmk.model.landmark import LMKPooling

    export = importlib.import_module("lmk.export")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert export.LandmarkPooling is LegacyPoolerLoader and LegacyPoolerLoader is not LMKPooling
    assert "LandmarkPooling" not in export.__all__
    with pytest.warns(DeprecationWarning, match="use lmk.model.exported.LegacyPoolerLoader"):
        assert importlib.import_module("lmk.model.st_folder").LegacyExportPooling is LegacyPoolerLoader
