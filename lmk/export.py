"""`python -m lmk.export <run dir>`: the command is `lmk.sharing.command` (a run -> a shareable folder, the hub).
Also the stable import path that folders written before the code travelled name in their modules.json:
`lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling`."""

from lmk.model.exported import LegacyPoolerLoader, load_exported
from lmk.model.landmark import LandmarkTransformer
from lmk.sharing.st_folder import export_sentence_transformers

LandmarkPooling = LegacyPoolerLoader  # old folders' modules.json name only: a loader, not the LMK pooler (LMKPooling)
__all__ = ["LandmarkTransformer", "export_sentence_transformers", "load_exported"]

if __name__ == "__main__":
    import sys

    from lmk.run.cli import guard
    from lmk.sharing.command import main

    sys.exit(guard(main)())  # a user error (no token, an unfinished run): what is wrong and the fix, exit 2
