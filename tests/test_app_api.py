"""The launched app over its HTTP API (gradio_client): streaming both trees, messages, separate sessions."""
from __future__ import annotations

import html
import json
import os
import re

import pytest

from tests.conftest import served_app

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(embedded):
    with served_app(embedded) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def _shown_text(html_text: str) -> str:
    """The output text as the page shows it: the token spans after the legend, tags stripped."""
    body = html_text.split('class="tok-text"', 1)[1]
    spans = re.findall(r'<span class="tok tok-\w+" data-step="\d+"[^>]*>(.*?)</span>', body, flags=re.S)
    return html.unescape("".join(spans).replace("<br>", "\n"))


def _is_tree(value) -> bool:
    """A Plot output carrying a Plotly tree figure (not a skipped update)."""
    if not isinstance(value, dict) or value.get("type") != "plotly":
        return False
    fig = json.loads(value["plot"])
    return any((t.get("meta") or {}).get("nodes") for t in fig["data"]) or "prefill" in value["plot"]


def test_every_step_of_a_generate_decodes_on_the_one_engine_thread(client, monkeypatch):
    """Gradio resumes a streaming handler on any of its worker threads; the decoder's OpenMP team belongs to the
    calling thread, so each hop left the old team spinning against the new one (app_parts/engine_thread.py)."""
    import threading

    from eagle2.decode.engine import Decoder

    ran, step = [], Decoder.step

    def recorded(self, *args, **kwargs):
        ran.append(threading.current_thread())  # the object: a new pool's first thread has the same name
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "step", recorded)
    for _ in range(2):  # two runs: the second must not start a thread of its own either
        outputs = list(client.submit("Name three colours.", max_new_tokens=8, api_name="/generate"))
        assert outputs[-1][0].startswith("Done.")
    assert len(ran) > 6 and all(t is ran[0] for t in ran) and ran[0].name.startswith("eagle2-engine"), \
        sorted({t.name for t in ran})


def test_generate_streams_both_trees_live_then_times_the_decodes(client):
    job = client.submit("Count from 1 to 10.", max_new_tokens=12, with_vanilla=False, api_name="/generate")
    outputs = list(job)
    live = [o for o in outputs if isinstance(o[0], str) and o[0].startswith("Live pass")]
    assert any(_is_tree(o[2]) and _is_tree(o[3]) for o in live), "the live pass draws both trees"
    assert any(isinstance(o[0], str) and o[0].startswith("Timed pass") for o in outputs)
    final = outputs[-1]
    assert final[0].startswith("Done.")
    assert any(isinstance(o[1], str) and "SmolLM2" in o[1] and "cpu float32" in o[1] for o in outputs)
    assert 'class="tok tok-' in final[8] and 'class="tok tok-' in final[9]
    assert "EAGLE-2 (dynamic tree)" in final[10] and "| 12 |" in final[10]
    assert final[4]["maximum"] >= 1 and final[4]["value"] == final[4]["maximum"]
    fig, text, caption = client.predict(1, True, api_name="/scrub_eagle2")  # this client's own session
    assert "step 1:" in json.loads(fig["plot"])["layout"]["title"]["text"] and caption.startswith("Step 1:")


def test_bad_settings_give_a_message_not_an_error(client):
    outputs = list(client.submit("   ", api_name="/generate"))
    assert outputs[-1][0].startswith("⚠") and "prompt is empty" in outputs[-1][0]
    outputs = list(client.submit("Hi", tree_choice="custom", tree_json="[[0], [1", sizing="custom",
                                 api_name="/generate"))
    assert "not valid JSON" in outputs[-1][0]


def test_concurrent_sessions_each_get_their_own_run(url, embedded):
    from gradio_client import Client

    from eagle2.api import run
    from eagle2.config import DecodeConfig

    prompts = ["Name three colours.", "What is 2 + 2?"]
    clients = [Client(url, verbose=False) for _ in prompts]
    jobs = [c.submit(p, max_new_tokens=6, with_vanilla=False, api_name="/generate") for c, p in zip(clients, prompts)]
    finals = [list(job)[-1] for job in jobs]  # both were queued at once; the model runs one decode at a time
    for prompt, final, c in zip(prompts, finals, clients):
        want = run(embedded, prompt, DecodeConfig(method="vanilla", max_new_tokens=6)).records
        want_text = "".join(t for r in want for t in r.new_texts)
        assert final[0].startswith("Done.")
        assert _shown_text(final[8]) == want_text and _shown_text(final[9]) == want_text
        fig, text, _ = c.predict(0, True, api_name="/scrub_eagle1")  # each client's own session state
        assert _shown_text(text) == want_text


def test_stop_ends_a_long_run_and_the_next_one_works(client):
    import time

    from app_parts.presets import page_token_limit

    # the page's largest token limit (512 on a CPU: about half a minute for both trees on 2 cores): long enough
    # that a client lagging behind the stream on a slow machine still finds the run going when it asks to stop
    longest = page_token_limit()
    job = client.submit("Tell me a long story about a dragon.", max_new_tokens=longest, with_vanilla=False,
                        api_name="/generate")
    deadline = time.time() + 120
    seen = False
    while time.time() < deadline and not seen:
        seen = any(isinstance(o[0], str) and "step 2" in o[0] for o in job.outputs())
        time.sleep(0.2)
    assert seen, "the run never reached step 2 within 120 s"
    assert client.predict(api_name="/stop") == "Stopping after the current step…"
    final = list(job)[-1]
    assert final[0].startswith("Stopped. Kept what was produced")
    assert 3 <= final[8].count("data-step=") < longest and _shown_text(final[8])  # what was made stays shown
    again = list(client.submit("Say hello.", max_new_tokens=4, with_vanilla=False, api_name="/generate"))[-1]
    assert again[0].startswith("Done.")


def test_each_panel_runs_the_policy_picked_for_it_chain_and_engine_flags(client, embedded):
    from eagle2.api import run
    from eagle2.config import DecodeConfig

    sglang = "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
    outputs = list(client.submit("Name three colours.", max_new_tokens=16, left_policy="chain", left_arg="3",
                                 right_policy="engine", right_arg=sglang, api_name="/generate"))
    live = [o for o in outputs if isinstance(o[0], str) and o[0].startswith("Live pass")]
    assert any(_is_tree(o[2]) and _is_tree(o[3]) for o in live), "both panels draw while decoding"
    final = outputs[-1]
    assert final[0].startswith("Done."), final[0]
    want = "".join(t for r in run(embedded, "Name three colours.", DecodeConfig(method="vanilla",
                                                                           max_new_tokens=16)).records
                   for t in r.new_texts)
    assert _shown_text(final[8]) == want and _shown_text(final[9]) == want
    table = final[10]
    assert "| chain of 3 | 4 |" in table
    assert "| SGLang: steps 3, topk 4, 8 draft tokens (root counted) | 8 |" in table
    assert "do not share a node budget" in table or "did not share a node budget" in table
    bad = list(client.submit("Hi", right_policy="engine", right_arg=sglang.replace("topk 4", "topk 1"),
                             api_name="/generate"))[-1]
    assert bad[0].startswith("⚠") and "sglang" in bad[0] and "--speculative-num-draft-tokens must equal" in bad[0]
