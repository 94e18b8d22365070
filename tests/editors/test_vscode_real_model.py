"""kspec's .vsix in a real VS Code (code-server in headless Chromium, Playwright typing as a user)
with the real default model, Qwen2.5-Coder-0.5B Q4_K_M, as a user meets it.
Pauses at several places of three files (examples/demo.py, a Python class, a small JS file);
the screen (the ghost text in the DOM, the status item's aria-label, screenshots) says:

- whether a ghost shows after each pause, and how soon (`pause_s`: from the last key to a ghost
  on screen, 0 when one already showed as the last key was typed);
- whether the suggestion grows on screen without a key: after `$/kspec/suggestionsUpdated` the
  extension hides and asks again, so the final text must reach the screen by itself, also where
  the user typed into the ghost while it was decoding. The final text is what VS Code shows when
  asked again by hand afterwards (Escape, then "Trigger Inline Suggestion" from the command
  palette, answered from the server's typeahead cache);
- with VS Code's suggest widget open, that the ghost extends the selected item
  (`selectedCompletionInfo`, lsp_server/selected_item.py), for the first item and the next;
- with k = 4, how many distinct alternatives Alt+] cycles through once the answer is final;
- the status item: busy while decoding, idle (its check mark) after.

The figures go to test-artifacts/vscode-e2e/figures.json under "real_model" (the small-model
test's keys stay), the screenshots and the extension's output channel (every LSP message: the
test sets kspec's log level to Trace as a user would) to test-artifacts/vscode-e2e/real-model/.
It asserts the behaviour (widget agreement, grown text reaching the screen, ghosts in most
pauses, busy then idle, cycling shows other alternatives) with bounds a busy 2-core machine
holds, and records the issue's latency and share goals beside the figures without failing on
them. Skipped where the model is not installed (`kspec models pull qwen2.5-coder-0.5b`) or the
tools are missing (scripts/setup-vscode-e2e.sh)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from code_server import CHROMIUM_ARGS, E2ETools, open_at, user_settings
from suite_models import REAL_DEFAULT, real_default_env
from vscode_build import package

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "vscode-e2e"
OUT = ARTIFACTS / "real-model"
FIGURES_KEY = "real_model"
K = 4
STATUS = '[id="kspec.kspec.kspec.status"] a'

# Recorded in the page from its first moment, every 20 ms: each change of the ghost text (its
# inline part, then the lines VS Code shows below the cursor's line) and of the status item's
# aria-label, with the page's clock (Date.now(): this machine's, as time.time() here).
RECORD_JS = r"""
(() => {
  if (window.top !== window) return;
  const k = window.__kspec = {events: [], ghost: '', status: null, ghostT: 0};
  const ghost = () => {
    // with the suggest widget open, the selected item's part is a "-preview" decoration
    const inline = [...document.querySelectorAll('.monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text-decoration-preview')]
      .map(e => e.textContent).join('');
    const below = [...document.querySelectorAll('.monaco-editor .suggest-preview-text .view-line')].map(e => e.textContent);
    return [inline, ...below].join('\n').replace(/\u00a0/g, ' ').replace(/\s+$/, '');
  };
  setInterval(() => {
    const now = Date.now();
    const a = document.querySelector('[id="kspec.kspec.kspec.status"] a');
    const label = a ? a.getAttribute('aria-label') : null;
    if (label !== null && label !== k.status) { k.status = label; k.events.push({t: now, status: label}); }
    const g = ghost();
    if (g !== k.ghost) { k.ghost = g; k.ghostT = now; k.events.push({t: now, ghost: g}); }
  }, 20);
})();
"""
GHOST_SHOWN_JS = "() => window.__kspec.ghost !== ''"
GHOST_GONE_JS = "() => window.__kspec.ghost === ''"
GHOST_OTHER_JS = "(before) => window.__kspec.ghost !== '' && window.__kspec.ghost !== before"
# the engine's work is over (the status item's check mark) and the ghost has not changed for
# `quiet` ms: the extension's hide-and-ask-again after the final notification has had its turn
SETTLED_JS = f"""(quiet) => {{
  const a = document.querySelector('{STATUS}');
  return !!a && a.getAttribute('aria-label').startsWith('check') && Date.now() - window.__kspec.ghostT >= quiet;
}}"""
QUIET_MS = 1000
# the suggest widget's selected row: its label, and the ghost at the same moment
WIDGET_JS = """() => {
  const row = document.querySelector('.editor-widget.suggest-widget.visible .monaco-list-row.focused');
  if (!row) return null;
  const name = row.querySelector('.label-name');
  return {label: (name ? name.textContent : row.getAttribute('aria-label') || '').replace(/\\u00a0/g, ' '), ghost: window.__kspec.ghost};
}"""

# the goals (on a quiet machine), recorded beside what was measured
GOALS = {"pause_ghost_share": 0.95, "pause_median_s": 0.5, "grown_share": 0.90, "widget_agree_share": 1.0, "k_cyclable_share": 0.80}
# what fails the test: behaviour, with room for a 2-core machine that other work shares
GHOST_SHARE_BOUND = 0.6
GROWN_MISSES_BOUND = 1
PAUSE_MEDIAN_BOUND_S = 3.0  # kspec.deadlineMs' default: a ghost within a request's deadline

INVENTORY = '''from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1

    def total(self) -> float:
        $


@dataclass
class Inventory:
    items: list[Item] = field(default_factory=list)

    def add(self, item: Item) -> None:
        $

    def value(self) -> float:
        $

    def names(self) -> list[str]:
        $

    def count(self) -> int:
        $

    def cheapest(self) -> Item:
        $

    def restock(self, amount: int) -> None:
        $
'''.replace("$", "")  # $: the end of a blank line's indentation
SHAPES = '''// Points in the plane.
const point = {x: 1, y: 2};

function distance(a, b) {
  $
}

function scale(p, factor) {
  $
}

function describe() {
  $
}

function area(width, height) {
  $
}

module.exports = { distance, scale, describe };
'''.replace("$", "")


@dataclass(frozen=True)
class Place:
    file: str
    after: str  # the cursor goes to the (blank, indented) line below the first line holding this
    typed: str  # typed there, a key at a time, then the pause
    invoke: bool = False  # then Ctrl+Space (the suggest widget: VS Code opens it by itself after "." only)
    into: int = 0  # then, once a ghost shows, type its first `into` characters (served from the typeahead) and pause


PAUSES = (
    Place("demo.py", '"""All prime numbers smaller than limit."""', "primes = "),
    Place("inventory.py", "def total(self)", "return "),
    Place("inventory.py", "def add(self", "self."),
    Place("inventory.py", "def value(self)", "return sum("),
    Place("inventory.py", "def names(self)", "return ["),
    Place("shapes.js", "function distance(a, b)", "const dx = "),
    Place("shapes.js", "function scale(p, factor)", "return "),
    # typing into the ghost while the engine still decodes: the answer grows for the text as typed
    Place("inventory.py", "def cheapest(self)", "return ", into=3),
    Place("inventory.py", "def restock(self", "for ", into=2),
    Place("shapes.js", "function area(width, height)", "return ", into=2),
)
# with the suggest widget open: TypeScript's members of `point`, VS Code's words of the file
WIDGET_PAUSES = (
    Place("shapes.js", "function describe()", "return point."),
    Place("inventory.py", "def count(self)", "return len(self.it", invoke=True),
)
TYPE_DELAY_MS = 60  # between keys: a quick typist
WORD_END = re.compile(r"[A-Za-z0-9_]*$")
DISTINCT_NOTE = re.compile(r"last answer: (\d+) distinct alternatives? of k")


def _place(folder: Path, place: Place) -> tuple[int, int]:
    """1-based line and column of the end of the indentation of the line below `place.after`."""
    lines = (folder / place.file).read_text().splitlines()
    anchor = next(i for i, line in enumerate(lines) if place.after in line)
    below = lines[anchor + 1]
    return anchor + 2, len(below) - len(below.lstrip()) + 1


@pytest.fixture(scope="module")
def real_model() -> Path:
    from kspec.engine.models.catalog import installed_path, known_model
    from kspec.engine.models.resolve import cache_root

    path = installed_path(known_model(REAL_DEFAULT), cache_root())
    if path is None:
        pytest.skip(f"the default model is not installed: kspec models pull {REAL_DEFAULT}")
    return path


def _now_ms() -> float:
    return time.time() * 1000


def _events(page, since: float) -> list[dict]:
    return page.evaluate("(t) => window.__kspec.events.filter(e => e.t >= t)", since)


def _ghost(page) -> str:
    return page.evaluate("() => window.__kspec.ghost")


PICKED_ROW_JS = """(row) => {
  const r = document.querySelector('.quick-input-widget .monaco-list-row.focused .label-name');
  return !!r && r.textContent.trim().startsWith(row);
}"""

ROW_JS = """(row) => [...document.querySelectorAll('.quick-input-widget .monaco-list-row .label-name')]
  .some(r => r.textContent.trim() === row)"""


def _pick(page, typed: str, row: str) -> None:
    """Type `typed` into the open quick pick, wait for `row` to be the focused row, take it."""
    page.keyboard.type(typed)
    page.wait_for_function(PICKED_ROW_JS, arg=row, timeout=10_000, polling=50)
    page.keyboard.press("Enter")


def _palette(page, command: str) -> None:
    """Run `command` from the command palette (Ctrl+Shift+P), as a user would."""
    page.keyboard.press("Control+Shift+p")
    page.wait_for_selector(".quick-input-widget input", state="visible")
    _pick(page, command, command)


def _trace_lsp(page) -> None:
    """Developer: Set Log Level -> kspec -> Trace: the output channel (in the artifacts) then
    holds every LSP message, as kspec.trace.server asks."""
    _palette(page, "Developer: Set Log Level")
    page.wait_for_function(ROW_JS, arg="kspec", timeout=10_000, polling=50)  # the list of logs
    _pick(page, "kspec", "kspec")
    page.wait_for_function(PICKED_ROW_JS, arg="Info", timeout=10_000, polling=50)  # kspec's levels, at the default
    _pick(page, "Trace", "Trace")
    page.wait_for_selector(".quick-input-widget", state="hidden")


def _settle(page, timeout_s: float = 30) -> None:
    page.wait_for_function(SETTLED_JS, arg=QUIET_MS, timeout=timeout_s * 1000, polling=50)


def _hide(page) -> None:
    """Escape until no ghost and no suggest widget show."""
    for _ in range(3):
        if page.evaluate(f"() => ({GHOST_GONE_JS})() && !document.querySelector('.suggest-widget.visible')"):
            return
        page.keyboard.press("Escape")
        try:
            page.wait_for_function(GHOST_GONE_JS, timeout=2000, polling=50)
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: Escape again
            continue
    page.wait_for_function(GHOST_GONE_JS, timeout=2000, polling=50)


def _escape(page, number: int) -> None:
    """Escape once: the ghost must go; if it does not, the screen and what changed on it since
    the key say why (a suggest widget that Escape closed first, a ghost shown again by a late
    notification)."""
    pressed = _now_ms()
    page.keyboard.press("Escape")
    try:
        page.wait_for_function(GHOST_GONE_JS, timeout=5000, polling=20)
    except Exception as timeout:  # noqa: BLE001 - Playwright's TimeoutError: report what shows
        page.screenshot(path=str(OUT / f"p{number}-escape.png"))
        widget = page.evaluate("() => !!document.querySelector('.suggest-widget.visible')")
        raise AssertionError(f"pause {number}: the ghost still shows 5 s after Escape (suggest widget visible: "
                             f"{widget}); since the key: {_events(page, pressed - 1)}") from timeout


def _type_at(page, folder: Path, place: Place) -> tuple[float, float]:
    """Go to the place, type there; returns (before the first key, after the last) in ms."""
    line, column = _place(folder, place)
    open_at(page, place.file, line, column)
    _hide(page)
    start = _now_ms()
    page.keyboard.type(place.typed, delay=TYPE_DELAY_MS)
    return start, _now_ms()


def _first_ghost(events: list[dict], typed: float) -> tuple[str, float] | None:
    """The ghost on screen at the last key, else the first to come after it, and when (ms)."""
    shown = ""
    for event in events:
        if "ghost" not in event:
            continue
        if event["t"] <= typed:
            shown = event["ghost"]
        elif shown:
            break
        elif event["ghost"]:
            return event["ghost"], event["t"]
    return (shown, typed) if shown else None


def _pause(page, folder: Path, number: int, place: Place) -> dict[str, object]:
    record: dict[str, object] = {"file": place.file, "after": place.after, "typed": place.typed}
    start, typed = _type_at(page, folder, place)
    last_key = typed
    try:
        page.wait_for_function(GHOST_SHOWN_JS, timeout=15_000, polling=20)
        into = _ghost(page)[: place.into].split("\n")[0]
        if into:  # a typist reads on and types what the ghost says
            page.keyboard.type(into, delay=TYPE_DELAY_MS)
            last_key = _now_ms()
            record["typed_into"] = into
    except Exception:  # noqa: BLE001 - Playwright's TimeoutError: no ghost after this pause
        pass
    _settle(page)  # the engine's work over, the screen quiet: no key pressed since typing
    events = _events(page, start)
    statuses = [e["status"] for e in events if "status" in e]
    record["statuses"] = statuses
    record["busy_seen"] = any(s.startswith("sync~spin") for s in statuses)
    record["idle_after"] = page.evaluate(f"() => document.querySelector('{STATUS}').getAttribute('aria-label')")
    fewer = DISTINCT_NOTE.search(record["idle_after"])  # the status says when the answer had fewer than k
    record["server_distinct"] = int(fewer.group(1)) if fewer else K
    first = _first_ghost(events, typed)
    record["ghost"] = first is not None
    if first is None:
        page.screenshot(path=str(OUT / f"p{number}-no-ghost.png"))
        _hide(page)
        return record
    record["pause_s"] = round((first[1] - typed) / 1000, 3)
    if last_key != typed:  # typed into it: from then on
        first = _first_ghost(events, last_key) or ("", last_key)
    record["first_ghost"], first_t = first
    shown = [record["first_ghost"]]  # the ghosts on screen from the first (after the last key) on, before any key
    for event in events:
        if "ghost" in event and event["t"] >= first_t and event["ghost"] and event["ghost"] not in shown:
            shown.append(event["ghost"])
    record["shown_before_key"] = shown
    record["last_change_s"] = round((max(e["t"] for e in events if "ghost" in e) - last_key) / 1000, 3)
    record["settled"] = _ghost(page)
    page.screenshot(path=str(OUT / f"p{number}-1-settled.png"))

    # the final text: ask again by hand (Escape, then "Trigger Inline Suggestion": code-server
    # binds no key to it), answered from the server's typeahead cache
    _escape(page, number)
    asked = _now_ms()
    _palette(page, "Trigger Inline Suggestion")
    try:
        page.wait_for_function(GHOST_SHOWN_JS, timeout=10_000, polling=20)
        _settle(page)
        final = _ghost(page)
    except Exception:  # noqa: BLE001 - Playwright's TimeoutError: asked by hand, nothing came
        final = ""
    record["final"] = final
    record["asked_engine_again"] = any(e.get("status", "").startswith("sync~spin") for e in _events(page, asked))
    record["grown"] = bool(final) and final != record["first_ghost"]  # another (longer) text came after the first ghost
    record["final_reached_screen"] = final in shown
    record["final_settled_on_screen"] = final == record["settled"]

    # k = 4: Alt+] (VS Code's next inline suggestion) until it comes back round
    cycled = [final] if final else []
    if final:
        for _ in range(K):
            page.keyboard.press("Alt+BracketRight")
            try:
                page.wait_for_function(GHOST_OTHER_JS, arg=cycled[-1], timeout=3000, polling=20)
            except Exception:  # noqa: BLE001 - Playwright's TimeoutError: nothing else to show
                break
            now = _ghost(page)
            if now in cycled:
                break
            cycled.append(now)
        page.screenshot(path=str(OUT / f"p{number}-2-cycled.png"))
    record["cycled"] = cycled
    record["distinct_cycled"] = len(cycled)
    _hide(page)
    return record


def _agrees(typed: str, label: str, ghost: str) -> bool:
    """The ghost extends the widget's item: the word typed so far, then the ghost, starts with its
    label (VS Code's rule: it shows no ghost that does not)."""
    return bool(ghost) and (WORD_END.search(typed).group(0) + ghost).startswith(label)


def _whole_item(typed: str, label: str, ghost: str) -> bool:
    """...and keeps the item a whole name: `y` then ` * point.x`, not `ym - point.x` (another name)."""
    after = (WORD_END.search(typed).group(0) + ghost)[len(label):]
    return _agrees(typed, label, ghost) and not (after[:1].isalnum() or after[:1] == "_")


def _widget_pause(page, folder: Path, number: int, place: Place) -> list[dict[str, object]]:
    """The suggest widget opens as `place.typed` is typed; the ghost, if any, for its first item,
    then (Down) for the next."""
    checks = []
    _type_at(page, folder, place)
    if place.invoke:
        page.keyboard.press("Control+Space")
    previous_ghost = ""  # the next item's ghost is waited for as one that differs from the last item's
    for step in range(2):
        record: dict[str, object] = {"file": place.file, "typed": place.typed, "item": step}
        try:
            page.wait_for_function(WIDGET_JS, timeout=30_000, polling=50)  # TypeScript's server starts
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: no widget
            record["widget"] = False
            page.screenshot(path=str(OUT / f"w{number}-{step}-no-widget.png"))
            checks.append(record)
            break
        record["widget"] = True
        try:
            # (after Down, the last item's ghost can still show for a moment: its answer is not the new item's)
            page.wait_for_function(f"(before) => ({GHOST_OTHER_JS})(before) && ({WIDGET_JS})() !== null", arg=previous_ghost,
                                   timeout=15_000, polling=20)
            _settle(page)
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: no ghost with the widget open
            pass
        seen = page.evaluate(WIDGET_JS) or {"label": None, "ghost": _ghost(page)}
        record["label"], record["ghost"] = seen["label"], seen["ghost"]
        previous_ghost = seen["ghost"]
        # an item that changes what was typed ("Item" for "it") has no ghost that could extend it:
        # VS Code shows ghost text only after the typed text (whatever the server answers)
        record["renderable"] = seen["label"] is not None and seen["label"].startswith(WORD_END.search(place.typed).group(0))
        record["agrees"] = seen["label"] is not None and _agrees(place.typed, seen["label"], seen["ghost"])
        record["whole_item"] = seen["label"] is not None and _whole_item(place.typed, seen["label"], seen["ghost"])
        page.screenshot(path=str(OUT / f"w{number}-{step}.png"))
        checks.append(record)
        if step == 0:
            page.keyboard.press("ArrowDown")  # the next item: the ghost must follow it
            try:
                page.wait_for_function(f"(before) => {{ const w = ({WIDGET_JS})(); return w !== null && w.label !== before; }}",
                                       arg=seen["label"], timeout=5000, polling=20)
            except Exception:  # noqa: BLE001 - Playwright's TimeoutError: one item only
                break
    _hide(page)
    return checks


def _merge_figures(figures: dict[str, object]) -> None:
    """figures.json under FIGURES_KEY, beside what the small-model test wrote there."""
    path = ARTIFACTS / "figures.json"
    try:
        merged = json.loads(path.read_text())
    except (OSError, ValueError):
        merged = {}
    merged = merged if isinstance(merged, dict) else {}
    merged[FIGURES_KEY] = figures
    path.write_text(json.dumps(merged, indent=1))


def _share(hits: int, of: int) -> float | None:
    return round(hits / of, 3) if of else None


def _summary(pauses: list[dict], checks: list[dict]) -> dict[str, object]:
    ghosted = [p for p in pauses if p["ghost"]]
    grown = [p for p in ghosted if p.get("grown")]
    finals = [p for p in ghosted if p.get("final")]
    widget = [c for c in checks if c.get("widget") and c["renderable"]]
    summary: dict[str, object] = {
        "pauses": len(pauses),
        "pause_ghost_share": _share(len(ghosted), len(pauses)),
        "pause_median_s": round(statistics.median(p["pause_s"] for p in ghosted), 3) if ghosted else None,
        "pause_s": [p["pause_s"] for p in ghosted],
        "grown_pauses": len(grown),
        "grown_share": _share(sum(p["final_reached_screen"] for p in grown), len(grown)),
        "grown_settled_share": _share(sum(p["final_settled_on_screen"] for p in grown), len(grown)),
        "grown_typed_into": len([p for p in grown if p.get("typed_into")]),
        "grown_typed_into_share": _share(sum(p["final_reached_screen"] for p in grown if p.get("typed_into")),
                                         len([p for p in grown if p.get("typed_into")])),
        "widget_checks": len(widget),
        "widget_ghost_share": _share(sum(bool(c["ghost"]) for c in widget), len(widget)),
        "widget_agree_share": _share(sum(c["agrees"] for c in widget), len(widget)),
        # of those, the ghost keeps the selected item a whole name (not `items` for `item`)
        "widget_whole_item_share": _share(sum(c["whole_item"] for c in widget), len(widget)),
        "k": K,
        "k_cyclable_share": _share(sum(p["distinct_cycled"] >= K for p in finals), len(finals)),
        "distinct_cycled": [p["distinct_cycled"] for p in finals],
        # what the server's last final answer had (its status item says when fewer than k): where
        # VS Code cycles as many, fewer than k is the engine's doing (branches that agreed), not the editor's
        "server_distinct": [p["server_distinct"] for p in finals],
        "cycled_all_server_gave_share": _share(sum(p["distinct_cycled"] >= p["server_distinct"] for p in finals if not p.get("typed_into")),
                                               len([p for p in finals if not p.get("typed_into")])),
        "busy_seen_share": _share(sum(p["busy_seen"] for p in ghosted), len(ghosted)),
    }
    summary["goals"] = GOALS
    summary["goals_met"] = {
        key: summary[key] is not None and (summary[key] <= goal if key.endswith("_s") else summary[key] >= goal)
        for key, goal in GOALS.items()
    }
    return summary


@pytest.mark.slow
def test_real_model_in_vscode(tools: E2ETools, real_model: Path, built: Path, kspec_bin: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    began = time.monotonic()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    user_data, extensions, folder = tmp_path / "user-data", tmp_path / "extensions", tmp_path / "workspace"
    for path in (user_data / "User", extensions, folder):
        path.mkdir(parents=True)
    # no kspec.model: the default, as a user gets it (the suite's $KSPEC_MODEL is left out below)
    (user_data / "User" / "settings.json").write_text(json.dumps(user_settings(kspec_bin, k=K)))
    shutil.copyfile(REPO / "examples" / "demo.py", folder / "demo.py")
    (folder / "inventory.py").write_text(INVENTORY)
    (folder / "shapes.js").write_text(SHAPES)
    tools.run("--user-data-dir", str(user_data), "--extensions-dir", str(extensions),
              "--install-extension", str(package(tmp_path)), timeout=120)

    figures: dict[str, object] = {}
    pauses: list[dict] = []
    checks: list[dict] = []
    environ = real_default_env()
    with tools.serve(user_data, extensions, folder, OUT / "code-server.log", environ) as url, sync_playwright() as play:
        browser = play.chromium.launch(executable_path=str(tools.chromium), args=list(CHROMIUM_ARGS), headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.add_init_script(RECORD_JS)
        try:
            page.goto(f"{url}?folder={folder}")
            loading = time.monotonic()
            page.wait_for_function(f"() => ({SETTLED_JS})(0)", timeout=600_000, polling=100)  # the model loaded
            figures["load_s"] = round(time.monotonic() - loading, 1)
            ready = page.evaluate(f"() => document.querySelector('{STATUS}').getAttribute('aria-label')")
            figures["ready_label"] = ready
            page.screenshot(path=str(OUT / "0-ready.png"))
            assert "qwen2.5-coder-0.5b" in ready, ready  # the default model, with no setting
            _trace_lsp(page)

            # warm-up: the first request prefills the file and runs the kernels the first time
            line, column = _place(folder, PAUSES[0])
            open_at(page, "demo.py", line, column)
            warm = time.monotonic()
            page.keyboard.type("r")
            page.wait_for_function(GHOST_SHOWN_JS, timeout=60_000, polling=50)
            figures["warm_up_s"] = round(time.monotonic() - warm, 2)
            _settle(page, timeout_s=60)
            _hide(page)
            page.keyboard.press("Backspace")

            for number, place in enumerate(PAUSES):
                pauses.append(_pause(page, folder, number, place))
            for number, place in enumerate(WIDGET_PAUSES):
                checks.extend(_widget_pause(page, folder, number, place))
        finally:
            page.screenshot(path=str(OUT / "9-end.png"))
            figures["status_labels"] = page.evaluate("() => window.__kspec.events.filter(e => 'status' in e).map(e => e.status)")
            browser.close()
            for number, log in enumerate(sorted(user_data.glob("logs/*/exthost*/kspec.kspec/kspec.log"))):
                shutil.copyfile(log, OUT / f"kspec-output-{number}.log")
            figures["pause_records"] = pauses
            figures["widget_records"] = checks
            figures["run_s"] = round(time.monotonic() - began, 1)
            if pauses:
                figures = {**_summary(pauses, checks), **figures}
            (OUT / "figures.json").write_text(json.dumps(figures, indent=1))
            _merge_figures(figures)

    summary = _summary(pauses, checks)
    ghosted = [p for p in pauses if p["ghost"]]
    assert summary["pause_ghost_share"] >= GHOST_SHARE_BOUND, pauses
    assert all(p["idle_after"].startswith("check") for p in pauses), [p["idle_after"] for p in pauses]
    # busy while it decoded: a ghost that grew was decoded during the pause (one the typeahead cache
    # served whole as the last key was typed, from the warm-up's answer, had no engine work to show)
    assert all(p["busy_seen"] for p in ghosted if p["grown"]), [p["statuses"] for p in ghosted if p["grown"]]
    grown = [p for p in ghosted if p["grown"]]
    # what grew after the first ghost reaches the screen without a key: all but one of those pauses
    # (a machine that stalls past QUIET_MS), and every one where the user had typed into the ghost
    assert sum(not p["final_reached_screen"] for p in grown) <= GROWN_MISSES_BOUND, grown
    assert all(p["final_reached_screen"] for p in grown if p.get("typed_into")), grown
    widget = [c for c in checks if c.get("widget") and c["renderable"]]
    assert widget, checks  # the suggest widget opened
    assert any(c["ghost"] for c in widget), widget  # and a ghost showed with it
    assert all(c["agrees"] for c in widget if c["ghost"]), widget  # every ghost extends the selected item
    assert any(p["distinct_cycled"] >= 2 for p in ghosted), [p["cycled"] for p in ghosted]  # Alt+] shows others
    assert summary["pause_median_s"] <= PAUSE_MEDIAN_BOUND_S, summary["pause_s"]
