"""What `publish` refuses before a model loads, torch-free: nothing to do, the hub token (none, refused, offline, a
bad repo id), an --out that holds files, a folder that is not a finished training run. `python -m lmk.export`
checks these before lmk.sharing.publish (torch, mteb) loads, so a wrong setting fails in a second."""

from __future__ import annotations

from pathlib import Path

from lmk.config import UserError
from lmk.hub.push import check_push
from lmk.run.results import STATUS_DONE, Results


class PublishError(UserError, ValueError):
    """A run that cannot be published (not finished, no model, no table row where one was named)."""


def _unfinished(run_dir: Path, results: Results) -> PublishError:
    if results.is_empty:
        return PublishError(f"{run_dir} has no results.json, so it is not a training run; give the folder "
                            "`python -m lmk.train` wrote (outputs/train/<name>/...)")
    if results.command == "evaluate":
        return PublishError(f"{run_dir} is an lmk.evaluate folder, not a training run; export the run it evaluated "
                            f"({(results.model or {}).get('run_dir') or 'model= of that evaluation'})")
    return PublishError(f"{run_dir} has not finished training (results.json status {results.status!r}); finish it "
                        "first: rerun its `python -m lmk.train ...` command, which resumes from its checkpoints")


def check_out(out: Path) -> None:
    """`out` is new or an empty folder (the folder appears whole there)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PublishError(f"--out {out} exists and is not empty (files of another model would be published with "
                           "this one); give a new folder")


def check_run(run_dir: Path) -> Results:
    """`run_dir` is a finished training run; its results."""
    results = Results.read(run_dir)
    if results.status != STATUS_DONE or results.command == "evaluate":
        raise _unfinished(run_dir, results)
    return results


def check_publish(run_dir: str | Path, out: str | Path | None, repo_id: str | None) -> None:
    """Every refusal of `publish` before its model loads, in its order: nothing to do, the hub token, `out`, the run."""
    if out is None and repo_id is None:
        raise PublishError("nothing to do: give --out DIR (write the folder) and/or --push-to-hub <org>/<name>")
    if repo_id:
        check_push(repo_id, verify=True)  # no token, a refused token, offline, a bad id: before the model loads
    if out is not None:
        check_out(Path(out))
    check_run(Path(run_dir))
