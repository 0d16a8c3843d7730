"""The LMK authors' trainable latent-attention pooler (their modeling.py, after NV-Embed)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .poolers import Pooler, masked_mean, register_pooler


@register_pooler
class LatentAttentionPooling(Pooler):
    """Latent-attention pooling in the LMK authors' design (their modeling.py, after NV-Embed).

    Every token attends to `num_latents` learnable vectors (queries from the tokens, keys and values from
    the latents, no mask: the latents are never padding), then a GEGLU feed-forward block; both blocks are
    pre-norm and residual (the latents get their own norm). The pooled vector is the masked mean of the
    result. Their sizes: 64 latents of the hidden size, hidden_size // 64 heads of head_dim = hidden_size
    each, bias-free projections, feed-forward width 4 x hidden_size; latents initialised N(0, 1).
    """

    name = "latent_attention"  # needs: names.DECLARED_POOLERS["latent_attention"] (the hidden size; trainable)

    def __init__(
        self,
        hidden_size: int,
        num_latents: int = 64,
        num_heads: int | None = None,
        head_dim: int | None = None,
        ff_mult: int = 4,
    ) -> None:
        super().__init__()
        num_heads = hidden_size // num_latents if num_heads is None else num_heads
        head_dim = hidden_size if head_dim is None else head_dim
        for key, value in (
            ("hidden_size", hidden_size),
            ("num_latents", num_latents),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("ff_mult", ff_mult),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                hint = " (hidden_size // num_latents is 0: set num_heads)" if key == "num_heads" else ""
                raise ValueError(f"latent_attention {key} must be an integer >= 1, got {value!r}{hint}")
        self.hidden_size, self.num_latents, self.num_heads = hidden_size, num_latents, num_heads
        self.head_dim, self.ff_mult = head_dim, ff_mult
        inner = num_heads * head_dim
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_size))
        self.attn_norm = nn.LayerNorm(hidden_size)
        self.latent_norm = nn.LayerNorm(hidden_size)
        self.to_q = nn.Linear(hidden_size, inner, bias=False)
        self.to_kv = nn.Linear(hidden_size, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, hidden_size, bias=False)
        self.ff_norm = nn.LayerNorm(hidden_size)
        self.ff_in = nn.Linear(hidden_size, 2 * ff_mult * hidden_size)
        self.ff_out = nn.Linear(ff_mult * hidden_size, hidden_size)

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # [B, heads, N, head_dim]

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if token_embeddings.shape[-1] != self.hidden_size:
            raise ValueError(
                f"latent_attention was built for hidden_size {self.hidden_size}, got {token_embeddings.shape[-1]}"
            )
        # run in the pooler's own dtype (float32 params) so a bf16 backbone output works too
        x = token_embeddings.to(self.latents.dtype)
        latents = self.latent_norm(self.latents).unsqueeze(0).expand(x.shape[0], -1, -1)
        q = self._heads(self.to_q(self.attn_norm(x)))
        k, v = (self._heads(t) for t in self.to_kv(latents).chunk(2, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim), as theirs
        x = x + self.to_out(attended.transpose(1, 2).flatten(2))
        value, gate = self.ff_in(self.ff_norm(x)).chunk(2, dim=-1)
        x = x + self.ff_out(value * F.gelu(gate))  # GEGLU
        return masked_mean(x, attention_mask)

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hidden_size": self.hidden_size,
            "num_latents": self.num_latents,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "ff_mult": self.ff_mult,
        }
