"""The sentence-transformers input module of an LMK model: landmark tokenization (LandmarkTokenizer) + the backbone.

`LandmarkTransformer` turns texts into `input_ids` / `attention_mask` / `pool_mask` (`preprocess`, the
sentence-transformers 5.4+ input hook) and runs the backbone (`forward` -> `token_embeddings`); the pooler that
follows it is one of poolers.py's classes. Its settings are saved with it (landmark_config.json), under the names
sentence-transformers' LMK pull request uses where the concept is the same:

    landmark_interval         the chunk size: a landmark after every that many content tokens (at inference)
    train_landmark_interval   the sizes drawn per text in training (strategy `variable`); null: landmark_interval
    lmk_token_id              the landmark token (the tokenizer's SEP, else EOS)

plus `strategy`, the sentence splitter's `language` / `sentence_splitter` / `max_sentence_tokens`, the draw's
`seed`, `max_seq_length` (the length texts are cut to after insertion) and `max_positions` (the backbone's).
In training mode (`model.train()`) the `variable` strategy draws its chunk sizes, as in the pull request; `encode`
runs in eval mode.

This file and its relative imports travel inside every exported model, so it imports only torch, transformers,
sentence-transformers, numpy, regex and the standard library.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from .backbone_inputs import backbone_inputs
from .koehn_splitter import prefix_file
from .legacy_config import LEGACY_CONFIG_FILE, export_settings
from .sliding_window_guard import guard_padded_rows
from .tokenization import LandmarkTokenizer, say_unset_cut

try:
    from sentence_transformers.base.modules import InputModule
except ImportError:  # sentence-transformers 5.x keeps its module classes in `models`
    from sentence_transformers.models import InputModule

CONFIG_FILE = "landmark_config.json"
PREFIX_DIR = "non_breaking_prefixes"  # the koehn splitter's prefix file, copied beside the config


def set_rope(model: PreTrainedModel, enabled: bool, name: str = "?") -> None:
    """`enabled=False` zeroes every rotary inverse frequency (and sets the rotary output scaling to 1), as the
    authors' `disable_rope` does for ModernBERT: cos = 1 and sin = 0 at every position, so attention no
    longer sees positions (the RoPE-off ablation). The buffers are not saved with the weights, so every
    loader calls this again (`rope` in the saved config)."""
    if enabled:
        return
    rotary = [m for m in model.modules()
              if any(n.endswith("inv_freq") for n, _ in m.named_buffers(recurse=False))]
    if not rotary:
        raise ValueError(
            f"encoder {name!r}: rope=false needs a rotary-position backbone (e.g. ModernBERT); "
            f"{type(model).__name__} has no rotary embedding (set encoder.rope=true)"
        )
    with torch.no_grad():
        for module in rotary:
            for key, buf in module.named_buffers(recurse=False):
                if key.endswith("inv_freq"):  # <layer_type>_inv_freq and its original_ copy
                    buf.zero_()
            for attr in [a for a in vars(module) if a.endswith("attention_scaling")]:
                setattr(module, attr, 1.0)


def read_settings(folder: str | Path) -> dict[str, Any]:
    """The input module's settings in a local export folder of any version (an old one's through legacy_config)."""
    folder = Path(folder)
    if (folder / CONFIG_FILE).is_file():
        return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    return export_settings(json.loads((folder / LEGACY_CONFIG_FILE).read_text(encoding="utf-8")))


def _tokenizer_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The saved settings (the pull request's names) -> LandmarkTokenizer's keyword arguments."""
    strategy, interval, drawn = config["strategy"], config["landmark_interval"], config.get("train_landmark_interval")
    if drawn is not None and strategy != "variable":
        raise ValueError(f"train_landmark_interval={drawn!r} with strategy {strategy!r}: only strategy 'variable' "
                         "draws chunk sizes in training; set train_landmark_interval to null")
    return {
        "strategy": strategy,
        "chunk_size": interval,
        "train_chunk_sizes": [drawn] if isinstance(drawn, int) else (drawn or [interval]),
        "max_length": config["max_seq_length"],
        "seed": config.get("seed", 0),
        "language": config.get("language", "en"),
        "sentence_splitter": config.get("sentence_splitter", "koehn"),
        "max_sentence_tokens": config.get("max_sentence_tokens"),
        "placement": config.get("placement", "after"),  # exports before placements existed: after
    }


