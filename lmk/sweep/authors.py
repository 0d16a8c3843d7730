"""The authors' values as data (`experiments/*/authors.yaml`): check them against the composed configs and
render them as the Markdown table docs/method.md shows.

`python -m lmk.sweep.authors experiments/table2/authors.yaml` checks every key (exit 1 on a mismatch);
`--write docs/method.md` regenerates the table between the markers in that file.

Each block of the YAML names Hydra overrides of `conf/train.yaml`; each key is a dotted path in the
validated config (`lmk.train.trainer_args.validate_training`, so schema and Lightning defaults count) or a name in `DERIVED`. A key with
`ours:` is a deliberate deviation: the composed value must equal `ours`, and `reason` says why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from lmk.config import CONF_DIR, effective_batch, to_container
from lmk.train.trainer_args import validate_training

START, END = "<!-- authors-table:start -->", "<!-- authors-table:end -->"
# overrides every composition needs outside a Hydra run (no output dir, no row)
_COMPOSE_EXTRA = ("row=authors", "run_dir=authors-check")


def _source_weights(plain: dict[str, Any]) -> dict[str, float]:
    return {str(s["name"]): float(s["weight"]) for s in plain["data"]["sources"]}


# Values computed from several keys of the composed config (plain, resolved containers).
DERIVED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "effective_batch": lambda plain: effective_batch(plain)["queries"],
    "source_weights": _source_weights,
}


@dataclass(frozen=True)
class Entry:
    block: str
    overrides: tuple[str, ...]
    key: str
    value: Any
    source: str
    note: str = ""
    ours: Any = None
    reason: str = ""

    @property
    def deviation(self) -> bool:
        return bool(self.reason)

    @property
    def expected(self) -> Any:
        """What the composed config must hold: the authors' value, or ours for a deliberate deviation."""
        return self.ours if self.deviation else self.value


def load_entries(path: str | Path) -> list[Entry]:
    raw = yaml.safe_load(Path(path).read_text())
    entries = []
    for block in raw["blocks"]:
        for key, spec in block["keys"].items():
            if "ours" in spec and not spec.get("reason"):
                raise ValueError(f"{path}: {block['title']} / {key}: a deviation (`ours`) needs a `reason`")
            entries.append(Entry(block=block["title"], overrides=tuple(block["overrides"]), key=key,
                                 value=spec["value"], source=spec["source"], note=spec.get("note", ""),
                                 ours=spec.get("ours"), reason=spec.get("reason", "")))
    return entries


def compose(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> tuple[Any, dict[str, Any]]:
    """(validated root config, plain resolved mapping) of `conf/train.yaml` with `overrides`, offline."""
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        cfg = hydra_compose("train", overrides=[*overrides, *_COMPOSE_EXTRA])
    return validate_training(cfg), to_container(cfg)  # values only (no preflight): data may live elsewhere


def lookup(typed: Any, plain: dict[str, Any], key: str) -> Any:
    """A dotted key of the validated config (dataclass attributes, then mapping keys), or a DERIVED value."""
    if key in DERIVED:
        return DERIVED[key](plain)
    node: Any = typed
    for part in key.split("."):
        if isinstance(node, dict):
            if part not in node:
                raise KeyError(f"{key}: no {part!r} (keys: {', '.join(map(str, node))})")
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            raise KeyError(f"{key}: {type(node).__name__} has no {part!r}")
    return node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def check(path: str | Path, conf_dir: Path = CONF_DIR) -> list[str]:
    """Every mismatch between the YAML and the composed configs, as readable lines (empty: all match)."""
    problems = []
    composed: dict[tuple[str, ...], tuple[Any, dict[str, Any]]] = {}
    for e in load_entries(path):
        if e.overrides not in composed:
            composed[e.overrides] = compose(e.overrides, conf_dir)
        typed, plain = composed[e.overrides]
        try:
            got = lookup(typed, plain, e.key)
        except KeyError as exc:
            problems.append(f"{e.block}: {exc}")
            continue
        if not _same(got, e.expected):
            what = f"ours (deviation) {e.ours!r}" if e.deviation else f"the authors' {e.value!r} ({e.source})"
            problems.append(f"{e.block}: {e.key} = {got!r} with {' '.join(e.overrides)}, expected {what}")
        if e.deviation and _same(e.value, e.ours):
            problems.append(f"{e.block}: {e.key} is marked a deviation but ours equals theirs ({e.value!r})")
    return problems


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def render(path: str | Path) -> str:
    """The Markdown table: one row per key, the lmk column says `same` or our value and why."""
    raw = yaml.safe_load(Path(path).read_text())
    try:  # the repository-relative name, wherever the command runs from
        name = Path(path).resolve().relative_to(CONF_DIR.parent).as_posix()
    except ValueError:
        name = Path(path).as_posix()
    lines = [f"Source files are in github `{raw['repository']}` at `{raw['commit']}`; generated from "
             f"`{name}` by `python -m lmk.sweep.authors`.", ""]
    block = None
    for e in load_entries(path):
        if e.block != block:
            block = e.block
            lines += ["", f"**{block}** (`{' '.join(e.overrides)}`)", "",
                      "| key | authors | source | lmk |", "|---|---|---|---|"]
        note = f" ({e.note})" if e.note else ""
        ours = f"**{_fmt(e.ours)}**: {e.reason}" if e.deviation else "same"
        lines.append(f"| `{e.key}` | {_fmt(e.value)} | `{e.source}`{note} | {ours} |".replace("\n", " "))
    return "\n".join(lines).strip() + "\n"


def write_into(doc: str | Path, table: str) -> bool:
    """Replace the text between the markers of `doc` with `table`; True when the file changed."""
    doc = Path(doc)
    text = doc.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{doc}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table}{END}{tail}"
    if new != text:
        doc.write_text(new)
    return new != text


def table_in(doc: str | Path) -> str:
    text = Path(doc).read_text()
    return text.split(START, 1)[1].split(END, 1)[0].lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the authors' values against the composed configs.")
    parser.add_argument("spec", nargs="?", default="experiments/table2/authors.yaml")
    parser.add_argument("--write", metavar="DOC", help="regenerate the table between the markers of DOC")
    args = parser.parse_args(argv)
    problems = check(args.spec)
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    if args.write:
        changed = write_into(args.write, render(args.spec))
        print(f"{args.write}: table {'updated' if changed else 'already current'}")
    n = len(load_entries(args.spec))
    print(f"{n - len(problems)}/{n} keys match {args.spec}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
