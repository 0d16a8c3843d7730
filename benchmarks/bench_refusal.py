"""How long a wrong setting takes to be refused: `python -m lmk.train <setting>` from start to its error line.

Every check that needs no heavy import runs first (lmk's rules on the section as written, data paths, task names
from mteb's cached registry), so these settings fail before Lightning or mteb loads. The peer is a setting only
Lightning's Trainer signature can refuse (`trainer.precision=bogus`): what every refusal cost when the signature
was read first. The goal is the README's "a typo fails in a second" with room for a slower machine: under 2 s,
judged on the interval of the repeats (each sample is its time over 2 s).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import check_size, figure

SECTION = "refusal"
# tiny (the tests): each setting once, no warm-up and no peer (a Lightning import: seconds of the suite)
SIZES: dict[str, dict[str, Any]] = {"tiny": {"repeats": 1, "peer": False}, "full": {"repeats": 7, "peer": True}}
GOAL_S = 2.0
# name -> the overrides of a command line that must be refused
SETTINGS: dict[str, list[str]] = {
    "streaming without max_steps": ["data.streaming=true", "trainer.max_steps=-1", "+trainer.max_epochs=1"],
    "misspelt task": ["eval=local", "eval.tasks=[LocalShrt]"],
    "monitor with no evaluation": ["train.monitor=eval/local-short", "eval=none"],
}
PEER = ["trainer.precision=bogus"]


def refusal_seconds(overrides: list[str]) -> float:
    """Wall seconds of one `python -m lmk.train` that must exit 1 (a refusal); RuntimeError if it does not."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    with tempfile.TemporaryDirectory() as cwd:  # Hydra makes the run folder (outputs/...) before the task refuses
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "lmk.train", *overrides], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
        took = time.perf_counter() - start
    if proc.returncode != 1 or "Traceback" in proc.stderr:
        raise RuntimeError(f"lmk.train {' '.join(overrides)} was not refused in one line (exit {proc.returncode}): "
                           f"{proc.stderr[-500:]}")
    return took


def run(size: str = "tiny") -> list[dict[str, Any]]:
    sizes = SIZES[check_size(size)]
    repeats = sizes["repeats"]
    peer = None
    if sizes["peer"]:
        refusal_seconds(SETTINGS["misspelt task"])  # warms the mteb task-name cache, as any earlier job on the machine
        peer = statistics.median(refusal_seconds(PEER) for _ in range(repeats))
    figures = []
    for name, overrides in SETTINGS.items():
        ours = [refusal_seconds(overrides) for _ in range(repeats)]
        figures.append(figure(
            SECTION, f"refused: {name}", unit="s", ours=statistics.median(ours), peer=peer,
            peer_name="a refusal that needs Lightning's Trainer signature", ratio_def=f"seconds / {GOAL_S:g} s",
            goal=("<=", 1.0), ratio_samples=[t / GOAL_S for t in ours],
            details={"overrides": overrides, "times_s": ours}))
    return figures
