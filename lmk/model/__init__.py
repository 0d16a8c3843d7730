"""The model side: texts -> landmark-tokenized features -> backbone -> pooler -> L2-normalised embeddings.

    landmark/        the code every export carries: LandmarkTokenizer (strategies, layouts, sentence splitters),
                     the poolers (@register_pooler: cls, mean, lmk, latent_attention) and LandmarkTransformer
    backbone.py      the transformers backbone + tokenizer of an encoder config (package, hub, random init)
    embedding.py     EmbeddingModel: build, encode (batched, any device / precision), save / load
    batching.py      inference batches by rows or by token budget; device.py: eval device and precision
    long_attention.py  sliding-window layers without a dense T x T mask at inference
    st_folder.py     an EmbeddingModel as a sentence-transformers folder carrying landmark/'s files; load_exported
    loading.py       any model reference (run folder, export, .ckpt, HF encoder) -> EmbeddingModel
    modernbert_tokenizer.py  an offline tokenizer that behaves like ModernBERT's (rehearsal)
"""


def __getattr__(name: str) -> object:
    if name == "EmbeddingModel":
        # lazy: `from lmk.model import EmbeddingModel` without importing torch for the layer's torch-free users
        from lmk.model.embedding import EmbeddingModel

        return EmbeddingModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
