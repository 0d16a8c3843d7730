"""`python -m lmk.export <run dir>`: the command is `lmk.eval.export_command` (a run -> a shareable folder, the hub).

Also the stable import path of lmk's sentence-transformers modules: folders written before the code travelled name
`lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling` in their modules.json.
"""

from lmk.model.landmark import LandmarkTransformer
from lmk.model.st_folder import LegacyExportPooling, export_sentence_transformers, load_exported

LandmarkPooling = LegacyExportPooling  # the name old folders' modules.json gives (not the LMK pooler: LMKPooling)
__all__ = ["LandmarkPooling", "LandmarkTransformer", "export_sentence_transformers", "load_exported"]

if __name__ == "__main__":
    import sys

    from lmk.eval.export_command import main
    from lmk.run.cli import guard

    sys.exit(guard(main)())  # a user error (no token, an unfinished run): what is wrong and the fix, exit 2