class LandmarkTransformer(InputModule):
    """Texts -> landmark-tokenized features -> the backbone's `token_embeddings` (see the module doc)."""

    config_file_name = CONFIG_FILE
    save_in_root = True

    def __init__(self, auto_model: PreTrainedModel, landmark_tokenizer: LandmarkTokenizer,
                 max_seq_length: int | None = None, max_positions: int | None = None, rope: bool = True,
                 attn_implementation: str = "sdpa", lmk: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.auto_model = auto_model  # the attribute name sentence-transformers' own Transformer uses
        self.landmark_tokenizer = landmark_tokenizer
        self.tokenizer = landmark_tokenizer.tokenizer  # the Hugging Face tokenizer (InputModule's attribute)
        self.max_positions = int(max_positions or self.tokenizer.model_max_length)
        self._max_seq_length = int(max_seq_length or landmark_tokenizer.max_length)
        # neither given: the tokenizer's default length, said once when a text is cut there
        self._length_set = max_seq_length is not None or landmark_tokenizer.max_length_set
        self.rope = bool(rope)
        self.attn_implementation = attn_implementation
        self.lmk = dict(lmk or {})  # lmk's own description of the model (names, configs); never read here

    @property
    def max_seq_length(self) -> int:
        """The length texts are cut to after landmark insertion (`model.max_seq_length = N` sets it)."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self._max_seq_length = int(value)
        self._length_set = True

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Landmark tokenization, cut to `max_seq_length` after insertion (and to the backbone's positions)."""
        texts = list(inputs)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"LandmarkTransformer takes text only; input {i} is {type(text).__name__}")
        max_length = min(self.max_seq_length, self.max_positions)
        # a prompt (an instruction, sentence-transformers' `prompts`) precedes the text without landmarks in it
        features = self.landmark_tokenizer(texts, train=self.training, max_length=max_length, prompt=prompt or None)
        if not self._length_set:
            say_unset_cut(self, features, max_length, "set `model.max_seq_length = N` (or LandmarkTransformer(..., "
                          f"max_seq_length=N)); this backbone takes up to {self.max_positions} tokens")
        return features

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        inputs = backbone_inputs(self.auto_model, features)
        features["token_embeddings"] = self.auto_model(**inputs).last_hidden_state
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.auto_model.config.hidden_size)

    get_word_embedding_dimension = get_embedding_dimension  # the name sentence-transformers 5.x asks for

    def get_config_dict(self) -> dict[str, Any]:
        tok = self.landmark_tokenizer
        return {
            "max_seq_length": self.max_seq_length,
            "max_positions": self.max_positions,
            "strategy": tok.strategy,
            "landmark_interval": tok.chunk_size,
            "train_landmark_interval": list(tok.train_chunk_sizes) if tok.strategy == "variable" else None,
            "lmk_token_id": tok.landmark_id,
            "language": tok.language,
            "sentence_splitter": tok.sentence_splitter,
            "max_sentence_tokens": tok.max_sentence_tokens,
            "seed": tok.seed,
            "rope": self.rope,
            "attn_implementation": self.attn_implementation,
            "lmk": self.lmk,
            **({"placement": tok.placement} if tok.placement != "after" else {}),
        }

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.auto_model.save_pretrained(output_path, safe_serialization=safe_serialization)
        self.tokenizer.save_pretrained(output_path)
        self.save_config(output_path)
        tok = self.landmark_tokenizer
        if tok.strategy == "sentence" and tok.sentence_splitter == "koehn":
            self._save_prefixes(Path(output_path) / PREFIX_DIR)

    def _save_prefixes(self, folder: Path) -> None:
        """The koehn splitter's prefix file of this model's language, with the sentence-splitter package's licence
        (LGPL-3.0): the model then splits sentences without that package."""
        tok = self.landmark_tokenizer
        source = prefix_file(tok.language, tok.prefix_dir)
        folder.mkdir(parents=True, exist_ok=True)
        if source.resolve() != (folder / source.name).resolve():
            shutil.copyfile(source, folder / source.name)
        licence = folder / "LICENSE"
        if tok.prefix_dir is not None and (Path(tok.prefix_dir) / "LICENSE").is_file():
            if (Path(tok.prefix_dir) / "LICENSE").resolve() != licence.resolve():
                shutil.copyfile(Path(tok.prefix_dir) / "LICENSE", licence)
            return
        try:
            text = metadata.distribution("sentence-splitter").read_text("LICENSE")
        except metadata.PackageNotFoundError:
            text = None
        licence.write_text(text or "GNU Lesser General Public License v3 (LGPL-3.0): the non-breaking prefix "
                                   "files of the sentence-splitter package (Koehn & Schroeder; Digital Silk Road; "
                                   "Linas Valiukas), https://github.com/berkmancenter/mediacloud-sentence-splitter\n",
                           encoding="utf-8")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             trust_remote_code: bool = False, model_kwargs: dict[str, Any] | None = None,
             **kwargs: Any) -> LandmarkTransformer:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        config = cls.load_config(model_name_or_path, **hub)
        if "landmark_interval" not in config:
            old = cls.load_file_path(model_name_or_path, LEGACY_CONFIG_FILE, **hub)  # an export before this config
            if old is None:
                raise FileNotFoundError(f"{model_name_or_path}/{subfolder}: no {CONFIG_FILE} with landmark "
                                        "settings; not an LMK model folder")
            config = export_settings(json.loads(Path(old).read_text(encoding="utf-8")))
        source = {"subfolder": subfolder or "", "revision": revision, "token": token, "cache_dir": cache_folder,
                  "local_files_only": local_files_only, "trust_remote_code": trust_remote_code}
        backbone = AutoModel.from_pretrained(model_name_or_path, **source, **{
            "attn_implementation": config.get("attn_implementation", "sdpa"), **(model_kwargs or {})})
        set_rope(backbone, bool(config.get("rope", True)), str(model_name_or_path))  # not saved: reapply
        guard_padded_rows(backbone)  # as every lmk model: no NaN from a padded sliding-window row without a key
        hf_tok = AutoTokenizer.from_pretrained(model_name_or_path, model_max_length=int(config["max_positions"]),
                                               **source)
        settings = _tokenizer_settings(config)
        prefix_dir = None
        if settings["strategy"] == "sentence" and settings["sentence_splitter"] == "koehn":
            found = cls.load_file_path(model_name_or_path, f"{PREFIX_DIR}/{settings['language']}.txt", **hub)
            prefix_dir = str(Path(found).parent) if found else None  # None: the sentence-splitter package
        tok = LandmarkTokenizer(hf_tok, **settings, prefix_dir=prefix_dir)
        if config.get("lmk_token_id") not in (None, tok.landmark_id):
            raise ValueError(f"{model_name_or_path}: lmk_token_id={config['lmk_token_id']} but the tokenizer's "
                             f"landmark (its SEP, else EOS) is {tok.landmark_id}; the landmark is the tokenizer's "
                             "separator: set lmk_token_id to it")
        return cls(backbone, tok, max_seq_length=config["max_seq_length"], max_positions=config["max_positions"],
                   rope=config.get("rope", True), attn_implementation=config.get("attn_implementation", "sdpa"),
                   lmk=config.get("lmk"))
