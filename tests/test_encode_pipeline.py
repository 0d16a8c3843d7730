"""The encode pipeline (lmk.model.pipeline): embeddings bitwise equal to the un-pipelined computation for every
registered pooler and strategy, workers on and off; order kept under token-budget batches; one tokenization per
text; a failing or killed tokenization worker is one clear error naming the text index, never a hang; a NaN
embedding names its text (CPU, a tiny 2-layer ModernBERT)."""

from __future__ import annotations

import itertools
import os
import pickle
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from components import POOLER_NAMES, STRATEGY_NAMES
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig, EvalConfigError
from lmk.config.model import PoolingConfig
from lmk.config.schema import ConfigError
from lmk.eval.encoder import LmkEncoder
from lmk.model.batching import fixed_batches, token_budget_batches
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark.tokenization import LandmarkTokenizer
from lmk.model.pipeline import EncodeError, NonFiniteEmbeddingError, collate, resolve_workers, unpad

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = [
    "Landmark pooling inserts a separator after every chunk of tokens. It pools them.",
    "Short one.",
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 4,
    "",
    "Mean pooling averages all token states; CLS pooling keeps only the first one.",
    "Dense retrieval embeds queries and passages in one vector space. A dot product ranks them. " * 2,
    "x",
    "First line.\n\nSecond paragraph after a blank line. And a third sentence here.",
]
BUDGET = 96  # tokens per text (max_length)
MAX_TOKENS = 160  # tokens per batch: the long texts go alone, the short ones share


# bitwise comparisons: one intra-op thread, so no reduction order depends on the machine's load
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def base() -> EmbeddingModel:
    enc = OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml")
    enc.config_overrides = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
                            "num_attention_heads": 2, "max_position_embeddings": 8192}
    enc.seed = 0
    pool = OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml")
    return EmbeddingModel.build(enc, OmegaConf.merge(pool, {"chunk_size": 8}), passage_max_length=BUDGET).eval()


def _combos() -> list[tuple[str, str]]:
    out = []
    for pooler, strategy in itertools.product(POOLER_NAMES, STRATEGY_NAMES):
        try:
            PoolingConfig(name=f"{pooler}-{strategy}", pooler=pooler, strategy=strategy, chunk_size=8)
        except ConfigError:  # a pooler that needs pooled positions and a strategy that marks none
            continue
        out.append((pooler, strategy))
    return out


def _unpipelined(model: EmbeddingModel, texts: list[str], batch_size: int, max_tokens: int | None) -> np.ndarray:
    """What encode computed before the pipeline, from the same primitives: the same plan (lengths from a separate
    tokenization pass), each batch tokenized together, its forward, placed by index."""
    if max_tokens is None:
        plan = fixed_batches([len(t) for t in texts], batch_size)
    else:
        plan = token_budget_batches(model.token_lengths(texts, max_length=BUDGET), max_tokens)
    out = np.empty((len(texts), model.hidden_size), np.float32)
    with torch.inference_mode():
        for idx in plan:
            feats = model.landmark_tokenizer([texts[i] for i in idx], max_length=BUDGET)
            out[idx] = model._embed(feats, "fp32").numpy()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("pooler", "strategy"), _combos())
