"""Evaluation: mteb encoder adapter, local tasks, suites, scoring, the runner and the Lightning callback.

Submodules are imported where used (mteb is heavy): `from lmk.eval.runner import run_suite`,
`from lmk.eval.callback import build_eval_callback`, `from lmk.config.eval import EvalConfig`.
"""

__all__ = ["callback", "config", "encoder", "estimate", "mirror", "replicas", "runner", "scoring", "stage", "suites",
           "tasks"]
