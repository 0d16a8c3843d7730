"""Passkey / needle generators against the LongEmbed protocol (docs/method.md section 5)."""

from __future__ import annotations

import re

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
            # names are "First Last" (Faker first_name + last_name): \S+ keeps the regex linear
            m = re.findall(r"(\S+ \S+)'s pass key is (\d+)\. Remember it\. (\d+) is the pass key for (\S+ \S+)\.", text)
            assert len(m) == 1, text[:200]  # the line is inserted exactly once
            name, k1, k2, name2 = m[0]
            assert name == name2 and k1 == k2 and len(k1) == 5
            names.append(name)
            rest = text.replace(f"{name}'s pass key is {k1}. Remember it. {k1} is the pass key for {name}.", "")
            assert set(rest.split()) <= set(le.FILLER.split())  # everything else is filler
        assert len(set(names)) == 100  # unique names
        for q in c.queries:
            name = q["text"].removeprefix("What is the pass key for ").removesuffix("?")
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
