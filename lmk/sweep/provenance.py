"""The data and environment part of a table's provenance: what each sweep's runs were computed from.

Read from the sweep folder only (nothing is rebuilt): each row's `results.json` (`environment`: the lock
hash, Python, what differed from the lock, the CPU kernels it computed with; `data_fingerprint`: the training data) and the manifest of every
hub mirror under it (the replicas' per-task content fingerprints, compared with the pinned ones of
`lmk/resources/data_fingerprints.json`, see `lmk.eval.fingerprints`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from lmk.hub import mirror
from lmk.run.results import Results


def _pinned_data() -> dict[str, str]:
    text = resources.files("lmk").joinpath("resources/data_fingerprints.json").read_text()
    return json.loads(text)["data"]


def _grouped(values: dict[str, Any]) -> str:
    """"`a` (rows x, y); `b` (row z)" or "`a` (all rows)"."""
    by_value: dict[str, list[str]] = {}
    for row, value in sorted(values.items()):
        by_value.setdefault(str(value), []).append(row)
    if len(by_value) == 1:
        return f"{next(iter(by_value))} (all rows)"
    return "; ".join(f"{v} (rows {', '.join(rows)})" for v, rows in by_value.items())


def _environment(env: dict[str, Any]) -> str:
    if not env:
        return "not recorded"
    n = env.get("n_differ")
    state = "no lock" if n is None else "matches the lock" if n == 0 else \
        f"{n} distribution(s) differ from the lock, e.g. {', '.join(env.get('differs_from_lock', [])[:2])}"
    kernels = env.get("cpu_kernels") or {}
    if kernels.get("capability"):  # what decides a CPU run's floats: the kernels ATen picked, set or not, threads
        how = "set" if kernels.get("switches") else "the CPU's own"
        state += f"; {kernels['capability']} kernels ({how}), {kernels.get('threads')} threads"
    return f"lock `{env.get('lock')}`, Python {env.get('python')}, {state}"


def provenance_lines(out: str | Path) -> list[str]:
    """Markdown lines (environment, training data, replicas) for the sweep folder `out`."""
    out = Path(out)
    envs, data = {}, {}
    for path in sorted(out.rglob("results.json")):
        res = Results.read(path.parent)
        if res.row_id is None:
            continue
        label = path.parent.relative_to(out).as_posix()  # train/<row>, train/<row>/seed<k>, zeroshot/<row>
        envs[label] = _environment(res.environment)
        if res.data_fingerprint:
            data[label] = f"`{res.data_fingerprint}`"
    lines = []
    if envs:
        lines.append(f"- environment: {_grouped(envs)}")
    if data:
        lines.append(f"- training data: {_grouped(data)}")
    pins = _pinned_data()
    for manifest in sorted(out.rglob(mirror.MANIFEST)):
        content = {task: fp for e in mirror.read_manifest(manifest.parent)["artifacts"]
                   for task, fp in (e.get("content") or {}).items()}
        if content:
            differ = [t for t, fp in content.items() if pins.get(f"replica:{t}") != fp]
            verdict = "all as pinned" if not differ else f"differ from the pinned ones: {', '.join(differ)}"
            lines.append(f"- replicas in `{manifest.parent.relative_to(out)}`: "
                         + ", ".join(f"{t} `{fp}`" for t, fp in sorted(content.items())) + f" ({verdict})")
    if lines:
        lines.insert(0, "Data and environment (`python -m lmk.eval.fingerprints` compares this machine's with the "
                        "pinned ones; `python -m lmk.run.environment check` lists what differs from the lock):")
    return lines
