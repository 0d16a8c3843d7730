"""Landmark statistics (lmk.data.landmarks) on hand-made texts whose answers are known, counted by the model's own
landmark tokenizer."""

from __future__ import annotations

import pytest

from lmk.data.landmarks import LandmarkTally, count_landmarks, flat_summary, landmark_stats
from lmk.model.landmark.tokenization import LandmarkTokenizer

HUNDRED = " ".join(["cat"] * 100)  # 100 MiniLM tokens
CODE = "def f(x):\n    return x\n\n\nclass A:\n    pass\n"  # indented: the split keeps under 90% of it


def test_the_hundred_token_text_fits_four_landmarks_at_chunk_32(minilm_tokenizer):
    assert len(minilm_tokenizer(HUNDRED, add_special_tokens=False)["input_ids"]) == 100
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="fixed", chunk_size=32, max_length=512)
    assert landmark_stats(tok, [HUNDRED, "cat"], 512) == {
        "texts": 2, "landmarks": {"mean": 2.5, "median": 2.5, "min": 1, "max": 4},
        "single_landmark_share": 0.5, "truncated_share": 0.0}


def test_truncation_is_a_layout_that_did_not_fit_not_a_full_row(minilm_tokenizer):
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="fixed", chunk_size=32, max_length=512)
    # [CLS] + 100 tokens + 4 landmarks = 105: exactly full at 105, cut at 104 (its last landmark lost)
    full = count_landmarks(tok, [HUNDRED], 105)
    cut = count_landmarks(tok, [HUNDRED], 104)
    assert (full.landmarks.tolist(), full.truncated.tolist()) == ([4], [False])
    assert (cut.landmarks.tolist(), cut.truncated.tolist()) == ([3], [True])
    # at 60 only the first landmark survives: a single-landmark text, truncated
    assert landmark_stats(tok, [HUNDRED], 60)["single_landmark_share"] == 1.0


def test_sentence_strategy_counts_the_replaced_splits_at_evaluation_only(minilm_tokenizer):
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="sentence", max_length=512)
    texts = ["One sentence only.", "Two here. And two.", CODE]
    counts = count_landmarks(tok, texts, 512)
    # one sentence is its own split (all of its characters kept): one landmark, not replaced; the code's split
    # is replaced by the whole text: one landmark instead of one per line
    assert counts.landmarks.tolist() == [1, 2, 1] and counts.replaced.tolist() == [False, False, True]
    train = count_landmarks(tok, texts, 512, train=True)
    assert train.landmarks[2] > 1 and not train.replaced.any()  # training keeps the line split
    assert landmark_stats(tok, texts, 512)["split_replaced_share"] == pytest.approx(0.3333)


def test_a_strategy_without_landmarks_reports_truncation_only(minilm_tokenizer):
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="none", max_length=512)
    assert landmark_stats(tok, [HUNDRED, "cat"], 50) == {"texts": 2, "landmarks": None, "truncated_share": 0.5}


def test_counting_training_layouts_leaves_the_training_draws_alone(minilm_tokenizer):
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="variable", chunk_size=32, train_chunk_sizes=(10, 50))
    before = tok([HUNDRED] * 8, train=True)["pool_mask"]  # 10 landmarks per text of size 10, 2 of size 50
    tok.reseed(0)
    landmarks = count_landmarks(tok, [HUNDRED] * 8, 512, train=True).landmarks
    assert set(landmarks.tolist()) <= {2, 10} and len(set(landmarks.tolist())) == 2  # both sizes drawn
    assert tok([HUNDRED] * 8, train=True)["pool_mask"].equal(before)  # the generator did not move


def test_the_tally_keeps_the_first_texts_of_each_key_and_says_how_many_it_saw(minilm_tokenizer):
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="fixed", chunk_size=32, max_length=512)
    tally = LandmarkTally(max_texts=4)
    tally.add(("Task", "test", "passage"), tok, [HUNDRED] * 3, 512)
    tally.add(("Task", "test", "passage"), tok, ["cat"] * 3, 512)
    tally.add(("Task", "test", "query"), tok, ["cat"], 512)
    tally.add(("Other", "test", "query"), tok, ["cat"], 512)
    figures = tally.pop("Task")
    assert figures["test"]["passage"]["texts"] == 4 and figures["test"]["passage"]["texts_seen"] == 6
    assert figures["test"]["passage"]["landmarks"]["mean"] == pytest.approx((3 * 4 + 1) / 4)
    assert "texts_seen" not in figures["test"]["query"] and tally.pop("Task") == {}
    assert flat_summary("x", figures)["x/test/passage/landmarks/min"] == 1
    assert "x/test/query/landmarks" not in flat_summary("x", {"test": {"query": {"landmarks": None}}})
