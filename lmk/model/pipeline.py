"""The encode pipeline: texts -> landmark-tokenized batches -> embeddings in input order, the model never waiting
on the tokenizer where it can be helped.

- Each text is tokenized once per call. Fixed batches (`batch_size` rows, sorted by character length) are known
  before any tokenization, so each batch is tokenized as a whole while the model runs the previous ones.
  Token-budget batches are planned from token lengths: windows of texts are tokenized into unpadded rows (the
  lengths come from that pass) and each batch is padded from its rows (exactly the tensors the tokenizer gives
  for those texts together: rows never depend on each other). Texts that reach the max length lead the plan in
  input order, so their batches go to the model while later windows are still tokenized; the rest follow once
  every length is known.
- `workers` processes (a torch DataLoader, forked so the tokenizer is inherited, one torch thread each) do the
  tokenization and landmark insertion, the pure-Python sentence splitter included, and keep `prefetch` results
  each ready; 0 does everything in the calling thread (debugging). On CUDA the batches are pinned and copied
  without blocking, and embeddings come back through pinned buffers checked a few batches later, so no batch ends
  with a synchronising copy.
- A failure while tokenizing (an exception, or a worker killed) is one `EncodeError` naming the text index; a
  NaN or inf embedding is a `NonFiniteEmbeddingError` naming its text index. Output values do not depend on
  `workers`: the same batches meet the same model.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lmk.model.batching import fixed_batches, token_budget_batches
from lmk.model.landmark.layouts import rows_and_local

WINDOW = 128  # texts per tokenization task when planning token-budget batches
MAX_AUTO_WORKERS = 8  # beyond this, tokenization outruns any single accelerator we target
SMALL_CALL_CHARS = 1 << 16  # auto workers: a call with fewer characters is tokenized in the calling thread
IN_FLIGHT = 4  # CUDA: embeddings copied back and not yet checked (their events are long done when read)
Features = dict[str, torch.Tensor]


class EncodeError(RuntimeError):
    """Tokenizing texts for encode failed (in a worker or not); the message names the text index."""


class NonFiniteEmbeddingError(ValueError):
    """An embedding holds NaN or inf; `index` is the text's position in the encode call."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        # an eval job's exception is pickled back to the sweeper (Hydra's and submitit's launchers)
        return type(self), (self.index, str(self))


