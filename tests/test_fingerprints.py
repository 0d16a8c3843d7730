"""The rehearsal reproducible across machines: every generated or replicated data set has
a content fingerprint pinned in lmk/resources/data_fingerprints.json, and the table prints what its rows were
computed from (the lock, the replicas' content)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmk.config.eval import LENGTHS, RULER_VARIANTS
from lmk.data import longembed
from lmk.eval import fingerprints as fp
from lmk.eval.replicas import REPLICAS, Sizes, replica_fingerprint, write_replicas
from lmk.run.environment import lock_hash
from lmk.run.results import update_results
from lmk.sweep.provenance import provenance_lines


def test_every_set_has_a_pin_and_the_resource_only_sets_match_it() -> None:
    pins = fp.pinned()
    assert set(pins["data"]) == {"offline-pairs", "bge-full-data-replica", "local:passkey", "local:needle", "local:prose",
                                 *(f"replica:{t}" for t in REPLICAS), *(f"ruler:{v}" for v in RULER_VARIANTS)}
    # built from lmk/resources only: the same on every machine, whatever the environment
    assert longembed.fingerprint(longembed.generate_passkey(LENGTHS)) == pins["data"]["local:passkey"]
    assert longembed.fingerprint(longembed.generate_needle(LENGTHS)) == pins["data"]["local:needle"]
    assert fp.ruler_fingerprints() == {f"ruler:{v}": pins["data"][f"ruler:{v}"] for v in RULER_VARIANTS}
    for task in ("LEMBPasskeyRetrieval", "LEMBNeedleRetrieval"):
        assert replica_fingerprint(task, REPLICAS[task].splits(Sizes())) == pins["data"][f"replica:{task}"]


@pytest.mark.slow
def test_every_generated_set_matches_its_pin() -> None:
    """The sets read from installed packages match where the environment is the pinned one (the lock plus
    Python); elsewhere the test says the environment differs instead of failing on the code."""
    pins = fp.pinned()
    env_fp = fp.environment_fingerprint()
    current = fp.fingerprints()
    diff = fp.compare(current, env_fp, pins)
    if env_fp != pins["environment_fingerprint"]:
        assert not [d for d in diff if "the code changed" in d], diff
        here = fp.environment()["versions"]
        pytest.skip(f"this environment differs from the pinned one ({here} vs {pins['environment']}): only the "
                    "resource-only sets are comparable")
    assert diff == []


def test_a_difference_names_its_cause() -> None:
    pins = {"environment_fingerprint": "e1", "data": {"offline-pairs": "a", "local:needle": "b"}}
    same_env = fp.compare({"offline-pairs": "x", "local:needle": "b"}, "e1", pins)
    assert same_env == ["offline-pairs: x, pinned a (the code changed)"]
    other_env = fp.compare({"offline-pairs": "x", "local:needle": "y"}, "e2", pins)
    assert other_env == ["local:needle: y, pinned b (the code changed)",
                         "offline-pairs: x, pinned a (your environment differs)"]


def test_the_table_prints_the_lock_and_the_replicas_content(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    for row in ("cls", "mean"):
        update_results(out / "train" / row, row=row, status="done", data_fingerprint="replica:bge-full-data:abc")
    write_replicas(out / "hub-mirror", ["LEMBNeedleRetrieval"])  # the rehearsal's sizes: as pinned
    write_replicas(out / "other-mirror", ["SciFact"], Sizes(n_queries=2, n_docs=4))  # other sizes: not
    lines = provenance_lines(out)
    text = "\n".join(lines)
    assert f"lock `{lock_hash()}`" in text and "(all rows)" in text
    assert "training data: `replica:bge-full-data:abc` (all rows)" in text
    assert f"LEMBNeedleRetrieval `{fp.pinned()['data']['replica:LEMBNeedleRetrieval']}` (all as pinned)" in text
    assert "differ from the pinned ones: SciFact" in text
