"""The model side: texts -> landmark-tokenized features -> backbone -> pooler -> L2-normalised embeddings.

    tokenization.py  LandmarkTokenizer (strategies none / fixed / variable / sentence / every_k / multi_cls)
    layouts.py       where each token of a row goes (numpy), truncation after insertion; STRATEGY_TRAITS
    sentences.py     sentence splitters of the `sentence` strategy
    pooling/         the pooler registry (@register_pooler): cls, mean, lmk, latent_attention
    backbone.py      the transformers backbone + tokenizer of an encoder config (package, hub, random init)
    embedding.py     EmbeddingModel: build, encode (batched, any device / precision), save / load
    batching.py      inference batches by rows or by token budget; device.py: eval device and precision
    long_attention.py  sliding-window layers without a dense T x T mask at inference
    export.py        sentence-transformers modules (saved folders name them lmk.export.*)
    loading.py       any model reference (run folder, export, .ckpt, HF encoder) -> EmbeddingModel
    modernbert_tokenizer.py  an offline tokenizer that behaves like ModernBERT's (rehearsal)
"""


def __getattr__(name: str) -> object:
    if name == "EmbeddingModel":
        # lazy: `from lmk.model import EmbeddingModel` without importing torch for the layer's torch-free users
        from lmk.model.embedding import EmbeddingModel

        return EmbeddingModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
