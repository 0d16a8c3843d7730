"""Models for the probes: trained runs of a sweep folder, or untrained encoders from conf/."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.model import EmbeddingModel


def _conf_dir(conf_dir: str | Path | None) -> Path:
    if conf_dir is not None:
        return Path(conf_dir)
    return Path(__file__).resolve().parents[2] / "conf"


def _load_cfg(conf: Path, group: str, name: str) -> Any:
    from omegaconf import OmegaConf

    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        avail = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        raise ValueError(
            f"unknown {group} {name!r}; allowed: {', '.join(avail) or '(none found in ' + str(conf) + ')'}"
        )
    return OmegaConf.load(path)


def _run_label(run_dir: Path) -> str:
    import json

    try:
        cfg = json.loads((run_dir / "results.json").read_text()).get("config", {})
        enc = cfg.get("encoder", {}).get("name")
        pool = cfg.get("pooling", {})
        pname = pool.get("name")
        if (
            pname
            and pool.get("strategy") in ("fixed", "variable", "every_k", "multi_cls")
            and pool.get("chunk_size")
        ):
            pname = f"{pname}-{pool['chunk_size']}"
        if enc and pname:
            return f"{enc}/{pname}"
    except (OSError, ValueError, AttributeError):
        pass
    return run_dir.name


def _load_export(export: Path, device: str) -> EmbeddingModel:
    from lmk.model import EmbeddingModel

    if (export / "modules.json").is_file():  # a sentence-transformers export (lmk.export)
        from lmk.export import load_exported

        return load_exported(export, device=device).eval()
    return EmbeddingModel.from_pretrained(export).to(device).eval()  # a save_pretrained folder


def load_models(
    results_dir: str | Path | None = None,
    encoders: Sequence[str] = ("minilm-l6", "tiny-modernbert"),
    poolings: Sequence[str] = ("cls", "mean", "lmk-fixed"),
    *,
    conf_dir: str | Path | None = None,
    device: str = "cpu",
) -> dict[str, EmbeddingModel]:
    """Labelled models to compare, on `device`.

    results_dir given: every run folder under it (a Table 2 sweep) holding export/ and results.json,
    labelled "encoder/pooling" from its results.json (else the folder name). Otherwise each encoder of
    conf/encoder/ built once (untrained heads; random init for tiny-modernbert) and re-pooled with each
    of conf/pooling/ via with_pooling, so the poolings of one encoder share the very same weights.
    """
    from lmk.model import EmbeddingModel

    models: dict[str, EmbeddingModel] = {}
    if results_dir is not None:
        root = Path(results_dir)
        if not root.is_dir():
            raise ValueError(
                f"results_dir {str(root)!r} is not a folder; pass a Table 2 sweep folder or None"
            )
        runs = sorted(p.parent for p in root.rglob("results.json") if (p.parent / "export").is_dir())
        if not runs:
            raise ValueError(f"no run folder with export/ and results.json under {str(root)!r}")
        for run in runs:
            label = _run_label(run)
            if label in models:
                label = f"{label} ({run.name})"
            models[label] = _load_export(run / "export", device)
        return models
    if not encoders or not poolings:
        raise ValueError("encoders and poolings must be non-empty lists of config names")
    conf = _conf_dir(conf_dir)
    pool_cfgs = [_load_cfg(conf, "pooling", p) for p in poolings]
    for enc in encoders:
        base = EmbeddingModel.build(_load_cfg(conf, "encoder", enc), pool_cfgs[0]).to(device).eval()
        for name, pcfg in zip(poolings, pool_cfgs, strict=True):
            models[f"{enc}/{name}"] = base if pcfg is pool_cfgs[0] else base.with_pooling(pcfg)
    return models
