"""The model side: texts -> landmark-tokenized features -> backbone -> pooler -> L2-normalised embeddings.

    landmark/        the code every export carries: LandmarkTokenizer (strategies, layouts, sentence splitters),
                     the poolers (@register_pooler: cls, mean, lmk, last_token, latent_attention) and LandmarkTransformer
    backbone.py      the transformers backbone + tokenizer of an encoder config (package, hub, random init)
    embedding.py     EmbeddingModel: build, encode (batched, any device / precision), save / load
    batching.py      inference batches by rows or by token budget; device.py: eval device and precision
    long_attention.py  sliding-window layers without a dense T x T mask at inference
    packed_attention.py  unpadded inference: a batch's real tokens as one row, varlen attention within each text
    exported.py      an export folder (lmk.sharing writes them) checked, then read back with lmk's own classes
    multi_vector.py  a text as its landmark states kept apart (MaxSim scoring), the states the lmk pooler averages
    loading.py       any model reference (run folder, export, .ckpt, HF encoder) -> EmbeddingModel
    modernbert_tokenizer.py  an offline tokenizer that behaves like ModernBERT's (rehearsal)
    decoder_tokenizer.py     an offline tokenizer shaped like Llama's / Mistral's (the random decoders)
    lora.py          LoRA adapters (peft) on a frozen backbone; the merged plain model an export carries

Writing an export is lmk.sharing.st_folder; the old path lmk.model.st_folder and the writers' names here still
resolve, with a DeprecationWarning.
"""

from lmk import interface, moved

__all__, _own = interface(__name__, {
    "lmk.model.backbone": ("is_checkpointing", "load_backbone"),
    "lmk.model.config_files": ("SHIPPED_CONFIGS", "load_config_json", "package_model_path", "shipped_config"),
    "lmk.model.batching": ("fixed_batches", "token_budget_batches"),
    "lmk.model.device": ("autocast", "resolve_device", "resolve_precision"),
    "lmk.model.checkpoint": ("CheckpointRefused", "allowed_types", "check_checkpoint", "load_checkpoint"),
    "lmk.model.embedding": ("EmbeddingModel", "make_tokenizer"),
    "lmk.model.exported": ("ExportFolderError", "LegacyPoolerLoader", "check_folder", "is_export", "is_multi_vector",
                           "load_exported"),
    "lmk.model.loading": ("load_hf_encoder", "load_model"),
    "lmk.model.lora": ("add_lora", "is_lora", "merged"),
    "lmk.model.multi_vector": ("encode_states", "no_landmarks", "padded_states", "pooled_states"),
    "lmk.model.packed_attention": ("PACKED", "Packing", "choose", "pack_plan", "packed_hidden_states"),
    "lmk.model.long_attention": ("BLOCK", "LEAN_SDPA", "banded_attention", "guard_padded_rows",
                                 "lean_attention"),
    "lmk.model.pipeline": ("EncodeError", "NonFiniteEmbeddingError", "WINDOW", "collate", "resolve_workers",
                           "unpad"),
    "lmk.model.shape": ("EncoderShape", "encoder_shape"),
}, modules=("backbone", "decoder_tokenizer", "modernbert_tokenizer", "packed_attention", "pipeline"))
__getattr__ = moved(__name__, {**{name: f"lmk.sharing.{name}" for name in (
    "CODE_DIR", "code_files", "export_multi_vector", "export_sentence_transformers", "needed_packages",
    "to_multi_vector_encoder")}, "LegacyExportPooling": "lmk.model.exported.LegacyPoolerLoader"}, inner=_own)
