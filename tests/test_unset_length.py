"""A text cut at a length nobody set is said out loud, once per model: which length, and how to set it. Where the
length was given (LandmarkTokenizer(max_length=...), LandmarkTransformer(max_seq_length=...), `model.max_seq_length
= N`, every saved model) or no text reaches it, nothing is said."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoModel

from lmk.model.landmark import LandmarkTokenizer, LandmarkTransformer

LONG = " ".join(["landmark"] * 700)  # 700 content tokens: past 512 after insertion
SHORT = "a short text"
LOGGER = "lmk.model.landmark.tokenization"


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return AutoModel.from_pretrained(minilm_path)


def test_a_tokenizer_without_max_length_says_once_where_it_cuts(minilm_tokenizer, caplog):
    tok = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32)
    tok([SHORT])
    assert _said(caplog) == []
    out = tok([SHORT, LONG])
    assert out["attention_mask"].sum(dim=1).tolist()[1] == 512
    tok([LONG])
    (line,) = _said(caplog)
    assert "LandmarkTokenizer: a text reached 512 tokens" in line and "pass max_length=N" in line


def test_a_tokenizer_with_max_length_says_nothing(minilm_tokenizer, caplog):
    LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32, max_length=512)([LONG])
    LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32)([LONG], max_length=512)
    assert _said(caplog) == []


def test_a_model_on_the_default_length_says_once_per_model(minilm, minilm_tokenizer, caplog):
    first = LandmarkTransformer(minilm, LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32))
    first.preprocess([LONG])
    first.preprocess([LONG, LONG])
    (line,) = _said(caplog)  # the model's line; its tokenizer, called with the model's length, says nothing
    assert line.startswith("LandmarkTransformer: a text reached 512 tokens")
    assert "set `model.max_seq_length = N`" in line and "up to 512 tokens" in line
    second = LandmarkTransformer(minilm, LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32))
    second.preprocess([LONG])
    assert len(_said(caplog)) == 2


def test_a_model_whose_length_was_set_says_nothing(minilm, minilm_tokenizer, caplog):
    given = LandmarkTransformer(minilm, LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32), max_seq_length=512)
    from_tokenizer = LandmarkTransformer(minilm, LandmarkTokenizer(minilm_tokenizer, "fixed", max_length=256))
    set_later = LandmarkTransformer(minilm, LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32))
    set_later.max_seq_length = 128  # as sentence-transformers' `model.max_seq_length = 128` does
    for model in (given, from_tokenizer, set_later):
        model.preprocess([LONG])
    assert set_later.preprocess([LONG])["attention_mask"].shape[1] == 128
    assert _said(caplog) == []
