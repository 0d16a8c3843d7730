"""`python -m lmk.export <run dir>` runs `lmk.sharing.command`. Also the import path old folders' modules.json name:
`lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling` (their pooling's loader, not the LMK pooler)."""
from importlib import import_module

from lmk import interface

# fast path: the names (torch) load when first used, so `python -m lmk.export` refuses a wrong setting in a second
__all__, _names = interface(__name__, {"lmk.model.landmark": ("LandmarkTransformer",), "lmk.model.exported": (
    "load_exported",), "lmk.sharing.st_folder": ("export_sentence_transformers",)})


def __getattr__(name: str) -> object:
    return import_module("lmk.model.exported").LegacyPoolerLoader if name == "LandmarkPooling" else _names(name)


if __name__ == "__main__":
    from lmk.sharing.command import cli

    cli()
