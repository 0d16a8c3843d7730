"""mteb 2.x encoder adapter around `lmk.model.embedding.EmbeddingModel`.

mteb hands `encode` a DataLoader of dicts (`batch["text"]`) plus the prompt type; queries go to the
"query" side and documents to the "passage" side, each with its own max length (8192 for the
long-context suites). The landmark tokenization of the configured pooling applies to both sides
(eval mode: fixed chunk size), and `EmbeddingModel.encode` sorts texts by length into batches of at
most `max_tokens_per_batch` tokens (padding counted; null: `batch_size` rows), under an autocast of
`precision` on the model's device (the caller puts the model there), tokenized by `workers` processes (the
encode pipeline, lmk.model.pipeline). A NaN or inf embedding fails the task with the text's id.

The ModelMeta name carries model, pooling (with chunk size) and the weights fingerprint, and the
experiment kwargs carry the per-side max lengths (and a precision other than fp32): two variants never
share an mteb cache entry. Batching is not part of the identity: it does not change the embeddings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta
from mteb.types import PromptType

from lmk.data.landmarks import EVAL_TEXTS, LandmarkTally
from lmk.eval.score_stats import split_key
from lmk.eval.scorings import register_scoring
from lmk.model.device import resolve_precision
from lmk.model.pipeline import NonFiniteEmbeddingError

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from torch.utils.data import DataLoader

    from lmk.config.eval import EvalConfig
    from lmk.model.embedding import EmbeddingModel

logger = logging.getLogger(__name__)


def _safe(text: str) -> str:
    # ModelMeta names become cache folder names: keep them filesystem-safe.
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


@register_scoring
class LmkEncoder(AbsEncoder):
    """An `EmbeddingModel` as an mteb encoder (cosine similarity; embeddings are L2-normalised): the `single` scoring
    (lmk.eval.scorings; its needs are declared in lmk.config.scorings and set here on registration)."""

    name: str = "single"  # eval.scoring=single
    needs_landmarks: bool = False
    multi_vector: bool = False
    describe: str = ""
    settings: tuple[str, ...] = ()
    summed: tuple[str, ...] = ()

    @classmethod
    def options(cls, cfg: EvalConfig) -> dict[str, Any]:
        """The keyword arguments of this scoring's own `eval.*` settings (none for single)."""
        return {}

    @classmethod
    def from_eval(cls, model: EmbeddingModel, cfg: EvalConfig, **kwargs: Any) -> LmkEncoder:
        """The encoder of this scoring for `model` under the eval config `cfg` (`kwargs`: the settings every scoring
        takes, e.g. show_progress, tag, precision)."""
        return cls(model, cfg.query_max_length, cfg.passage_max_length, cfg.batch_size, **cls.options(cfg), **kwargs)

    def record(self) -> dict[str, Any]:
        """What the eval record says of this scoring beside `scoring` (its `settings` and `summed` keys)."""
        return {}

    def index_size(self, task: str) -> dict[str, Any] | None:
        """The index a task's documents make under this scoring (None: one vector per document, no index)."""
        return None

    def __init__(
        self,
        model: EmbeddingModel,
        query_max_length: int = 512,
        passage_max_length: int = 512,
        batch_size: int = 32,
        show_progress: bool = False,
        tag: str | None = None,
        max_tokens_per_batch: int | None = None,
        precision: str = "fp32",
        workers: int | str = "auto",
        prefetch: int = 2,
        query_prompts: Mapping[str, str] | None = None,
    ) -> None:
        """`query_prompts`: an instruction per task name, put before that task's queries (never its documents) as a
        prompt without landmarks (EmbeddingModel.encode); they name the cache entry too (other prompts, other
        embeddings)."""
        checks = [("query_max_length", query_max_length), ("passage_max_length", passage_max_length),
                  ("batch_size", batch_size)]
        if max_tokens_per_batch is not None:  # None: batch_size rows per batch
            checks.append(("max_tokens_per_batch", max_tokens_per_batch))
        for key, value in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r}: must be a positive integer")
        self.model = model
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length
        self.batch_size = batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        # resolved against the model's device now, so the cache identity names the real precision
        self.precision = resolve_precision(precision, getattr(model, "device", "cpu"))
        self.show_progress = show_progress
        # the encode pipeline's tokenization processes (lmk.model.pipeline): not part of the identity
        self.workers, self.prefetch = workers, prefetch
        self.query_prompts = {str(k): str(v) for k, v in (query_prompts or {}).items() if v}
        self.fingerprint = model.fingerprint()
        # Counters (tests and logs): encode calls, texts encoded, texts truncated to the max length.
        self.n_encode_calls = 0
        self.n_texts = 0
        self.n_truncated = 0
        # landmark statistics of the texts encoded, per (task, split, side): the run's results record them
        self.landmarks = LandmarkTally(max_texts=EVAL_TEXTS)
        self.mteb_model_meta = self._model_meta(tag)

    def _model_meta(self, tag: str | None) -> ModelMeta:
        m = self.model
        pooling = m.pooling_cfg.label if getattr(m, "pooling_cfg", None) is not None else "custom"
        encoder = m.encoder_cfg.name if getattr(m, "encoder_cfg", None) is not None else m.name.split("__")[0]
        n_params = sum(p.numel() for p in m.parameters()) if hasattr(m, "parameters") else None
        experiment: dict[str, Any] = {"qlen": self.query_max_length, "plen": self.passage_max_length}
        if self.precision != "fp32":
            experiment["precision"] = self.precision  # bf16 embeddings differ (slightly) from fp32 ones
        if tag:
            experiment["tag"] = _safe(tag)
        if self.query_prompts:  # instructed queries embed differently: their own cache entry
            digest = hashlib.blake2b(json.dumps(self.query_prompts, sort_keys=True).encode(), digest_size=4)
            experiment["prompts"] = digest.hexdigest()
        return ModelMeta(
            loader=None,
            name=f"lmk/{_safe(encoder)}__{_safe(pooling)}__{self.fingerprint}",
            revision=self.fingerprint,
            release_date=None,
            languages=None,
            n_parameters=n_params,
            memory_usage_mb=None,
            max_tokens=float(m.max_positions),
            embed_dim=int(m.hidden_size),
            license=None,
            open_weights=None,
            public_training_code=None,
            public_training_data=None,
            framework=["PyTorch"],
            reference=None,
            similarity_fn_name="cosine",
            use_instructions=bool(self.query_prompts),
            training_datasets=None,
            experiment_kwargs=experiment,
        )

    def max_length(self, prompt_type: PromptType | str | None) -> int:
        side = self.side(prompt_type)
        return self.query_max_length if side == "query" else self.passage_max_length

    @staticmethod
    def side(prompt_type: PromptType | str | None) -> str:
        # mteb encodes queries with PromptType.query and documents with PromptType.document; symmetric
        # tasks pass None: embed those as passages.
        value = prompt_type.value if isinstance(prompt_type, PromptType) else prompt_type
        return "query" if value == "query" else "passage"

    def encode(
        self,
        inputs: DataLoader[Mapping[str, Any]],
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        texts: list[str] = []
        ids: list[Any] = []
        for batch in inputs:
            texts.extend(batch["text"])
            ids.extend(batch.get("id") or [None] * len(batch["text"]))
        side = self.side(prompt_type)
        max_length = self.max_length(prompt_type)
        start = time.perf_counter()
        try:
            emb = self.model.encode(
                texts, side=side, batch_size=self.batch_size, max_length=max_length, show_progress=self.show_progress,
                max_tokens_per_batch=self.max_tokens_per_batch, precision=self.precision, workers=self.workers,
                prefetch=self.prefetch,
                prompt=self.query_prompts.get(task_metadata.name) if side == "query" else None,
            )
        except NonFiniteEmbeddingError as err:  # name the text as the task knows it
            text_id = ids[err.index] if err.index < len(ids) and ids[err.index] is not None else err.index
            raise NonFiniteEmbeddingError(err.index, f"eval {task_metadata.name} [{hf_split}/{hf_subset}] {side} "
                                          f"{text_id!r}: {err}") from None
        elapsed = max(time.perf_counter() - start, 1e-9)
        tokenizer = getattr(self.model, "landmark_tokenizer", None)
        if tokenizer is not None:  # the texts as this encode laid them out (at most the backbone's positions)
            self.landmarks.add((task_metadata.name, split_key(hf_split, hf_subset), side), tokenizer, texts,
                               min(max_length, int(self.model.max_positions)))
        truncated = int(getattr(self.model, "truncation_count", 0))
        self.n_encode_calls += 1
        self.n_texts += len(texts)
        self.n_truncated += truncated
        logger.info(
            "eval %s [%s/%s] %s: %d texts in %.1fs (%.1f docs/s, %s), %d reached max_length=%d (truncated)",
            task_metadata.name, hf_split, hf_subset, side, len(texts), elapsed, len(texts) / elapsed,
            self.precision, truncated, min(max_length, int(self.model.max_positions)),
        )
        return np.asarray(emb, dtype=np.float32)
