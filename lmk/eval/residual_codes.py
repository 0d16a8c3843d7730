"""Residual codes of unit vectors (ColBERTv2 / PLAID compression), the storage of `eval.scoring=maxsim-compressed`.

A vector is stored as the id of its nearest centroid (spherical k-means over the corpus's landmark vectors) and its
residual (vector - centroid) quantized to `bits` per dimension: each residual value falls into one of 2^bits buckets
whose cutoffs are quantiles of the residual values seen at fitting, and decodes to the bucket's weight (the median
of the values it holds). A decoded vector is centroid + weights, L2-normalised (the vectors MaxSim scores are unit
vectors). At 2 bits a 768-wide vector is 192 bytes of residual and a 2- or 4-byte id instead of 3,072 float32 bytes.

Fitting is seeded and runs on the CPU in float32, so the same vectors give the same codes on every run. The byte
arithmetic (`vector_bytes`, `auto_centroids`: lmk.eval.residual_sizes, torch-free) is shared with the sweep's cost
model (lmk.sweep.cost.index).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# the byte arithmetic lives torch-free beside (the cost model reads it); its names stay importable from here
from lmk.eval.residual_sizes import (  # noqa: F401
    BITS,
    auto_centroids,
    check_bits,
    codebook_bytes,
    id_bytes,
    residual_bytes,
    vector_bytes,
)

FIT_SAMPLE = 2**16  # vectors k-means and the bucket quantiles are fitted on (a seeded sample of a larger corpus)
KMEANS_ITERS = 20
_QUANTILE_VALUES = 2**24  # residual values the bucket quantiles read (torch.quantile's input limit)
_ROWS = 8192  # vectors assigned to centroids at once (bounds the [rows, k] similarity block)


def _assign(vectors: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The nearest centroid (highest dot product) of every vector, in row blocks."""
    return torch.cat([(vectors[i:i + _ROWS] @ centroids.T).argmax(dim=1) for i in range(0, len(vectors), _ROWS)])


def kmeans(vectors: torch.Tensor, k: int, iters: int = KMEANS_ITERS, seed: int = 0) -> torch.Tensor:
    """Spherical k-means [k, dim] of unit `vectors` (CPU, float32): seeded initial centroids drawn from the vectors,
    then `iters` rounds of assignment and normalised means; a centroid left with no vector keeps its place."""
    vectors = vectors.float().cpu()
    k = min(k, len(vectors))
    gen = torch.Generator().manual_seed(seed)
    centroids = vectors[torch.randperm(len(vectors), generator=gen)[:k]].clone()
    for _ in range(iters):
        assign = _assign(vectors, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assign, vectors)
        filled = torch.bincount(assign, minlength=k) > 0
        centroids[filled] = F.normalize(sums[filled], dim=1)
    return centroids


def _pack(buckets: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, dim] bucket numbers (< 2^bits) -> [n, ceil(dim * bits / 8)] uint8, 8 / bits numbers per byte."""
    per = 8 // bits
    pad = (-buckets.shape[1]) % per
    b = F.pad(buckets.to(torch.int32), (0, pad)).view(len(buckets), -1, per)
    shifts = torch.arange(per, dtype=torch.int32) * bits
    return (b << shifts).sum(dim=2).to(torch.uint8)


def _unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    b = (packed.to(torch.int32).unsqueeze(2) >> shifts) & (2**bits - 1)
    return b.view(len(packed), -1)[:, :dim].long()


@dataclass
class ResidualCodec:
    """Centroids [k, dim], the residual buckets' cutoffs [2^bits - 1] and weights [2^bits], all float32."""

    centroids: torch.Tensor
    cutoffs: torch.Tensor
    weights: torch.Tensor
    bits: int

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @classmethod
    def fit(cls, vectors: torch.Tensor, bits: int = 2, centroids: int | None = None, seed: int = 0,
            sample: int = FIT_SAMPLE) -> ResidualCodec:
        """Fit on unit `vectors` [n, dim] (a seeded sample of `sample` of them when there are more): k-means with
        `centroids` (None: `auto_centroids(n)`), then the residual quantiles."""
        check_bits(bits)
        vectors = vectors.float().cpu()
        if len(vectors) == 0:
            raise ValueError("a residual codec needs at least one vector to fit on")
        gen = torch.Generator().manual_seed(seed)
        fit = vectors[torch.randperm(len(vectors), generator=gen)[:sample]] if len(vectors) > sample else vectors
        k = centroids if centroids is not None else auto_centroids(len(vectors))
        c = kmeans(fit, k, seed=seed)
        rows = fit[: max(1, _QUANTILE_VALUES // fit.shape[1])]
        residual = (rows - c[_assign(rows, c)]).flatten()
        levels = 2**bits
        cutoffs = torch.quantile(residual, torch.arange(1, levels) / levels) if levels > 1 else torch.zeros(0)
        weights = torch.quantile(residual, (torch.arange(levels) + 0.5) / levels)
        return cls(c, cutoffs.float(), weights.float(), bits)

    def encode(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit vectors [n, dim] -> (centroid ids [n] int32, packed residuals [n, residual_bytes] uint8)."""
        vectors = vectors.float().cpu()
        codes = _assign(vectors, self.centroids) if len(vectors) else torch.zeros(0, dtype=torch.long)
        buckets = torch.bucketize(vectors - self.centroids[codes], self.cutoffs)
        return codes.to(torch.int32), _pack(buckets, self.bits)

    def decode(self, codes: torch.Tensor, packed: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """(ids, packed residuals) -> unit vectors [n, dim] float32 on `device`."""
        centroids, weights = self.centroids.to(device), self.weights.to(device)
        residual = weights[_unpack(packed.to(device), self.bits, self.dim)]
        return F.normalize(centroids[codes.to(device).long()] + residual, dim=1)

    def nbytes(self) -> int:
        return codebook_bytes(self.dim, self.bits, len(self.centroids))
