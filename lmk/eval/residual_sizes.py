"""The byte arithmetic of residual codes (lmk.eval.residual_codes), torch-free: the sweep's cost model
(lmk.sweep.cost.index) sizes a compressed MaxSim index with it, before anything loads a model."""

from __future__ import annotations

import math

BITS: tuple[int, ...] = (1, 2, 4, 8)


def auto_centroids(n_vectors: int) -> int:
    """PLAID's centroid count for `n_vectors` vectors: the power of two at or below 16 sqrt(n), at most n."""
    if n_vectors < 1:
        return 1
    return max(1, min(n_vectors, 2 ** int(math.floor(math.log2(16 * math.sqrt(n_vectors))))))


def id_bytes(centroids: int) -> int:
    """Bytes of one centroid id: the smallest unsigned integer holding `centroids` ids."""
    return 1 if centroids <= 2**8 else 2 if centroids <= 2**16 else 4


def residual_bytes(dim: int, bits: int) -> int:
    return math.ceil(dim * bits / 8)


def vector_bytes(dim: int, bits: int, centroids: int) -> int:
    """Bytes one vector takes in the index: its packed residual and its centroid id."""
    return residual_bytes(dim, bits) + id_bytes(centroids)


def codebook_bytes(dim: int, bits: int, centroids: int) -> int:
    """Bytes shared by the whole index: float32 centroids, bucket cutoffs and weights."""
    return 4 * (centroids * dim + 2 * 2**bits - 1)


def check_bits(bits: int) -> int:
    if bits not in BITS:
        raise ValueError(f"residual codes of {bits} bits: allowed {list(BITS)}")
    return bits
