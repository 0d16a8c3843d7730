"""`python -m benchmarks.run [--size tiny|full] [--out DIR]`: every benchmark, one JSON + one Markdown report.

Each section runs in this one process, side by side with its peer; a section that raises is recorded
with its error (the others still run) and makes the exit status 1. Goals missed do not fail the run
unless `--strict` is given: the report is the deliverable, the lead reads the pass/fail column.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import SIZES, check_size, env_info

# section name -> module (each has SECTION, SIZES and run(size) -> list[figure])
SECTIONS: dict[str, str] = {
    "tokenization": "benchmarks.bench_tokenization",
    "encode": "benchmarks.bench_encode",
    "train_step": "benchmarks.bench_train_step",
    "train_tokens": "benchmarks.bench_token_budget",
    "long_inputs": "benchmarks.bench_long_inputs",
    "roofline": "benchmarks.bench_roofline",
    "gpu": "benchmarks.bench_gpu",
    "refusal": "benchmarks.bench_refusal",
    "maxsim": "benchmarks.bench_maxsim",
}
REPORT_JSON, REPORT_MD = "bench.json", "bench.md"
SCHEMA_VERSION = 2  # 2: figures carry "verdict" and "ci"


def parse_sections(spec: str | None) -> list[str]:
    if not spec:
        return list(SECTIONS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in SECTIONS]
    if bad:
        raise ValueError(f"unknown benchmark section(s) {bad}; allowed: {', '.join(SECTIONS)}")
    return names


def run_benchmarks(size: str = "tiny", sections: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the sections and return the report dict (what bench.json holds)."""
    check_size(size)
    sections = list(sections) if sections is not None else list(SECTIONS)
    report: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "size": size, "env": env_info(),
                              "sections": {}, "figures": []}
    start_all = time.perf_counter()
    for name in parse_sections(",".join(sections)):
        start = time.perf_counter()
        entry: dict[str, Any] = {"status": "ok", "error": None}
        try:
            figures = importlib.import_module(SECTIONS[name]).run(size)
            report["figures"].extend(figures)
            entry["figures"] = len(figures)
        except Exception as exc:  # one broken section must not hide the others' figures
            entry.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            print(f"[bench] section {name} failed: {entry['error']}", file=sys.stderr)
        entry["wall_s"] = time.perf_counter() - start
        report["sections"][name] = entry
        print(f"[bench] {name}: {entry['status']} in {entry['wall_s']:.1f} s", file=sys.stderr, flush=True)
    report["total_wall_s"] = time.perf_counter() - start_all
    return report


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def to_markdown(report: dict[str, Any]) -> str:
    """The human-readable report: one table row per figure, then the sections' wall times and errors."""
    env = report["env"]
    lines = [
        f"# lmk benchmarks (size: {report['size']})",
        "",
        f"torch {env.get('torch')}, transformers {env.get('transformers')}, {env.get('cpu_count')} CPUs "
        f"({env.get('torch_threads')} torch threads), CUDA: {env.get('gpu', 'no')}; "
        f"load average at start {tuple(round(x, 2) for x in env.get('loadavg', ()))}; "
        f"total {report.get('total_wall_s', 0):.1f} s. Times are medians of repeats, warm-up excluded; ours and "
        "the peer run interleaved (AB BA AB..., the order rotated each repeat), a timed ratio is the geometric "
        "mean of the per-repeat paired ratios [95% t-interval], and a goal is PASS/FAIL only when the whole "
        "interval clears/misses it (else inconclusive).",
        "",
        "| section | figure | unit | ours | peer | ratio | ratio is | goal | pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in report["figures"]:
        verdict = f"skipped: {f['reason']}" if f["status"] != "ok" else f.get("verdict", "info")
        ratio = _fmt(f["ratio"])
        if f.get("ci"):
            ratio += f" [{_fmt(f['ci'][0])}, {_fmt(f['ci'][1])}]"
        lines.append(
            f"| {f['section']} | {f['name']} | {f['unit']} | {_fmt(f['ours'])} | {_fmt(f['peer'])} "
            f"({f['peer_name'] or '-'}) | {ratio} | {f['ratio_def'] or '-'} | {f['goal'] or '-'} "
            f"| {verdict} |"
        )
    lines += ["", "| section | status | wall s | error |", "|---|---|---|---|"]
    for name, s in report["sections"].items():
        lines.append(f"| {name} | {s['status']} | {s['wall_s']:.1f} | {s['error'] or ''} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / REPORT_JSON, out / REPORT_MD
    js.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md.write_text(to_markdown(report))
    return js, md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=SIZES, help="tiny: seconds, for tests; full: the report")
    ap.add_argument("--out", default="outputs/bench", help="folder for bench.json and bench.md")
    ap.add_argument("--only", default=None, help=f"comma-separated sections (default all): {', '.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's choice; 1 avoids stalls on a shared machine)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed, too")
    args = ap.parse_args(argv)
    sections = parse_sections(args.only)
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    report = run_benchmarks(args.size, sections)
    js, md = write_report(report, args.out)
    print(md.read_text())
    print(f"[bench] wrote {js} and {md}", file=sys.stderr)
    failed = any(s["status"] == "error" for s in report["sections"].values())
    missed = any(f["passed"] is False for f in report["figures"])
    return 1 if failed or (args.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
