"""Unpadded (packed) encoding: the real tokens of a padded batch as one row, attention kept within each text.

A padded batch [B, T] spends attention and MLP work on padding, and on a sliding-window backbone (ModernBERT) SDPA
gets a dense [B, 1, T, T] mask, which rules out its flash kernel. The packed path instead

- packs the real tokens of the batch into one row [1, N] (N = the batch's real tokens), with position ids that
  restart at 0 for each text (each token's position in its own text: the padded path's positions, which count
  from a row's first real token, lmk.model.landmark.backbone_inputs) and cumulative lengths `cu_seqlens`;
- runs the backbone with an attention implementation registered here ("lmk_varlen"), which attends within each
  text: `torch.nn.attention.varlen.varlen_attn` (FlashAttention, CUDA, bf16/fp16) with the layer's window (a
  ModernBERT sliding-window layer: |i - j| <= config.sliding_window; a decoder: causal, with Mistral's window when
  it has one), or, anywhere else, `reference_attention` (SDPA per text, the same windows): what the CPU tests use;
- unpacks the last hidden states to [B, T, H] (zeros at padding), so pooling over `pool_mask` (the landmark
  positions) is unchanged.

Transformers passes the keyword arguments of the backbone's forward down to its attention functions; the cumulative
lengths travel as its own packed-sequence names (`cu_seq_lens_q` / `cu_seq_lens_k` / `max_length_q` /
`max_length_k`). "lmk_varlen" registers no mask function, so transformers builds no mask for it (the mask argument
stays None). `choose` decides the path: packed where it pays and is exact (CUDA, varlen_attn, a supported
backbone, half precision), padded otherwise; `encoder.packed` (auto | true | false) forces either.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

__all__ = ["PACKED", "SUPPORTED", "Packing", "choose", "pack_plan", "packed_hidden_states", "reference_attention",
           "unsupported", "varlen_attention", "varlen_kernel"]

PACKED = "lmk_varlen"
# model types whose attention goes through transformers' attention interface with the layer's window, positions from
# position_ids and nothing else depending on the row: the tables' ModernBERT and decoders (tested on the CPU:
# modernbert, mistral, llama)
SUPPORTED = ("modernbert", "mistral", "llama")
HALF = (torch.bfloat16, torch.float16)
_registered = False


@dataclass(frozen=True)
class Packing:
    """Where a padded batch's real tokens go in the packed row."""
    index: torch.Tensor       # [N] positions of the real tokens in the flattened [B * T] batch, row after row
    positions: torch.Tensor   # [1, N] each token's position in its own text (0 at its first real token)
    cu_seqlens: torch.Tensor  # [B + 1] int32 cumulative lengths: text b is packed[cu[b]:cu[b + 1]]
    max_length: int           # the longest text's tokens
    shape: tuple[int, int]    # (B, T) of the padded batch

    def to(self, device: torch.device | str) -> Packing:
        return Packing(self.index.to(device, non_blocking=True), self.positions.to(device, non_blocking=True),
                       self.cu_seqlens.to(device, non_blocking=True), self.max_length, self.shape)


def pack_plan(attention_mask: torch.Tensor) -> Packing:
    """The packing of a padded batch (either padding side); build it from the CPU mask so nothing waits on a device."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    positions = (mask.long().cumsum(dim=1) - 1)[mask].unsqueeze(0)  # row-major, as `index`
    cu = F.pad(lengths.cumsum(dim=0), (1, 0)).to(torch.int32)
    return Packing(mask.reshape(-1).nonzero().squeeze(1), positions, cu,
                   int(lengths.max()) if lengths.numel() else 0, (int(mask.shape[0]), int(mask.shape[1])))


@functools.cache
def varlen_kernel() -> Any:
    """torch's varlen_attn (torch >= 2.10), or None."""
    try:
        # imported on use: torch < 2.10 has no varlen module (then the padded path stays)
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _kernel_params() -> frozenset[str]:
    fn = varlen_kernel()
    return frozenset(inspect.signature(fn).parameters) if fn is not None else frozenset()


def _windowed(backbone: Any) -> bool:
    cfg = backbone.config
    return "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) or \
        getattr(cfg, "sliding_window", None) is not None


