"""The parameter walk of the evaluation entry point and of the sweep's eval stage, measured on real runs.

    PYTHONPATH=$PWD .venv/bin/python tools/eval_walk.py [--only evaluate|stage] [--json FILE] [--trace]

`evaluate`: one tiny evaluation in this process, as `python -m lmk.evaluate pooling=cls eval=table2-tiny`
(lmk.eval.command.cli, into a temporary run folder). `stage`: the sweep's eval stage (lmk.sweep.eval_stage's
entry, as lmk.sweep.driver calls it) of the tiny scale for one trained row, with the row sweeper's launch
replaced by writing each planned job's finished results.json (no training, no subprocess), so that planning,
preparing, launching and merging all run.

A room is a function of lmk/eval or lmk/sweep (module + qualified name; comprehensions and lambdas belong to
the function around them, module and class bodies run by an import are no room); the walk is the innermost room on the call stack after each call and return
(`sys.setprofile`), repeats collapsed. Printed per walk, for functions and for modules:
    rooms    distinct rooms visited
    moves    changes of room
    returns  moves into a room already left (back to a caller, or a call into a room visited before)
    re-entries  the returns that are calls (a walk going back to an earlier room, not up the stack)
    edges    distinct (from, to) moves: the walk's shape, independent of how many tasks / texts loop
    distinct returns  distinct (from, to) moves that were returns (a loop over tasks counts once)
What an import runs (module bodies, the decorators that register local tasks) is no part of the walk.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WATCHED = tuple(str(ROOT / "lmk" / p) + os.sep for p in ("eval", "sweep"))
INNER = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")


def _room(frame: Any) -> str | None:
    code = frame.f_code
    # module and class bodies (an import) are not rooms: only functions are optimized code
    if not code.co_flags & inspect.CO_OPTIMIZED or code.co_name in INNER or not code.co_filename.startswith(WATCHED):
        return None
    module = Path(code.co_filename).relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
    return f"{module}:{getattr(code, 'co_qualname', code.co_name)}"


class Walk:
    """The sequence of rooms a run passes through, recorded by `sys.setprofile`."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.steps: list[tuple[str, str]] = []  # (room, "call" | "return")
        self.importing = 0  # module bodies running: what they call (decorators registering tasks) is no walk

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        if frame.f_code.co_name == "<module>":
            self.importing += 1 if event == "call" else -1
            return
        if self.importing:
            return
        room = _room(frame)
        if room is None:
            return
        if event == "call":
            self.stack.append(room)
        elif self.stack:
            self.stack.pop()
        here = self.stack[-1] if self.stack else None
        if here is not None and (not self.steps or self.steps[-1][0] != here):
            self.steps.append((here, event))

    def run(self, fn: Callable[[], Any]) -> Any:
        sys.setprofile(self._profile)
        try:
            return fn()
        finally:
            sys.setprofile(None)

    def figures(self, level: str = "function") -> dict[str, Any]:
        seq: list[tuple[str, str]] = []
        for room, how in self.steps:
            room = room.split(":")[0] if level == "module" else room
            if not seq or seq[-1][0] != room:
                seq.append((room, how))
        seen: set[str] = set()
        returns = reentries = 0
        back: set[tuple[str, str]] = set()  # the distinct moves that were returns
        for i, (room, how) in enumerate(seq):
            if i and room in seen:
                returns += 1
                reentries += how == "call"
                back.add((seq[i - 1][0], room))
            seen.add(room)
        edges = {(a[0], b[0]) for a, b in zip(seq, seq[1:])}
        return {"rooms": len(seen), "moves": max(len(seq) - 1, 0), "returns": returns, "re-entries": reentries,
                "edges": len(edges), "distinct returns": len(back), "sequence": [r for r, _ in seq]}


def evaluate_walk(tmp: Path) -> Walk:
    """`python -m lmk.evaluate pooling=cls eval=table2-tiny` in this process."""
    from lmk.eval.command import cli

    argv = sys.argv
    sys.argv = ["lmk.evaluate", "pooling=cls", "eval=table2-tiny", f"hydra.run.dir={tmp / 'evaluate'}"]
    walk = Walk()
    try:
        walk.run(lambda: _exit_ok(cli))
    finally:
        sys.argv = argv
    section = json.loads((tmp / "evaluate" / "results.json").read_text())["eval"]
    print(f"evaluate: groups {section['groups']}", flush=True)
    return walk


def _exit_ok(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except SystemExit as err:
        if err.code not in (0, None):
            raise


def stage_walk(tmp: Path) -> Walk:
    """The tiny scale's eval stage for one trained row, each planned job finished by writing its results.json."""
    from lmk.run.results import update_results
    from lmk.sweep.eval_stage import run_stage
    from lmk.sweep.spec import Scale

    out, row = tmp / "sweep", "cls"
    run = out / "train" / row
    (run / "export").mkdir(parents=True)
    (run / "export" / "model.safetensors").write_bytes(b"weights")
    update_results(run, status="done", command="train")
    scale = Scale(name="tiny", columns=[], eval_stage={"overrides": ["eval=table2-tiny"], "shard_by": "group"})
    planned: list[Any] = []

    def sweep_command(block: Any, eval_dir: Path, *_: Any) -> list[str]:
        planned.append((block, eval_dir))
        return ["launch", block.name]

    def run_block(cmd: list[str], env: Any) -> int:
        for block, eval_dir in planned:  # what each job of the block would write
            for job in block.jobs():
                tasks = next(o for o in job.overrides if o.startswith("eval.tasks=")).split("=", 1)[1]
                fp = next(o for o in job.overrides if o.startswith("++model_fingerprint=")).split("=", 1)[1]
                scores = {t: {"main_score": 0.5, "metric": "ndcg_at_10", "splits": {"test": 0.5}}
                          for t in tasks.strip("[]").split(",")}
                update_results(eval_dir / job.id, status="done", command="evaluate",
                               config={"model_fingerprint": fp.strip("'")},
                               eval={"suite": "table2-tiny", "tasks": scores, "timings": {}, "scoring": "single"})
        return 0

    walk = Walk()
    code = walk.run(lambda: run_stage(scale, [row], out, "walk-eval", False, False, sweep_command, run_block))
    merged = json.loads((run / "results.json").read_text())["eval"]
    print(f"stage: exit {code}, merged shards {merged['stage']['shards']}", flush=True)
    return walk


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("evaluate", "stage"))
    parser.add_argument("--json", type=Path, help="write the figures and sequences here")
    parser.add_argument("--trace", action="store_true", help="print each walk's sequence of rooms")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("evaluate", evaluate_walk), ("stage", stage_walk)):
            if args.only not in (None, name):
                continue
            walk = fn(Path(tmp))
            report[name] = {level: walk.figures(level) for level in ("function", "module")}
    for name, levels in report.items():
        for level, fig in levels.items():
            print(f"{name:8} {level:8} rooms {fig['rooms']:3}  moves {fig['moves']:4}  returns {fig['returns']:4}  "
                  f"re-entries {fig['re-entries']:4}  edges {fig['edges']:3}  distinct returns {fig['distinct returns']:3}")
            if args.trace:
                print("    " + " -> ".join(r.split(":")[-1] for r in fig["sequence"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
