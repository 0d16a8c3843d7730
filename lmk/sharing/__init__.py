"""Sharing: a trained run -> a folder anyone can load (sentence-transformers alone, mteb), a model card, the hub.

    st_folder.py   an EmbeddingModel as a sentence-transformers folder carrying lmk/model/landmark's files (an
                   export; the training run writes one when it ends); lmk.model.exported reads it back
    mteb_model.py  an export (folder or hub id) as an mteb ModelMeta with its loader; results in the results-repository
                   layout
    card.py        the model card (README.md) generated from the run
    publish.py     a run -> a shareable folder (export, card, mteb results), then the hub
    command.py     `python -m lmk.export` (lmk/export.py runs it)
    push_rows.py   `python -m lmk.sweep ... --push-to-hub`: every finished row of a built table to the hub
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.sharing.card": ("TableRow", "card_row", "eval_results"),
    "lmk.sharing.mteb_model": ("load_model", "model_meta", "n_parameters", "save_results"),
    "lmk.sharing.publish": ("Publication", "PublishError", "publish", "write_folder"),
    "lmk.sharing.push_rows": ("publish_rows", "push_target"),
    "lmk.sharing.st_folder": ("CODE_DIR", "code_files", "export_multi_vector", "export_sentence_transformers",
                              "needed_packages", "to_multi_vector_encoder", "to_sentence_transformer"),
}, modules=("command", "publish", "st_folder"))
