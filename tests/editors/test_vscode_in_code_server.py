"""kspec's .vsix in a real VS Code: code-server in headless Chromium, driven by Playwright as a
user would. The status item goes loading -> ready, ghost text shows after a
pause, Alt+] cycles through the alternatives, Tab accepts. Screenshots and the figures land in
test-artifacts/vscode-e2e/. Runs where scripts/setup-vscode-e2e.sh installed the tools."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

from code_server import CHROMIUM_ARGS, E2ETools, keep_figures, open_at, user_settings
from vscode_build import package

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "vscode-e2e"
STATUS = '[id="kspec.kspec.kspec.status"] a'
# the inline part of the ghost text (its first line), one span per token colour
GHOST_JS = "() => Array.from(document.querySelectorAll('.monaco-editor .ghost-text-decoration')).map(e => e.textContent).join('')"
# every distinct label of the status item, recorded in the page from its first moment
RECORD_STATUS_JS = """
window.__kspecStatus = [];
setInterval(() => {
  const a = document.querySelector('[id="kspec.kspec.kspec.status"] a');
  const label = a ? a.getAttribute('aria-label') : null;
  const seen = window.__kspecStatus;
  if (label && seen[seen.length - 1] !== label) seen.push(label);
}, 25);
"""
PAUSE_GOAL_S = 1.0  # the goal: ghost text within 1 s of a pause, after warm-up (figures.json)
PAUSE_BOUND_S = 2.0  # what fails the test: twice the goal, as a 2-core machine under other load has measured
LINE, COLUMN = 16, 5  # examples/demo.py: the body of primes_below
REAL_MODEL_KEY = "real_model"  # figures.json's part from test_vscode_real_model.py, kept


def _ghost(page) -> str:
    return page.evaluate(GHOST_JS).replace("\xa0", " ")


def _wait_for_ghost(page, timeout_s: float, other_than: str = "") -> str:
    page.wait_for_function(
        f"(before) => {{ const g = ({GHOST_JS})(); return g.length > 0 && g !== before; }}",
        arg=other_than.replace(" ", "\xa0"), timeout=timeout_s * 1000,
    )
    return _ghost(page)


def _warm_up(page, attempts: int = 4) -> float:
    """The first suggestion (prefill of the file, kernels' first run): type, and type again as a
    user would if nothing showed. Returns the seconds it took."""
    start = time.monotonic()
    for attempt in range(attempts):
        page.keyboard.type("r")
        try:
            _wait_for_ghost(page, timeout_s=20)
            return time.monotonic() - start
        except Exception:  # noqa: BLE001 - Playwright's TimeoutError: nothing shown yet
            page.keyboard.press("Escape")
            page.keyboard.press("Backspace")
    page.screenshot(path=str(ARTIFACTS / "2-no-ghost.png"))
    raise AssertionError(f"no ghost text after {attempts} tries in {time.monotonic() - start:.0f} s")


def test_ghost_text_cycle_and_accept_in_vscode(tools: E2ETools, built: Path, kspec_bin: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    kept = keep_figures(ARTIFACTS / "figures.json", REAL_MODEL_KEY)  # the real-model test's, if it ran
    for old in ARTIFACTS.glob("*"):  # this test's files of an earlier run; the real-model test's folder stays
        if old.is_file():
            old.unlink()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    user_data, extensions, folder = tmp_path / "user-data", tmp_path / "extensions", tmp_path / "workspace"
    for path in (user_data / "User", extensions, folder):
        path.mkdir(parents=True)
    (user_data / "User" / "settings.json").write_text(json.dumps(user_settings(kspec_bin)))
    demo = folder / "demo.py"
    shutil.copyfile(REPO / "examples" / "demo.py", demo)
    original_lines = demo.read_text().splitlines()
    tools.run("--user-data-dir", str(user_data), "--extensions-dir", str(extensions),
              "--install-extension", str(package(tmp_path)), timeout=120)

    figures: dict[str, object] = dict(kept)
    with tools.serve(user_data, extensions, folder, ARTIFACTS / "code-server.log") as url, sync_playwright() as play:
        browser = play.chromium.launch(executable_path=str(tools.chromium), args=list(CHROMIUM_ARGS), headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.add_init_script(RECORD_STATUS_JS)
        try:
            page.goto(f"{url}?folder={folder}")
            page.wait_for_function("() => (window.__kspecStatus || []).some(l => l.startsWith('check'))", timeout=120_000)
            statuses = page.evaluate("() => window.__kspecStatus")
            page.screenshot(path=str(ARTIFACTS / "1-ready.png"))
            ready = next(i for i, label in enumerate(statuses) if label.startswith("check"))  # $(check) kspec
            assert any(label.startswith("loading~spin") for label in statuses[:ready]), statuses  # loading -> ready

            open_at(page, "demo.py", LINE, COLUMN)
            figures["warm_up_s"] = round(_warm_up(page), 2)
            page.screenshot(path=str(ARTIFACTS / "2-first-ghost.png"))

            pauses = []
            for key in "pfn":  # fresh prefixes (p..., f..., n...): each pause is a new request, not the typeahead
                page.keyboard.press("Escape")
                page.keyboard.press("Backspace")
                page.keyboard.type(key)
                typed = time.monotonic()
                _wait_for_ghost(page, timeout_s=10)
                pauses.append(round(time.monotonic() - typed, 3))
            figures["ghost_after_pause_s"] = pauses
            page.screenshot(path=str(ARTIFACTS / "3-ghost.png"))

            # a user reads the suggestion, then cycles: by then the alternatives decoded after the
            # early answer are in (the status item back at its check mark, no request with the engine)
            page.wait_for_function(f"() => document.querySelector('{STATUS}').getAttribute('aria-label').startsWith('check')")
            shown = [_ghost(page)]
            for _ in range(3):  # VS Code's "next inline suggestion"
                page.keyboard.press("Alt+BracketRight")
                try:
                    shown.append(_wait_for_ghost(page, timeout_s=3, other_than=shown[-1]))
                except Exception:  # noqa: BLE001 - the last alternative: cycling came back round
                    break
            figures["alternatives_cycled"] = shown
            page.screenshot(path=str(ARTIFACTS / "4-cycled.png"))

            accepted = _ghost(page)
            page.keyboard.press("Tab")
            page.wait_for_function(f"() => ({GHOST_JS})() === ''")
            page.keyboard.press("Control+s")
            page.wait_for_selector(".tab.active.dirty", state="detached")
            page.screenshot(path=str(ARTIFACTS / "5-accepted.png"))
        finally:
            figures["status_labels"] = page.evaluate("() => window.__kspecStatus")  # the whole run's
            (ARTIFACTS / "figures.json").write_text(json.dumps(figures, indent=1))
            browser.close()
            for number, log in enumerate(sorted(user_data.glob("logs/*/exthost*/kspec.kspec/kspec.log"))):
                shutil.copyfile(log, ARTIFACTS / f"kspec-output-{number}.log")  # the extension's output channel

    assert len(set(shown)) >= 2, shown  # cycling shows other alternatives
    figures["pause_goal_met"] = statistics.median(pauses) <= PAUSE_GOAL_S
    (ARTIFACTS / "figures.json").write_text(json.dumps(figures, indent=1))
    assert statistics.median(pauses) <= PAUSE_BOUND_S, pauses
    lines = demo.read_text().splitlines()
    assert lines[: LINE - 1] == original_lines[: LINE - 1]
    assert lines[LINE - 1] == " " * (COLUMN - 1) + "n" + accepted, (lines[LINE - 1], accepted)
