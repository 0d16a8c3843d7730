"""What older lmk versions saved under names lmk no longer writes: the one module that reads them.

`lmk_config.json` was the file `EmbeddingModel.save_pretrained` wrote (now `embedding_model.json`), and exports
written before the input module saved its own `landmark_config.json` hold it at their root. Both are the same
description of a model (its tokenizer's settings under `tokenizer`, the export's length as `st_max_seq_length`).
This file travels inside every export with the rest of the package, so it imports only the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LEGACY_CONFIG_FILE = "lmk_config.json"


def saved_config_file(folder: str | Path, name: str) -> Path | None:
    """The model description a save_pretrained folder holds: `name`, else the legacy file; None when neither."""
    for file in (Path(folder) / name, Path(folder) / LEGACY_CONFIG_FILE):
        if file.is_file():
            return file
    return None


def export_settings(old: dict[str, Any]) -> dict[str, Any]:
    """An old export's root config -> the settings `landmark_config.json` holds today (the export's names)."""
    tok, enc = old["tokenizer"], old.get("encoder") or {}
    return {
        "max_seq_length": old.get("st_max_seq_length") or old["passage_max_length"],
        "max_positions": old["max_positions"],
        "strategy": tok["strategy"],
        "landmark_interval": tok["chunk_size"],
        "train_landmark_interval": tok["train_chunk_sizes"] if tok["strategy"] == "variable" else None,
        **{k: tok[k] for k in ("language", "sentence_splitter", "max_sentence_tokens", "seed") if k in tok},
        "rope": enc.get("rope", True),
        "attn_implementation": enc.get("attn_implementation", "sdpa"),
        "lmk": {k: old.get(k) for k in ("name", "encoder", "pooling", "query_max_length", "passage_max_length")},
    }