def available_cpus() -> int:
    """CPUs this process may run on (a SLURM allocation, not the whole node)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(spec: Any, device: torch.device | str, chars: int | None = None) -> int:
    """`workers` -> a count. auto: none for a call whose texts total under SMALL_CALL_CHARS characters (forking
    costs about what tokenizing them does) or inside a daemonic process; else, beside an accelerator, up to 8 processes keeping 2 cores for
    the model's thread and the pinning thread, and on the CPU 1 where there are 4 cores or more (one worker
    overlaps tokenization and sentence splitting with the forward; on 2 cores it only takes them from torch's
    threads: measured 0.79x of the in-thread speed in `make bench`)."""
    if spec is None or spec == "auto":
        cpus = available_cpus()
        if (chars is not None and chars < SMALL_CALL_CHARS) or multiprocessing.current_process().daemon:
            return 0  # a daemonic process (a pool's worker) may not start processes of its own
        if torch.device(device).type == "cpu":
            return 1 if cpus >= 4 else 0
        return max(1, min(MAX_AUTO_WORKERS, cpus - 2))
    if isinstance(spec, bool) or not isinstance(spec, (int, np.integer)) or spec < 0:
        raise ValueError(f"workers={spec!r} is not valid; use 'auto' or an integer >= 0 (0: tokenize in the "
                         "model's thread, for debugging)")
    return int(spec)


def _check_prefetch(prefetch: Any) -> int:
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 1:
        raise ValueError(f"prefetch={prefetch!r} is not valid; use an integer >= 1 (ready batches per worker)")
    return int(prefetch)


# ------------------------------------------------------------------------------------------- rows and batches
def unpad(feats: Features) -> Features:
    """A tokenized batch as flat rows: ids (int32) and pool flags of every real token, row after row, and the
    length of each row."""
    mask = feats["attention_mask"].bool()
    return {"ids": feats["input_ids"][mask].to(torch.int32), "pool": feats["pool_mask"][mask],
            "lengths": mask.sum(dim=1)}


def collate(rows: dict[str, np.ndarray], idx: np.ndarray, pad_id: int, left_padding: bool) -> Features:
    """The padded batch of rows `idx` (flat `rows` as `unpad` gives them, with `offsets`): the tensors the
    landmark tokenizer returns for those texts together."""
    n = rows["lengths"][idx]
    width = int(n.max())
    r, local = rows_and_local(n)
    src = rows["offsets"][idx][r] + local
    cols = local + (width - n)[r] if left_padding else local
    ids = np.full((len(idx), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(idx), width), dtype=np.int64)
    pool = np.zeros((len(idx), width), dtype=bool)
    ids[r, cols] = rows["ids"][src]
    mask[r, cols] = 1
    pool[r, cols] = rows["pool"][src]
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
            "pool_mask": torch.from_numpy(pool)}


class _Tasks(Dataset):
    """Item k tokenizes the texts `groups[k]`: a whole batch (`as_rows` False) or a window of rows. A Python
    error comes back as {"error": message} naming the first text that fails alone; `owner[k]` holds the pid
    working on item k (-1 once done) so a killed worker's texts can be named."""

    def __init__(self, tokenize: Callable[[list[str]], Features], texts: Sequence[str],
                 groups: Sequence[np.ndarray], as_rows: bool, owner: torch.Tensor | None = None) -> None:
        self.tokenize, self.texts, self.groups, self.as_rows, self.owner = tokenize, texts, groups, as_rows, owner

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, k: int) -> dict[str, Any]:
        if self.owner is not None:
            self.owner[k] = os.getpid()
        idx = self.groups[k]
        try:
            feats = self.tokenize([self.texts[i] for i in idx])
            return unpad(feats) if self.as_rows else feats
        except Exception as exc:  # noqa: BLE001 - reported as one error naming the text, in the main process
            return {"error": self._failure(idx, exc)}
        finally:
            if self.owner is not None:
                self.owner[k] = -1

    def _failure(self, idx: np.ndarray, exc: Exception) -> str:
        culprit, err = None, exc
        for i in idx.tolist():  # the error path only: find the text that fails alone
            try:
                self.tokenize([self.texts[i]])
            except Exception as alone:  # noqa: BLE001 - the same failure, now tied to one text
                culprit, err = i, alone
                break
        where = f"text {culprit}" if culprit is not None else f"texts {_span(idx)}"
        return (f"{where} could not be tokenized ({type(err).__name__}: {err}); fix or drop that text (rerun with "
                "workers=0, eval.workers=0, to debug it in one process)")


def _span(idx: Sequence[int] | np.ndarray) -> str:
    idx = sorted(int(i) for i in idx)
    return f"{idx[0]}..{idx[-1]}" if len(idx) > 3 else ", ".join(map(str, idx))


def _keep(item: Any) -> Any:  # DataLoader collate_fn: items are already tensors (module level: picklable)
    return item


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # tokenization needs no intra-op threads; the model's process has the cores


