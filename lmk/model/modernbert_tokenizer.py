"""An offline tokenizer that behaves like ModernBERT's, for rehearsing the paper path without the hub.

ModernBERT-base's tokenizer is a cased byte-level BPE (OLMo's): words carry their leading space (`Ġthe`),
its 50,280 BPE entries come first, then [UNK]=50280 [CLS]=50281 [SEP]=50282 [PAD]=50283 [MASK]=50284,
then unused entries up to 50,368 (a multiple of 64); `[CLS] text [SEP]`, no token type ids,
model_max_length 8192. This module trains the same kind of tokenizer, smaller (`bpe_size` merges), on
text every Python install has (the standard library's `pydoc_data.topics`), deterministically, and keeps
it under the lmk cache dir (`$LMK_CACHE/tokenizers/modernbert-like-<fingerprint>/`).

`get_model_path()` makes this module usable wherever a model package is: `encoder.tokenizer:
lmk.model.modernbert_tokenizer` (see conf/encoder/modernbert-base-shape.yaml).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from pydoc_data.topics import topics

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from lmk.run.umask_files import cache_root, follow_umask

# ModernBERT's special tokens, in its id order after the BPE entries
SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
MODEL_MAX_LENGTH = 8192
BPE_SIZE = 4000
VOCAB_MULTIPLE = 64  # ModernBERT pads its vocabulary to a multiple of 64 with [unusedN] entries
VERSION = 1  # bump when the recipe changes (it is part of the cache fingerprint)


def training_texts() -> list[str]:
    """The training text: pydoc topics (English prose and code), in a fixed order."""
    return [topics[k] for k in sorted(topics)]


def fingerprint(bpe_size: int = BPE_SIZE) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"v": VERSION, "bpe": bpe_size, "tokenizers": tokenizers.__version__}).encode())
    for text in training_texts():
        h.update(text.encode("utf-8"))
    return h.hexdigest()[:12]


def build(folder: str | os.PathLike, bpe_size: int = BPE_SIZE) -> Path:
    """Train the tokenizer and save it (transformers' fast-tokenizer files) into `folder`."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(training_texts(), trainer=trainer)
    n = backend.get_vocab_size()
    # specials after the merges (ModernBERT's layout), [MASK] eating the space before it like ModernBERT's
    backend.add_special_tokens([AddedToken(t, lstrip=t == "[MASK]", normalized=False) for t in SPECIAL_TOKENS])
    total = -(-(n + len(SPECIAL_TOKENS)) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    backend.add_tokens([AddedToken(f"[unused{i}]", normalized=False) for i in range(total - n - len(SPECIAL_TOKENS))])
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token="[MASK]", model_max_length=MODEL_MAX_LENGTH, model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,  # transformers 5 refuses it for BPE (it strips spaces)
    )
    folder = Path(folder)
    tok.save_pretrained(str(folder))
    return folder


def get_model_path(bpe_size: int = BPE_SIZE, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached tokenizer folder (built on first use; safe when several processes race to build it)."""
    return cached_folder(f"modernbert-like-{fingerprint(bpe_size)}", lambda tmp: build(tmp, bpe_size), cache_dir)


def cached_folder(name: str, build_into: Callable[[Path], object], cache_dir: str | os.PathLike | None = None) -> Path:
    """`$LMK_CACHE/tokenizers/<name>`, written by `build_into(folder)` on first use (into a temporary folder renamed
    into place: safe when several processes race to build it)."""
    root = cache_root(cache_dir) / "tokenizers"
    folder = root / name
    if (folder / "tokenizer.json").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    follow_umask(tmp, directory=True)  # mkdtemp makes it 0700
    try:
        build_into(tmp)
        try:
            os.rename(tmp, folder)  # atomic: a reader never sees half a folder
        except OSError:
            if not (folder / "tokenizer.json").exists():  # not a lost race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
