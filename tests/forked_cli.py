"""`python -m lmk...` for tests, without paying the heavy imports per command.

Most of what a fast test spends on a command line is the interpreter importing torch, Lightning, transformers,
sentence-transformers and mteb again (about 10 CPU-seconds each time). Here one process per test worker imports them
once and forks a child per command: the child is a real, separate process that runs the module's `__main__` with the
given argv, working folder and environment, writes its own stdout / stderr and exits with its own code, as
`python -m` would. `run` is a drop-in for `subprocess.run` and falls back to a fresh interpreter wherever forking
could change what is tested:
- anything but `python -m <module>` with captured output and no stdin;
- an environment that differs in a variable read at import time (the hub, caches, threads, `PYTHON*`, `HOME`);
- a working folder other than the repository that holds Python code (it could shadow an imported module).
`run_code` does the same for `python -c <code>` (opt-in: code that patches a module must patch it where the warm
process's modules took the name from). `LMK_TEST_FORK=0` runs every command in a fresh interpreter (the
full-fidelity run, e.g. to rule this out)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Read when a library is imported (paths, offline mode, thread pools), so a forked child would not see a change.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "SENTENCE_TRANSFORMERS", "MTEB", "DATASETS", "TORCH",
                   "CUDA", "PYTHON", "OMP_", "MKL_", "OPENBLAS", "KMP_", "LD_", "HOME", "XDG_", "WANDB_DIR")
# What the entry points import (not the entry modules themselves: `python -m` runs those fresh, as `__main__`).
PRELOAD = ("torch", "lightning.pytorch", "transformers", "sentence_transformers", "mteb", "hydra", "omegaconf",
           "datasets", "wandb", "peft", "lmk.train.command", "lmk.eval.command", "lmk.sharing.command",
           "lmk.sweep.driver", "lmk.model.landmark",
           # what the commands load only past their refusals (their fast paths): the children's work, loaded once
           "lmk.sharing.publish", "lmk.sweep.cost.estimate", "lmk.eval.score_stats", "lmk.eval.tasks", "lmk.eval.replicas")

_server: subprocess.Popen | None = None
_server_env: dict[str, str] = {}
_lock = threading.Lock()


# ------------------------------------------------------------------------------------------------ the client side
def run(args: list[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
        capture_output: bool = False, text: bool = False, timeout: float | None = None, check: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(args, ...)`, forked from a warm interpreter where that runs the same command."""
    args = [str(a) for a in args]
    full_env = dict(os.environ if env is None else env)
    if not _forkable(args, cwd, full_env, capture_output, kwargs):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=capture_output, text=text, timeout=timeout,
                              check=check, **kwargs)
    return _forked(args, {"module": args[2]}, cwd, full_env, text, timeout, check)


