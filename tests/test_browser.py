"""The page in a real browser: Debian's chromium driven by Playwright's Python package (no browser download).

Generate shows both tree charts and the text; the step slider scrubs back to step 1; Stop ends a long
run and the page stays usable. The first finished run is saved as docs/screenshot.png for the README.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import served_app

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
SHOT = Path(__file__).resolve().parent.parent / "docs" / "screenshot.png"
RUN_MS = 240_000  # a short run takes well under a minute on two busy cores

pytestmark = [pytest.mark.browser, pytest.mark.slow]
DecodeConfig = pytest.importorskip("eagle2.config").DecodeConfig


@pytest.fixture(scope="module")
def page(embedded):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")

    with served_app(embedded) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1440, "height": 1000})
        pg.set_default_timeout(60_000)
        pg.goto(url)
        pg.wait_for_selector("#prompt textarea")
        try:
            yield pg
        finally:
            browser.close()


def _set_number(page, elem_id: str, value: int) -> None:
    """Type into a slider's number box and leave it (typing fires the slider's `input`, which redraws)."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Tab")


def _status(page) -> str:
    return page.locator("#status").inner_text()


def _wait_status(page, prefix: str, timeout: int = RUN_MS) -> None:
    page.wait_for_function("p => (document.querySelector('#status')?.innerText || '').startsWith(p)", arg=prefix,
                           timeout=timeout)


def _title(page, method: str) -> str:
    return page.locator(f"#tree-{method} .gtitle").first.text_content() or ""


