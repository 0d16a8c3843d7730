"""Landmark tokenization: texts -> input_ids / attention_mask / pool_mask.

Layout of one text (docs/method.md section 1)::

    [CLS] z1 [LMK] z2 [LMK] ... zn [LMK]

`z_i` are chunks of content tokens, `[LMK]` is the tokenizer's own separator id (EOS where there is no
SEP), the leading token is CLS (BOS fallback). Truncation to `max_length` happens *after* insertion
(landmarks count toward it); a row whose landmarks were all cut gets its last token overwritten with a landmark.

Speed: the batch is tokenized once by the fast tokenizer (no special tokens, truncated to the largest
content that can still appear in the output), then every row is laid out with numpy index arithmetic on
flat arrays (one scatter into one padded array): no Python loop per token, no per-row torch op.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch

from .capacity import max_landmarks
from .layouts import STRATEGY_TRAITS, chunked_layout, pack, plain_layout, sentence_layout, with_prompt
from .names import PLACED_STRATEGIES, PLACEMENTS
from .sentences import DEFAULT_LANGUAGE, DEFAULT_SPLITTER, check_splitter, split_sentences

STRATEGIES: tuple[str, ...] = tuple(STRATEGY_TRAITS)  # the strategy names (their traits: layouts.py)

_CONFIG_KEYS = (
    "strategy",
    "chunk_size",
    "train_chunk_sizes",
    "max_length",
    "seed",
    "language",
    "sentence_splitter",
    "max_sentence_tokens",
    "placement",
)
MIN_MAX_LENGTH = 3  # [CLS] + one content token + one landmark
DEFAULT_MAX_LENGTH = 512  # where max_length is not given: a text cut there is said once (say_unset_cut)
_log = logging.getLogger(__name__)
# sentence strategy: a token spans well under this many characters on average (English ~4.5)
_CHARS_PER_TOKEN = 8
# sentence strategy at inference (the authors' eval script): a split whose pieces, joined by spaces, keep
# less than this share of the stripped text's characters (e.g. indented code) is replaced by the whole text
_MIN_SPLIT_KEPT = 0.9


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    # bool is an int subclass; True as a chunk size is always a bug
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def say_unset_cut(owner: Any, features: Mapping[str, torch.Tensor], max_length: int, fix: str) -> None:
    """Once per `owner` (a tokenizer, a model): a text filled `max_length` tokens, a length nobody set, so texts
    are being cut there; the warning names the length and `fix`, how to set it."""
    mask = features["attention_mask"]
    if getattr(owner, "_said_cut", False) or not mask.numel() or int(mask.sum(dim=1).max()) < max_length:
        return
    owner._said_cut = True
    _log.warning("%s: a text reached %d tokens (landmarks included) and was cut there, a default length nobody "
                 "set; %s", type(owner).__name__, max_length, fix)


def _check_max_length(value: Any, name: str = "max_length") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < MIN_MAX_LENGTH:
        raise ValueError(
            f"{name} must be an integer >= {MIN_MAX_LENGTH} (room for [CLS], one token and a landmark), "
            f"got {value!r}"
        )
    return int(value)


def _check_chunk_sizes(value: Any) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            f"train_chunk_sizes must be a non-empty list of integers >= 1, e.g. [32, 64, 128, 256]; "
            f"got {value!r}"
        )
    sizes = tuple(value)
    if not sizes:
        raise ValueError(
            "train_chunk_sizes must be a non-empty list of integers >= 1, e.g. [32, 64, 128, 256]"
        )
    return tuple(_check_positive_int("each of train_chunk_sizes", s) for s in sizes)


def _first_id(tokenizer: Any, *attrs: str) -> int | None:
    for attr in attrs:
        token_id = getattr(tokenizer, attr, None)
        if token_id is not None:
            return int(token_id)
    return None


def _worker_seed() -> int | None:
    """The torch DataLoader worker's seed, None in the main process."""
    info = torch.utils.data.get_worker_info()
    return None if info is None else int(info.seed)


