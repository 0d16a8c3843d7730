"""What a run writes follows the umask (mkstemp/mkdtemp alone would make it 0600/0700)."""

from __future__ import annotations

import os
import stat

import pytest

from lmk.run.results import update_results


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_results_json_follows_umask(tmp_path, umask_022):
    update_results(tmp_path / "run", status="done")
    assert mode(tmp_path / "run" / "results.json") == 0o644
    assert mode(tmp_path / "run") == 0o755


def test_eval_json_files_follow_umask(tmp_path, umask_022):
    from lmk.run.umask_files import write_json  # what the eval runner writes its files with

    write_json(tmp_path / "per_query.json", {"a": 1}, indent=1)
    assert mode(tmp_path / "per_query.json") == 0o644


def test_offline_pairs_cache_folder_follows_umask(tmp_path, umask_022):
    from lmk.data import offline_pairs as op

    folder = op.ensure_offline_pairs(tmp_path, max_rows=60)
    assert mode(folder) == 0o755
    entries = list(folder.rglob("*"))  # a BGE-layout repo: card, meta.json, data/<split>-*.parquet
    assert any(f.suffix == ".parquet" for f in entries)
    assert all(mode(f) == (0o755 if f.is_dir() else 0o644) for f in entries)