def test_embeddings_bitwise_equal_unpipelined_workers_on_and_off(base, pooler, strategy):
    model = base.with_pooling({"name": f"{pooler}-{strategy}", "pooler": pooler, "strategy": strategy,
                               "chunk_size": 8})
    for max_tokens in (None, MAX_TOKENS):
        want = _unpipelined(model, TEXTS, 3, max_tokens)
        for workers in (0, 1):  # 1 worker is the forked path (more only multiply it)
            got = model.encode(TEXTS, batch_size=3, max_length=BUDGET, max_tokens_per_batch=max_tokens,
                               workers=workers)
            assert np.array_equal(got, want), (max_tokens, workers)


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_batches_padded_from_rows_equal_the_tokenizer_on_the_batch(minilm_tokenizer, strategy, side):
    hf = type(minilm_tokenizer).from_pretrained(minilm_tokenizer.name_or_path, padding_side=side)
    tok = LandmarkTokenizer(hf, strategy=strategy, chunk_size=5, max_length=40)
    rows = {k: v.numpy() for k, v in unpad(tok(TEXTS)).items()}
    rows["offsets"] = np.cumsum(rows["lengths"]) - rows["lengths"]
    for idx in ([2, 0, 5], [1], [3, 6, 7, 4]):
        got, want = collate(rows, np.array(idx), tok.pad_id, side == "left"), tok([TEXTS[i] for i in idx])
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), (k, idx)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_of_full_texts_sent_while_tokenizing_match_the_plan(base, monkeypatch, workers):
    from lmk.model import pipeline

    monkeypatch.setattr(pipeline, "WINDOW", 3)  # many windows: texts at the budget go out before the last one
    texts = [TEXTS[i % len(TEXTS)] + " more words" * (40 * (i % 3 == 0)) for i in range(20)]
    assert (base.token_lengths(texts, max_length=BUDGET) >= BUDGET).sum() >= 5
    got = base.encode(texts, max_length=BUDGET, max_tokens_per_batch=2 * BUDGET, workers=workers)
    assert np.array_equal(got, _unpipelined(base, texts, 3, 2 * BUDGET))


class _Recording(LandmarkTokenizer):
    """Records TOKENIZERS_PARALLELISM as each of its calls sees it (in this process: workers=0)."""

    seen: list[str | None] = []

    def __call__(self, texts, train=False, max_length=None):
        type(self).seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
        return super().__call__(texts, train=train, max_length=max_length)


@pytest.mark.parametrize("before", ["false", None])
@pytest.mark.parametrize("max_tokens", [None, MAX_TOKENS])
def test_in_thread_tokenization_uses_the_tokenizers_threads_then_restores_the_setting(base, monkeypatch, before,
                                                                                    max_tokens):
    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    model = _with_tokenizer(base, _Recording)
    _Recording.seen = []
    got = model.encode(TEXTS, batch_size=3, max_length=BUDGET, max_tokens_per_batch=max_tokens, workers=0)
    assert _Recording.seen and set(_Recording.seen) == {"true"}  # the Rust tokenizer's own threads, every call
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before  # a fork afterwards sees the caller's setting
    assert np.array_equal(got, _unpipelined(base, TEXTS, 3, max_tokens))


class _Counting(LandmarkTokenizer):
    """Counts the texts it tokenizes (in this process: workers=0)."""

    seen = 0

    def __call__(self, texts, train=False, max_length=None):
        type(self).seen += len(texts)
        return super().__call__(texts, train=train, max_length=max_length)


def _with_tokenizer(model: EmbeddingModel, cls: type[LandmarkTokenizer]) -> EmbeddingModel:
    tok = cls.from_config(model.tokenizer, model.landmark_tokenizer.config())
    return EmbeddingModel(model.backbone, tok, model.pooler, passage_max_length=BUDGET).eval()


def test_token_budget_tokenizes_each_text_once(base):
    model = _with_tokenizer(base, _Counting)
    _Counting.seen = 0
    model.encode(TEXTS, max_length=BUDGET, max_tokens_per_batch=MAX_TOKENS, workers=0)
    assert _Counting.seen == len(TEXTS)  # the lengths that plan the batches come from the same pass


@pytest.mark.timeout(60)
def test_order_kept_and_a_text_over_the_budget_goes_alone(base):
    texts = TEXTS * 3
    lengths = base.token_lengths(texts, max_length=BUDGET)
    budget = int(lengths.max()) - 1  # the longest texts do not fit: each must go alone
    calls: list[int] = []
    handle = base.backbone.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        got = base.encode(texts, max_length=BUDGET, max_tokens_per_batch=budget, workers=2)
    finally:
        handle.remove()
    long_rows = int((lengths > budget).sum())
    assert long_rows >= 3 and sum(1 for rows, width in calls if width > budget and rows == 1) == long_rows
    assert all(rows * width <= budget for rows, width in calls if width <= budget)
    for i in (0, 2, 5, 10, 23):  # each row is its own text's embedding
        np.testing.assert_allclose(got[i], base.encode([texts[i]], max_length=BUDGET, workers=0)[0], atol=1e-5)


