"""LoRA adapters on a frozen backbone, through peft (`encoder.lora`), and the plain model an export carries.

`add_lora` wraps a backbone in peft's `PeftModel`: the base weights are frozen (requires_grad False) and only the
adapter matrices train, so the optimiser (lmk.train.module takes the parameters that require grad) and the Lightning
checkpoint (lmk.train.module leaves frozen weights out) hold the adapters only. `merged` gives the plain transformers
model with the adapters folded into the weights (W + scale B A): what `save_pretrained` and the sentence-transformers
export write, so a folder loads without peft and without lmk.
"""

from __future__ import annotations

import copy
from typing import Any

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel


def add_lora(model: PreTrainedModel, lora: dict[str, Any], name: str = "?") -> PeftModel:
    """`model` with LoRA adapters (`lora`: r, alpha, dropout, target_modules; lmk.config.model.check_lora); the base
    weights frozen. A target module the model does not have is named with the ones it has."""
    config = LoraConfig(r=int(lora["r"]), lora_alpha=lora["alpha"], lora_dropout=float(lora["dropout"]),
                        target_modules=list(lora["target_modules"]), bias="none")
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise ValueError(f"encoder {name!r}: lora.target_modules={lora['target_modules']} do not match "
                         f"{type(model).__name__}'s layers; its linear layers: {', '.join(linear)} ({err})") from err


def is_lora(model: Any) -> bool:
    return isinstance(model, PeftModel)


def merged(model: Any) -> Any:
    """The plain model with its adapters folded in (a copy: the training model keeps its adapters); `model` itself
    when it has none."""
    if not is_lora(model):
        return model
    return copy.deepcopy(model).merge_and_unload()