def _exited(pid: int) -> bool:
    if not hasattr(os, "waitid"):  # macOS: the error then names no texts
        return False
    try:  # WNOWAIT: look without reaping (the DataLoader reaps its own workers)
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class _Items:
    """Items of `tasks` in order: computed here (workers=0) or by forked DataLoader workers. `close()` stops the
    workers; `explain(exc)` turns a DataLoader's dead-worker error (its SIGCHLD handler raises it wherever the
    main thread is) into an EncodeError naming the texts the dead worker held."""

    def __init__(self, tasks: _Tasks, workers: int, prefetch: int, pin: bool) -> None:
        self.tasks, self.it = tasks, None
        if workers == 0:
            self.source: Iterator[dict[str, Any]] = (tasks[k] for k in range(len(tasks)))
            return
        # forked workers inherit a tokenizer whose Rust threads may have run: keep them from starting new ones
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        tasks.owner = torch.zeros(len(tasks), dtype=torch.int64).share_memory_()
        # fork on Linux (cheap, nothing pickled); elsewhere the platform's default (macOS: fork is unsafe there)
        fork = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
        loader = DataLoader(tasks, batch_size=None, shuffle=False, num_workers=min(workers, len(tasks)),
                            collate_fn=_keep, pin_memory=pin, prefetch_factor=prefetch, worker_init_fn=_worker_init,
                            multiprocessing_context="fork" if fork else None)
        self.it = self.source = iter(loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for item in self.source:
            if "error" in item:
                raise EncodeError(item["error"])
            yield item

    def explain(self, exc: RuntimeError) -> EncodeError | None:
        if self.tasks.owner is None or "DataLoader worker" not in str(exc):
            return None
        owners = self.tasks.owner.tolist()
        dead = {p for p in set(owners) if p > 0 and _exited(p)}
        lost = [i for k, p in enumerate(owners) if p in dead for i in self.tasks.groups[k].tolist()]
        where = f"texts {_span(lost)}" if lost else "a batch of texts"
        return EncodeError(f"a tokenization worker died while preparing {where} ({exc}); rerun with workers=0 "
                           "(eval.workers=0) to find the cause in one process")

    def close(self) -> None:
        if self.it is not None:  # stop the workers now, not whenever the iterator is collected
            getattr(self.it, "_shutdown_workers", lambda: None)()
            self.it = None


@contextlib.contextmanager
def tokenizer_threads(enabled: bool) -> Iterator[None]:
    """The fast tokenizer's own threads (its batch parallelism) for the calls inside, when `enabled`.

    The project runs with TOKENIZERS_PARALLELISM=false (Makefile, the train command) so that no forked process
    inherits a thread pool it cannot use. Tokenizing in the model's thread (workers=0), nothing forks meanwhile and
    the model waits anyway, so the Rust tokenizer may use every core: half the time on 2 cores in `make bench`.
    The previous value is restored on exit, so a fork afterwards finds parallelism configured and off (no warning,
    no pool in the child).
    """
    if not enabled:
        yield
        return
    key, before = "TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ[key] = "true"  # read by the Rust tokenizer at each batch call
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


@contextlib.contextmanager
def _running(items: _Items) -> Iterator[_Items]:
    """Workers stopped on every exit; a dead worker reported as one EncodeError."""
    try:
        yield items
    except RuntimeError as exc:
        explained = items.explain(exc)
        if explained is None:
            raise
        raise explained from None
    finally:
        items.close()


# --------------------------------------------------------------------------------------------- the pipeline
def copy_to_host(emb: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    """A CUDA tensor copied into pinned memory without blocking, and the event that marks the copy's end: both on
    the stream of the tensor's own device (with eval.device=cuda:N the current device may be another one, whose
    stream knows nothing of this copy)."""
    with torch.cuda.device(emb.device):
        stream = torch.cuda.current_stream(emb.device)
        host = torch.empty(emb.shape, dtype=emb.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(emb, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    return host, event


class _Gather:
    """Embeddings into `out` by text index. On CUDA through pinned buffers and events, read IN_FLIGHT batches
    later (no synchronising copy per batch); every row checked finite when read."""

    def __init__(self, out: np.ndarray, device: torch.device) -> None:
        self.out, self.cuda = out, device.type == "cuda"
        self.pending: deque[tuple[np.ndarray, torch.Tensor, Any]] = deque()

    def add(self, idx: np.ndarray, emb: torch.Tensor) -> None:
        if not self.cuda:
            self._store(idx, emb.cpu())
            return
        self.pending.append((idx, *copy_to_host(emb)))
        while len(self.pending) > IN_FLIGHT:
            self._finish()

    def _finish(self) -> None:
        idx, host, event = self.pending.popleft()
        event.synchronize()
        self._store(idx, host)

    def close(self) -> None:
        while self.pending:
            self._finish()

    def _store(self, idx: np.ndarray, emb: torch.Tensor) -> None:
        arr = emb.numpy()
        bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        if len(bad):
            i = int(idx[bad[0]])
            raise NonFiniteEmbeddingError(i, f"the embedding of text {i} holds NaN or inf ({len(bad)} of its "
                                             "batch's rows do); check the weights, or encode in fp32 "
                                             "(eval.precision=fp32) if a half precision overflowed")
        self.out[idx] = arr


class _Rows:
    """Unpadded rows as the windows arrive (text i is row i - WINDOW * (i // WINDOW) of window i // WINDOW)."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []

    def add(self, part: Features) -> np.ndarray:
        """Store one window; returns its texts' lengths."""
        rows = {k: v.numpy() for k, v in part.items()}
        rows["offsets"] = np.cumsum(rows["lengths"]) - rows["lengths"]
        self.parts.append(rows)
        return rows["lengths"]

    def take(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The rows of texts `idx`, as a flat store of their own (row k = text idx[k])."""
        picked = [(self.parts[i // WINDOW], i % WINDOW) for i in idx.tolist()]
        lengths = np.array([p["lengths"][j] for p, j in picked], dtype=np.int64)
        spans = [slice(p["offsets"][j], p["offsets"][j] + p["lengths"][j]) for p, j in picked]
        return {"ids": np.concatenate([p["ids"][s] for (p, _), s in zip(picked, spans, strict=True)]),
                "pool": np.concatenate([p["pool"][s] for (p, _), s in zip(picked, spans, strict=True)]),
                "lengths": lengths, "offsets": np.cumsum(lengths) - lengths}


def _budget_batches(items: _Items, max_length: int, max_tokens: int, pad: tuple[int, bool]
                    ) -> Iterator[tuple[np.ndarray, Features]]:
    """Token-budget batches from windows of rows. The plan sorts longest first and no text exceeds `max_length`, so
    texts that reach it lead the plan in input order, `max_tokens // max_length` to a batch: those batches go to the
    model while later windows are still being tokenized; the rest follow once every length is known."""
    store, capped, lengths = _Rows(), [], []
    per_batch, streamed = max(1, max_tokens // max_length), []
    for part in items:
        start = sum(map(len, lengths))
        lengths.append(store.add(part))
        capped.extend((start + np.flatnonzero(lengths[-1] >= max_length)).tolist())
        while len(capped) >= (len(streamed) + 1) * per_batch:
            idx = np.array(capped[len(streamed) * per_batch : (len(streamed) + 1) * per_batch])
            streamed.append(idx)
            yield idx, collate(store.take(idx), np.arange(len(idx)), *pad)
    plan = token_budget_batches(np.concatenate(lengths), max_tokens)
    if any(not np.array_equal(a, b) for a, b in zip(plan, streamed, strict=False)):
        raise RuntimeError("lmk.model.pipeline: batches sent early differ from the plan; report this bug")
    for idx in plan[len(streamed):]:
        yield idx, collate(store.take(idx), np.arange(len(idx)), *pad)


def encode_texts(
    tokenize: Callable[[list[str]], Features],
    embed: Callable[[Features], torch.Tensor],
    texts: list[str],
    *,
    hidden_size: int,
    max_length: int,
    device: torch.device,
    batch_size: int = 32,
    max_tokens_per_batch: int | None = None,
    pad: tuple[int, bool] = (0, False),
    workers: Any = "auto",
    prefetch: int = 2,
    progress: str | None = None,
) -> tuple[np.ndarray, int]:
    """float32 [N, hidden_size] embeddings of `texts` in input order, and how many texts reached `max_length`.

    tokenize(texts) -> CPU features of those texts together (the landmark tokenizer at `max_length`);
    embed(CPU features) -> [B, H] embeddings on `device` (it moves the batch there). pad: (pad id, left
    padding) of the tokenizer. progress: a tqdm description, None for no bar.
    """
    n_workers = resolve_workers(workers, device, chars=sum(map(len, texts)))
    prefetch = _check_prefetch(prefetch)
    out = np.empty((len(texts), hidden_size), dtype=np.float32)
    if not texts:
        return out, 0
    pin = device.type == "cuda"
    if max_tokens_per_batch is None:
        # character length is a cheap proxy for token count: the batches are known before any tokenization
        plan = fixed_batches([len(t) for t in texts], batch_size)
        items = _Items(_Tasks(tokenize, texts, plan, as_rows=False), n_workers, prefetch, pin)
        batches: Iterator[tuple[np.ndarray, Features]] = zip(plan, items, strict=True)
    else:
        windows = [np.arange(s, min(s + WINDOW, len(texts))) for s in range(0, len(texts), WINDOW)]
        items = _Items(_Tasks(tokenize, texts, windows, as_rows=True), n_workers, prefetch, False)
        batches = _budget_batches(items, max_length, max_tokens_per_batch, pad)
    gather, truncated = _Gather(out, device), 0
    bar = tqdm(total=len(texts), desc=progress, unit="text") if progress is not None else None
    with tokenizer_threads(n_workers == 0), _running(items):
        for idx, feats in batches:
            truncated += int((feats["attention_mask"].sum(dim=1) >= max_length).sum())
            if pin and not feats["input_ids"].is_pinned():
                feats = {k: v.pin_memory() for k, v in feats.items()}
            gather.add(idx, embed(feats))
            if bar is not None:
                bar.update(len(idx))
        gather.close()
    if bar is not None:
        bar.close()
    return out, truncated
