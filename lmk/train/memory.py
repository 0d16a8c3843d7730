"""Per-device training memory of a job, and the gradient-checkpointing decision it sets.

Pure arithmetic on the encoder's shape (`lmk.model.shape`) and the job's sizes: nothing is allocated, so the
paper's ModernBERT-base x 256 queries x 8 passages is estimated on a laptop in microseconds. The sweep's dry run
prints it per job (`lmk.sweep.cost.job_report`) and `lmk.train` decides `encoder.gradient_checkpointing: auto`
from it at job start (`decide_checkpointing`): the same numbers in both places.

The memory model (bytes per token per layer, `EncoderShape.layer_activation_bytes`) counts the tensors autograd
saves in one pre-norm transformer layer (ModernBERT: GeGLU MLP, no biases, no dropout):
  attention: norm input (stream) + norm output, fused QKV, rotated q/k, attention output  -> s*h + 7a*h
  MLP:       norm input (stream) + norm output, Wi output (2I), GELU output, gated product -> s*h + a*h + 4a*I
with `a` the compute dtype's bytes and `s` the residual stream's. Under bf16-mixed the linear layers run in
bf16 but the residual stream stays float32 (fp32 embeddings + bf16 branch outputs promote to fp32), so
`s` = 4 there: that is why checkpointed activations of 256 x 8 x 512 tokens are about 70 GB.
Gradient checkpointing keeps only each layer's input (s*h per token per layer) plus one layer's full
activations while it is recomputed; gradient caching bounds the tokens in flight to one chunk.
`overhead` (CUDA context, cuBLAS workspace, allocator fragmentation) is an assumption; the GPU check
(`make gpu-check`) measures the real peak next to this estimate.

With LoRA (`encoder.lora`, the decoder recipe) the base weights are frozen in their own dtype (bf16 for an 8B
decoder) and hold no gradient or optimizer state; the adapters are float32 with their gradients, AdamW's two
moments, autocast's half copies and DDP's buckets; each layer also keeps what the adapters' backward needs
(`EncoderShape.lora_activation_bytes`: A's output, and each module's dropped-out input when lora.dropout > 0).
A decoder's layer formula counts grouped-query attention's smaller key/value projections and a SwiGLU MLP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import DictConfig

from lmk.config import to_container
from lmk.config.model import check_lora
from lmk.model.shape import EncoderShape, encoder_shape

GIB = 1024**3
MIXED = ("16-mixed", "bf16-mixed", "16", "bf16")
HALF_TRUE = ("16-true", "bf16-true")
CONTEXT_OVERHEAD_GIB = 1.5  # CUDA context + cuBLAS/cuDNN workspaces (assumed)
FRAGMENTATION = 0.10  # allocator slack on top of activations (assumed)
# `auto` checkpointing stays off while the estimate without it is at most this share of the GPU's memory: the
# estimate's overhead is assumed, so a job that needs all of the GPU by its count is checkpointed.
MEMORY_MARGIN = 0.9
CHECKPOINTING = (True, False, "auto")  # the values of encoder.gradient_checkpointing
SECTIONS = ("encoder", "data", "train", "trainer", "launcher")  # what the estimates read of a job config


@dataclass(frozen=True)
class Precision:
    """Bytes per element of weights, the compute dtype and the residual stream."""

    weight_bytes: int
    compute_bytes: int
    stream_bytes: int
    autocast_copy: bool  # autocast caches a half copy of every weight during the forward

    @classmethod
    def of(cls, trainer_precision: Any = "32-true", weight_dtype: str = "float32") -> Precision:
        p = str(trainer_precision)
        w = 2 if weight_dtype in ("bfloat16", "float16") or p in HALF_TRUE else 4
        if p in MIXED:
            # fp32 master weights + half compute; half weights (encoder.dtype) stream in half too
            return cls(weight_bytes=w, compute_bytes=2, stream_bytes=w, autocast_copy=w == 4)
        return cls(weight_bytes=w, compute_bytes=w, stream_bytes=w, autocast_copy=False)


@dataclass
class MemoryEstimate:
    """Per-device training memory in bytes, by component."""

    weights: float
    grads: float
    optimizer: float
    autocast_weights: float
    ddp_buckets: float
    activations: float
    attention_masks: float
    loss: float
    overhead: float
    tokens_in_flight: int
    notes: list[str] = field(default_factory=list)

    COMPONENTS = ("weights", "grads", "optimizer", "autocast_weights", "ddp_buckets", "activations",
                  "attention_masks", "loss", "overhead")

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in self.COMPONENTS)

    def gib(self) -> dict[str, float]:
        out = {k: round(getattr(self, k) / GIB, 2) for k in self.COMPONENTS}
        out["total"] = round(self.total / GIB, 2)
        return out

    def fits(self, gpu_memory_gb: float) -> bool:
        return self.total <= gpu_memory_gb * GIB

    def summary(self, gpu_memory_gb: float | None = None) -> str:
        g = self.gib()
        parts = (f"weights {g['weights']} + grads {g['grads']} + AdamW {g['optimizer']} + autocast copies "
                 f"{g['autocast_weights']} + DDP buckets {g['ddp_buckets']} + activations {g['activations']} "
                 f"({self.tokens_in_flight:,} tokens in flight) + masks {g['attention_masks']} + loss {g['loss']} "
                 f"+ overhead {g['overhead']} = {g['total']} GiB")
        if gpu_memory_gb is None:
            return parts
        verdict = "fits" if self.fits(gpu_memory_gb) else "DOES NOT FIT"
        return f"{parts} -> {verdict} a {gpu_memory_gb:g} GB GPU"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gib"] = self.gib()
        return d


def _activation_blocks(queries: int, group_size: int, query_len: int, passage_len: int,
                       grad_cache_chunk: int | None, grad_cache_tokens: int = 0) -> list[tuple[int, int]]:
    """(rows, length) blocks whose graphs are alive at the same time."""
    if grad_cache_chunk and grad_cache_tokens > 0:
        # a token-budget chunk holds rows x width <= budget (a longer row alone, lmk.train.chunks), so its worst case
        # is budget // length rows at the full length: the most tokens and the widest masks; the row count of the
        # chunk setting does not bound it
        sides = [(min(queries, max(1, grad_cache_tokens // query_len)), query_len),
                 (min(queries * group_size, max(1, grad_cache_tokens // passage_len)), passage_len)]
        return [max(sides, key=lambda b: (b[0] * b[1], b[1]))]  # a tie: the wider block, the bigger masks
    if grad_cache_chunk:
        chunk = max(1, int(grad_cache_chunk))
        if passage_len >= query_len:
            return [(min(chunk, queries * group_size), passage_len)]
        return [(min(chunk, queries), query_len)]
    return [(queries, query_len), (queries * group_size, passage_len)]


def estimate_memory(
    shape: EncoderShape,
    *,
    queries: int,
    group_size: int,
    query_len: int,
    passage_len: int,
    precision: Precision | None = None,
    checkpointing: bool = False,
    grad_cache_chunk: int | None = None,
    grad_cache_tokens: int = 0,
    world_size: int = 1,
    attn_implementation: str = "sdpa",
    lora: dict[str, Any] | None = None,
) -> MemoryEstimate:
    """Peak training memory of one device for `queries` queries x `group_size` passages per step.

    Inputs are assumed padded to the max lengths (the worst case of a batch). `grad_cache_chunk` (rows
    per chunk, `train.grad_cache_chunk`) when gradient caching is on, else None; `grad_cache_tokens`
    (`train.grad_cache_tokens`) > 0 chunks it by that token budget instead. `lora` (the filled-in
    `encoder.lora`): the base weights frozen, only float32 adapters trained.
    """
    for name, value in (("queries", queries), ("group_size", group_size), ("query_len", query_len),
                        ("passage_len", passage_len), ("world_size", world_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    prec = precision or Precision.of()
    n = shape.params()
    blocks = _activation_blocks(queries, group_size, query_len, passage_len, grad_cache_chunk, grad_cache_tokens)
    notes = []
    if grad_cache_chunk and grad_cache_tokens > 0:
        notes.append(f"grad cache: one chunk of at most {grad_cache_tokens:,} tokens in flight ({blocks[0][0]} rows "
                     f"at {blocks[0][1]} tokens)")
    elif grad_cache_chunk:
        notes.append(f"grad cache: one chunk of {max(1, int(grad_cache_chunk))} rows in flight")
    tokens = sum(r * t for r, t in blocks)
    per_layer = shape.layer_activation_bytes(prec.compute_bytes, prec.stream_bytes)
    if lora is not None:
        per_layer += shape.lora_activation_bytes(prec.compute_bytes, lora)
    s = prec.stream_bytes
    if checkpointing:
        # each layer's input + the final hidden states; one layer's full activations while recomputed
        biggest = max(r * t for r, t in blocks)
        activations = tokens * s * shape.hidden * (shape.layers + 1) + biggest * per_layer
        notes.append("gradient checkpointing: layer inputs kept, one layer recomputed at a time")
    else:
        activations = tokens * (per_layer * shape.layers + s * shape.hidden * 2)
    if attn_implementation in ("sdpa", "eager"):
        # transformers builds dense [rows, 1, T, T] masks (boolean for SDPA) for global and sliding layers
        mask_bytes = 1 if attn_implementation == "sdpa" else prec.compute_bytes
        masks = sum(r * t * t for r, t in blocks) * mask_bytes * (2 if shape.local_window else 1)
        if attn_implementation == "eager":  # attention probabilities are kept too
            activations += sum(r * t * t for r, t in blocks) * shape.heads * prec.compute_bytes * shape.layers
    else:
        masks = 0
    # gathered passages (+ their gradients) and the [B, W*B*G] score matrix (+ softmax, grads), float32
    gathered = world_size * queries * group_size
    loss = 4 * (2 * gathered * shape.hidden + 3 * queries * gathered)
    if grad_cache_chunk:
        loss += 4 * 2 * queries * (group_size + 1) * shape.hidden  # cached embeddings + their gradients
    if lora is not None:
        return _lora_estimate(shape, prec, lora, world_size, float(activations), float(masks), float(loss), tokens,
                              notes)
    return MemoryEstimate(
        weights=n * prec.weight_bytes, grads=n * prec.weight_bytes, optimizer=2 * n * prec.weight_bytes,
        autocast_weights=n * 2 if prec.autocast_copy else 0,
        ddp_buckets=n * prec.weight_bytes if world_size > 1 else 0,
        activations=float(activations), attention_masks=float(masks), loss=float(loss),
        overhead=CONTEXT_OVERHEAD_GIB * GIB + FRAGMENTATION * activations, tokens_in_flight=tokens, notes=notes,
    )


def _lora_estimate(shape: EncoderShape, prec: Precision, lora: dict[str, Any], world_size: int, activations: float,
                   masks: float, loss: float, tokens: int, notes: list[str]) -> MemoryEstimate:
    """The frozen base in its dtype; float32 adapters with gradients, AdamW state, autocast copies, DDP buckets."""
    n, trainable = shape.params(), shape.lora_params(lora)
    notes.append(f"LoRA r {lora['r']} on {len(lora['target_modules'])} modules: {trainable / 1e6:.3g}M float32 "
                 f"adapter weights train (gradients + AdamW), {n / 1e9:.3g}B frozen base weights at "
                 f"{prec.weight_bytes} bytes")
    mixed = prec.compute_bytes < 4
    return MemoryEstimate(
        weights=n * prec.weight_bytes + 4 * trainable, grads=4 * trainable, optimizer=8 * trainable,
        autocast_weights=2 * trainable if mixed else 0, ddp_buckets=4 * trainable if world_size > 1 else 0,
        activations=activations, attention_masks=masks, loss=loss,
        overhead=CONTEXT_OVERHEAD_GIB * GIB + FRAGMENTATION * activations, tokens_in_flight=tokens, notes=notes,
    )


# ---- from a composed job config -----------------------------------------------------------------


def sections(cfg: Any) -> dict[str, Any]:
    """The sections of a job config the estimates read (`SECTIONS`), as plain containers: a dict as it is, a
    DictConfig's sections resolved one by one (keys such as run_dir resolve only inside a Hydra run)."""
    if isinstance(cfg, dict):
        return cfg
    return {k: to_container(cfg[k]) if isinstance(cfg[k], DictConfig) else cfg[k] for k in SECTIONS if k in cfg}


