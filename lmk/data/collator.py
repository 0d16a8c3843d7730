"""`PairCollator`: a batch of examples -> the tokenized training batch (query and passage features, teacher scores).

Kept apart from the datamodule (and its `datasets` stack) so that a training step can be built from texts alone:
the gpu-check's paper-shaped step needs the model layer and this, not the data readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch


class PairCollator:
    """Examples -> {"query": features, "passage": features, ["teacher_scores": FloatTensor[B, G]]}.

    Tokenizes through `LandmarkTokenizer(texts, train=True, max_length=...)`, so the `variable`
    strategy draws a chunk size per text. Its generator is reseeded from the batch's sample keys, so
    the draws are the same across runs whatever the worker count. A plain Hugging Face tokenizer also
    works (normal [CLS] ... [SEP] layout, pool_mask all False).
    """

    def __init__(self, tokenizer: Any, query_max_length: int = 128, passage_max_length: int = 512) -> None:
        if tokenizer is None:
            raise ValueError("PairCollator needs a tokenizer (a LandmarkTokenizer, e.g. model.landmark_tokenizer)")
        for key, value in (("query_max_length", query_max_length), ("passage_max_length", passage_max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"PairCollator {key}={value!r} is not valid; allowed values: an integer >= 2")
        self.tokenizer = tokenizer
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length

    def _tokenize(self, texts: list[str], max_length: int, prompts: list[str | None] | None = None
                  ) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        if hasattr(tok, "landmark_id"):
            # an instruction before a query is tokenized apart from it: no landmark goes into the instruction
            return tok(texts, train=True, max_length=max_length, **({"prompt": prompts} if prompts else {}))
        if prompts:
            texts = [(p or "") + t for p, t in zip(prompts, texts, strict=True)]
        enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        ids = enc["input_ids"]
        return {"input_ids": ids, "attention_mask": enc["attention_mask"], "pool_mask": torch.zeros_like(ids, dtype=torch.bool)}

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("PairCollator got an empty batch")
        sizes = {len(e["passages"]) for e in examples}
        if len(sizes) != 1:
            raise ValueError(f"examples have different group sizes {sorted(sizes)}; every group needs the same size")
        if hasattr(self.tokenizer, "reseed") and all("key" in e for e in examples):
            digest = hashlib.sha256(repr([tuple(e["key"]) for e in examples]).encode()).digest()
            self.tokenizer.reseed(int.from_bytes(digest[:4], "little"))
        queries = [e["query"] for e in examples]
        prompts = [e.get("query_prompt") for e in examples]
        passages = [p for e in examples for p in e["passages"]]
        batch: dict[str, Any] = {
            "query": self._tokenize(queries, self.query_max_length, prompts if any(prompts) else None),
            "passage": self._tokenize(passages, self.passage_max_length),
        }
        if all("key" in e for e in examples):
            batch["keys"] = [tuple(e["key"]) for e in examples]  # named by the non-finite guard (lmk.train.guard)
        if all(e.get("scores") is not None for e in examples):
            batch["teacher_scores"] = torch.tensor([list(e["scores"]) for e in examples], dtype=torch.float32)
        return batch
