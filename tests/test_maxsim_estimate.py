"""The dry run's MaxSim index and search cost (lmk.sweep.cost.index): landmark vectors per text as the landmark
tokenizer lays them out, bytes and FLOPs by hand, and a MaxSim row's eval jobs carry its scoring and its cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from lmk.model import decoder_tokenizer
from lmk.model.landmark import LandmarkTokenizer
from lmk.sweep.cost.estimate import format_estimate, sweep_estimate
from lmk.sweep.cost.index import Layout, compressed_index_bytes, task_index
from lmk.sweep.jobs import plan, rescore_block
from lmk.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
DECODER = str(ROOT / "experiments" / "decoder" / "spec.yaml")


@pytest.mark.parametrize(("chunk", "max_length"), [(8, 64), (64, 512), (32, 128)])
def test_landmark_vectors_per_text_are_what_the_tokenizer_pools(chunk: int, max_length: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(decoder_tokenizer.get_model_path())
    landmarks = LandmarkTokenizer(tokenizer, strategy="fixed", chunk_size=chunk, max_length=max_length)
    layout = Layout("fixed", chunk, "landmarks", 8)
    for words in (1, 5, 8, 9, 30, 63, 64, 100, 200, 1000):  # short, exact chunks, and cut at max_length
        text = " ".join(["word"] * words)
        content = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        pooled = int(landmarks([text])["pool_mask"].sum())
        assert layout.landmarks(content, max_length) == pooled, (words, content)


def test_index_bytes_and_search_flops_by_hand() -> None:
    layout = Layout("fixed", 64, "landmarks", 8)
    # split 1: 10 documents of 130 tokens (3 landmarks), 4 queries of 10 tokens (1); split 2: 5 docs of 64 (1), 2 of 70 (2)
    parts = [(10.0, 130.0), (4.0, 10.0), (5.0, 64.0), (2.0, 70.0)]
    idx = task_index("T", parts, layout, query_max_length=128, passage_max_length=512, flops_per_s=1e3, encode_s=5.0)
    assert idx.documents == 15 and idx.vectors_per_doc == pytest.approx(35 / 15)
    assert idx.index_bytes == 35 * 8 * 4 and idx.bytes_per_doc == pytest.approx(35 * 8 * 4 / 15)
    assert idx.queries == 6 and idx.vectors_per_query == pytest.approx(8 / 6)
    assert idx.search_flops == 2 * 8 * (4 * 1 * 10 * 3 + 2 * 2 * 5 * 1) and idx.search_s == idx.search_flops / 1e3
    tokens = task_index("T", parts, Layout("fixed", 64, "tokens", 8), 128, 512, 1e3, 5.0)
    assert tokens.vectors_per_query == pytest.approx((4 * 10 + 2 * 70) / 6)  # every token state of a query
    assert "T: 15 docs x 2.3 vectors = 75 B/doc, 1.1 KB" in idx.line() and "(encode 0.1 min)" in idx.line()
    # compressed: 35 vectors (35 centroids, auto) of 2 bytes of 2-bit residuals and a one-byte id, the codebook beside
    assert compressed_index_bytes(idx, layout) == 35 * (2 + 1) + 4 * (35 * 8 + 2 * 4 - 1)


def test_a_compressed_rows_layout_reads_its_bits() -> None:
    conf = {"pooling": {"strategy": "fixed", "chunk_size": 32}, "eval": {"scoring": "maxsim-compressed",
                                                                          "maxsim_bits": 4}}
    layout = Layout.of(conf, 768)
    assert layout is not None and layout.compressed and layout.bits == 4
    assert "768-wide vectors as 4-bit residual codes" in layout.describe()
    assert Layout.of({**conf, "eval": {"scoring": "maxsim"}}, 768) == Layout("fixed", 32, "landmarks", 768)
    assert Layout.of({**conf, "eval": {"scoring": "single"}}, 768) is None


def test_a_maxsim_rows_job_scores_its_rows_model_its_own_way() -> None:
    spec = load_spec(DECODER)
    scale = spec.scale("paper")
    rows = [r for r in spec.rows if r.id in ("lmk-fixed-64", "lmk-fixed-64-maxsim")]
    out = Path("/tmp/lmk-plan")
    block = [b for b in plan(scale, rows, out) if b.name == "eval"][0]
    single = {j.row: j for j in block.jobs()}["lmk-fixed-64--mldr-eng"]
    assert not any(j.row.startswith("lmk-fixed-64-maxsim") for j in block.jobs())  # nothing of its own to train
    maxsim = rescore_block(scale, rows, out / "train").jobs()[0]
    assert maxsim.row == "lmk-fixed-64-maxsim" and f"model={out / 'train' / 'lmk-fixed-64'}" in maxsim.overrides
    assert "eval.scoring=maxsim" in maxsim.overrides and not any("scoring" in o for o in single.overrides)
    assert maxsim.compose().eval.scoring == "maxsim" and single.compose().eval.scoring == "single"


def test_the_dry_run_prints_a_maxsim_rows_index_and_search_beside_the_encode(tmp_path: Path) -> None:
    rows = ["lmk-fixed-64", "lmk-fixed-64-maxsim"]
    (train, ev), rates = sweep_estimate(DECODER, "paper", rows, gpu="H100", gpu_check=tmp_path / "absent.json")
    assert list(ev.maxsim) == ["lmk-fixed-64-maxsim"]  # the single-vector row has no index
    mldr = {i.task: i for i in ev.maxsim["lmk-fixed-64-maxsim"]}["MultiLongDocRetrieval"]
    # MLDR-en's documents at 8192 tokens, a landmark every 64: tens of 4096-wide float32 vectors each
    assert 40 < mldr.vectors_per_doc <= 8191 // 65 and mldr.bytes_per_doc == mldr.vectors_per_doc * 4096 * 4
    assert mldr.documents == 200_000 and mldr.search_s > 0 and mldr.encode_s > mldr.search_s
    # the MaxSim row's jobs take their search on top of the single-vector row's (6 shards each, rows in order)
    single, scored = ev.durations[:6], ev.durations[6:]
    assert all(b >= a for a, b in zip(single, scored, strict=True)) and sum(scored) > sum(single)
    text = format_estimate([train, ev], rates)
    assert "MaxSim index and search of lmk-fixed-64-maxsim (a landmark every 64 tokens, 4096 x float32" in text
    assert "MultiLongDocRetrieval: 200,000 docs x" in text and "MaxSim search: exact, float32 on the eval GPU" in text
    # the compressed index's size beside the float32 one: 4096 wide at 2 bits is 1,024 bytes and an id (~16x less)
    line = next(ln for ln in text.splitlines() if "all tasks: index" in ln)
    assert "compressed (2-bit residual codes + centroid ids" in line and "x less)" in line
    assert 14 < float(line.split("(")[-1].split("x less")[0]) < 16.1
    # and at every width a researcher may pick, the default's figure among them, growing with the bits
    widths = next(ln for ln in text.splitlines() if "compressed at each eval.maxsim_bits" in ln)
    sizes = {int(w.split("-bit")[0]): float(w.split()[1]) for w in widths.split("maxsim_bits: ", 1)[1].split(", ")}
    assert list(sizes) == [1, 2, 4, 8] and sizes[1] < sizes[2] < sizes[4] < sizes[8]
    assert f"{sizes[2]:.1f} GB (" in line  # the 2-bit figure is the row's own
    plain = format_estimate(*sweep_estimate(DECODER, "paper", ["lmk-fixed-64"], gpu="H100",
                                            gpu_check=tmp_path / "absent.json"))
    assert "MaxSim" not in plain


def test_the_eval_stage_merge_keeps_a_maxsim_rows_scoring(tmp_path: Path) -> None:
    """A row evaluated by MaxSim in an eval stage says so in its merged results (the table and notebook read it)."""
    from lmk.config.eval import EvalConfig
    from lmk.run.results import update_results
    from lmk.sweep.eval_stage import merge, model_fingerprint

    run, eval_dir = tmp_path / "train" / "r", tmp_path / "eval"
    (run / "export").mkdir(parents=True)
    (run / "export" / "model.safetensors").write_bytes(b"w")
    update_results(run, status="done")
    suite = EvalConfig.from_cfg({"name": "s", "tasks": ["A", "B"], "groups": {"g1": ["A"], "g2": ["B"]}})
    for shard, task, seconds in (("g1", "A", 1.5), ("g2", "B", 2.0)):
        update_results(eval_dir / f"r--{shard}", status="done", config={"model_fingerprint": model_fingerprint(run)},
                       eval={"tasks": {task: {"main_score": 0.5}}, "scoring": "maxsim", "maxsim_query": "landmarks",
                             "maxsim_search_seconds": seconds})
    assert merge(["r"], tmp_path / "train", eval_dir, suite, {"g1": ["A"], "g2": ["B"]}) == {"r": {"g1": "done",
                                                                                                  "g2": "done"}}
    merged = json.loads((run / "results.json").read_text())["eval"]
    assert merged["scoring"] == "maxsim" and merged["maxsim_query"] == "landmarks"
    assert merged["maxsim_search_seconds"] == 3.5 and merged["groups"] == {"g1": 0.5, "g2": 0.5}
