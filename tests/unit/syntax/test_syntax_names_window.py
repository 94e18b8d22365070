"""Python names in a window: what the alternative reads, and what the code after it needs."""

from __future__ import annotations

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import rank_alternatives
from kspec.engine.syntax.postprocess import PostprocessConfig
from kspec.engine.syntax.checks import Checker
from kspec.engine.syntax.pynames import module_names

FILE = '''import json


def load(path, default):
    """Load the JSON document at `path`.

    Falls back to `default` (a dict) when the file is missing.
    """
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        data = default
    if not data:
        raise ValueError(msg)
    return data


DEFAULTS = load(
    "defaults.json", {}
)
'''

CURSOR = FILE.index("    if not data:")
# Windows: the whole file, and cut inside the docstring (the def line and the import are
# above it), inside brackets (from `open(...)` to inside `load(...)`'s string), and
# mid-statement at both ends.
WINDOWS = {
    "whole": (0, len(FILE)),
    "docstring": (FILE.index("JSON document"), len(FILE)),
    "brackets": (FILE.index("(path) as") + 3, FILE.index("defaults.json") + 3),
    "statement": (FILE.index("data = json") + 5, FILE.index("return data") + 9),
}
# Names each window reads whose binding is above it (or in it).
KNOWN = {
    "whole": "path, default, handle, data",
    "docstring": "path, default, handle, data",
    "brackets": "handle, default, data",
    "statement": "default, data",
}


def cut(name: str) -> tuple[str, str]:
    start, end = WINDOWS[name]
    return FILE[start:CURSOR], FILE[CURSOR:end]


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_names_from_above_the_window_are_not_blamed(name: str) -> None:
    prefix, suffix = cut(name)
    checker = Checker(prefix, suffix, "python")
    # Parameters whose def line may be above the window, names bound in the window.
    assert checker.check(f"    print({KNOWN[name]})\n").undefined_names == ()


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_a_name_defined_nowhere_is_blamed(name: str) -> None:
    prefix, suffix = cut(name)
    checker = Checker(prefix, suffix, "python")
    assert checker.check("    print(lenght(data))\n").undefined_names == ("lenght",)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_what_the_suffix_needs(name: str) -> None:
    prefix, suffix = cut(name)
    checker = Checker(prefix, suffix, "python")
    defines = checker.check('    msg = f"{path} is empty"\n')
    assert defines.needs_defined == ("msg",) and defines.needs_missing == ()
    leaves = checker.check("    print(data)\n")
    assert leaves.needs_defined == () and leaves.needs_missing == ("msg",)


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_the_alternative_that_defines_what_the_suffix_needs_ranks_first(name: str) -> None:
    prefix, suffix = cut(name)
    candidates = [
        Completion("    print(data)\n", logprob=-1.0, n_tokens=5),  # more likely, leaves `msg` undefined
        Completion('    msg = "empty"\n', logprob=-1.3, n_tokens=5),
    ]
    ranked = rank_alternatives(prefix, suffix, "python", candidates)
    assert [r.completion.text for r in ranked] == ['    msg = "empty"\n', "    print(data)\n"]


ROMAN = '''def check(number):
    """Raise when `number` is out of range (the window may start in here)."""
    if not 1 <= number <= 1000:
        raise ValueError(
            f"{number} is out of range"
        )


def to_roman(number):
    num = [1, 4, 5, 9, 10]
    sym = ["I", "IV", "V", "IX", "X"]
    i = 4
    while number:
        div = number // num[i]
        number %= num[i]
        while div:
            res += sym[i]
            div -= 1
        i -= 1
    return res.lower()
'''
ROMAN_CURSOR = ROMAN.index("    while number:")


def window_starts(text: str, docstring: str, brackets: str, statement: str) -> dict[str, int]:
    """Where windows of `text` start: the whole file, and at each marker (inside a docstring,
    inside brackets, mid-statement)."""
    return {"whole": 0, "docstring": text.index(docstring), "brackets": text.index(brackets), "statement": text.index(statement)}


ROMAN_WINDOWS = window_starts(ROMAN, docstring="the window may", brackets="is out of range", statement="<= number <=")