def job_world_size(cfg: Any) -> int:
    """Data-parallel ranks of a job: trainer.devices (or launcher.gpus_per_node) x trainer.num_nodes."""
    c = sections(cfg)
    trainer, launcher = c.get("trainer") or {}, c.get("launcher") or {}
    devices = trainer.get("devices", 1)
    per_node = devices if isinstance(devices, int) else int(launcher.get("gpus_per_node", 1) or 1)
    return max(1, per_node) * int(trainer.get("num_nodes", 1) or 1)


def job_memory(cfg: Any, checkpointing: bool | None = None) -> MemoryEstimate:
    """The memory estimate of one composed `lmk.train` job config (DictConfig or dict), with gradient
    checkpointing as given, or (None) as the job decides it (`decide_checkpointing`)."""
    c = sections(cfg)
    enc, data, train, trainer = (c.get(k) or {} for k in ("encoder", "data", "train", "trainer"))
    if checkpointing is None:
        checkpointing = decide_checkpointing(c).on
    return estimate_memory(
        encoder_shape(enc), queries=int(data.get("batch_size", 1)), group_size=int(data.get("group_size", 1)),
        query_len=int(data.get("query_max_length", 128)), passage_len=int(data.get("passage_max_length", 512)),
        precision=Precision.of(trainer.get("precision", "32-true"), enc.get("dtype", "float32")),
        checkpointing=checkpointing,
        grad_cache_chunk=int(train.get("grad_cache_chunk", 32)) if train.get("grad_cache") else None,
        grad_cache_tokens=int(train.get("grad_cache_tokens") or 0),
        world_size=job_world_size(c), attn_implementation=str(enc.get("attn_implementation", "sdpa")),
        lora=job_lora(c),
    )


