"""LandmarkTokenizer and sentence splitting: exact layouts, a naive reference, invariants, bad input."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmk.model.landmark.sentences import split_sentences
from lmk.model.landmark.tokenization import STRATEGIES, LandmarkTokenizer

CLS, SEP, PAD = 101, 102, 0
FIVE = "hello world foo bar cat"  # exactly five MiniLM word tokens
A, B, C, D, E = 7592, 2088, 29379, 3347, 4937
WORDS = [
    "hello",
    "world",
    "foo",
    "bar",
    "cat",
    "unbelievable",
    "Dr.",
    "a",
    "I",
    "42",
    "ok.",
    "yes!",
    "no?",
    "é",
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rows(out: dict[str, torch.Tensor]) -> list[tuple[list[int], list[bool]]]:
    """Unpadded (ids, pooled) of each row, whatever the padding side."""
    result = []
    for ids, mask, pool in zip(out["input_ids"], out["attention_mask"], out["pool_mask"]):
        keep = mask.bool()
        result.append((ids[keep].tolist(), pool[keep].tolist()))
    return result


def content_ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def left_padded(tok):
    other = copy.deepcopy(tok)  # the fixture is session-wide: never flip its padding side
    other.padding_side = "left"
    return other


# ------------------------------------------------------------------------------ naive reference
def _chunks(ids: list[int], g: int) -> list[list[int]]:
    return [ids[i : i + g] for i in range(0, len(ids), g)]


def reference(
    tok,
    text: str,
    strategy: str,
    g: int,
    budget: int,
    cls: int,
    lmk: int,
    splitter: str = "koehn",
    cap: int | None = None,
    train: bool = False,
):
    """Python-loop statement of docs/method.md sections 1 and 7: insert everything, then truncate, then fix."""
    if strategy == "sentence":
        sentences = split_sentences(text, "en", splitter)
        if not train and sentences and len(" ".join(sentences)) < 0.9 * len(text.strip()):
            sentences = [text.strip()]  # the authors' eval script keeps a lossy split's text whole
        pieces = [content_ids(tok, s) if s else [] for s in sentences]
        chunks = [c for p in pieces for c in ((_chunks(p, cap) or [[]]) if cap else [p])] or [[]]
    else:
        ids = content_ids(tok, text)
        chunks = _chunks(ids, g) or [[]]
    if strategy in ("none", "every_k"):
        seq = [cls] + content_ids(tok, text)[: budget - 2] + [lmk]
        pool = [strategy == "every_k" and i % g == 0 for i in range(len(seq))]
        return seq, pool
    if strategy == "multi_cls":
        seq, pool = [], []
        for chunk in chunks:
            seq += [cls] + chunk
            pool += [True] + [False] * len(chunk)
        # the authors' eval script: cut to max_length - 1, then the closing [SEP]
        return seq[: budget - 1] + [lmk], pool[: budget - 1] + [False]
    seq, pool = [cls], [False]
    for chunk in chunks:
        seq += chunk + [lmk]
        pool += [False] * len(chunk) + [True]
    seq, pool = seq[:budget], pool[:budget]
    if not any(pool):
        seq[-1], pool[-1] = lmk, True
    return seq, pool


# ------------------------------------------------------------------------------- exact layouts
def test_fixed_layout_five_tokens_chunk_two(minilm_tokenizer):
    assert content_ids(minilm_tokenizer, FIVE) == [A, B, C, D, E]
    out = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=2)([FIVE])
    assert out["input_ids"].tolist() == [[CLS, A, B, SEP, C, D, SEP, E, SEP]]
    assert out["pool_mask"].tolist() == [[False, False, False, True, False, False, True, False, True]]
    assert out["attention_mask"].tolist() == [[1] * 9]
    assert out["input_ids"].dtype == torch.long and out["attention_mask"].dtype == torch.long
    assert out["pool_mask"].dtype == torch.bool


def test_fixed_exact_multiple_has_one_final_landmark(minilm_tokenizer):
    out = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=2)(["hello world foo bar"])
    assert out["input_ids"].tolist() == [[CLS, A, B, SEP, C, D, SEP]]


def test_truncation_after_insertion_keeps_trailing_content(minilm_tokenizer):
    out = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=2, max_length=8)([FIVE])
    assert out["input_ids"].tolist() == [[CLS, A, B, SEP, C, D, SEP, E]]


def test_truncation_overwrites_last_token_when_no_landmark_survives(minilm_tokenizer):
    out = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=10, max_length=5)([FIVE])
    assert out["input_ids"].tolist() == [[CLS, A, B, C, SEP]]
    assert out["pool_mask"].tolist() == [[False, False, False, False, True]]
    # the smallest budget: [CLS] one token [LMK]
    out = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32, max_length=3)([FIVE])
    assert out["input_ids"].tolist() == [[CLS, A, SEP]]


def test_empty_text_is_cls_landmark_and_batch_is_padded(minilm_tokenizer):
    for strategy in ("fixed", "variable", "sentence"):
        out = LandmarkTokenizer(minilm_tokenizer, strategy, chunk_size=2, max_sentence_tokens=2)(
            [FIVE, "", "   "]
        )
        assert out["input_ids"].tolist()[1:] == [[CLS, SEP] + [PAD] * 7] * 2, strategy
        assert out["pool_mask"][1].tolist() == [False, True] + [False] * 7
        assert out["attention_mask"][1].tolist() == [1, 1] + [0] * 7


def test_none_matches_the_tokenizers_own_call(minilm_tokenizer):
    texts = [FIVE, "", "a much longer text " * 20]
    ours = LandmarkTokenizer(minilm_tokenizer, "none", max_length=16)(texts)
    theirs = minilm_tokenizer(texts, truncation=True, max_length=16, padding=True, return_tensors="pt")
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["attention_mask"], theirs["attention_mask"])
    assert not ours["pool_mask"].any()


def test_every_k_marks_positions_without_inserting(minilm_tokenizer):
    out = LandmarkTokenizer(minilm_tokenizer, "every_k", chunk_size=3)([FIVE, "hello"])
    assert out["input_ids"].tolist() == [[CLS, A, B, C, D, E, SEP], [CLS, A, SEP, PAD, PAD, PAD, PAD]]
    assert out["pool_mask"].int().tolist() == [[1, 0, 0, 1, 0, 0, 1], [1, 0, 0, 0, 0, 0, 0]]


def test_multi_cls_layout(minilm_tokenizer):
    out = LandmarkTokenizer(minilm_tokenizer, "multi_cls", chunk_size=2)([FIVE, ""])
    assert out["input_ids"].tolist() == [[CLS, A, B, CLS, C, D, CLS, E, SEP], [CLS, SEP] + [PAD] * 7]
    assert out["pool_mask"].int().tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0], [1] + [0] * 8]


def test_sentence_layout_and_long_sentence_split(minilm_tokenizer):
    text = "Hello world. Foo bar cat hello world. Yes"
    s1, s2, s3 = (
        content_ids(minilm_tokenizer, s) for s in ("Hello world.", "Foo bar cat hello world.", "Yes")
    )
    assert len(s1) == 3 and len(s2) == 6 and len(s3) == 1
    out = LandmarkTokenizer(minilm_tokenizer, "sentence", max_sentence_tokens=4)([text])
    expected = [CLS, *s1, SEP, *s2[:4], SEP, *s2[4:], SEP, *s3, SEP]
    assert out["input_ids"].tolist() == [expected]
    assert out["pool_mask"][0].nonzero().flatten().tolist() == [i for i, t in enumerate(expected) if t == SEP]


def test_sentence_without_punctuation_equals_fixed(minilm_tokenizer):
    text = "one two three four five six seven eight nine ten eleven"
    sent = LandmarkTokenizer(minilm_tokenizer, "sentence", max_sentence_tokens=4)([text])
    fixed = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=4)([text])
    assert torch.equal(sent["input_ids"], fixed["input_ids"])
    assert torch.equal(sent["pool_mask"], fixed["pool_mask"])


def test_sentence_long_text_prefix_path_matches_reference(minilm_tokenizer):
    # long texts go through the character-budget shortcut; the result must not change
    texts = [
        "".join(f"Sentence {i} is here. " for i in range(400)),
        ("International" + " " * 30 + ". ") * 50,  # few tokens per character: needs the second call
        "Short one. Two.",
        "x" * 3000,
    ]
    for splitter in ("koehn", "sentencex"):
        lt = LandmarkTokenizer(
            minilm_tokenizer, "sentence", max_length=40, sentence_splitter=splitter, max_sentence_tokens=8
        )
        for text, (ids, pool) in zip(texts, rows(lt(texts))):
            assert (ids, pool) == reference(
                minilm_tokenizer, text, "sentence", 8, 40, CLS, SEP, splitter, cap=8
            )


def test_left_padding_mirrors_right_padding(minilm_tokenizer):
    texts = [FIVE, "", "hello world"]
    for strategy in STRATEGIES:
        right = LandmarkTokenizer(minilm_tokenizer, strategy, chunk_size=2)(texts)
        lt = LandmarkTokenizer(left_padded(minilm_tokenizer), strategy, chunk_size=2)
        assert lt.padding_side == "left"
        left = lt(texts)
        assert rows(left) == rows(right), strategy
        assert left["attention_mask"][:, -1].all()  # padding is on the left
        assert not left["pool_mask"][~left["attention_mask"].bool()].any()
    out = LandmarkTokenizer(left_padded(minilm_tokenizer), "fixed", chunk_size=2)(["", "hello"])
    assert out["input_ids"].tolist() == [[PAD, CLS, SEP], [CLS, A, SEP]]


def test_bos_eos_fallback(bos_eos_tokenizer):
    tok = bos_eos_tokenizer
    lt = LandmarkTokenizer(tok, "fixed", chunk_size=2)
    assert (lt.landmark_id, lt.cls_id) == (tok.eos_token_id, tok.bos_token_id)
    assert lt.pad_id == tok.eos_token_id  # no pad token: padding uses the landmark id, masked out anyway
    text = "Hello world. This is it."
    ids, pool = rows(lt([text]))[0]
    assert (ids, pool) == reference(tok, text, "fixed", 2, 512, tok.bos_token_id, tok.eos_token_id)


def test_modernbert_like_tokenizer(modernbert_tokenizer):
    tok = modernbert_tokenizer
    lt = LandmarkTokenizer(tok, "fixed", chunk_size=3)
    assert (lt.landmark_id, lt.cls_id, lt.pad_id) == (tok.sep_token_id, tok.cls_token_id, tok.pad_token_id)
    normal = LandmarkTokenizer(tok, "none")(["Hello world. This is it."])
    assert normal["input_ids"].tolist() == [tok("Hello world. This is it.")["input_ids"]]
    # byte-level BPE: sentences carry their leading space, so the content equals the whole-text tokens
    text = "Hello world. This is it. The sky is blue."
    ids, pool = rows(LandmarkTokenizer(tok, "sentence", sentence_splitter="sentencex")([text]))[0]
    content = [t for t in ids[1:] if t != tok.sep_token_id]
    assert content == content_ids(tok, text)
    assert sum(pool) == 3


def test_call_max_length_override_and_single_string(minilm_tokenizer):
    lt = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=2, max_length=512)
    assert lt(FIVE, max_length=4)["input_ids"].tolist() == [[CLS, A, B, SEP]]
    assert lt.max_length == 512
    assert lt([])["input_ids"].shape == (0, 0)


def test_longer_than_model_max_length(minilm_tokenizer):
    # chunking for long-context backbones: the budget may exceed the wrapped tokenizer's model_max_length
    lt = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=32, max_length=2048)
    out = lt(["word " * 3000])
    assert out["input_ids"].shape == (1, 2048)
    assert out["pool_mask"].sum() == 2047 // 33


# ----------------------------------------------------------------------------------- variable
def chunk_of(pool: list[bool]) -> int:
    """Chunk size of a row with at least two full chunks: distance between landmarks - 1."""
    first = pool.index(True)
    return first - 1


def test_variable_uses_chunk_size_at_inference(minilm_tokenizer):
    text = "word " * 300
    var = LandmarkTokenizer(minilm_tokenizer, "variable", chunk_size=4, train_chunk_sizes=(8, 16))([text] * 3)
    fixed = LandmarkTokenizer(minilm_tokenizer, "fixed", chunk_size=4)([text] * 3)
    assert torch.equal(var["input_ids"], fixed["input_ids"])


def test_variable_draws_per_text_and_is_repeatable(minilm_tokenizer):
    texts = ["word " * 100] * 24
    sizes = (2, 3, 5, 8)

    def draw(lt):
        return [chunk_of(pool) for _, pool in rows(lt(texts, train=True))]

    a = LandmarkTokenizer(minilm_tokenizer, "variable", train_chunk_sizes=sizes, seed=7)
    b = LandmarkTokenizer(minilm_tokenizer, "variable", train_chunk_sizes=sizes, seed=7)
    first = draw(a)
    assert set(first) <= set(sizes) and len(set(first)) > 1  # per text, not per batch
    assert draw(b) == first  # same seed, same draws
    second = draw(a)
    assert second != first  # the generator advances between batches
    a.reseed(7)
    assert draw(a) == first
    for _, pool in rows(a(texts, train=True)):  # each row keeps its own size throughout
        g = chunk_of(pool)
        landmarks = [i for i, p in enumerate(pool) if p]
        assert landmarks[:-1] == [(k + 1) * (g + 1) for k in range(len(landmarks) - 1)]
        assert landmarks[-1] == len(pool) - 1


def test_variable_in_dataloader_workers(minilm_tokenizer):
    from torch.utils.data import DataLoader

    lt = LandmarkTokenizer(minilm_tokenizer, "variable", train_chunk_sizes=(2, 3, 5, 8), seed=1)
    texts = ["word " * 40] * 16

    def run() -> list[tuple[int, ...]]:
        loader = DataLoader(
            texts,
            batch_size=8,
            num_workers=2,
            generator=torch.Generator().manual_seed(0),
            collate_fn=lambda batch: lt(batch, train=True)["pool_mask"],
        )
        return [tuple(chunk_of(row.tolist()) for row in pool) for pool in loader]

    first = run()
    assert run() == first  # repeatable under a seeded loader
    assert first[0] != first[1]  # the two workers do not replay the same draws


# --------------------------------------------------------------------------- property tests
texts_strategy = st.lists(st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join), min_size=1, max_size=5)


@SETTINGS
@given(
    texts=texts_strategy,
    strategy=st.sampled_from(STRATEGIES),
    g=st.integers(1, 9),
    budget=st.integers(3, 40),
    left=st.booleans(),
)
def test_matches_naive_reference(minilm_tokenizer, texts, strategy, g, budget, left):
    tok = left_padded(minilm_tokenizer) if left else minilm_tokenizer
    out = LandmarkTokenizer(tok, strategy, chunk_size=g, max_length=budget)(texts)
    got = rows(out)
    for text, row in zip(texts, got):
        assert row == reference(minilm_tokenizer, text, strategy, g, budget, CLS, SEP)
    assert out["input_ids"].shape[1] == max(len(ids) for ids, _ in got)  # padded to the longest row


@SETTINGS
@given(
    texts=texts_strategy,
    strategy=st.sampled_from(("fixed", "variable", "sentence")),
    g=st.integers(1, 9),
    budget=st.integers(3, 40),
    train=st.booleans(),
)
def test_landmark_invariants(minilm_tokenizer, texts, strategy, g, budget, train):
    sizes = (1, 2, 4, 7)
    lt = LandmarkTokenizer(
        minilm_tokenizer,
        strategy,
        chunk_size=g,
        train_chunk_sizes=sizes,
        max_length=budget,
        max_sentence_tokens=g,
    )
    out = lt(texts, train=train)
    assert out["input_ids"].shape[1] <= budget
    assert not (out["pool_mask"] & ~out["attention_mask"].bool()).any()  # padding is never pooled
    for text, (ids, pool) in zip(texts, rows(out)):
        plain = content_ids(minilm_tokenizer, text)
        assert ids[0] == CLS and sum(pool) >= 1
        assert all(t == SEP for t, p in zip(ids, pool) if p)
        content = [t for t, p in zip(ids[1:], pool[1:]) if not p]
        assert content == plain[: len(content)]  # order preserved: a prefix of the plain tokenization
        if len(ids) < budget:
            assert content == plain  # nothing was truncated
        # content tokens before each landmark, and the chunk lengths between landmarks
        counts = [i - 1 - k for k, i in enumerate(i for i, p in enumerate(pool) if p)]
        gaps = list(np.diff([0, *counts]))
        if not plain:
            assert counts == [0]
        elif strategy == "fixed" or (strategy == "variable" and not train):
            # a landmark after exactly every g content tokens (the last chunk may be shorter)
            assert all(gap == g for gap in gaps[:-1]) and 1 <= gaps[-1] <= g
        elif strategy == "variable":  # one drawn size per text (unknowable from a single landmark)
            assert (
                len(gaps) == 1
                or gaps[0] in sizes
                and all(gap == gaps[0] for gap in gaps[:-1])
                and 1 <= gaps[-1] <= gaps[0]
            )
        else:  # sentence: no chunk longer than g
            assert all(1 <= gap <= g for gap in gaps)


# --------------------------------------------------------------------------------- sentences
@pytest.mark.parametrize(
    "text",
    [
        "Hello world.  This is it!\n\nNext one? yes.   ",
        "no punctuation at all",
        "Mr. Smith went. He said hi.",
        "  ",
    ],
)
def test_split_sentences_concatenates_back(text):
    pieces = split_sentences(text, splitter="sentencex")
    assert "".join(pieces) == text or (not text.strip() and pieces == [])
    assert all(p.strip() for p in pieces)
    assert all(not p[-1].isspace() for p in pieces[:-1])  # whitespace moved to the next sentence


def test_split_sentences_cases():
    assert split_sentences("no punctuation at all", splitter="sentencex") == ["no punctuation at all"]
    assert split_sentences("Hello world. This is it.", splitter="sentencex") == [
        "Hello world.",
        " This is it.",
    ]
    assert split_sentences("", splitter="sentencex") == []
    with pytest.raises(ValueError, match="str"):
        split_sentences(None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ config / API
def test_config_roundtrip(minilm_tokenizer):
    lt = LandmarkTokenizer(
        minilm_tokenizer, "variable", chunk_size=16, train_chunk_sizes=[8, 16], max_length=64, seed=3
    )
    cfg = json.loads(json.dumps(lt.config()))
    again = LandmarkTokenizer.from_config(minilm_tokenizer, cfg)
    assert again.config() == lt.config()
    texts = ["word " * 50] * 4
    assert torch.equal(again(texts, train=True)["input_ids"], lt(texts, train=True)["input_ids"])
    assert (lt.strategy, lt.chunk_size, lt.max_length) == ("variable", 16, 64)
    assert (lt.landmark_id, lt.cls_id, lt.pad_id, lt.padding_side) == (SEP, CLS, PAD, "right")
    with pytest.raises(ValueError, match="allowed: strategy"):
        LandmarkTokenizer.from_config(minilm_tokenizer, {"strategy": "fixed", "chunk": 4})


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "lmk"}, "allowed: none, fixed, variable, sentence, every_k, multi_cls"),
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
        ({"chunk_size": 2.5}, "chunk_size must be an integer >= 1"),
        ({"chunk_size": True}, "chunk_size must be an integer >= 1"),
        ({"train_chunk_sizes": []}, "train_chunk_sizes must be a non-empty list"),
        ({"train_chunk_sizes": "32,64"}, "train_chunk_sizes must be a non-empty list"),
        ({"train_chunk_sizes": [32, 0]}, "train_chunk_sizes must be an integer >= 1"),
        ({"max_length": 2}, r"max_length must be an integer >= 3 \(room for \[CLS\]"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"language": ""}, "language must be a language code"),
    ],
)
def test_bad_arguments(minilm_tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LandmarkTokenizer(minilm_tokenizer, **kwargs)


def test_bad_call_arguments(minilm_tokenizer):
    lt = LandmarkTokenizer(minilm_tokenizer)
    with pytest.raises(ValueError, match=r"texts\[2\] is NoneType"):
        lt(["a", "b", None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"texts\[0\] is int"):
        lt([3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_length must be an integer >= 3"):
        lt(["a"], max_length=1)


def test_tokenizer_without_separator_or_leading_token(bos_eos_tokenizer):
    no_sep = copy.deepcopy(bos_eos_tokenizer)
    no_sep.eos_token = None
    with pytest.raises(ValueError, match="neither a SEP nor an EOS.*sep_token or eos_token"):
        LandmarkTokenizer(no_sep)
    no_cls = copy.deepcopy(bos_eos_tokenizer)
    no_cls.bos_token = None
    with pytest.raises(ValueError, match="neither a CLS nor a BOS.*cls_token or bos_token"):
        LandmarkTokenizer(no_cls)


# ------------------------------------------------------------------ the authors' layouts ------------
TEN = "one two three four five six seven eight nine ten"


def test_multi_cls_truncation_ends_with_sep_as_the_authors(minilm_tokenizer):
    ten = content_ids(minilm_tokenizer, TEN)
    out = LandmarkTokenizer(minilm_tokenizer, "multi_cls", chunk_size=4, max_length=11)([TEN])
    # theirs: ([CLS] z1 [CLS] z2 [CLS] z3)[: max_len - 1] + [SEP]; the row never ends on a bare CLS
    assert out["input_ids"].tolist() == [[CLS, *ten[:4], CLS, *ten[4:8], SEP]]
    assert out["input_ids"][0, -2:].tolist() == [2809, SEP]
    assert out["pool_mask"].int().tolist() == [[1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]]
    whole = LandmarkTokenizer(minilm_tokenizer, "multi_cls", chunk_size=4, max_length=14)([TEN])
    assert whole["input_ids"].tolist() == [[CLS, *ten[:4], CLS, *ten[4:8], CLS, *ten[8:], SEP]]


def test_sentence_default_is_the_authors_layout(minilm_tokenizer):
    tok = minilm_tokenizer
    lt = LandmarkTokenizer(tok, "sentence")
    assert (lt.sentence_splitter, lt.max_sentence_tokens, lt.language) == ("koehn", None, "en")
    long = "Then " + "word " * 100 + "end."
    text = f"Hello world.\n\nThis is it! {long}"
    ids, pool = rows(lt([text]))[0]
    # a blank line is an empty piece: two landmarks in a row; the 102-word sentence is never cut
    h, t, w = (content_ids(tok, s) for s in ("Hello world.", "This is it!", long))
    assert ids == [CLS, *h, SEP, SEP, *t, SEP, *w, SEP]
    assert sum(pool) == 4
    # sentencex merges the blank line into the next sentence: one landmark fewer
    old = LandmarkTokenizer(tok, "sentence", sentence_splitter="sentencex")
    assert sum(rows(old([text]))[0][1]) == 3


def test_sentence_lossy_split_is_kept_whole_at_inference_only(minilm_tokenizer):
    # the splitter collapses the run of spaces: the pieces keep under 90% of the text's characters
    text = "x = 1." + " " * 40 + "Then y."
    assert split_sentences(text) == ["x = 1.", "Then y."]
    lt = LandmarkTokenizer(minilm_tokenizer, "sentence")
    ids, pool = rows(lt([text]))[0]
    assert sum(pool) == 1 and ids == [CLS, *content_ids(minilm_tokenizer, text), SEP]  # the eval script
    assert sum(rows(lt([text], train=True))[0][1]) == 2  # the training collator has no such rule


def test_sentence_pieces_are_tokenized_stripped_with_byte_level_bpe(modernbert_tokenizer):
    tok = modernbert_tokenizer
    text = "Hello world. This is it."
    ids, pool = rows(LandmarkTokenizer(tok, "sentence")([text]))[0]
    sep = tok.sep_token_id
    # as the authors: each splitter piece alone, so "This" loses the leading-space form it has in context
    assert ids == [
        tok.cls_token_id,
        *content_ids(tok, "Hello world."),
        sep,
        *content_ids(tok, "This is it."),
        sep,
    ]


def test_language_reaches_the_splitter_from_the_pooling_config(minilm_tokenizer):
    from omegaconf import OmegaConf

    from lmk.config.model import PoolingConfig
    from lmk.model.embedding import make_tokenizer

    text = "Er kam am 3. Oktober an. Dann ging er."  # "3." ends no sentence in German
    yaml = OmegaConf.load("conf/pooling/lmk-sentence.yaml")
    cfg = PoolingConfig.coerce(OmegaConf.merge(yaml, {"language": "de"}))
    assert (cfg.sentence_splitter, cfg.max_sentence_tokens) == ("koehn", None)
    lt = make_tokenizer(minilm_tokenizer, cfg, 64, 0)
    assert (lt.language, lt.sentence_splitter) == ("de", "koehn")
    assert sum(rows(lt([text]))[0][1]) == 2
    english = make_tokenizer(minilm_tokenizer, PoolingConfig.coerce(yaml), 64, 0)
    assert english.language == "en" and sum(rows(english([text]))[0][1]) == 3
    capped = make_tokenizer(
        minilm_tokenizer, PoolingConfig.coerce(OmegaConf.merge(yaml, {"max_sentence_tokens": 2})), 64, 0
    )
    assert capped.max_sentence_tokens == 2 and sum(rows(capped([text]))[0][1]) > 3
    again = LandmarkTokenizer.from_config(minilm_tokenizer, json.loads(json.dumps(lt.config())))
    assert again.config() == lt.config()


def test_multilingual_splitter_works_offline():
    from lmk.model.landmark.sentences import multilingual_backend

    text = "今天天气很好。我们去公园吧！"
    pieces = split_sentences(text, "zh", "multilingual")
    assert pieces == ["今天天气很好。", "我们去公园吧！"]
    if multilingual_backend() == "sentencex":  # spaCy's xx_sent_ud_sm is not installed here
        assert pieces == split_sentences(text, "zh", "sentencex")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"language": "zh"}, "no rules for language 'zh'.*sentence_splitter: multilingual"),
        ({"sentence_splitter": "nltk"}, "allowed: koehn, multilingual, sentencex"),
        ({"max_sentence_tokens": 0}, "max_sentence_tokens"),
    ],
)
def test_bad_sentence_options(minilm_tokenizer, kwargs, match):
    from lmk.config.model import PoolingConfig

    with pytest.raises(ValueError, match=match):
        LandmarkTokenizer(minilm_tokenizer, "sentence", **kwargs)
    with pytest.raises(ValueError, match=match):
        PoolingConfig(name="lmk-sentence", strategy="sentence", **kwargs)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_literal_special_tokens_stay_text(minilm_tokenizer, strategy):
    text = "hello [SEP] world [PAD] foo [CLS] bar [MASK] cat [UNK]"
    lt = LandmarkTokenizer(minilm_tokenizer, strategy, chunk_size=4)
    ids, pool = rows(lt([text]))[0]
    content = minilm_tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert not {PAD, SEP, CLS, 100, 103} & set(content)
    # the only special ids are those the layout put there: no landmark, pad or CLS injected by the text
    assert [t for t in ids if t not in (CLS, SEP)] == content
    assert PAD not in ids
    if strategy in ("fixed", "variable", "sentence"):
        assert ids.count(SEP) == sum(pool) == (1 if strategy == "sentence" else -(-len(content) // 4))
        assert ids.count(CLS) == 1
    elif strategy == "multi_cls":
        assert ids.count(SEP) == 1 and ids.count(CLS) == sum(pool) == -(-len(content) // 4)
    else:
        assert ids.count(SEP) == 1 and ids.count(CLS) == 1


def test_literal_special_tokens_stay_text_with_a_fast_bpe_tokenizer(modernbert_tokenizer):
    tok = modernbert_tokenizer
    ids, pool = rows(LandmarkTokenizer(tok, "fixed", chunk_size=1000)(["Hello [SEP] world [PAD]"]))[0]
    assert ids.count(tok.sep_token_id) == sum(pool) == 1 and tok.pad_token_id not in ids