@pytest.mark.parametrize("name", sorted(ROMAN_WINDOWS))
def test_an_assignment_to_a_name_nothing_reads_where_the_suffix_needs_another_is_not_shown(name: str) -> None:
    """HumanEval/156: `j = 10` where the suffix reads `res`, the only alternative left, was shown
    (pyflakes: unused `j`). A wrong assignment is dropped, even alone; the one the suffix reads,
    and a statement that binds nothing, stay."""
    prefix, suffix = ROMAN[ROMAN_WINDOWS[name] : ROMAN_CURSOR], ROMAN[ROMAN_CURSOR:]
    assert rank_alternatives(prefix, suffix, "python", [Completion("    j = 10\n", logprob=-0.2, n_tokens=4)]) == []
    candidates = [
        Completion("    j = 10\n", logprob=-0.2, n_tokens=4),  # unused, and `res` still unbound
        Completion("    print(number)\n", logprob=-1.0, n_tokens=5),  # binds nothing: `res` unbound, but nothing invented
        Completion("    res = ''\n", logprob=-1.3, n_tokens=5),
    ]
    shown = [r.completion.text for r in rank_alternatives(prefix, suffix, "python", candidates)]
    assert shown == ["    res = ''\n", "    print(number)\n"]
    kept = rank_alternatives(prefix, suffix, "python", candidates[:1], config=PostprocessConfig(drop_wrong_binding=False))
    assert [(r.check.unused_variables, r.check.needs_missing) for r in kept] == [(("j",), ("res",))]


def test_an_unused_assignment_is_kept_when_the_suffix_needs_nothing() -> None:
    prefix = FILE[: FILE.index("    return data")]
    ranked = rank_alternatives(prefix, FILE[FILE.index("    return data") :], "python", [Completion("    count = 10\n", logprob=-0.2, n_tokens=4)])
    assert [(r.completion.text, r.check.unused_variables, r.check.needs_missing) for r in ranked] == [("    count = 10\n", ("count",), ())]


def test_a_mid_word_completion_that_invents_a_name_ranks_below_one_that_does_not() -> None:
    # `len` -> `length`: the model finishes the word into a name that exists nowhere.
    prefix = FILE[FILE.index("Falls back") : CURSOR] + "    if len"
    suffix = "(data) == 0:\n" + FILE[CURSOR + len("    if not data:\n") :]
    candidates = [Completion("gth", logprob=-0.5, n_tokens=1), Completion("", logprob=-0.6, n_tokens=1)]
    ranked = rank_alternatives(prefix, suffix, "python", candidates + [Completion("(data or ())", logprob=-0.9, n_tokens=4)])
    assert ranked[-1].completion.text == "gth"
    assert ranked[-1].check.undefined_names == ("length",)


def test_names_the_file_binds_above_a_long_window_are_known() -> None:
    # A long file: post-processing looks at a window of it, and takes the imports and
    # module-level definitions above the window from a regex over that part.
    body = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(400))
    prefix = "import json\nfrom os import path as osp\n\n\n" + body + "def main(name):\n    "
    candidates = [Completion("return json.dumps(osp.basename(name))", logprob=-1.0, n_tokens=8), Completion("return jsn.dumps(name)", logprob=-0.5, n_tokens=6)]
    ranked = rank_alternatives(prefix, "\n", "python", candidates)
    assert [r.check.undefined_names for r in ranked] == [(), ("jsn",)]
    assert ranked[0].completion.text.startswith("return json")


def test_module_names() -> None:
    text = "import os, sys as system\nfrom a.b import (c,\n    d as e)\ndef f():\n    z = 1\nclass K:\n    pass\nX: int = 3\n"
    assert module_names(text) == {"os", "system", "c", "e", "f", "K", "X"}


def test_an_augmented_assignment_after_the_cursor_needs_its_name_defined_before() -> None:
    """`res += s` reads `res`: the hole before it must bind it (HumanEval/156's `res = ''`);
    `res += ...` in an alternative defines nothing the suffix could rely on either."""
    prefix = "def to_roman(number, sym):\n    i = 12\n"
    suffix = "    while number:\n        res += sym[i]\n        number -= 1\n    return res\n"
    checker = Checker(prefix, suffix, "python")
    defines = checker.check("    res = ''\n")
    assert defines.needs_defined == ("res",) and defines.needs_missing == ()
    assert checker.check("    j = 10\n").needs_missing == ("res",)
    assert checker.check("    res += ''\n").needs_missing == ("res",)


def test_the_module_of_a_from_import_is_not_a_name_the_window_defines() -> None:
    """`from pickle import Pickler` binds `Pickler`, not `pickle`: `pickle.dumps(...)` reads a
    name nothing defines (stdlib shelve.py, where the model wrote `pickle.pack(key, f)`)."""
    prefix = "from pickle import Pickler\nfrom io import BytesIO\n\n\ndef dump(key):\n    f = BytesIO()\n    "
    checker = Checker(prefix, "\n    return f\n", "python")
    assert checker.check("pickle.dump(key, f)").undefined_names == ("pickle",)
    assert checker.check("Pickler(f).dump(key)").undefined_names == ()


CLASS_FILE = '''import os


class Store:
    LIMIT = 10

    def __init__(self, root):
        self.root = root

    def path(self, name):
        cached = self.root
        return os.path.join(cached, name)

    def size(self, name):
        total = 0
        for part in split(name):
            total += len(part)
        return total


def split(name):
    def pieces():
        marker = "/"
        return name.split(marker)
    return pieces()
'''


