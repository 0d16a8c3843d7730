"""The glossary (docs/architecture.md) gives each concept one name: its retired names appear nowhere else.

Read: the code spans of the glossary table's last column. Searched: git's files under lmk/, conf/, experiments/,
docs/, notebooks/ and README.md, except the glossary itself and the legacy adapter (which names what older versions
saved). How a retired name is looked for depends on what it is:
- a module path (`lmk.run.files`): the dotted path and its file (`lmk/run/files.py`), anywhere in the text;
- a file name (`lmk_config.json`): anywhere in the text;
- an identifier (`budget`): a name in Python code (identifier, attribute, keyword, and the expressions of f-strings;
  not the prose of strings and comments, where "a word budget" is English), a YAML key or a YAML value that is one
  bare word (`pooler: lmk`, `- lmk`, `pooling.pooler=lmk` in an override list), or a word in the docs' code spans
  and fences.
The aliases that keep a retired name working are the only places that may say it: a Python module whose docstring
starts "Deprecated alias" (the whole module is the alias), and a line marked `# deprecated alias`.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from functools import cache, lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEGACY_ADAPTER = "lmk/model/landmark/legacy_config.py"
SEARCHED = ("lmk", "conf", "experiments", "docs", "notebooks", "README.md")
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
YAML_KEY = re.compile(r"^\s*(?:- )?([A-Za-z_][\w.]*)\s*:", re.M)
OVERRIDE = re.compile(r"(?<![\w.])\+{0,2}([a-z_][\w.]*)=")
# a YAML value that is one bare word: `key: word`, `- word` (a comment may follow), or `key=word` in an override list
YAML_WORD = re.compile(r"^[ \t]*(?:- )?(?:[\w.]+[ \t]*:[ \t]*)?([A-Za-z_][\w.]*)[ \t]*(?:#.*)?$", re.M)
OVERRIDE_WORD = re.compile(r"(?<![\w.])\+{0,2}[a-z_][\w.]*=([A-Za-z_][\w.]*)(?=[\s,\]]|$)", re.M)
ALIAS_MODULE, ALIAS_LINE = '"""Deprecated alias', "# deprecated alias"


def _glossary(text: str) -> tuple[int, int]:
    """Start and end offsets of the glossary section."""
    start = text.index("## Glossary")
    end = text.find("\n## ", start + 1)
    return start, len(text) if end < 0 else end


@lru_cache(maxsize=1)
def retired_names() -> tuple[str, ...]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start, end = _glossary(text)
    rows = [line for line in text[start:end].splitlines() if line.startswith("|") and not line.startswith("|--")]
    names = [n for row in rows[1:] for n in SPAN.findall(row.strip().strip("|").split("|")[-1])]
    return tuple(names)


@lru_cache(maxsize=1)
def searched_files() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "--", *SEARCHED], cwd=ROOT, capture_output=True, text=True, check=True)
    return tuple(f for f in out.stdout.splitlines() if f != LEGACY_ADAPTER and (ROOT / f).is_file())


def _fstring_names(token: str) -> set[str]:
    """The names in an f-string's expressions (`f"{budget}"`: budget); its literal text is prose. Python 3.12 tokenizes
    them as names already, 3.11 as one string token."""
    try:
        tree = ast.parse(token.strip(), mode="eval")
    except SyntaxError:
        return set()
    values = [n.value for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)]
    return {getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "arg", "")
            for v in values for n in ast.walk(v) if isinstance(n, ast.Name | ast.Attribute | ast.keyword)} - {""}


def _python_names(source: str) -> set[str]:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):  # a cell with shell magic: its words as names
        return set(re.findall(r"[A-Za-z_]\w*", source))
    names = {t.string for t in tokens if t.type == tokenize.NAME}
    fstrings = [t.string for t in tokens if t.type == tokenize.STRING and "f" in re.match(r"\w*", t.string)[0].lower()]
    return names.union(*map(_fstring_names, fstrings))


def _code_of_markdown(text: str) -> str:
    return "\n".join(FENCE.findall(text) + SPAN.findall(FENCE.sub("", text)))


