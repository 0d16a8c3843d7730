"""`python -m lmk.data.stats` on a small file and on a generated corpus."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.data import stats  # noqa: E402


def test_stats_on_jsonl(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    rows = [{"query": "what is a cat", "pos": ["a cat is an animal"], "neg": ["dogs bark"] * (i % 3)} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert stats.main([str(path), "--json", "--cache-dir", str(tmp_path / "hf")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 6 and out["queries_without_negatives"] == 2
    assert out["negatives_per_query"]["max"] == 2
    q = out["tokens"]["minilm"]["query"]
    assert q["p50"] == 6  # [CLS] what is a cat [SEP]
    assert out["tokens"]["minilm"]["pos"]["max"] == 7


def test_stats_on_corpus(capsys):
    assert stats.main(["passkey", "--sample", "5"]) == 0
    text = capsys.readouterr().out
    assert "LocalPasskey/test_256" in text and "docs: 100" in text


def test_landmark_statistics_of_a_training_source_under_a_pooling(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    rows = [{"query": "what is a cat", "pos": ["a cat is an animal"], "neg": ["dogs bark"]} for _ in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert stats.main([str(path), "--json", "--cache-dir", str(tmp_path / "hf"), "--pooling", "lmk-fixed",
                       "--set", "chunk_size=2", "--passage-max-length", "8", "--landmark-rows", "2"]) == 0
    figures = json.loads(capsys.readouterr().out)["landmarks"]["lmk-fixed-2"]["minilm"]
    assert figures["rows"] == 2  # --landmark-rows: the first 2 of the 3 rows
    # query: 4 tokens, a landmark after every 2: 2 landmarks, [CLS] + 4 + 2 = 7 tokens, not cut at 128
    assert figures["query"]["landmarks"] == {"mean": 2.0, "median": 2.0, "min": 2, "max": 2}
    # positive: 5 tokens -> 3 landmarks in 9 tokens, cut at 8 (the last landmark lost); negative: 2 tokens, 1
    passage = figures["passage"]
    assert passage["texts"] == 4 and passage["landmarks"] == {"mean": 1.5, "median": 1.5, "min": 1, "max": 2}
    assert passage["single_landmark_share"] == 0.5 and passage["truncated_share"] == 0.5


def test_landmark_statistics_of_a_corpus_under_the_sentence_strategy(capsys):
    assert stats.main(["longdocs", "--sample", "5", "--pooling", "lmk-sentence"]) == 0
    text = capsys.readouterr().out
    assert "lmk-sentence:" in text and "split_replaced_share:" in text and "single_landmark_share:" in text


def test_the_sentence_strategy_keeps_its_sentences_on_the_prose_task(capsys):
    """The prose task is where the authors' evaluation rule (a split keeping under 90% of the characters becomes the
    whole text) leaves the split alone: many landmarks per document at evaluation, not the one of the code task."""
    assert stats.main(["prose", "--json", "--sample", "20", "--pooling", "lmk-sentence",
                       "--passage-max-length", "512"]) == 0
    doc = json.loads(capsys.readouterr().out)["landmarks"]["lmk-sentence"]["minilm"]["LocalProse/test"]["doc"]
    assert doc["split_replaced_share"] == 0.0 and doc["single_landmark_share"] == 0.0
    assert doc["landmarks"]["min"] > 1 and doc["landmarks"]["mean"] > 10


def test_landmark_statistics_lay_texts_out_with_the_poolings_placement():
    """Statistics build the run's own landmark tokenizer (LandmarkTokenizer.from_pooling), placement included: the
    authors' placement puts a landmark before each chunk, not after it."""
    import torch

    from lmk.model.embedding import make_tokenizer

    tok = stats.load_tokenizer("minilm")
    authors_cfg = stats.load_pooling("lmk-fixed-authors")
    authors, after = stats.landmark_tokenizer(tok, authors_cfg), stats.landmark_tokenizer(tok, stats.load_pooling("lmk-fixed"))
    assert authors.placement == "authors" and after.placement == "after"
    text = ["landmarks summarise the chunk of text that comes before them in a document"]
    laid_out = authors(text, max_length=64)
    assert not torch.equal(laid_out["pool_mask"], after(text, max_length=64)["pool_mask"])
    model_tok = make_tokenizer(tok, authors_cfg, 64, 0)  # as training and evaluation build it
    for key in ("input_ids", "pool_mask"):
        assert torch.equal(model_tok(text, max_length=64)[key], laid_out[key])


def test_corpus_landmark_statistics_report_the_layouts_capacity(capsys):
    assert stats.main(["prose", "--json", "--sample", "3", "--pooling", "lmk-fixed", "--passage-max-length", "256"]) == 0
    doc = json.loads(capsys.readouterr().out)["landmarks"]["lmk-fixed-32"]["minilm"]["LocalProse/test"]["doc"]
    assert doc["max_landmarks"] == 256 // 32 + 2 >= doc["landmarks"]["max"]
