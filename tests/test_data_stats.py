"""`python -m lmk.data.stats` on a small file and on a generated corpus."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.data import stats  # noqa: E402


def test_stats_on_jsonl(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    rows = [{"query": "what is a cat", "pos": ["a cat is an animal"], "neg": ["dogs bark"] * (i % 3)} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert stats.main([str(path), "--json", "--cache-dir", str(tmp_path / "hf")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 6 and out["queries_without_negatives"] == 2
    assert out["negatives_per_query"]["max"] == 2
    q = out["tokens"]["minilm"]["query"]
    assert q["p50"] == 6  # [CLS] what is a cat [SEP]
    assert out["tokens"]["minilm"]["pos"]["max"] == 7


def test_stats_on_corpus(capsys):
    assert stats.main(["passkey", "--sample", "5"]) == 0
    text = capsys.readouterr().out
    assert "LocalPasskey/test_256" in text and "docs: 100" in text