def unsupported(backbone: Any) -> str | None:
    """Why `backbone` cannot run packed (None: it can, through `reference_attention` at least)."""
    cfg = getattr(backbone, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED:
        return f"backbone type {kind!r} is not one of the packed path's ({', '.join(SUPPORTED)})"
    impl = getattr(cfg, "_attn_implementation", None)
    if impl not in ("sdpa", "eager", PACKED):
        return f"attn_implementation {impl!r} (the packed path replaces sdpa or eager)"
    return None


def choose(backbone: Any, device: torch.device | str, precision: str, setting: bool | str = "auto"
           ) -> tuple[bool, str]:
    """(packed?, why) for an inference encode on `device` at `precision` (bf16 | fp16 | fp32).

    auto: packed where varlen_attn can run it (CUDA at compute capability 8 or newer, bf16/fp16, the window of a
    sliding-window layer supported by this torch) for a supported backbone, padded otherwise. true: packed, through
    `reference_attention` where varlen_attn cannot run (exact, not fast); refused for an unsupported backbone.
    false: padded."""
    if setting is False or setting == "false":
        return False, "padded (encoder.packed=false)"
    why = unsupported(backbone)
    if setting is True or setting == "true":
        if why is not None:
            raise ValueError(f"encoder.packed=true, but {why}; set encoder.packed=auto or false")
        return True, "packed (encoder.packed=true)"
    device = torch.device(device)
    if why is None and varlen_kernel() is None:
        why = "torch has no torch.nn.attention.varlen (torch >= 2.10)"
    if why is None and device.type != "cuda":
        why = f"device {device.type} (varlen_attn is CUDA only)"
    if why is None and precision not in ("bf16", "fp16") and getattr(backbone, "dtype", None) not in HALF:
        why = f"precision {precision} (FlashAttention runs bf16/fp16)"
    if why is None and torch.cuda.get_device_capability(device)[0] < 8:
        why = "GPU older than compute capability 8.0 (FlashAttention 2)"
    if why is None and _windowed(backbone) and "window_size" not in _kernel_params():
        why = "this torch's varlen_attn has no window_size (torch >= 2.11) for the sliding-window layers"
    return (True, "packed (varlen_attn)") if why is None else (False, f"padded: {why}")


def _window(module: Any, sliding_window: int | None, is_causal: bool | None) -> tuple[bool, int]:
    """(causal, left window) in FlashAttention's convention, as transformers' flash path reads a layer: the window
    `sliding_window - 1` on the left (and, bidirectional, on the right); -1 for none."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))
    return causal, (int(sliding_window) - 1 if sliding_window else -1)


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                        causal: bool, window: int, scale: float | None) -> torch.Tensor:
    """What varlen_attn computes, by SDPA per text: [N, H, D] inputs (keys may have fewer heads), [N, H, D] out.
    Query i of a text attends to its keys j with |i - j| <= window (window >= 0) and j <= i (causal)."""
    heads = query.shape[1]
    if key.shape[1] != heads:  # grouped-query attention: each key head serves consecutive query heads
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    out = torch.empty_like(query)
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        i = torch.arange(b - a, device=query.device)
        allowed = torch.ones(b - a, b - a, dtype=torch.bool, device=query.device)
        if window >= 0:
            allowed &= (i[:, None] - i[None, :]).abs() <= window
        if causal:
            allowed &= i[None, :] <= i[:, None]
        out[a:b] = F.scaled_dot_product_attention(query[a:b].transpose(0, 1), key[a:b].transpose(0, 1),
                                                  value[a:b].transpose(0, 1), attn_mask=allowed,
                                                  scale=scale).transpose(0, 1)
    return out


def _kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: torch.Tensor, max_length: int,
            causal: bool, window: int, scale: float | None) -> torch.Tensor:
    params, kwargs = _kernel_params(), {"scale": scale}
    if "window_size" in params:
        kwargs["window_size"] = (window, 0 if causal else window)
    elif window >= 0:  # choose() keeps a windowed backbone off such a torch
        raise RuntimeError("this torch's varlen_attn has no window_size; a sliding-window layer needs torch >= 2.11")
    else:
        kwargs["is_causal"] = causal
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    return varlen_kernel()(query, key, value, cu, cu, max_length, max_length, **kwargs)


def _varlen_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    sliding_window: int | None = None, is_causal: bool | None = None,
                    cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: [1, H, N, D] inputs, [1, N, H, D] output."""
    if cu_seq_lens_q is None or max_length_q is None:
        raise RuntimeError(f"attn_implementation {PACKED!r} needs cu_seq_lens_q and max_length_q "
                           "(lmk.model.packed_attention.packed_hidden_states passes them)")
    if attention_mask is not None or dropout:
        raise RuntimeError(f"attn_implementation {PACKED!r} takes no attention mask and no dropout (inference)")
    causal, window = _window(module, sliding_window, is_causal)
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [N, heads, D]
    if q.is_cuda and q.dtype in HALF and varlen_kernel() is not None:
        out = _kernel(q, k, v, cu_seq_lens_q, int(max_length_q), causal, window, scaling)
    else:
        out = reference_attention(q, k, v, cu_seq_lens_q, causal, window, scaling)
    return out.unsqueeze(0), None


def register() -> None:
    """Register "lmk_varlen" with transformers' attention interface (idempotent); no mask function on purpose."""
    global _registered
    if not _registered:
        AttentionInterface.register(PACKED, _varlen_forward)
        _registered = True


@contextlib.contextmanager
def varlen_attention(backbone: Any) -> Iterator[None]:
    """Within the block, `backbone` attends through "lmk_varlen"."""
    register()
    cfg = backbone.config
    before = cfg._attn_implementation
    cfg._attn_implementation = PACKED
    try:
        yield
    finally:
        cfg._attn_implementation = before


def _takes(backbone: Any, name: str) -> bool:
    base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone
    try:
        return name in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def packed_hidden_states(backbone: Any, feats: dict[str, torch.Tensor], packing: Packing | None = None
                         ) -> torch.Tensor:
    """The backbone's last hidden states [B, T, H] of a padded batch, computed packed (zeros at padding).
    `packing`: `pack_plan` of the batch's mask, already on the backbone's device (built here when None)."""
    packing = packing if packing is not None else pack_plan(feats["attention_mask"])
    device = feats["input_ids"].device
    if packing.index.device != device:
        packing = packing.to(device)
    inputs: dict[str, Any] = {"input_ids": feats["input_ids"].reshape(-1)[packing.index].unsqueeze(0),
                              "position_ids": packing.positions,
                              "cu_seq_lens_q": packing.cu_seqlens, "cu_seq_lens_k": packing.cu_seqlens,
                              "max_length_q": packing.max_length, "max_length_k": packing.max_length}
    if "token_type_ids" in feats and _takes(backbone, "token_type_ids"):
        inputs["token_type_ids"] = feats["token_type_ids"].reshape(-1)[packing.index].unsqueeze(0)
    if _takes(backbone, "use_cache"):
        inputs["use_cache"] = False  # a decoder would keep every layer's keys and values for nothing
    with varlen_attention(backbone):
        hidden = backbone(**inputs).last_hidden_state[0]
    b, t = packing.shape
    out = hidden.new_zeros(b * t, hidden.shape[-1])
    out[packing.index] = hidden
    return out.view(b, t, -1)
