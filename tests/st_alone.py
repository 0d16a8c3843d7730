"""Load exported models with sentence-transformers alone, as a user without lmk would, and save their embeddings.

    python -I tests/st_alone.py [--multi-vector] <texts.json> <out dir> <model folder or hub id>...

Run with `python -I` (no current folder or PYTHONPATH on sys.path); an import hook then refuses `lmk` (installed in
this venv as an editable package) and the optional splitter packages, so the only code that can run is the
model folder's own. Writes <out>/<i>.npy per model, or <out>/<i>.error with the exception's text. With
--multi-vector each folder loads as a MultiVectorEncoder: <out>/<i>.npz holds each text's document vectors
(doc<k>) and query vectors (query<k>), and <out>/<i>.scores.npy their MaxSim (queries x documents).
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import traceback
from pathlib import Path

REFUSED = ("lmk", "sentence_splitter", "sentencex", "spacy")


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201 - the finder protocol
        if fullname.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (refused: this environment has no lmk)",
                                      name=fullname)
        return None


def main() -> None:
    sys.meta_path.insert(0, Refuse())
    try:
        import lmk  # noqa: F401 - must fail
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("lmk is importable: the check would prove nothing")
    import numpy as np
    from sentence_transformers import SentenceTransformer

    args = sys.argv[1:]
    multi_vector = args[:1] == ["--multi-vector"]
    args = args[1:] if multi_vector else args
    texts = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    for i, ref in enumerate(args[2:]):
        try:
            if multi_vector:
                from sentence_transformers import MultiVectorEncoder

                model = MultiVectorEncoder(ref, trust_remote_code=True, device="cpu")
                docs = model.encode_document(texts, batch_size=3)
                queries = model.encode_query(texts, batch_size=3)
                np.savez(out / f"{i}.npz", **{f"doc{k}": d.numpy() for k, d in enumerate(docs)},
                         **{f"query{k}": q.numpy() for k, q in enumerate(queries)})
                np.save(out / f"{i}.scores.npy", model.similarity(queries, docs).numpy())
            else:
                model = SentenceTransformer(ref, trust_remote_code=True, device="cpu")
                np.save(out / f"{i}.npy", model.encode(texts, batch_size=3, convert_to_numpy=True))
            (out / f"{i}.modules").write_text(json.dumps([type(m).__module__ for m in model]))
        except Exception as err:  # recorded for the test to read
            (out / f"{i}.error").write_text(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED)
    (out / "refused_loaded.json").write_text(json.dumps(loaded))


if __name__ == "__main__":
    main()
