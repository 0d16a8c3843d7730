"""An offline tokenizer shaped like a Llama / Mistral one, for the random-weight decoder (`encoder=tiny-decoder`).

Llama's and Mistral's tokenizers are byte-fallback BPEs with `<unk>`=0, `<s>`=1, `</s>`=2 first, a BOS added
before every text and no EOS, no padding token and no SEP / CLS: lmk's layout then leads with `<s>` and uses `</s>`
as the landmark (the tokenizer's EOS where there is no SEP), padding with it too (padding is masked out). This module
trains the same kind of tokenizer, small, on the text modernbert_tokenizer trains on (the standard library's pydoc
topics, in a fixed order), a byte-level BPE so every text maps to known tokens, and keeps it under the lmk cache dir
(`$LMK_CACHE/tokenizers/llama-like-<fingerprint>/`). `get_model_path()` makes it usable as `encoder.tokenizer:
lmk.model.decoder_tokenizer`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from lmk.model.modernbert_tokenizer import cached_folder, training_texts

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # Llama's ids 0, 1, 2
MODEL_MAX_LENGTH = 32768  # Mistral-7B-v0.3's context
BPE_SIZE = 4000
VERSION = 1  # bump when the recipe changes (it is part of the cache fingerprint)


def fingerprint(bpe_size: int = BPE_SIZE) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"v": VERSION, "kind": "llama-like", "bpe": bpe_size,
                         "tokenizers": tokenizers.__version__}).encode())
    for text in training_texts():
        h.update(text.encode("utf-8"))
    return h.hexdigest()[:12]


def build(folder: str | os.PathLike, bpe_size: int = BPE_SIZE) -> Path:
    """Train the tokenizer and save it (transformers' fast-tokenizer files) into `folder`."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)  # Llama's leading space
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, min_frequency=2, show_progress=False,
                                  special_tokens=[AddedToken(t, normalized=False) for t in SPECIAL_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(training_texts(), trainer=trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", bos)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        model_max_length=MODEL_MAX_LENGTH, model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False, padding_side="left",  # as the authors set it (train_decoder.py)
    )
    folder = Path(folder)
    tok.save_pretrained(str(folder))
    return folder


def get_model_path(bpe_size: int = BPE_SIZE, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached tokenizer folder (built on first use; safe when several processes race to build it)."""
    return cached_folder(f"llama-like-{fingerprint(bpe_size)}", lambda tmp: build(tmp, bpe_size), cache_dir)