def test_checks_of_a_method_parse_only_the_method_and_keep_the_window_names() -> None:
    """A method the window shows whole is checked alone (a reparse costs what follows the
    edit), while the names stay the whole window's: a function defined after the class is
    known, a local of another method is not, nor a class attribute read bare (a NameError)."""
    cursor = CLASS_FILE.index("        return total")
    checker = Checker(CLASS_FILE[:cursor], CLASS_FILE[cursor:], "python")
    assert checker.window_prefix.lstrip("\n").startswith("    def size(self, name):")
    assert "def split" not in checker.window_suffix
    assert checker.check("        total += len(split(name))\n").undefined_names == ()
    assert checker.check("        total += len(cached)\n").undefined_names == ("cached",)
    assert checker.check("        total += LIMIT\n").undefined_names == ("LIMIT",)
    assert checker.check("        total += (\n").syntax_errors == 1


def test_a_nested_function_is_checked_with_the_function_around_it() -> None:
    """The inner function reads its outer function's names: the checks parse the outer one,
    so a closure's names are known and a local of another function still is not."""
    cursor = CLASS_FILE.index("        return name.split(marker)")
    checker = Checker(CLASS_FILE[:cursor], CLASS_FILE[cursor:], "python")
    assert checker.window_prefix.lstrip("\n").startswith("def split(name):")
    assert checker.check("        print(name, marker)\n").undefined_names == ()
    assert checker.check("        print(cached)\n").undefined_names == ("cached",)


def test_outside_names_read_lexically() -> None:
    """The part of a window the checks do not parse: module-level bindings (not a function's
    parameters), bindings in any scope, names read outside strings, comments and import paths."""
    from kspec.engine.syntax.lexer import lex
    from kspec.engine.syntax.languages import SPECS
    from kspec.engine.syntax.pynames import OutsideNames

    text = (
        "from pickle import Pickler as P\nimport os.path\nLIMIT: int = 3\n\n"
        "def helper(a, *rest, key=None, **kw):\n    local = 'not_a_name'  # nor_this\n    for i, j in kw:\n        pass\n"
        "    with open(a) as handle:\n        return handle, LIMIT\n\nclass Box:\n    size = 1\n"
    )
    found = OutsideNames.of(text, lex(text, SPECS["python"]).tokens, 0, len(text))
    assert found.binds >= {"P", "os", "LIMIT", "helper", "Box"} and not found.binds & {"a", "rest", "key", "kw", "local"}
    assert found.bound >= {"a", "rest", "kw", "local", "i", "j", "handle", "size"}
    assert not found.bound & {"Pickler", "path"}  # an alias binds, the name it renames does not; `import os.path` binds `os`
    assert "pickle" not in found.reads and not found.reads & {"not_a_name", "nor_this", "path"}
    assert {"handle", "LIMIT", "open"} <= found.reads and not found.wildcard
    assert OutsideNames.of("from os import *\n", [], 0, 16).wildcard
    # Blocks that are not functions or classes bind at module level.
    guarded = "try:\n    import json\nexcept ImportError:\n    json = None\nif True:\n    def helper():\n        inner = 1\n"
    found = OutsideNames.of(guarded, lex(guarded, SPECS["python"]).tokens, 0, len(guarded))
    assert {"json", "helper"} <= found.binds and "inner" not in found.binds


ANNOTATED = '''class Option:
    def __init__(
        self,
        type: types.ParamType[t.Any] | None = None,
        default: t.Callable[[t.Any, int], t.Any] = make(x, y),
    ) -> None:
        self.type = type

    def convert(self, value):
        return '''


def test_names_a_parameters_annotation_or_default_reads_are_no_parameters() -> None:
    """click's core.py: `__init__(self, type: types.ParamType[t.Any] | None = None)` above the method
    the checks parse binds `self`, `type` and `default`; `t`, `types` and `make` are read there (imported
    above the window), so an alternative that reads them is not blamed (it was, twice: "bound only
    inside other functions")."""
    checker = Checker(ANNOTATED, "\n", "python")
    assert checker.window_prefix.lstrip("\n").startswith("    def convert(self, value):")  # __init__ is read lexically
    assert checker.check("t.cast(types.ParamType[t.Any], make(value))").undefined_names == ()
    found = checker.check("default(value)")  # the parameters are still __init__'s own
    assert found.undefined_names == found.certainly_undefined == ("default",)


WRITERS = '''class Reader:
    """Reads a file (the docstring window starts in here)."""

    def __init__(self, f):
        self._f = f


class Writer:
    def __init__(self, f):
        self._f = f
        self._length = (
            0
        )

    def close(self):
        self._f.write(str(self._length))


def open_file(f, mode):
    if mode == "r":
        return Reader(f)
    '''