# Set before Generate is clicked: window.__left turns true at the first change of the status line away from what
# it said before (Generate's own "Waiting for the model…" comes first), so that waiting for "Done." afterwards
# cannot be answered by the "Done." of the run before.
STATUS_LEFT = """(before) => {
    window.__left = false;
    if (window.__leftWatch) window.__leftWatch.disconnect();
    window.__leftWatch = new MutationObserver(() => {
        if ((document.querySelector('#status')?.innerText || '') !== before) {
            window.__left = true;
            window.__leftWatch.disconnect();
        }
    });
    window.__leftWatch.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def _generate(page, prompt: str, max_new: int, plain: bool) -> None:
    """Fill in and press Generate; returns once the status line shows that this run began."""
    page.fill("#prompt textarea", prompt)
    _set_number(page, "max-new", max_new)
    box = page.get_by_label("also run plain decoding (for the speedup)")
    if box.is_checked() != plain:
        box.click()
    page.evaluate(STATUS_LEFT, _status(page))
    page.click("#generate")
    page.wait_for_function("() => window.__left")


def test_generate_shows_two_trees_and_text(page):
    _generate(page, "Write a haiku about the sea.", 12, plain=True)
    page.wait_for_selector("#tree-eagle2 .js-plotly-plot .scatterlayer")
    page.wait_for_selector("#tree-eagle1 .js-plotly-plot .scatterlayer")
    _wait_status(page, "Done.")
    assert page.locator("#tree-eagle2 .js-plotly-plot").count() == 1
    assert page.locator("#tree-eagle1 .js-plotly-plot").count() == 1
    for m in ("eagle2", "eagle1"):
        assert page.locator(f"#text-{m} .tok-text .tok").count() == 12
        assert re.search(r"step \d+:", _title(page, m))
    assert "plain decoding" in page.locator("#metrics").inner_text()
    # the tree-size chart replays the EAGLE-2 run: a curve from 1 node (plain decoding) up to the run's own size
    page.wait_for_function("() => (document.querySelector('#tree-size .gtitle')?.textContent || '').includes('replayed')")
    assert page.locator("#tree-size .scatterlayer .trace").count() >= 3  # replayed curve, EAGLE-2 as run, EAGLE-1
    SHOT.parent.mkdir(exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SHOT))


def _step_shown(page, method: str) -> int | None:
    found = re.search(r"step (\d+)", _title(page, method))
    return int(found.group(1)) if found else None


# Records in the page, on every change of the DOM, the step each tree's title shows (only while the status line
# starts with `while`, when given): what a visitor would see, observed by the page itself, with no polling sleep.
WATCH_STEPS = """(only) => {
    window.__seen = {eagle2: [], eagle1: []};
    if (window.__watch) window.__watch.disconnect();
    const look = () => {
        if (only && !(document.querySelector('#status')?.innerText || '').startsWith(only)) return;
        for (const m of ['eagle2', 'eagle1']) {
            const k = /step (\\d+)/.exec(document.querySelector(`#tree-${m} .gtitle`)?.textContent || '');
            if (k && !window.__seen[m].includes(+k[1])) window.__seen[m].push(+k[1]);
        }
    };
    window.__watch = new MutationObserver(look);
    window.__watch.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
SAME_STEP = ("() => { const k = s => (/step (\\d+)/.exec(document.querySelector(s)?.textContent || '') || [])[1];"
             " return k('#unfold-eagle2 .gtitle') !== undefined && k('#unfold-eagle2 .gtitle') === "
             "k('#tree-eagle2 .gtitle'); }")


def _wait_frame(page, name: str) -> None:
    page.wait_for_function("n => (document.querySelector('#unfold-eagle2 .gtitle')?.textContent || '')"
                           ".endsWith(n)", arg=name)


def test_both_trees_grow_while_the_decoder_runs_then_play_steps_and_unfold(page):
    """While Generate decodes, each panel's title shows several steps (recorded by the page on every redraw);
    after the run, Play walks both trees from the first step, Pause stops them, "Unfold the step shown" unfolds
    the step the panels show, the step buttons move by one, and a step unfolds frame by frame: by typed frame
    numbers (Enter, no blur), the arrow keys and the frame buttons."""
    page.evaluate(WATCH_STEPS, "Live pass")  # before Generate, so that no early step goes unseen
    _generate(page, "Explain in a few sentences how a bicycle stays upright.", 96, plain=True)  # a live pass of seconds
    _wait_status(page, "Done.")
    seen = page.evaluate("() => window.__seen")
    assert len(seen["eagle2"]) >= 3 and len(seen["eagle1"]) >= 3, seen
    assert "The live pass and the timed pass gave the same tokens" in page.locator("#metrics").inner_text()
    # Play from the first step: both trees walk together, until Pause
    page.evaluate(WATCH_STEPS, None)
    page.click("#play")
    page.wait_for_function("() => window.__seen.eagle2.length >= 3 && window.__seen.eagle1.length >= 3")
    page.click("#play")  # pause
    page.wait_for_function("() => (document.querySelector('#play')?.innerText || '').includes('Play')")
    played = page.evaluate("() => window.__seen")
    assert min(played["eagle2"]) <= 3, played  # it started from the first steps
    # "Unfold the step shown" after Play and Pause: the step the EAGLE-2 panel shows, not the prefill
    page.locator("#unfold").get_by_text("Unfold a step").first.click()
    page.click("#unfold-go")
    page.wait_for_function(SAME_STEP)
    assert _step_shown(page, "eagle2") >= 1
    k = _step_shown(page, "eagle2")
    page.click("#step-forward")
    page.wait_for_function("k => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                           ".includes(`step ${k + 1}:`)", arg=k)
    page.click("#unfold-go")  # the step buttons moved the panels: the unfolding follows them
    page.wait_for_function("k => (document.querySelector('#unfold-eagle2 .gtitle')?.textContent || '')"
                           ".includes(`step ${k + 1} · root`)", arg=k)
    page.click("#step-back")
    page.wait_for_function("k => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                           ".includes(`step ${k}:`)", arg=k)
    # a typed frame number redraws at once (Enter: the number box keeps its focus, so no blur and no release)
    box = page.locator("#unfold-stage input[type=number]")
    box.fill("1")
    box.press("Enter")
    page.wait_for_function("() => (document.querySelector('#unfold-eagle2 .gtitle')?.textContent || '')"
                           ".includes('level 1')")
    assert "level 1" in page.locator("#unfold-eagle1 .gtitle").first.text_content()
    assert page.locator("#unfold-text-eagle2").inner_text().strip()
    # the arrow keys on the slider, then the frame buttons
    page.locator("#unfold-stage input[type=range]").press("ArrowLeft")
    _wait_frame(page, "root")
    page.click("#frame-forward")
    page.wait_for_function("() => (document.querySelector('#unfold-eagle2 .gtitle')?.textContent || '')"
                           ".includes('level 1')")
    page.click("#frame-back")
    _wait_frame(page, "root")


def test_a_link_carries_the_example_and_a_bad_link_says_what_it_ignored(page):
    page.fill("#prompt textarea", "Name a green fruit.")
    _set_number(page, "max-new", 24)
    page.click("#copy-link")
    page.wait_for_function("() => (document.querySelector('#link textarea, #link input')?.value || '')"
                           ".includes('?prompt=')")
    link = page.locator("#link textarea, #link input").first.input_value()
    assert "max_new_tokens=24" in link and "Name+a+green+fruit" in link
    other = page.context.browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        pg = other.new_page()
        pg.set_default_timeout(60_000)
        pg.goto(link)
        pg.wait_for_function("() => (document.querySelector('#prompt textarea')?.value || '') === 'Name a green fruit.'")
        assert pg.locator("#max-new input[type=number]").input_value() == "24"
        assert _status(pg).startswith("Opened from a link")
        base = link.split("?")[0]
        pg.goto(base + "?prompt=Hi&depth=nan&top_k=999&seed=1e400&evil=%3Cscript%3E&sizing=paper")
        pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '').includes('ignored')")
        said = _status(pg)
        assert "depth" in said and "top_k" in said and "seed" in said and "evil" in said and "<script>" not in said
        assert pg.locator("#prompt textarea").input_value() == "Hi"
        assert pg.locator("#depth input[type=number]").input_value() == str(DecodeConfig().depth)
    finally:
        other.close()


def test_scrub_back_to_step_one(page):
    last = int(page.locator("#step-eagle2 input[type=range]").get_attribute("max"))
    assert last > 1
    _set_number(page, "step-eagle2", last)  # from the last step, whatever an earlier test left shown
    page.wait_for_function("s => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                           ".includes(`step ${s}:`)", arg=last)
    before, other = _title(page, "eagle2"), _title(page, "eagle1")
    _set_number(page, "step-eagle2", 1)
    page.wait_for_function("() => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                           ".includes('step 1:')")
    assert _title(page, "eagle2") != before and _title(page, "eagle1") == other
    assert page.locator('#text-eagle2 .tok-text .tok[data-step="1"][style*="outline"]').count() >= 1


def test_stop_then_generate_again(page):
    _generate(page, "Tell me a long story about a dragon who learns to bake bread.", 400, plain=False)
    page.wait_for_function("() => /EAGLE-2 \\(dynamic tree\\) step ([2-9]|\\d\\d)/"
                           ".test(document.querySelector('#status')?.innerText || '')", timeout=RUN_MS)
    page.click("#stop")
    _wait_status(page, "Stopped", timeout=60_000)
    kept = page.locator("#text-eagle2 .tok-text .tok").count()
    assert 3 <= kept < 400
    _generate(page, "Say hello.", 6, plain=False)
    _wait_status(page, "Done.")
    assert 1 <= page.locator("#text-eagle2 .tok-text .tok").count() <= 6
    assert page.locator("#tree-eagle2 .js-plotly-plot").count() == 1


def test_prompt_lookup_branch_is_drawn_when_ticked(page):
    box = page.locator("#lookup input[type=checkbox]")
    box.check()
    try:
        _generate(page, "Repeat this sentence exactly: the small red boat drifted past the old lighthouse.", 16,
                  plain=False)
        _wait_status(page, "Done.")
        last = int(page.locator("#step-eagle2 input[type=range]").get_attribute("max"))
        drawn = []
        for step in range(1, last + 1):  # scrub until a step whose tree carries the branch
            _set_number(page, "step-eagle2", step)
            page.wait_for_function("s => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                                   ".includes(`step ${s}:`)", arg=step)
            if "prompt-lookup branch" in page.locator("#tree-eagle2 .legendtext").all_text_contents():
                drawn.append(step)
                break
        assert drawn, "no EAGLE-2 step drew the prompt-lookup branch"
        assert "prompt-lookup branch" not in page.locator("#tree-eagle1 .legendtext").all_text_contents()
    finally:
        box.uncheck()


def _pick(page, elem_id: str, option: str) -> None:
    """Choose a dropdown's option by its text, as a visitor does."""
    page.locator(f"#{elem_id} input").click()
    page.locator(f"#{elem_id}").get_by_role("option", name=option).click()
    page.wait_for_function("([e, o]) => document.querySelector(`#${e} input`)?.value === o", arg=[elem_id, option])


def test_each_panel_runs_a_chain_or_an_engines_flags(page):
    """The left panel as a chain of 3, the right as SGLang's flags: both draw while decoding, both texts equal
    plain decoding's, and the table names each in its own terms."""
    from app_parts.settings import PANEL_POLICIES

    sglang = "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
    try:
        _pick(page, "left-policy", PANEL_POLICIES["chain"])
        page.fill("#left-arg textarea", "3")
        _pick(page, "right-policy", PANEL_POLICIES["engine"])
        page.fill("#right-arg textarea", sglang)
        page.locator("#right-arg textarea").press("Tab")
        page.wait_for_function("() => (document.querySelector('#budget')?.innerText || '').includes('SGLang')")
        # (that both panels draw during the live pass is checked through the API, tests/test_app_api.py: a
        # 24-token live pass can be over between two of the page's redraws on a fast machine)
        _generate(page, "Name three colours and say why you like each.", 24, plain=True)
        _wait_status(page, "Done.")
        for m in ("eagle2", "eagle1"):
            assert page.locator(f"#tree-{m} .js-plotly-plot").count() == 1 and re.search(r"step \d+:", _title(page, m))
        table = page.locator("#metrics").inner_text()
        assert "chain of 3" in table and "SGLang: steps 3, topk 4, 8 draft tokens (root counted)" in table, table
        rows = [line for line in table.splitlines() if "chain of 3" in line or "SGLang" in line]
        assert len(rows) == 2 and all(line.rstrip().endswith("yes") for line in rows), rows  # same text as plain
        assert "chain of 3" in _title(page, "eagle2") and "SGLang" in _title(page, "eagle1")
    finally:
        _pick(page, "left-policy", PANEL_POLICIES["eagle2"])
        _pick(page, "right-policy", PANEL_POLICIES["eagle1"])
        page.fill("#left-arg textarea", "")
        page.fill("#right-arg textarea", "")


def _mark_xy(page, method: str, cls: str) -> list[float] | None:
    """Where the first mark of a node class (a trace's `meta.nodes`) sits on the screen, from Plotly's own axes."""
    return page.evaluate("""([m, cls]) => {
        const gd = document.querySelector(`#tree-${m} .js-plotly-plot`);
        const t = gd.data.find(d => d.meta && d.meta.nodes === cls);
        if (!t) return null;
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
        return [r.left + xa._offset + xa.l2p(t.x[0]), r.top + ya._offset + ya.l2p(t.y[0])];
    }""", [method, cls])


def test_sampling_shows_why_a_node_was_rejected(page):
    """At temperature 0.7 a rejected node's hover gives the target's probability of its token and the draw, the
    step's caption the residual's top tokens the bonus came from; the text still comes out."""
    _set_number(page, "temperature", 0.7)
    try:
        _generate(page, "Write two sentences about autumn leaves.", 32, plain=False)
        _wait_status(page, "Done.")
        assert page.locator("#text-eagle2 .tok-text .tok").count() >= 1
        last = int(page.locator("#step-eagle2 input[type=range]").get_attribute("max"))
        found = None
        for step in range(1, last):  # a step with a rejected node, not the last (the token limit may cut it)
            _set_number(page, "step-eagle2", step)
            page.wait_for_function("s => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                                   ".includes(`step ${s}:`)", arg=step)
            if "rejected by target" in page.locator("#tree-eagle2 .legendtext").all_text_contents():
                found = step
                break
        assert found, "no EAGLE-2 step had a rejected node"
        page.wait_for_function("() => (document.querySelector('#caption-eagle2')?.innerText || '')"
                               ".includes('Its top tokens:')")
        caption = page.locator("#caption-eagle2").inner_text()
        assert re.search(r"draw [\d.e-]+ ≥ [\d.e-]+ → rejected", caption), caption
        page.locator("#tree-eagle2").scroll_into_view_if_needed()
        x, y = _mark_xy(page, "eagle2", "rejected")
        page.mouse.move(x, y)
        page.wait_for_function("() => (document.querySelector('#tree-eagle2 .hoverlayer')?.textContent || '')"
                               ".includes('draw')")
        hover = page.locator("#tree-eagle2 .hoverlayer").text_content()
        assert re.search(r"target's probability of .+: [\d.e-]+", hover), hover
        assert re.search(r"draw [\d.e-]+ ≥ [\d.e-]+ → rejected", hover), hover
    finally:
        _set_number(page, "temperature", 0)


def test_three_sessions_queue_and_keep_their_own_runs(page, embedded, monkeypatch):
    """Three isolated browser sessions press Generate together: the decodes run one at a time on the shared
    model, and each page ends with exactly its own prompt's text and trees, also after scrubbing."""
    import threading
    import time

    import app
    from eagle2.api import run
    from eagle2.config import DecodeConfig

    spans, lock, inner = [], threading.Lock(), app.generate

    def timed(*args, **kwargs):  # records when each visitor's decode ran, on the server side
        start = time.perf_counter()
        try:
            yield from inner(*args, **kwargs)
        finally:
            with lock:
                spans.append((start, time.perf_counter()))

    monkeypatch.setattr(app, "generate", timed)  # looked up per call by the served page's handler
    prompts = ["Name three colours.", "Describe the moon in a few words.", "Say something kind."]
    want = ["".join(t for r in run(embedded, p, DecodeConfig(method="vanilla", max_new_tokens=16)).records
                    for t in r.new_texts) for p in prompts]
    assert len(set(want)) == 3, "the prompts must give different texts for this test to mean anything"
    url = page.url.split("?")[0]
    contexts = [page.context.browser.new_context(viewport={"width": 1280, "height": 900}) for _ in prompts]
    try:
        pages = []
        for ctx, prompt in zip(contexts, prompts):  # separate contexts: no shared cookies or storage
            pg = ctx.new_page()
            pg.set_default_timeout(60_000)
            pg.goto(url)
            pg.wait_for_selector("#prompt textarea")
            pg.fill("#prompt textarea", prompt)
            _set_number(pg, "max-new", 16)
            box = pg.get_by_label("also run plain decoding (for the speedup)")
            if box.is_checked():
                box.click()
            pages.append(pg)
        for pg in pages:
            pg.click("#generate")
        for pg in pages:
            _wait_status(pg, "Done.")
        for pg, text in zip(pages, want):
            for m in ("eagle2", "eagle1"):
                shown = "".join(pg.locator(f"#text-{m} .tok-text .tok").all_text_contents())
                assert shown == text.replace("\n", ""), (m, shown, text)
                assert pg.locator(f"#tree-{m} .js-plotly-plot").count() == 1
        before = [_title(pg, "eagle2") for pg in pages]
        assert "step 1:" not in before[1], before[1]  # the run took more than one step, so a scrub shows
        _set_number(pages[1], "step-eagle2", 1)  # scrubbing one page leaves the others alone
        pages[1].wait_for_function("() => (document.querySelector('#tree-eagle2 .gtitle')?.textContent || '')"
                                   ".includes('step 1:')")
        assert [_title(pg, "eagle2") for pg in (pages[0], pages[2])] == [before[0], before[2]]
    finally:
        for ctx in contexts:
            ctx.close()
    assert len(spans) == 3
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), f"decodes overlapped: {spans}"


def test_the_workload_tab_diagnoses_an_uploaded_file(page, tmp_path):
    import json

    f = tmp_path / "work.jsonl"
    f.write_text("".join(json.dumps({"category": c, "prompt": t}) + "\n" for c, t in
                         [("qa", "What is the capital of France?"), ("math", "What is 12 times 7?")]))
    page.get_by_role("tab", name="Workload").click()
    page.locator("#wl-file input[type=file]").set_input_files(str(f))
    _set_number(page, "wl-max-new", 8)
    page.click("#wl-run")
    page.wait_for_function("() => (document.querySelector('#wl-status')?.innerText || '').startsWith('Done')",
                           timeout=RUN_MS)
    page.wait_for_selector("#wl-curves .js-plotly-plot .scatterlayer .trace", state="attached")
    assert page.locator("#wl-curves .scatterlayer .trace").count() >= 3  # EAGLE-2 by depth, EAGLE-1 cut, chain
    assert "τ by verified nodes" in (page.locator("#wl-curves .gtitle").first.text_content() or "")
    page.wait_for_selector("#wl-positions .js-plotly-plot .heatmaplayer", state="attached")
    box = page.locator("#wl-curves .js-plotly-plot").bounding_box()
    assert box and box["width"] > 300 and box["height"] > 200  # drawn at a real size, not in a hidden tab
    summary = page.locator("#wl-summary").inner_text()
    assert "prompt 1 (qa)" in summary and "prompt 2 (math)" in summary and "passed" in summary
    page.get_by_role("tab", name="One prompt, step by step").click()


def test_stop_while_waiting_leaves_the_queue_without_decoding(page, monkeypatch):
    """A second visitor presses Generate while the first one's long run decodes: their page shows its place in
    the queue; Stop takes them out, and when the model is free their run ends at once, having decoded nothing.

    The first run is held after its first drawn step until its visitor presses Stop. Without the hold it raced
    the test: a run ends by itself (its token limit, or the page's time limit of EAGLE2_RUN_BUDGET_S), and on a
    busy machine the second page's loading and queueing could outlast it, so that Stop found nothing running
    ("Nothing is running.") or the time limit had ended it ("Stopped at the time limit…"), never "Stopped."."""
    import threading

    import app

    inner, released = app.generate, threading.Event()

    def held(*args, **kwargs):  # the served page looks `generate` up per call
        control = kwargs["control"]
        for u in inner(*args, **kwargs):
            yield u
            while u.trees and u.status.startswith("Live pass") and not control.stop_requested:
                released.wait(0.05)  # a wait on the first visitor's Stop, not a guess at how long a step takes

    monkeypatch.setattr(app, "generate", held)
    url = page.url.split("?")[0]
    contexts = [page.context.browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    try:
        first, second = (ctx.new_page() for ctx in contexts)
        for pg in (first, second):
            pg.set_default_timeout(60_000)
            pg.goto(url)
            pg.wait_for_selector("#prompt textarea")
        _generate(first, "Tell me a long story about a dragon.", 64, plain=True)
        _wait_status(first, "Live pass (drawn")  # its first steps drawn: held there until its Stop
        _generate(second, "Say hello.", 8, plain=False)
        # while a run waits, the status line carries Gradio's "queue: place/size | elapsed/estimate" before its text
        second.wait_for_function("() => (document.querySelector('#status')?.innerText || '')"
                                 ".includes('Waiting for the model')")
        second.wait_for_function("() => [...document.querySelectorAll('.progress-text')]"
                                 ".some(e => e.innerText.includes('queue: 1/1'))")
        second.click("#stop")
        second.wait_for_function("() => (document.querySelector('#status')?.innerText || '')"
                                 ".includes('Taken out of the queue')")
        first.click("#stop")
        try:
            _wait_status(first, "Stopped. Kept what was produced")
        except Exception as e:  # say where the first visitor's run stood
            raise AssertionError(f"the first visitor's status after Stop: {_status(first)!r}") from e
        _wait_status(second, "Stopped before it started")
        assert "no output yet" in second.locator("#text-eagle2").inner_text()
    finally:
        released.set()
        for ctx in contexts:
            ctx.close()


def test_a_server_still_preparing_says_which_step_and_a_generate_waits_for_it(page, embedded):
    """While the server prepares at start (app_parts/warmup.py), an open page's status line names the step; a
    Generate pressed meanwhile says what it waits for, then runs; the other page's line turns to Ready. by itself
    once the preparation ends."""
    import threading

    from app_parts import warmup
    from app_parts.presets import CACHE

    gate = threading.Event()
    prep = warmup.Preparation([("the model conversion", "held by the test", lambda: gate.wait(RUN_MS / 1000))])
    CACHE.preparation = prep.start()  # before the page is built: its timer starts only while a preparation runs
    contexts = []
    try:
        with served_app(embedded) as url:
            pages = []
            for _ in range(2):
                contexts.append(page.context.browser.new_context(viewport={"width": 1280, "height": 900}))
                pg = contexts[-1].new_page()
                pg.set_default_timeout(60_000)
                pg.goto(url)
                _wait_status(pg, warmup.PREPARING + "the model conversion, held by the test (step 1 of 1",
                             60_000)
                pages.append(pg)
            watcher, visitor = pages
            visitor.get_by_role("radio", name="my settings below").check()  # no machine profile to measure in this test
            _generate(visitor, "Say hello.", 4, plain=False)
            _wait_status(visitor, "Waiting for the model conversion (started at server start", 60_000)
            _wait_status(watcher, warmup.PREPARING, 60_000)  # still preparing: this page's line is unchanged
            gate.set()
            _wait_status(visitor, "Done.")
            _wait_status(watcher, "Ready.", 60_000)
    finally:
        gate.set()
        CACHE.preparation = None
        for ctx in contexts:
            ctx.close()
