"""Deprecated path: an export is written by lmk.sharing.st_folder and read by lmk.model.exported (its legacy pooling
loader is `LegacyPoolerLoader`); each name resolves there, with a DeprecationWarning."""

from lmk import moved

_READ = ("ExportFolderError", "OLD_MODULES", "REFETCH", "check_folder", "is_export", "is_multi_vector", "load_exported")
_WRITE = ("CODE_DIR", "class_ref", "code_files", "export_multi_vector", "export_sentence_transformers",
          "needed_packages", "to_multi_vector_encoder", "to_sentence_transformer")
__getattr__ = moved(__name__, {**{n: f"lmk.model.exported.{n}" for n in _READ},
                               **{n: f"lmk.sharing.st_folder.{n}" for n in _WRITE},
                               "LegacyExportPooling": "lmk.model.exported.LegacyPoolerLoader"})
