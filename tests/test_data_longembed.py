"""Passkey / needle generators against the LongEmbed protocol (docs/method.md section 5)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lmk.data import longembed as le


@pytest.fixture(scope="module")
def passkey():
    return le.generate_passkey()


@pytest.fixture(scope="module")
def needle():
    return le.generate_needle()


def _check_protocol(tasks):
    assert sorted(tasks) == list(le.LENGTHS)
    for length, c in tasks.items():
        assert c.split == f"test_{length}"
        assert c.corpus.num_rows == 100 and c.queries.num_rows == 50
        assert len(set(c.corpus["id"])) == 100
        budget = (3 * length) // 4
        words = [len(t.split()) for t in c.corpus["text"]]
        assert max(words) <= budget
        assert min(words) >= budget - 40  # filled up to (nearly) the budget
        assert set(c.corpus["length"]) == {length} and set(c.queries["length"]) == {length}
        assert all(0.0 <= d <= 1.0 for d in c.corpus["depth"])
        doc_depth = dict(zip(c.corpus["id"], c.corpus["depth"], strict=True))
        for q in c.queries:
            rel = c.qrels[q["id"]]
            assert list(rel.values()) == [1] and len(rel) == 1  # exactly one relevant document
            assert q["depth"] == doc_depth[next(iter(rel))]
    # depths spread over the whole document
    depths = [d for c in tasks.values() for d in c.corpus["depth"]]
    assert min(depths) < 0.1 and max(depths) > 0.9


def test_passkey_protocol(passkey):
    _check_protocol(passkey)
    for c in passkey.values():
        names = []
        texts = dict(zip(c.corpus["id"], c.corpus["text"], strict=True))
        for text in c.corpus["text"]:
            # names are single first names from the shipped list: \S+ keeps the regex linear
            m = re.findall(
                r"(\S+)'s pass key is (\d+)\. Remember it\. (\d+) is the pass key for (\S+)\.", text
            )
            assert len(m) == 1, text[:200]  # the line is inserted exactly once
            name, k1, k2, name2 = m[0]
            assert name == name2 and k1 == k2 and len(k1) == 5
            names.append(name)
            rest = text.replace(
                f"{name}'s pass key is {k1}. Remember it. {k1} is the pass key for {name}.", ""
            )
            assert set(rest.split()) <= set(le.FILLER.split())  # everything else is filler
        assert len(set(names)) == 100  # unique names
        for q in c.queries:
            name = q["text"].removeprefix("what is the passkey for ").removesuffix("?")
            holders = [d for d, t in texts.items() if f"for {name}." in t]
            assert holders == list(c.qrels[q["id"]])


def test_needle_protocol(needle):
    _check_protocol(needle)
    facts = {p["question"]: p["fact"] for p in le.load_needles()}
    assert len(facts) == 100
    for c in needle.values():
        texts = dict(zip(c.corpus["id"], c.corpus["text"], strict=True))
        for q in c.queries:
            fact = facts[q["text"]]
            counts = {d: t.count(fact) for d, t in texts.items()}
            (doc,) = c.qrels[q["id"]]
            assert counts[doc] == 1 and sum(counts.values()) == 1  # present once, in its document only
            words = texts[doc].split()
            at = texts[doc].index(fact)
            assert abs(len(texts[doc][:at].split()) / (len(words) - len(fact.split())) - q["depth"]) < 1e-3


def test_deterministic_and_seeded():
    a = le.generate_passkey(lengths=(256, 1024), seed=5)
    b = le.generate_passkey(lengths=(1024,), seed=5)
    assert a[1024].corpus["text"] == b[1024].corpus["text"] and a[1024].qrels == b[1024].qrels
    c = le.generate_passkey(lengths=(1024,), seed=6)
    assert c[1024].corpus["text"] != b[1024].corpus["text"]
    n1, n2 = le.generate_needle(lengths=(512,), seed=1), le.generate_needle(lengths=(512,), seed=1)
    assert n1[512].corpus["text"] == n2[512].corpus["text"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_queries"):
        le.generate_passkey(lengths=(256,), n_docs=10, n_queries=11)
    with pytest.raises(ValueError, match="n_docs"):
        le.generate_needle(lengths=(256,), n_docs=101)
    with pytest.raises(ValueError, match="lengths"):
        le.generate_passkey(lengths=(0,))


# ------------------------------------------------------------------ the LongEmbed protocol -----------
def test_passkey_query_and_shipped_names():
    names = le.load_passkey_names()
    assert len(set(names)) == len(names) >= 800
    assert all(n.isalpha() and n[0].isupper() and n[1:].islower() for n in names)
    assert {"Zyaire", "Kyree", "Malayah"} <= set(names)
    c = le.generate_passkey(lengths=(256,), seed=3)[256]
    for q in c.queries:
        (doc,) = c.qrels[q["id"]]
        text = c.corpus["text"][c.corpus["id"].index(doc)]
        name = re.search(r"(\S+)'s pass key is", text).group(1)
        assert name in names
        assert q["text"] == f"what is the passkey for {name}?"  # as the real mteb rows
        assert "pass key" in text and "passkey" not in text  # documents keep the two-word form


def test_needle_facts_are_real_general_knowledge():
    needles = le.load_needles()
    assert len(needles) == 100
    assert len({n["fact"] for n in needles}) == len({n["question"] for n in needles}) == 100
    assert {n["topic"] for n in needles} == {"physics", "history", "geography", "art"}
    for n in needles:
        assert n["answer"] in n["fact"], n  # the answer-bearing words are in the fact
        assert n["answer"].lower() not in n["question"].lower(), n  # and the question does not give them
        assert n["question"].endswith("?") and n["fact"].endswith(".")
    # the answers occur only in their needles, never in the shared background
    background = " ".join(le.background_words()[0]).lower()
    assert not [
        n["answer"] for n in needles if re.search(rf"\b{re.escape(n['answer'].lower())}\b", background)
    ]


def test_needle_documents_share_the_background_from_its_beginning():
    words, _ = le.background_words()
    needles = {n["question"]: n["fact"] for n in le.load_needles()}
    for length, c in le.generate_needle(lengths=(256, 1024), seed=4).items():
        facts = [needles[q] for q in c.queries["text"]]
        by_doc = {next(iter(c.qrels[q])): f for q, f in zip(c.queries["id"], facts, strict=True)}
        for doc, fact in by_doc.items():
            text = c.corpus["text"][c.corpus["id"].index(doc)]
            at = text.index(fact)
            background = (text[:at] + text[at + len(fact) :]).split()
            # the same prose for every document: the first words of the background, cut to the budget
            assert background == list(words[: le.word_budget(length) - len(fact.split())])
            before = text[:at].split()
            assert not before or before[-1][-1] in ".!?\"')"  # inserted at a sentence boundary


def test_needle_documents_stay_within_about_l_bert_tokens(minilm_tokenizer):
    needles = [n["fact"] for n in le.load_needles()]
    for length, c in le.generate_needle(lengths=(256, 512, 1024)).items():
        texts = list(c.corpus["text"])
        counts = [len(ids) for ids in minilm_tokenizer(texts, add_special_tokens=False)["input_ids"]]
        assert max(counts) <= 1.05 * length and min(counts) >= 0.75 * length, (
            length,
            min(counts),
            max(counts),
        )
        if length == 512:  # no needle is cut away by a 512-token model (was 36% with pydoc text)
            for text in texts:
                fact = next(f for f in needles if f in text)
                end = len(
                    minilm_tokenizer(text[: text.index(fact) + len(fact)], add_special_tokens=False)[
                        "input_ids"
                    ]
                )
                assert end <= 512 - 2


def test_background_is_long_enough_for_the_longest_length():
    budget = le.word_budget(max(le.LENGTHS))
    shortest = min(len(n["fact"].split()) for n in le.load_needles())  # needs the most background
    text, _ = le.needle_document(" ".join(["fact"] * shortest), budget, np.random.default_rng(0))
    assert len(text.split()) == budget
    with pytest.raises(ValueError, match="needle_essays.txt"):
        le.generate_needle(lengths=(4 * 50_000,))


# pinned: a change to the generators, the shipped resources or the random streams changes these
PINNED_SMALL = {"passkey": "0ce6ce81138fa8d8", "needle": "3bb51b648881c68b"}


def test_generated_sets_are_pinned():
    passkey = le.generate_passkey(lengths=(256, 512))
    needle = le.generate_needle(lengths=(256, 512))
    assert passkey[256].queries["text"][0] == "what is the passkey for Zesha?"
    assert needle[256].queries["text"][0] == "How long does light from the Sun take to reach the Earth?"
    assert {"passkey": le.fingerprint(passkey), "needle": le.fingerprint(needle)} == PINNED_SMALL


# the default sets (8 lengths, seed 0) that evaluation regenerates
PINNED_DEFAULT = {"passkey": "849767710d57b523", "needle": "885de828c2f6f917"}


def test_default_sets_are_pinned(passkey, needle):
    assert {"passkey": le.fingerprint(passkey), "needle": le.fingerprint(needle)} == PINNED_DEFAULT
