"""Gradient caching (GradCache, Gao et al. 2021): a contrastive batch far larger than memory allows.

The loss couples every query with every passage, so it cannot be split into independent
mini-batches. Instead:
1. embed the batch in mini-batches ("chunks") without autograd graphs, saving each chunk's RNG state;
2. compute the loss on the detached embeddings (as autograd leaves) and backprop to them only;
3. re-run each chunk with autograd (RNG state restored, so dropout draws the same masks) and
   backprop the cached embedding gradients into the parameters.
Peak activation memory is one chunk's; the loss and the parameter gradients equal the uncached ones.

An embedding may be a Tensor or a multi-vector `(states, mask)` pair (lmk.train.embeddings): each chunk then has its
own width, so the chunks are padded to the widest for the loss (`concat`) and each chunk's cached gradient is sliced
back to its rows and width (`grad_slice`). Planning the chunks (lmk.train.chunks: by rows, or by a token budget with
each chunk padded to its own longest row) and reassembling their embeddings (`embed_without_grad`'s concatenation, then
`ChunkPlan.restore`: the batch's row order, inside the loss's graph) are separate steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from lmk.train.chunks import ChunkPlan, plan_chunks, split_features
from lmk.train.embeddings import Embedding, as_leaf, concat, grad_slice, rows, values

__all__ = ["RandState", "backward_chunks", "cached_step", "embed_without_grad", "grad_cache_step", "split_features"]

Features = Mapping[str, Tensor]
EmbedFn = Callable[[Features], Embedding]


class RandState:
    """CPU (+ CUDA, when in use) RNG state at one point, replayable with `replay()`."""

    def __init__(self, devices: Sequence[torch.device]) -> None:
        self.cpu_state = torch.get_rng_state()
        self.cuda_devices = sorted({d.index or 0 for d in devices if d.type == "cuda"})
        self.cuda_states = [torch.cuda.get_rng_state(i) for i in self.cuda_devices]

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        # fork_rng restores the surrounding RNG afterwards, so replaying does not rewind the run's RNG.
        with torch.random.fork_rng(devices=self.cuda_devices):
            torch.set_rng_state(self.cpu_state)
            for i, state in zip(self.cuda_devices, self.cuda_states, strict=True):
                torch.cuda.set_rng_state(state, i)
            yield


def embed_without_grad(embed: EmbedFn, chunks: Sequence[Features]) -> tuple[Embedding, list[RandState]]:
    """Step 1: embeddings of all chunks (no graph), reassembled in row order, and the RNG state before each chunk."""
    outs, states = [], []
    for chunk in chunks:
        states.append(RandState([t.device for t in chunk.values()]))
        with torch.no_grad():
            outs.append(embed(chunk))
    return concat(outs), states


def backward_chunks(
    embed: EmbedFn,
    chunks: Sequence[Features],
    states: Sequence[RandState],
    grads: Tensor,
    backward: Callable[[Tensor], None] | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    last: bool = True,
) -> None:
    """Step 3: re-run each chunk with autograd and push `grads` (d loss / d embeddings) into the params.

    `backward(surrogate)` defaults to `surrogate.backward()` (the module passes Lightning's
    `manual_backward`). `no_sync()` (DDP's) is entered for every chunk but the very last of the
    step (`last` says whether this call holds it), so gradients are all-reduced once.
    """
    backward = backward or (lambda t: t.backward())
    start = 0
    for i, (chunk, state) in enumerate(zip(chunks, states, strict=True)):
        with state.replay():
            emb = embed(chunk)
        g = grad_slice(grads, start, emb)
        start += rows(emb)
        out = values(emb)
        # d(sum(emb * g))/d theta = g^T d emb / d theta: the chain rule with the cached gradient. In float32
        # outside autocast, so the cached gradient reaches the chunk's graph unrounded under bf16-mixed.
        with torch.autocast(device_type=out.device.type, enabled=False):
            surrogate = torch.dot(out.flatten().float(), g.flatten().float())
        final = last and i == len(chunks) - 1
        ctx = no_sync() if (no_sync is not None and not final) else contextlib.nullcontext()
        with ctx:
            backward(surrogate)
    if start != grads.shape[0]:
        raise RuntimeError(f"cached gradients cover {grads.shape[0]} rows, chunks {start}")


def grad_cache_step(
    embed: EmbedFn,
    query: Features,
    passage: Features,
    loss_fn: Callable[[Embedding, Embedding], Tensor],
    chunk_size: int = 32,
    backward: Callable[[Tensor], None] | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    passage_embed: EmbedFn | None = None,
    token_budget: int = 0,
) -> Tensor:
    """One cached forward/backward over a (query, passage) batch; returns the detached loss.

    Chunks of `chunk_size` rows, or with `token_budget` > 0 of at most that many tokens, each padded to its own
    longest row (lmk.train.chunks). `loss_fn(q_emb, p_emb)` may gather across devices (with gradients) itself.
    `passage_embed` embeds the passages when they are embedded otherwise than the queries (default: `embed`). After
    the call the parameters hold the same `.grad` as `loss_fn(embed(query), passage_embed(passage)).backward()` would
    give.
    """
    return cached_step(embed, plan_chunks(query, chunk_size, token_budget),
                       plan_chunks(passage, chunk_size, token_budget), loss_fn, backward, no_sync, passage_embed)


def cached_step(
    embed: EmbedFn,
    query: ChunkPlan,
    passage: ChunkPlan,
    loss_fn: Callable[[Embedding, Embedding], Tensor],
    backward: Callable[[Tensor], None] | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    passage_embed: EmbedFn | None = None,
) -> Tensor:
    """`grad_cache_step` over chunks planned already (the module plans them to count the step's fill)."""
    passage_embed = passage_embed or embed
    q_emb, q_states = embed_without_grad(embed, query.chunks)
    p_emb, p_states = embed_without_grad(passage_embed, passage.chunks)
    q_leaf, p_leaf = as_leaf(q_emb), as_leaf(p_emb)
    with torch.enable_grad():
        # the loss reads the rows in the batch's order; their gradients come back in chunk order
        loss = loss_fn(query.restore(q_leaf), passage.restore(p_leaf))
        q_grad, p_grad = torch.autograd.grad(loss, [values(q_leaf), values(p_leaf)])
    backward_chunks(embed, query.chunks, q_states, q_grad, backward, no_sync, last=False)
    backward_chunks(passage_embed, passage.chunks, p_states, p_grad, backward, no_sync, last=True)
    return loss.detach()