def job_lora(cfg: Any) -> dict[str, Any] | None:
    """A job's `encoder.lora` with the authors' values filled in (lmk.config.model.check_lora); None: no adapter."""
    enc = sections(cfg).get("encoder") or {}
    return check_lora(str(enc.get("name", "?")), enc.get("lora"))


@dataclass(frozen=True)
class Checkpointing:
    """Whether a training job checkpoints its layers' activations, and why (results.json, the dry run)."""

    setting: Any  # encoder.gradient_checkpointing: true, false or "auto"
    on: bool
    why: str
    without_gib: float | None = None  # the job's memory estimate without checkpointing
    with_gib: float | None = None
    gpu_memory_gb: float | None = None

    @property
    def line(self) -> str:
        """e.g. "gradient checkpointing off (auto): 46.2 GiB without it fits 80 GB"."""
        setting = self.setting if isinstance(self.setting, str) else str(self.setting).lower()
        return f"gradient checkpointing {'on' if self.on else 'off'} ({setting}): {self.why}"

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line}


def _sized(c: dict[str, Any]) -> tuple[MemoryEstimate, MemoryEstimate] | str:
    """The job's estimates (without, with) checkpointing, or why the encoder cannot be sized."""
    try:
        return job_memory(c, checkpointing=False), job_memory(c, checkpointing=True)
    except (ValueError, OSError) as err:
        return f"the encoder cannot be sized ({err})"