class LandmarkTokenizer:
    """Wraps a Hugging Face (fast) tokenizer and inserts landmark tokens.

    Strategies (`STRATEGIES`):
      - ``none``: the normal ``[CLS] ... [SEP]`` truncated to max_length; pool_mask is all False
        (for the cls / mean poolers, which ignore it).
      - ``fixed``: a landmark after every `chunk_size` content tokens, the last chunk included.
      - ``variable``: like fixed, but with ``train=True`` each text draws its own chunk size from
        `train_chunk_sizes` (seeded generator owned here; `reseed`; inside DataLoader workers it is
        re-derived from `seed` and torch's per-worker seed); ``train=False`` uses `chunk_size`. Only this
        strategy draws: every other one trains with `chunk_size`, and reports `train_chunk_sizes` as (chunk_size,).
      - ``sentence``: a landmark after each piece of `sentence_splitter` for `language` (sentences.py;
        an empty piece, from a blank line, still gets one), each piece tokenized on its own. With
        `max_sentence_tokens` set, a longer piece also gets a landmark after every that many tokens of it
        (None: never cut, as the authors). At inference (``train=False``) a split that keeps under 90% of
        the text's characters is replaced by the whole text as one piece (the authors' eval script).
      - ``every_k``: the normal layout, no insertion; pool_mask at positions 0, chunk_size, 2 chunk_size, ...
      - ``multi_cls``: ``[CLS] z1 [CLS] z2 ... [CLS] zn [SEP]``; pool_mask on every CLS (leading one
        included); the final SEP is not pooled. A truncated row is cut to max_length - 1 and still ends
        with the SEP (the authors' eval script).

    `placement` (fixed, variable): ``after`` (default) puts each landmark after its chunk, the last chunk included;
    ``authors`` puts it before each chunk and none after the last (``[CLS] [LMK] z1 [LMK] z2 ... [LMK] zn``), the
    authors' decoder code, under which a causal model's landmarks never see the last chunk (docs/method.md s.10).
    A call's `prompt` (an instruction) goes between the leading token and the text's layout, without landmarks.

    Every strategy tokenizes with special-token splitting on: "[SEP]" written in a text stays text and can
    never inject a landmark, CLS or padding id into its row. `prefix_dir` (not a setting: where files are) is the
    folder of the koehn splitter's non-breaking prefix files; None reads the sentence-splitter package's.
    """

    def __init__(
        self,
        tokenizer: Any,
        strategy: str = "fixed",
        chunk_size: int = 32,
        train_chunk_sizes: Sequence[int] = (32, 64, 128, 256),
        max_length: int | None = None,
        seed: int = 0,
        language: str = DEFAULT_LANGUAGE,
        sentence_splitter: str = DEFAULT_SPLITTER,
        max_sentence_tokens: int | None = None,
        prefix_dir: str | None = None,
        placement: str = "after",
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown landmark strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown landmark placement {placement!r}; allowed: {', '.join(PLACEMENTS)}")
        if placement != "after" and strategy not in PLACED_STRATEGIES:
            raise ValueError(f"placement={placement!r} applies to strategies {', '.join(PLACED_STRATEGIES)}, not "
                             f"{strategy!r}; use placement='after'")
        self._placement = placement
        self._strategy = strategy
        self._chunk_size = _check_positive_int("chunk_size", chunk_size)
        self._train_chunk_sizes = _check_chunk_sizes(train_chunk_sizes)
        if strategy != "variable":  # no draw: training uses chunk_size, whatever the list says
            self._train_chunk_sizes = (self._chunk_size,)
        self._max_length = _check_max_length(DEFAULT_MAX_LENGTH if max_length is None else max_length)
        self._max_length_set = max_length is not None
        self._seed = _check_positive_int("seed", seed, minimum=0)
        if not isinstance(language, str) or not language:
            raise ValueError(f"language must be a language code such as 'en', got {language!r}")
        if strategy == "sentence":  # other strategies never split, so any splitter/language pair is fine
            check_splitter(sentence_splitter, language, prefix_dir)
        self._prefix_dir = None if prefix_dir is None else str(prefix_dir)
        self._language = language
        self._splitter = sentence_splitter
        self._max_sentence_tokens = (
            None
            if max_sentence_tokens is None
            else _check_positive_int("max_sentence_tokens (or null for no cap)", max_sentence_tokens)
        )

        landmark_id = _first_id(tokenizer, "sep_token_id", "eos_token_id")
        cls_id = _first_id(tokenizer, "cls_token_id", "bos_token_id")
        if landmark_id is None:
            raise ValueError(
                "the tokenizer has neither a SEP nor an EOS token to use as the landmark; "
                "allowed: a tokenizer with sep_token or eos_token set (e.g. tokenizer.sep_token = '[SEP]')"
            )
        if cls_id is None:
            raise ValueError(
                "the tokenizer has neither a CLS nor a BOS token to lead each text; "
                "allowed: a tokenizer with cls_token or bos_token set (e.g. tokenizer.cls_token = '[CLS]')"
            )
        self.tokenizer = tokenizer
        self._landmark_id = landmark_id
        self._cls_id = cls_id
        # padding is masked out, so any id works where a tokenizer has no pad token
        pad_id = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = int(pad_id) if pad_id is not None else landmark_id
        self._rng = np.random.default_rng(self._seed)
        self._rng_worker: int | None = None

    # ----------------------------------------------------------------------------------- properties
    @property
    def strategy(self) -> str:
        return self._strategy

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    @property
    def train_chunk_sizes(self) -> tuple[int, ...]:
        return self._train_chunk_sizes

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_length_set(self) -> bool:
        """Whether max_length was given (else DEFAULT_MAX_LENGTH, and a text cut there is said once)."""
        return self._max_length_set

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def language(self) -> str:
        return self._language

    @property
    def sentence_splitter(self) -> str:
        return self._splitter

    @property
    def max_sentence_tokens(self) -> int | None:
        return self._max_sentence_tokens

    @property
    def placement(self) -> str:
        return self._placement

    @property
    def prefix_dir(self) -> str | None:
        return self._prefix_dir

    @property
    def landmark_id(self) -> int:
        return self._landmark_id

    @property
    def cls_id(self) -> int:
        return self._cls_id

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def padding_side(self) -> str:
        """Read from the wrapped tokenizer at every call, so changing it there takes effect here."""
        return getattr(self.tokenizer, "padding_side", "right")

    # ------------------------------------------------------------------------------- config / rng
    def config(self) -> dict[str, Any]:
        """JSON-able settings; `from_config(tokenizer, cfg)` rebuilds an equal tokenizer. The placement is named only
        where it is not the default, so a model that does not use it keeps the description (and fingerprint) it had."""
        placed = {} if self._placement == "after" else {"placement": self._placement}
        return {
            "strategy": self._strategy,
            "chunk_size": self._chunk_size,
            "train_chunk_sizes": list(self._train_chunk_sizes),
            "max_length": self._max_length,
            "seed": self._seed,
            "language": self._language,
            "sentence_splitter": self._splitter,
            "max_sentence_tokens": self._max_sentence_tokens,
            **placed,
        }

    def max_landmarks(self, length: int) -> int:
        """The most landmark states a text can have at `length` tokens under this layout (capacity.max_landmarks)."""
        return max_landmarks(self._strategy, self._chunk_size, length)

    @classmethod
    def from_pooling(cls, tokenizer: Any, pooling: Any, max_length: int | None = None, seed: int = 0
                     ) -> LandmarkTokenizer:
        """The landmark tokenizer of a run's pooling (any object with lmk's PoolingConfig attributes: strategy,
        chunk_size, train_chunk_sizes, language, sentence_splitter, max_sentence_tokens, placement) over the encoder's
        Hugging Face `tokenizer`: the one constructor training, evaluation, statistics and export build it with."""
        return cls(tokenizer, strategy=pooling.strategy, chunk_size=pooling.chunk_size,
                   train_chunk_sizes=tuple(pooling.train_chunk_sizes), max_length=max_length, seed=seed,
                   language=pooling.language, sentence_splitter=pooling.sentence_splitter,
                   max_sentence_tokens=pooling.max_sentence_tokens, placement=pooling.placement)

    @classmethod
    def from_config(cls, tokenizer: Any, cfg: Mapping[str, Any], prefix_dir: str | None = None) -> LandmarkTokenizer:
        unknown = sorted(set(cfg) - set(_CONFIG_KEYS))
        if unknown:
            raise ValueError(
                f"unknown LandmarkTokenizer config keys {unknown}; allowed: {', '.join(_CONFIG_KEYS)}"
            )
        return cls(tokenizer, **dict(cfg), prefix_dir=prefix_dir)

    def reseed(self, seed: int) -> None:
        """Restart the chunk-size generator of the `variable` strategy from `seed`."""
        self._seed = _check_positive_int("seed", seed, minimum=0)
        self._rng = np.random.default_rng(self._seed)
        self._rng_worker = _worker_seed()  # a reseed inside a worker is kept as is

    def _generator(self) -> np.random.Generator:
        # DataLoader workers each hold a copy of this object: without this, every worker (and every
        # epoch, with non-persistent workers) would replay the same draws. torch gives each worker a
        # seed derived from the (seeded) main process per epoch, so mixing it in stays repeatable.
        worker = _worker_seed()
        if worker != self._rng_worker:
            self._rng = np.random.default_rng([self._seed, worker])
            self._rng_worker = worker
        return self._rng

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"LandmarkTokenizer({type(self.tokenizer).__name__}, {args})"

    # --------------------------------------------------------------------------------------- call
    def __call__(
        self, texts: Sequence[str] | str, train: bool = False, max_length: int | None = None,
        prompt: str | Sequence[str | None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Tokenize a batch: input_ids / attention_mask LongTensor[B, T], pool_mask BoolTensor[B, T].

        `prompt` (an instruction, one for the batch or one per text): its tokens follow the leading token and
        precede the text's layout, count toward `max_length`, and get no landmark and no pooled position."""
        if isinstance(texts, str):  # a lone string is one text, not a sequence of characters
            texts = [texts]
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(
                    f"texts[{i}] is {type(text).__name__} ({text!r:.60}); every text must be a str"
                )
        unset = max_length is None and not self._max_length_set  # the default length nobody set
        max_length = self._max_length if max_length is None else _check_max_length(max_length)
        if not texts:
            empty = torch.zeros((0, 0), dtype=torch.long)
            return {"input_ids": empty, "attention_mask": empty.clone(), "pool_mask": empty.bool()}

        strategy = self._strategy
        if strategy in ("none", "every_k"):
            # [CLS] content [SEP]: the content keeps max_length - 2 tokens so the SEP always survives
            layout = plain_layout(*self._content(texts, max_length - 2), self._landmark_id)
        elif strategy == "sentence":
            ids, s_len, s_row = self._sentence_ids(texts, max_length, train)
            layout = sentence_layout(ids, s_len, s_row, len(texts), self._max_sentence_tokens, self._landmark_id)
        else:
            if strategy == "variable" and train:
                sizes = np.asarray(self._train_chunk_sizes, dtype=np.int64)
                chunk_sizes = self._generator().choice(sizes, size=len(texts))
            else:
                chunk_sizes = np.full(len(texts), self._chunk_size, dtype=np.int64)
            # content past max_length - 1 can never land inside max_length, so it is not even converted
            layout = chunked_layout(*self._content(texts, max_length - 1), chunk_sizes, strategy == "multi_cls",
                                    self._landmark_id, self._cls_id, before=self._placement == "authors")
        if prompt:
            layout = with_prompt(layout, *self._prompt_ids(prompt, len(texts), max_length))
        features = pack(layout, max_length, strategy=strategy, chunk_size=self._chunk_size, cls_id=self._cls_id,
                        landmark_id=self._landmark_id, pad_id=self._pad_id, left_padding=self.padding_side == "left")
        if unset:
            say_unset_cut(self, features, max_length, "pass max_length=N to LandmarkTokenizer (or to the call)")
        return features

    # ------------------------------------------------------------------------------------ layouts
    def _encode(self, texts: list[str], max_content: int) -> list[list[int]]:
        # the one tokenizer call: no special tokens, truncated in Rust so long texts stay cheap
        return self.tokenizer(
            texts,
            add_special_tokens=False,
            truncation=True,
            max_length=max_content,
            return_attention_mask=False,
            return_token_type_ids=False,
            split_special_tokens=True,  # "[SEP]" in a text is text, not a landmark
        )["input_ids"]

    def _content(self, texts: list[str], max_content: int) -> tuple[np.ndarray, np.ndarray]:
        """Flat content ids and per-text lengths, truncated to `max_content` (no content past it can survive)."""
        return self._content_of(self._encode(texts, max_content))

    def _prompt_ids(self, prompt: str | Sequence[str | None], rows: int, max_length: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Flat prompt ids and per-row lengths (a text without a prompt: none)."""
        prompts = [prompt] * rows if isinstance(prompt, str) else [p or "" for p in prompt]
        if len(prompts) != rows:
            raise ValueError(f"{len(prompts)} prompts for {rows} texts; give one prompt, or one per text")
        distinct = sorted(set(prompts))
        encoded = dict(zip(distinct, self._encode(distinct, max_length)))
        return self._content_of([encoded[p] for p in prompts])

    @staticmethod
    def _content_of(enc: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
        return np.fromiter(chain.from_iterable(enc), dtype=np.int64, count=int(lengths.sum())), lengths

    def sentence_pieces(self, text: str, train: bool = False) -> tuple[list[str], bool]:
        """The pieces the `sentence` strategy lays out for `text`, and whether its split was replaced by the whole
        text (at inference only: a split keeping under 90% of the stripped text's characters, the authors' rule)."""
        pieces = split_sentences(text, self._language, self._splitter, self._prefix_dir)
        if not train and pieces:
            whole = text.strip()
            if len(" ".join(pieces)) < _MIN_SPLIT_KEPT * len(whole):
                return [whole], True
        return pieces, False

    def _split(self, text: str, train: bool) -> list[str]:
        return self.sentence_pieces(text, train)[0]

    def _sentence_ids(
        self, texts: list[str], max_length: int, train: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat content ids, tokens per sentence piece and the row of each piece.

        Only a prefix of a text can survive truncation, so the first tokenizer call takes the pieces
        that start within `_CHARS_PER_TOKEN * max_length` characters of their text; a text that comes out
        shorter than `max_length` has its remaining pieces tokenized in a second call. What is left out
        lies past `max_length`, so the result is exact, and its cost follows `max_length`, not the text.
        """
        sentences = [self._split(t, train) for t in texts]
        per_text = np.fromiter(map(len, sentences), dtype=np.int64, count=len(texts))
        flat = list(chain.from_iterable(sentences))
        s_row = np.repeat(np.arange(len(texts)), per_text)
        s_len = np.zeros(len(flat), np.int64)
        pieces: list[list[int]] = [[]] * len(flat)
        max_content = max_length - 1

        def tokenize(idx: np.ndarray) -> None:
            idx = idx[[bool(flat[i]) for i in idx.tolist()]]  # an empty piece has no tokens to ask for
            if not len(idx):
                return
            enc = self._encode([flat[i] for i in idx], max_content)
            for i, token_ids in zip(idx.tolist(), enc):
                pieces[i] = token_ids
            s_len[idx] = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))

        if flat:
            chars = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
            starts = np.cumsum(chars) - chars
            chars_before = starts - starts[np.cumsum(per_text)[s_row] - per_text[s_row]]
            first = chars_before < _CHARS_PER_TOKEN * max_length
            tokenize(np.flatnonzero(first))
            short = np.bincount(s_row, s_len, len(texts)) < max_content
            rest = np.flatnonzero(~first & short[s_row])
            if len(rest):
                tokenize(rest)
        ids = np.fromiter(chain.from_iterable(pieces), dtype=np.int64, count=int(s_len.sum()))
        return ids, s_len, s_row
