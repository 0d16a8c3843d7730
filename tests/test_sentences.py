"""lmk.model.landmark.koehn_splitter: the Koehn & Schroeder splitter of the `sentence-splitter` package, compiled once. Its sentences
equal the package's on real prose (CPython's pydoc topics: paragraphs, code, lists) and on generated texts built
from the characters its rules look at; its non-breaking prefixes equal the package's for every language."""

from __future__ import annotations

from pydoc_data.topics import topics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sentence_splitter import SentenceSplitter

from lmk.config.model import koehn_languages, validate_splitter
from lmk.model.landmark import koehn_splitter as koehn
from lmk.model.landmark.sentences import check_splitter, split_sentences

# what the rules test: breaks (?!. and runs of dots), quotes and brackets, initial/final punctuation, upper case and
# other letters, digits, honorifics and numeric-only prefixes, acronyms, spaces and newlines
ATOMS = [" ", "  ", ".", "..", "...", "?", "!", "\n", " \n", '"', "'", "(", ")", "[", "]", "«", "»", "“", "”", "‘",
         "’", "¿", "¡", "%", "-", "Mr", "Mrs", "No", "Art", "U.S", "A", "a", "Z", "z", "1", "23", "é", "É", "中", "x.Y",
         "etc", "Dr", "vs", "#", "\t", ",", ";", ":", "Jan", "p", "pp", "Nos", "i.e", "e.g"]


@pytest.fixture(scope="module")
def package() -> SentenceSplitter:
    return SentenceSplitter(language="en")


def test_real_prose_splits_as_the_package_does(package: SentenceSplitter) -> None:
    fast = koehn.splitter("en")
    texts = [topics[k] for k in sorted(topics)]
    assert sum(len(package.split(t)) for t in texts) > 5000  # many sentences, not a trivial corpus
    for key, text in zip(sorted(topics), texts, strict=True):
        assert fast(text) == package.split(text), key


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(ATOMS), max_size=30).map("".join))
def test_generated_texts_split_as_the_package_does(package: SentenceSplitter, text: str) -> None:
    assert koehn.splitter("en")(text) == package.split(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_text_splits_as_the_package_does(package: SentenceSplitter, text: str) -> None:
    assert koehn.splitter("en")(text) == package.split(text)


@pytest.mark.parametrize("language", koehn_languages())
def test_non_breaking_prefixes_equal_the_package(language: str) -> None:
    theirs = SentenceSplitter(language=language)._SentenceSplitter__non_breaking_prefixes  # its parsed file
    kinds = {SentenceSplitter.PrefixType.DEFAULT: koehn.DEFAULT, SentenceSplitter.PrefixType.NUMERIC_ONLY:
             koehn.NUMERIC_ONLY}
    assert koehn.non_breaking_prefixes(language) == {p: kinds[k] for p, k in theirs.items()}


def test_config_time_and_run_time_splitter_checks_agree() -> None:
    """lmk.config cannot import the landmark package: its validate_splitter repeats sentences.check_splitter's
    config-time part, so both must accept and refuse the same choices with the same message."""
    assert koehn_languages() == koehn.languages()
    for splitter, language in [("koehn", "en"), ("koehn", "zh"), ("nltk", "en"), ("koehn", ""), ("koehn", None),
                               ("multilingual", "zh")]:
        answers = []
        for check in (validate_splitter, check_splitter):
            try:
                check(splitter, language)
                answers.append(None)
            except ValueError as err:
                answers.append(str(err))
        assert answers[0] == answers[1], (splitter, language)
    assert answers == [None, None]  # the last pair is valid for both


def test_numeric_prefixes_and_honorifics_follow_the_language() -> None:
    text = "See No. 5 for details. Mr. Smith agreed. It works."
    assert split_sentences(text) == ["See No. 5 for details.", "Mr. Smith agreed.", "It works."]
    assert split_sentences("Dr. Who ist hier. Er kommt.", language="de") == ["Dr. Who ist hier.", "Er kommt."]