def decide_checkpointing(cfg: Any) -> Checkpointing:
    """`encoder.gradient_checkpointing` of a job resolved: true and false as set; `auto` on only where the memory
    estimate without it exceeds `MEMORY_MARGIN` of `launcher.gpu_memory_gb`. Off for a job that trains on the
    CPU; on (the safe side) for a GPU job whose GPU memory is not given or whose encoder cannot be sized."""
    c = sections(cfg)
    setting = (c.get("encoder") or {}).get("gradient_checkpointing", False)
    if setting not in CHECKPOINTING:
        raise ValueError(f"encoder.gradient_checkpointing={setting!r} is not valid; allowed values: true, false, auto")
    gpu_gb = (c.get("launcher") or {}).get("gpu_memory_gb")
    on_cpu = str((c.get("trainer") or {}).get("accelerator", "auto")) == "cpu"
    sized = None if on_cpu and setting == "auto" else _sized(c)
    gib = {} if not isinstance(sized, tuple) else {"without_gib": round(sized[0].total / GIB, 1),
                                                    "with_gib": round(sized[1].total / GIB, 1)}
    made = {**gib, "gpu_memory_gb": gpu_gb}
    if setting is not True and setting is not False:  # auto
        return Checkpointing(setting, *_auto(on_cpu, gpu_gb, sized), **made)
    why = "set by encoder.gradient_checkpointing"
    if setting and gib and gpu_gb and gib["without_gib"] <= MEMORY_MARGIN * gpu_gb:
        why += f" ({gib['without_gib']} GiB without it would fit {gpu_gb:g} GB: auto saves a forward pass per token)"
    return Checkpointing(setting, bool(setting), why, **made)


def _auto(on_cpu: bool, gpu_gb: float | None, sized: Any) -> tuple[bool, str]:
    if on_cpu:
        return False, "trains on the CPU, no GPU memory to save"
    if not isinstance(sized, tuple):
        return True, f"{sized}: on, the safe side"
    without, with_ = (round(e.total / GIB, 1) for e in sized)
    if gpu_gb is None:
        return True, (f"launcher.gpu_memory_gb is not set, so {without} GiB without it cannot be checked: on, the "
                      "safe side (set launcher.gpu_memory_gb to decide)")
    limit = MEMORY_MARGIN * gpu_gb
    if without <= limit:
        return False, f"{without} GiB without it fits {gpu_gb:g} GB"
    return True, f"{without} GiB without it exceeds {limit:.1f} GiB ({MEMORY_MARGIN:.0%} of {gpu_gb:g} GB); {with_} with it"


# Only ways that keep fp32 master weights: bf16 weights (encoder.dtype=bfloat16, trainer.precision=bf16-true)
# lose most AdamW updates at lr 2e-5, so they are not suggested.
FIT_HINT = ("to fit: train.grad_cache=true (same loss, one chunk in flight), or a smaller data.batch_size on more "
            "GPUs (launcher.nodes)")