WRITER_WINDOWS = window_starts(WRITERS, docstring="the docstring window", brackets="0\n        )", statement="._length = (")


@pytest.mark.parametrize("name", sorted(WRITER_WINDOWS))
def test_a_name_the_window_binds_only_inside_other_functions_is_certainly_undefined(name: str) -> None:
    """wave.py's `open()`: `self` (the methods' parameter) read in a module-level function cannot
    come from above the window, `Writer` can (its class is above the cut windows): the first costs
    the undefined-name penalty twice, so the model's likelier `self...` ranks below."""
    prefix = WRITERS[WRITER_WINDOWS[name] :]
    candidates = [Completion("self._f.write(mode)", logprob=-1.5, n_tokens=5), Completion("return Writer(f)", logprob=-2.0, n_tokens=4)]
    ranked = rank_alternatives(prefix, "\n", "python", candidates)
    assert [r.completion.text for r in ranked] == ["return Writer(f)", "self._f.write(mode)"]
    assert ranked[1].check.undefined_names == ranked[1].check.certainly_undefined == ("self",)
    cut_above_writer = name in ("brackets", "statement")
    assert ranked[0].check.undefined_names == (("Writer",) if cut_above_writer else ())
    assert ranked[0].check.certainly_undefined == ()


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_the_piece_of_a_word_the_windows_end_cut_off_vouches_for_no_name(language: str) -> None:
    """HumanEval/154 in a window that ends `if a[i:i+l] == p` (of `pat`): the model copies `p`
    from there. That piece is no name the window reads, so an alternative reading it is blamed
    and ranks below one that reads only names the window vouches for; the whole word ending
    the window (a line end after it, or spelled before) still vouches."""
    if language == "python":
        prefix, alternatives = "    l = len(b)\n", ["    return any(a[i:i+l] == p for i in range(3))\n", "    if l == 0:\n        return True\n"]
        line = "    for i in range(len(a) - l + 1):\n        if a[i:i+l] == p"
    else:
        prefix, alternatives = "  const l = b.length;\n", ["  return a.includes(p);\n", "  if (l === 0) return true;\n"]
        line = "  for (let i = 0; i < l; i++) {\n    if (a.slice(i, i + l) === p"
    candidates = [Completion(alternatives[0], logprob=-1.0, n_tokens=8), Completion(alternatives[1], logprob=-2.0, n_tokens=8)]
    ranked = rank_alternatives(prefix, line, language, candidates)
    assert [r.completion.text.strip() for r in ranked] == [alternatives[1].strip(), alternatives[0].strip()]
    assert ranked[1].check.undefined_names == ("p",)
    for vouching in (line + "\n", line + "at\n" + line.replace("== p", "== p\n"), "  x = p\n" + line):
        checker = Checker(prefix, vouching, language)
        assert checker.check(alternatives[0]).undefined_names == (), vouching


@pytest.mark.parametrize("leading", ["", "\n\n", "  \n"])
def test_module_level_names_are_known_when_the_text_starts_with_blank_lines(leading: str) -> None:
    """The module's tree node starts after leading blank lines (HumanEval's prompts open with
    two): its bindings and the reads' scope chain must name it alike, or every module-level
    name read below reads as undefined."""
    prefix = leading + "def is_palindrome(text: str):\n    return text == text[::-1]\n\n\n"
    checker = Checker(prefix, "", "python")
    assert checker.check("print(is_palindrome('aba'))\n").undefined_names == ()
    assert checker.check("def is_palindrome(s):").undefined_names == ()
    assert checker.check("print(is_anagram('aba'))\n").undefined_names == ("is_anagram",)


def test_names_the_file_binds_outside_the_window_are_known_when_the_editor_sends_them() -> None:
    """An editor sends a window of a long file and the names its rest binds at module level
    (`CompletionRequest.outside_names`): `json`, imported at the top, is then no undefined name,
    and `render`, defined below the window, is nothing the hole must define."""
    from kspec.engine.syntax import hole_needs, postprocess

    prefix, suffix = "def save(record, out):\n    text = ", "\n    out.write(render(text))\n"
    candidates = [Completion("json.dumps(record)", logprob=-1.0, n_tokens=4, finish_reason="stop")]
    alone = rank_alternatives(prefix, suffix, "python", candidates)
    assert alone[0].check.undefined_names == ("json",)
    told = rank_alternatives(prefix, suffix, "python", candidates, outside=frozenset({"json", "render"}))
    assert told[0].check.undefined_names == () and told[0].completion.score > alone[0].completion.score
    assert [c.text for c in postprocess(prefix, suffix, "python", candidates, outside=frozenset({"json"}))] == ["json.dumps(record)"]
    assert hole_needs(prefix, suffix, "python").names == ("render",)
    assert hole_needs(prefix, suffix, "python", frozenset({"render"})).names == ()
