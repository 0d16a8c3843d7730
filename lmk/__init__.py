"""Landmark (LMK) pooling for dense embeddings."""

__version__ = "0.1.0"