def run_code(code: str, argv: list[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
             timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, ...)`, forked from the
    warm interpreter where the environment and working folder allow (as for `run`). Opt-in, unlike `run`: the code
    must not depend on being the first to import a module (the warm process has imported the entry points' modules,
    so patch a name where it is used, not only where it is defined)."""
    args = [sys.executable, "-c", code, *(str(a) for a in argv)]
    full_env = dict(os.environ if env is None else env)
    if not _runs_alike(cwd, full_env):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=check)
    return _forked(args, {"code": code}, cwd, full_env, True, timeout, check)


def _forked(args: list[str], what: dict[str, str], cwd: str | os.PathLike | None, full_env: dict[str, str],
            text: bool, timeout: float | None, check: bool) -> subprocess.CompletedProcess:
    with _lock, tempfile.TemporaryDirectory(prefix="lmk-cli-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        server = _ensure_server()
        request = {**what, "argv": args[3:], "cwd": str(Path(cwd or os.getcwd()).resolve()),
                   "env": full_env, "stdout": str(out), "stderr": str(err)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = int(server.stdout.readline())
        code = _wait(server, pid, timeout)
        stdout, stderr = out.read_bytes(), err.read_bytes()
    if text:
        stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    if code is None:
        raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
    proc = subprocess.CompletedProcess(args, code, stdout, stderr)
    if check:
        proc.check_returncode()
    return proc


def _forkable(args: list[str], cwd: str | os.PathLike | None, env: dict[str, str], capture_output: bool,
              kwargs: dict[str, Any]) -> bool:
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-m" or not capture_output or kwargs:
        return False
    return _runs_alike(cwd, env)


def _runs_alike(cwd: str | os.PathLike | None, env: dict[str, str]) -> bool:
    """Whether a child forked from the warm process, in `cwd` with `env`, imports what a fresh interpreter would."""
    if os.environ.get("LMK_TEST_FORK") == "0" or not hasattr(os, "fork"):
        return False
    changed = {k for k in set(env) | set(_server_env or os.environ)
               if env.get(k) != (_server_env or os.environ).get(k)}
    if any(k.startswith(IMPORT_TIME_ENV) for k in changed):
        return False
    folder = Path(cwd or os.getcwd()).resolve()
    return folder == ROOT or not _holds_python(folder)


def _holds_python(folder: Path) -> bool:
    try:
        return any(p.suffix == ".py" or (p / "__init__.py").exists() for p in folder.iterdir())
    except OSError:
        return False


def _ensure_server() -> subprocess.Popen:
    global _server, _server_env
    if _server is None or _server.poll() is not None:
        _server_env = dict(os.environ)
        _server = subprocess.Popen([sys.executable, __file__], cwd=ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, bufsize=1)
        atexit.register(_stop_server)
        ready = _server.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the warm CLI process did not start: {ready!r}")
    return _server


def _stop_server() -> None:
    """End of the test process: the warm process exits when its input closes (its CPU time then counts for ours)."""
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        _server.wait(timeout=60)


def _wait(server: subprocess.Popen, pid: int, timeout: float | None) -> int | None:
    """The child's exit code as subprocess reports it (-N for signal N), or None when it ran past `timeout`
    (then it and every process it started are killed)."""
    reply: list[str] = []
    reader = threading.Thread(target=lambda: reply.append(server.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reader.join()
        return None
    return int(reply[0])


# ------------------------------------------------------------------------------------------------ the server side
def _serve() -> None:
    import importlib

    # Replies go to a copy of the pipe; what the imports (or a child) print goes to stderr, never into a reply.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that fails to import fails again, visibly, in the child
            pass
    # Forking a process with threads copies only the calling one: a lock held by another would never be released.
    if threading.active_count() != 1:
        print(f"threads after the imports: {threading.enumerate()}", file=replies, flush=True)
        return
    # The preloaded objects never change: kept out of the children's garbage collections (which would otherwise walk,
    # and copy page by page, the whole inherited heap of torch and transformers).
    gc.freeze()
    print("ready", file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request)  # never returns: the child exits as `python -m` would
        print(pid, file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), file=replies, flush=True)


def _child(request: dict) -> None:
    import runpy

    os.setpgid(0, 0)  # its own process group: a timeout kills it and whatever it started
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, closed at exit
    sys.path[0] = request["cwd"]  # as `python -m` (and `python -c`) puts the working folder first
    try:
        if "code" in request:  # `python -c`: the code runs as a fresh __main__ module
            sys.argv = ["-c", *request["argv"]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(request["code"], "<string>", "exec"), main.__dict__)  # noqa: S102 - what `python -c` does
        else:
            sys.argv = ["-m", *request["argv"]]
            sys.modules.pop(request["module"], None)  # imported on the way by the preload: run it fresh
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:  # as the interpreter reads it: None is 0, a number its code, else printed and 1
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed with its traceback, exit code 1, as `python -m` does
        traceback.print_exc()
        code = 1
    # The end of `python -m` without tearing down the inherited modules one by one (seconds of a fresh
    # interpreter's exit): the non-daemon threads are joined, the exit handlers run, the output is flushed.
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.path[0] = str(ROOT)
    _serve()
