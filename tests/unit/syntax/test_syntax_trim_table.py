"""Trimming, table-driven: every language, every cursor situation the issue lists.

Each case is a file with the cursor marked `‸`, what the model produced there, and what
trimming must keep. Each expected text is also checked to fit its file without a new
syntax error, so a wrong expectation cannot hide here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kspec.engine.syntax.checks import Checker
from kspec.engine.syntax.context import build_context
from kspec.engine.syntax.trim import trim

CURSOR = "‸"


@dataclass(frozen=True)
class Case:
    language: str
    situation: str
    source: str  # the file with the cursor marked ‸
    completion: str  # what the model produced at the cursor
    expected: str  # what trimming keeps

    def split(self) -> tuple[str, str]:
        prefix, suffix = self.source.split(CURSOR)
        return prefix, suffix

    @property
    def id(self) -> str:
        return f"{self.language}-{self.situation}"


CASES = [
    # ---------------------------------------------------------------- Python
    Case("python", "mid-expression",
         "def area(r):\n    return 3.14 * ‸\n",
         "r * r\n\n\nprint(area(2))\n",
         "r * r"),
    Case("python", "new-line-in-block",
         "def total(xs):\n    t = 0\n    for x in xs:\n        ‸\n    return t\n",
         "t += x\n    return t\n",
         "t += x"),
    Case("python", "end-of-function",
         "def double(x):\n    y = x * 2\n    ‸\n\n\ndef other():\n    pass\n",
         "return y\n\n\ndef main():\n    print(double(3))\n",
         "return y"),
    Case("python", "call-arguments",
         "def f(a, b, c):\n    return print(a, ‸, c)\n",
         "b, c)\n\nf(1, 2, 3)\n",
         "b"),
    Case("python", "bracket-closed-by-suffix",
         "values = [‸]\nprint(values)\n",
         "1, 2, 3]\nprint(values)\n",
         "1, 2, 3"),
    Case("python", "inside-string",
         'name = "hello ‸"\nprint(name)\n',
         'world"\nprint(name)\n',
         "world"),
    Case("python", "inside-comment",
         "x = 1  # the ‸\ny = 2\n",
         "answer to everything\nz = 3\n",
         "answer to everything"),
    Case("python", "body-start",
         "def inc(x):\n    ‸",
         "y = x + 1\n    return y\n\n\nprint(inc(1))\n",
         "y = x + 1\n    return y"),
    Case("python", "compound-statement-at-line-start",
         "def keep(xs):\n    out = []\n‸\n    return out\n",
         "    for x in xs:\n        if x:\n            out.append(x)\n        else:\n            pass\n    return out\n",
         "    for x in xs:\n        if x:\n            out.append(x)\n        else:\n            pass"),
    Case("python", "mid-line-block-header",
         "def sign(x):\n    if x >‸\n    return 0\n",
         " 0:\n        return 1\n    return 0\n",
         " 0:\n        return 1"),
    Case("python", "decorator-then-def",
         "class A:\n    ‸",
         "@property\n    def name(self):\n        return 'a'\n\n    @property\n    def other(self):\n        return 'b'\n\nprint(A)\n",
         "@property\n    def name(self):\n        return 'a'\n\n    @property\n    def other(self):\n        return 'b'"),
    Case("python", "docstring-closed-by-suffix",
         'def f():\n    """Return the ‸"""\n    return 1\n',
         'answer."""\n    return 1\n',
         "answer."),
    # ------------------------------------------------------------ JavaScript
    Case("javascript", "mid-expression",
         "function area(r) {\n  return Math.PI * ‸\n}\n",
         "r * r;\n}\n\nconsole.log(area(2));\n",
         "r * r;"),
    Case("javascript", "new-line-in-block",
         "function sum(xs) {\n  let t = 0;\n  for (const x of xs) {\n    ‸\n  }\n  return t;\n}\n",
         "t += x;\n  }\n  return t;\n}\n",
         "t += x;"),
    Case("javascript", "end-of-function",
         "function f(x) {\n  const y = x * 2;\n  ‸\n}\n",
         "return y;\n}\n\nfunction g() {}\n",
         "return y;"),
    Case("javascript", "call-arguments",
         "const m = Math.max(‸);\n",
         "a, b);\nconsole.log(m);\n",
         "a, b"),
    Case("javascript", "bracket-closed-by-suffix",
         "const xs = [‸];\n",
         "1, 2, 3];\nconsole.log(xs);\n",
         "1, 2, 3"),
    Case("javascript", "inside-string",
         'const s = "hello ‸";\n',
         'world";\nconsole.log(s);\n',
         "world"),
    Case("javascript", "inside-template-field",
         "const s = `hi ${‸}`;\n",
         "user.name}`;\nconsole.log(s);\n",
         "user.name"),
    Case("javascript", "inside-comment",
         "// returns the ‸\nfunction f() {}\n",
         "sum of the list\nfunction g() {}\n",
         "sum of the list"),
    Case("javascript", "body-start-closed-by-suffix",
         "function inc(x) {\n‸\n}\n",
         "  const y = x + 1;\n  return y;\n}\n\ninc(1);\n",
         "  const y = x + 1;\n  return y;"),
    Case("javascript", "if-else-statement",
         "function sign(x) {\n  ‸\n  return 0;\n}\n",
         "if (x > 0) {\n    return 1;\n  } else {\n    return -1;\n  }\n  return 0;\n}\n",
         "if (x > 0) {\n    return 1;\n  } else {\n    return -1;\n  }"),
    # ------------------------------------------------------------ TypeScript
    Case("typescript", "mid-expression",
         "function add(a: number, b: number): number {\n  return a + ‸\n}\n",
         "b;\n}\n\nconsole.log(add(1, 2));\n",
         "b;"),
    Case("typescript", "new-line-in-block",
         "function total(xs: number[]): number {\n  let t = 0;\n  for (const x of xs) {\n    ‸\n  }\n  return t;\n}\n",
         "t += x;\n  }\n  return t;\n}\n",
         "t += x;"),
    Case("typescript", "end-of-function",
         "function half(x: number): number {\n  const y: number = x / 2;\n  ‸\n}\n",
         "return y;\n}\n\nexport default half;\n",
         "return y;"),
    Case("typescript", "call-arguments",
         "const m: number = Math.min(‸);\n",
         "a, b);\nconsole.log(m);\n",
         "a, b"),
    Case("typescript", "bracket-closed-by-suffix",
         "const names: string[] = [‸];\n",
         "'a', 'b'];\n",
         "'a', 'b'"),
    Case("typescript", "inside-string",
         "const greeting: string = 'hello ‸';\n",
         "world';\nconsole.log(greeting);\n",
         "world"),
    Case("typescript", "inside-comment",
         "/* the ‸ */\nconst x = 1;\n",
         "answer */\nconst y = 2;\n",
         "answer"),
    # ------------------------------------------------------------------- TSX
    Case("tsx", "mid-expression",
         "const App = () => <div className={‸}></div>;\n",
         "styles.app}></div>;\nexport default App;\n",
         "styles.app"),
    Case("tsx", "new-line-in-block",
         "function Item(props: { n: number }) {\n  const n = props.n;\n  ‸\n}\n",
         "return <li>{n}</li>;\n}\n\nexport default Item;\n",
         "return <li>{n}</li>;"),
    Case("tsx", "call-arguments",
         "const s = String(‸);\n",
         "props.n);\n",
         "props.n"),
    Case("tsx", "inside-string",
         'const c = "a ‸";\n',
         'b";\n',
         "b"),
    Case("tsx", "end-of-function",
         "function Title() {\n  const t = 'x';\n  ‸\n}\n",
         "return <h1>{t}</h1>;\n}\n\nexport default Title;\n",
         "return <h1>{t}</h1>;"),
    Case("tsx", "bracket-closed-by-suffix",
         "const xs = [‸];\nconst App = () => <ul>{xs}</ul>;\n",
         "1, 2];\n",
         "1, 2"),
    # -------------------------------------------------------------------- Go
    Case("go", "mid-expression",
         "package main\n\nfunc area(r float64) float64 {\n\treturn 3.14 * ‸\n}\n",
         "r * r\n}\n\nfunc main() {}\n",
         "r * r"),
    Case("go", "new-line-in-block",
         "package main\n\nfunc sum(xs []int) int {\n\tt := 0\n\tfor _, x := range xs {\n\t\t‸\n\t}\n\treturn t\n}\n",
         "t += x\n\t}\n\treturn t\n}\n",
         "t += x"),
    Case("go", "end-of-function",
         "package main\n\nfunc double(x int) int {\n\ty := x * 2\n\t‸\n}\n",
         "return y\n}\n\nfunc main() {}\n",
         "return y"),
    Case("go", "call-arguments",
         'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println(‸)\n}\n',
         '"hi", 1)\n}\n',
         '"hi", 1'),
    Case("go", "inside-string",
         'package main\n\nvar s = "hello ‸"\n',
         'world"\n\nfunc main() {}\n',
         "world"),
    Case("go", "raw-string-with-brackets",
         "package main\n\nvar s = ‸\n",
         "`(((`\n\nfunc main() {}\n",
         "`(((`"),
    Case("go", "bracket-closed-by-suffix",
         "package main\n\nvar xs = []int{‸}\n",
         "1, 2, 3}\n\nfunc main() {}\n",
         "1, 2, 3"),
    # ------------------------------------------------------------------ Rust
    Case("rust", "mid-expression",
         "fn area(r: f64) -> f64 {\n    3.14 * ‸\n}\n",
         "r * r\n}\n\nfn main() {}\n",
         "r * r"),
    Case("rust", "new-line-in-block",
         "fn sum(xs: &[i32]) -> i32 {\n    let mut t = 0;\n    for x in xs.iter() {\n        ‸\n    }\n    t\n}\n",
         "t += x;\n    }\n    t\n}\n",
         "t += x;"),
    Case("rust", "end-of-function-with-lifetimes",
         "fn first<'a>(xs: &'a [i32]) -> &'a i32 {\n‸\n}\n",
         "    &xs[0]\n}\n\nfn main() {}\n",
         "    &xs[0]"),
    Case("rust", "call-arguments",
         'fn main() {\n    println!("{}", ‸);\n}\n',
         "1 + 2);\n}\n",
         "1 + 2"),
    Case("rust", "inside-string",
         'fn main() {\n    let s = "hello ‸";\n}\n',
         'world";\n}\n',
         "world"),
    Case("rust", "char-literal-bracket",
         "fn main() {\n    let c = ‸\n}\n",
         "'(';\n}\n",
         "'(';"),
    Case("rust", "bracket-closed-by-suffix",
         "fn main() {\n    let v = vec![‸];\n}\n",
         "1, 2, 3];\n}\n",
         "1, 2, 3"),
    # ------------------------------------------------------------------ Java
    Case("java", "mid-expression",
         "class A {\n    int add(int a, int b) {\n        return a + ‸;\n    }\n}\n",
         "b;\n    }\n}\n",
         "b"),
    Case("java", "new-line-in-block",
         "class A {\n    int sum(int n) {\n        int s = 0;\n        for (int i = 0; i < n; i++) {\n            ‸\n        }\n        return s;\n    }\n}\n",
         "s += i;\n        }\n        return s;\n    }\n}\n",
         "s += i;"),
    Case("java", "end-of-method",
         "class A {\n    int twice(int x) {\n        int y = x * 2;\n        ‸\n    }\n}\n",
         "return y;\n    }\n\n    int other() { return 0; }\n}\n",
         "return y;"),
    Case("java", "call-arguments",
         "class A {\n    void f() {\n        System.out.println(‸);\n    }\n}\n",
         '"hi");\n    }\n}\n',
         '"hi"'),
    Case("java", "inside-string",
         'class A {\n    String s = "hello ‸";\n}\n',
         'world";\n}\n',
         "world"),
    Case("java", "inside-comment",
         "class A {\n    // the ‸\n    int x = 1;\n}\n",
         "answer\n    int y = 2;\n}\n",
         "answer"),
    Case("java", "bracket-closed-by-suffix",
         "class A {\n    int[] xs = {‸};\n}\n",
         "1, 2, 3};\n}\n",
         "1, 2, 3"),
    # --------------------------------------------------------------------- C
    Case("c", "mid-expression",
         "int sq(int x) {\n    return x * ‸\n}\n",
         "x;\n}\n\nint main(void) { return 0; }\n",
         "x;"),
    Case("c", "new-line-in-block",
         "int sum(int n) {\n    int s = 0;\n    for (int i = 0; i < n; i++) {\n        ‸\n    }\n    return s;\n}\n",
         "s += i;\n    }\n    return s;\n}\n",
         "s += i;"),
    Case("c", "call-arguments",
         '#include <stdio.h>\nint main(void) {\n    printf("%d\\n", ‸);\n    return 0;\n}\n',
         "42);\n    return 0;\n}\n",
         "42"),
    Case("c", "inside-string",
         'const char *s = "hello ‸";\n',
         'world";\nint x;\n',
         "world"),
    Case("c", "char-literal-bracket",
         "int main(void) {\n    char c = ‸\n}\n",
         "'{';\n    return 0;\n}\n",
         "'{';"),
    Case("c", "end-of-function",
         "int twice(int x) {\n    int y = x * 2;\n    ‸\n}\n",
         "return y;\n}\n\nint main(void) { return twice(2); }\n",
         "return y;"),
    Case("c", "bracket-closed-by-suffix",
         "int xs[] = {‸};\n",
         "1, 2, 3};\nint main(void) { return 0; }\n",
         "1, 2, 3"),
    # ------------------------------------------------------------------- C++
    Case("cpp", "mid-expression",
         "int sq(int x) {\n    return x * ‸\n}\n",
         "x;\n}\n",
         "x;"),
    Case("cpp", "new-line-in-block",
         "#include <vector>\nint sum(const std::vector<int>& v) {\n    int s = 0;\n    for (int x : v) {\n        ‸\n    }\n    return s;\n}\n",
         "s += x;\n    }\n    return s;\n}\n",
         "s += x;"),
    Case("cpp", "end-of-function",
         "int twice(int x) {\n    int y = x * 2;\n    ‸\n}\n",
         "return y;\n}\n\nint main() { return twice(2); }\n",
         "return y;"),
    Case("cpp", "call-arguments",
         "#include <algorithm>\nint m(int a, int b) {\n    return std::max(‸);\n}\n",
         "a, b);\n}\n",
         "a, b"),
    Case("cpp", "raw-string",
         'const char* s = ‸;\n',
         'R"x(a ")" b)x";\nint y;\n',
         'R"x(a ")" b)x"'),
    Case("cpp", "inside-comment",
         "int x = 1; // the ‸\nint y = 2;\n",
         "answer\nint z = 3;\n",
         "answer"),
    Case("cpp", "bracket-closed-by-suffix",
         "#include <vector>\nstd::vector<int> xs = {‸};\n",
         "1, 2, 3};\n",
         "1, 2, 3"),
    Case("cpp", "inside-string",
         'const char* s = "hello ‸";\n',
         'world";\nint y;\n',
         "world"),
]

LANGUAGES = {"python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp"}
# The situations the issue asks for; a case's situation starts with one of these.
SITUATIONS = (
    "mid-expression", "new-line-in-block", "end-of-", "call-arguments",
    "bracket-closed-by-suffix", "inside-",
)


def test_every_language_has_the_required_situations() -> None:
    for language in LANGUAGES:
        covered = [case.situation for case in CASES if case.language == language]
        missing = [s for s in SITUATIONS if not any(c.startswith(s) for c in covered)]
        assert not missing, (language, missing)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_trim(case: Case) -> None:
    prefix, suffix = case.split()
    ctx = build_context(prefix, suffix, case.language)
    assert trim(ctx, case.completion) == case.expected


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_expected_text_fits_the_file(case: Case) -> None:
    prefix, suffix = case.split()
    check = Checker(prefix, suffix, case.language).check(case.expected, names=False)
    assert check.syntax_errors == 0