class _Faulty(LandmarkTokenizer):
    """Fault injection: raises on a text containing BOOM; a worker process that meets KILL is SIGKILLed."""

    def __call__(self, texts, train=False, max_length=None):
        if any("BOOM" in t for t in texts):
            raise ValueError("planted failure")
        if any("KILL" in t for t in texts) and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(texts, train=train, max_length=max_length)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("max_tokens", [None, MAX_TOKENS])
def test_a_failing_text_is_one_error_naming_its_index(base, workers, max_tokens):
    model = _with_tokenizer(base, _Faulty)
    texts = [*TEXTS, "fine", "this one goes BOOM", "fine too"]
    with pytest.raises(EncodeError, match=r"^text 9 could not be tokenized \(ValueError: planted failure\); "):
        model.encode(texts, batch_size=4, max_length=BUDGET, max_tokens_per_batch=max_tokens, workers=workers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_tokens", [None, MAX_TOKENS])
def test_a_killed_worker_is_one_error_naming_its_texts_not_a_hang(base, max_tokens):
    model = _with_tokenizer(base, _Faulty)
    texts = [*TEXTS, "please KILL the worker"]
    with pytest.raises(EncodeError, match=r"tokenization worker died while preparing texts [\d., ]*\b8\b"):
        model.encode(texts, batch_size=3, max_length=BUDGET, max_tokens_per_batch=max_tokens, workers=2)
    # the model is still usable afterwards
    assert model.encode(TEXTS[:2], max_length=BUDGET, workers=2).shape == (2, model.hidden_size)


@pytest.mark.timeout(60)
def test_a_nan_embedding_names_its_text_index_and_id(base):
    model = EmbeddingModel.build(base.encoder_cfg, base.pooling_cfg, passage_max_length=BUDGET).eval()
    planted = "zebra"
    token = model.tokenizer(planted, add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.backbone.get_input_embeddings().weight[token] = float("nan")
    texts = ["a plain text", "another one", f"the {planted} text", "last"]
    with pytest.raises(NonFiniteEmbeddingError, match=r"^the embedding of text 2 holds NaN or inf") as err:
        model.encode(texts, batch_size=1, max_length=BUDGET, workers=0)
    assert err.value.index == 2
    encoder = LmkEncoder(model, passage_max_length=BUDGET, batch_size=1, workers=0)
    batch = {"text": texts, "id": ["d0", "d1", "doc-zebra", "d3"]}
    with pytest.raises(NonFiniteEmbeddingError, match=r"eval T \[test/default\] passage 'doc-zebra': the embedding") \
            as err:
        encoder.encode([batch], task_metadata=SimpleNamespace(name="T"), hf_split="test", hf_subset="default")
    # the eval job's exception is pickled back to the sweeper, which records it as the shard's error
    back = pickle.loads(pickle.dumps(err.value))
    assert (back.index, str(back)) == (err.value.index, str(err.value))


def test_workers_setting_resolves_and_is_validated():
    assert resolve_workers(0, "cpu") == 0 and resolve_workers(3, "cuda") == 3
    assert resolve_workers("auto", "cpu", chars=10**6) in (0, 1) and resolve_workers("auto", "cuda", chars=10**6) >= 1
    assert resolve_workers("auto", "cuda", chars=100) == 0  # a small call: forking would cost more
    with pytest.raises(ValueError, match=r"workers=-1 is not valid; use 'auto' or an integer >= 0"):
        resolve_workers(-1, "cpu")
    assert EvalConfig.from_cfg({"workers": 4, "prefetch": 3}).workers == 4
    with pytest.raises(EvalConfigError, match=r"eval.workers='many': must be auto or an integer >= 0"):
        EvalConfig.from_cfg({"workers": "many"})
    with pytest.raises(EvalConfigError, match=r"eval.prefetch=0 is not valid; allowed values: an integer >= 1"):
        EvalConfig.from_cfg({"prefetch": 0})


@pytest.mark.slow
def test_gpu_check_encode_pipeline_section_cpu_smoke(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import gpu_check

    report = gpu_check.run(True, ["encode_pipeline"], tmp_path)
    section = report["encode_pipeline"]
    assert section["status"] == "ok", section
    for length in ("64", "256"):  # the CUDA run reports "512" and "8192" with the same keys
        figures = section[length]
        assert figures["end_to_end_tokens_per_s"] > 0 and figures["forward_only_tokens_per_s"] > 0
        assert figures["ratio"] > 0