@cache
def _views(path: str) -> tuple[str, frozenset[str], str]:
    """(the whole text, the names used as code, the code text of a document) of one file."""
    text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
    if path.endswith(".py") and text.startswith(ALIAS_MODULE):  # the module is the alias
        return "", frozenset(), ""
    text = "\n".join(line for line in text.splitlines() if ALIAS_LINE not in line)
    if path == "docs/architecture.md":  # the glossary itself names them
        start, end = _glossary(text)
        text = text[:start] + text[end:]
    if path.endswith(".py"):
        return text, frozenset(_python_names(text)), ""
    if path.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        return code + "\n" + prose, frozenset(_python_names(code)), _code_of_markdown(prose)
    if path.endswith((".yaml", ".yml")):
        keys = YAML_KEY.findall(text) + OVERRIDE.findall(text)  # `key:` and the `key.path=` of override lists
        words = YAML_WORD.findall(text) + OVERRIDE_WORD.findall(text)  # values that are one bare word
        return text, frozenset(part for key in keys + words for part in key.split(".")), ""
    if path.endswith(".md"):
        return text, frozenset(), _code_of_markdown(text)
    return text, frozenset(), ""


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w])")


def occurrences(name: str) -> list[str]:
    """Files under the searched folders that use `name` (see the module doc for how)."""
    found = []
    module = re.fullmatch(r"lmk(\.[a-z_]\w*)+", name)
    for path in searched_files():
        text, names, doc_code = _views(path)
        if module:
            hit = _word(name).search(text) or _word(name.replace(".", "/") + ".py").search(text)
        elif "." in name:
            hit = _word(name).search(text)
        else:
            hit = name in names or _word(name).search(doc_code)
        if hit:
            found.append(path)
    return found


def test_the_glossary_lists_retired_names():
    names = retired_names()
    assert {"budget", "hf_tokenizer", "lmk_config.json", "lmk.model.export"} <= set(names), names


@pytest.mark.parametrize("name", retired_names())
def test_a_retired_name_appears_nowhere_but_the_glossary(name: str):
    assert occurrences(name) == [], f"{name!r} is retired (docs/architecture.md, Glossary): use the one name there"


def test_the_search_finds_each_kind_of_use(tmp_path, monkeypatch):
    """The check can fail: a retired identifier in code or an f-string's expression, a YAML key or one-word value, a
    doc's code span, a module path as a file; the aliases that keep an old name working are not uses."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    files = {"lmk/a.py": "def f(budget):\n    return budget  # a word budget in prose is fine\n",
             "lmk/b.py": "x = 'a budget of words'  # prose only\n",
             "conf/c.yaml": "cap: 3\n", "experiments/s.yaml": "overrides: [pooling.hf_tokenizer=1]\n", "docs/d.md": "a `hf_tokenizer` here\n", "docs/e.md": "see lmk/run/files.py\n",
             "README.md": "the budget in prose\n",
             "lmk/f.py": 'msg = f"the hf_tokenizer of {model.hf_tokenizer!r}, {len(cap)}"\nok = f"a budget in prose {x}"\n',
             "conf/v.yaml": "pooler: lmk_config  # a value\nnote: a budget of words\n",
             "experiments/o.yaml": "rows:\n  - lmk.sweep.tables\n  - {overrides: [eval.tokenizer=hf_tokenizer]}\n",
             "lmk/g.py": '"""Deprecated alias: lmk.run.files is lmk.run.umask_files."""\nfrom lmk.run import files\n',
             "lmk/h.py": 'cap = 1  # deprecated alias\nprint("lmk.run.files")\n'}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "searched_files", lambda: tuple(files))
    _views.cache_clear()
    try:
        assert occurrences("budget") == ["lmk/a.py"]
        assert occurrences("cap") == ["conf/c.yaml", "lmk/f.py"]
        assert occurrences("hf_tokenizer") == ["experiments/s.yaml", "docs/d.md", "lmk/f.py", "experiments/o.yaml"]
        assert occurrences("lmk_config") == ["conf/v.yaml"]
        assert occurrences("lmk.run.files") == ["docs/e.md", "lmk/h.py"]
        assert occurrences("lmk.sweep.tables") == ["experiments/o.yaml"]
    finally:
        _views.cache_clear()
