"""eagle2-viz: the Gradio page. Wiring only; the page's logic lives in app_parts/, the decoder in eagle2/.

`python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override).
Every visitor's runs live in their own gr.State; the only module-level object is the model cache. A visitor's
state is freed when their page closes or after EAGLE2_SESSION_TTL_S without use; a Generate decodes for at
most EAGLE2_RUN_BUDGET_S (app_parts/settings.py has the defaults).

The page is wired by name: `ui.req` maps each RunRequest field to its control, and every handler returns a
dict of the components it changes, so no list of inputs or outputs is kept in step with another by hand.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app_parts import actions, playback, warmup, workload
from app_parts.engine_thread import on_one_thread
from app_parts.link import LINKED, link_query, read_link
from app_parts.presets import CACHE, ModelPreset, default_sizing, load_presets, model_info, page_token_limit
from app_parts.runner import Update, generate
from app_parts.session import TREE_METHODS, RunControl, Session, free_session, release_freed_memory, session_ttl_s
from app_parts.settings import (CUSTOM, CUT, MAX_PROMPT_CHARS, PAGE_MAX_NEW, PANEL_POLICIES, SIZINGS, RunRequest,
                                budget_markdown, load_examples, page_flags, run_budget_s, static_tree, tree_choices)
from app_parts.views import LABELS, analysis_views, metrics_markdown, text_view, tree_view, warm_up
from eagle2.config import ASSETS, LIMITS, DecodeConfig
from eagle2.policies import DYNAMIC, STATIC
from eagle2.loading import Bundle

try:  # ZeroGPU on Hugging Face Spaces; a plain CPU or GPU machine has no `spaces` package
    import spaces
except ImportError:
    spaces = None

HEADER = """# EAGLE-2 draft trees, step by step
A real model decodes your prompt with speculative decoding: **EAGLE-2** builds a new draft tree at every step
from the draft head's confidence, **EAGLE-1** uses one fixed tree. Both trees grow on the page as the decoder
runs; then each method decodes once more with nothing drawn, for honest timings. Both use the same head and,
by default, the same number of verified nodes: the size that runs fastest on this machine. Play the run
back, unfold a step to see how EAGLE-2 built it, and share a link to the same example."""
CUSTOM_EXAMPLE = "[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]"
GPU_SLOT_S = 180  # a ZeroGPU slot for one Generate: loading, both passes within their time limit, the drawing
PACES = {"1 step/s": 1.0, "2 steps/s": 0.5, "4 steps/s": 0.25}


def _pace(choice: object) -> float:
    """Seconds between Play's steps for a pace choice (2 steps a second for anything else)."""
    return PACES.get(choice, 0.5) if isinstance(choice, str) else 0.5


def _on_gpu(fn):
    """Run `fn` on a ZeroGPU slot when `spaces` is installed; unchanged otherwise."""
    return spaces.GPU(duration=GPU_SLOT_S)(fn) if spaces is not None else fn


def _run_budget() -> float:
    """Seconds a Generate may decode here: inside the GPU slot on a ZeroGPU Space."""
    return run_budget_s(GPU_SLOT_S if spaces is not None else None)


def launch_options() -> dict[str, Any]:
    """Theme, CSS and upload limit for launch() (Gradio 6 takes them there, not in Blocks)."""
    return {"theme": gr.themes.Soft(primary_hue="green"), "css": (ASSETS / "app.css").read_text(),
            "max_file_size": "200mb"}


def _controls(ui: SimpleNamespace) -> None:
    """Left column: model, prompt, buttons, examples and every decoding setting (`ui.req`: field -> control)."""
    presets, d = load_presets(), DecodeConfig()
    names = list(presets)
    r = ui.req = {}
    r["preset"] = gr.Dropdown(names, value=names[0], label="Model and draft head (operator presets)",
                              elem_id="preset")
    ui.info = gr.Markdown(model_info(presets[names[0]], CACHE), elem_id="model-info")
    r["prompt"] = gr.Textbox(label="Prompt (the chat template is applied)", lines=4, max_lines=12,
                             max_length=MAX_PROMPT_CHARS, elem_id="prompt",
                             placeholder="Ask anything, or pick an example below")
    with gr.Row():
        ui.run_btn = gr.Button("Generate", variant="primary", elem_id="generate")
        ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
    ui.status = gr.Markdown("Ready.", elem_id="status")
    # while the server prepares the model at start, the status line says which step it is on (app_parts/warmup.py)
    ui.prep_timer = gr.Timer(1.0, active=CACHE.preparing())
    examples = load_examples()
    gr.Examples([[e["prompt"]] for e in examples], inputs=[r["prompt"]], label="Examples",
                example_labels=[f"{e['kind']}: {e['prompt'][:38]}…" for e in examples])
    with gr.Accordion("Decoding", open=True):
        r["max_new_tokens"] = gr.Slider(LIMITS["max_new_tokens"][0], page_token_limit(), value=PAGE_MAX_NEW,
                                            step=1, elem_id="max-new",
                                            label=f"max new tokens (a Generate decodes for at most {_run_budget():g} "
                                                  "s, both passes together)")
        r["temperature"] = gr.Slider(*LIMITS["temperature"], value=d.temperature, step=0.05,
                                     label="temperature (0 = greedy)", elem_id="temperature")
        r["top_p"] = gr.Slider(*LIMITS["top_p"], value=d.top_p, step=0.01, label="top-p", elem_id="top-p")
        r["seed"] = gr.Number(value=d.seed, precision=0, minimum=0, label="seed", elem_id="seed")
    with gr.Accordion("Tree sizes", open=True):
        r["sizing"] = gr.Radio([(text, key) for key, text in SIZINGS.items()], value=default_sizing(),
                               label="compare the trees at", elem_id="sizing")
    with gr.Accordion("Dynamic tree (EAGLE-2)", open=True):
        r["total_tokens"] = gr.Slider(*LIMITS["total_tokens"], value=d.total_tokens, step=1, elem_id="total",
                                      label="total tokens (verified per step, root included)")
        r["depth"] = gr.Slider(*LIMITS["depth"], value=d.depth, step=1, label="depth", elem_id="depth")
        r["top_k"] = gr.Slider(*LIMITS["top_k"], value=d.top_k, step=1, label="top-k", elem_id="top-k")
        r["min_prob"] = gr.Slider(*LIMITS["min_prob"], value=d.min_prob, step=0.01, elem_id="min-prob",
                                  label="confidence sizing (ours, eagle2_sized): keep only nodes at least this likely "
                                        "(cumulative draft probability; 0 = off, the paper's EAGLE-2)")
        r["expand_prob"] = gr.Slider(*LIMITS["expand_prob"], value=d.expand_prob, step=0.01,
                                         elem_id="expand-prob",
                                     label="confidence sizing (ours): expand only nodes at least this likely (0 = off)")
        r["lookup"] = gr.Checkbox(d.lookup, label=f"prompt-lookup branch (ours, eagle2_lookup): up to "
                                  f"{d.lookup_tokens} tokens copied from the text so far join the tree",
                                  elem_id="lookup")
    with gr.Accordion("Static tree (EAGLE-1)", open=True):
        r["tree_choice"] = gr.Dropdown(tree_choices(), value=CUT, label="tree (with 'my settings below')",
                                       elem_id="tree-choice")
        r["tree_json"] = gr.Textbox(CUSTOM_EXAMPLE, label="custom tree: JSON list of child-rank paths", lines=3,
                                    visible=False, elem_id="tree-json")
    with gr.Accordion("What each panel runs", open=True):
        for side, default in (("left", DYNAMIC), ("right", STATIC)):
            with gr.Row():
                r[f"{side}_policy"] = gr.Dropdown([(text, key) for key, text in PANEL_POLICIES.items()],
                                                  value=default, label=f"{side} panel", elem_id=f"{side}-policy",
                                                  scale=2)
                r[f"{side}_arg"] = gr.Textbox("", label="chain length, or an engine's flags", max_lines=3,
                                              max_length=MAX_PROMPT_CHARS, elem_id=f"{side}-arg", scale=3,
                                              placeholder="3  ·  --speculative-num-steps 3 --speculative-eagle-topk 4 "
                                                          "--speculative-num-draft-tokens 8")
        gr.Markdown("Engines' flags: SGLang `--speculative-*`, vLLM `speculative_config` JSON, TensorRT-LLM "
                    "`EagleDecodingConfig` fields, OpenVINO GenAI `num_assistant_tokens`/`branching_factor`/"
                    "`tree_depth`, llama.cpp `--spec-draft-n-max`/`--spec-draft-p-min`.", elem_id="engine-help")
    ui.budget = gr.Markdown(budget_markdown(d.total_tokens, CUT, "", sizing=default_sizing()), elem_id="budget")
    r["with_vanilla"] = gr.Checkbox(True, label="also run plain decoding (for the speedup)", elem_id="with-vanilla")
    ui.show_pruned = gr.Checkbox(True, label="show pruned branches")
    with gr.Row():
        ui.link_btn = gr.Button("Copy link to this example", size="sm", elem_id="copy-link")
    ui.link = gr.Textbox(label="link (the prompt and settings)", interactive=False, visible=False, elem_id="link")
    missing = set(LINKED) - set(r)
    assert not missing, f"RunRequest fields without a control: {missing}"


def _live_panel(ui: SimpleNamespace) -> None:
    """Right column: playback controls, the two trees side by side, each with its step slider, caption and text."""
    with gr.Row(elem_id="playback"):
        ui.back_btn = gr.Button("◀ step back", size="sm", elem_id="step-back")
        ui.play_btn = gr.Button("▶ Play", size="sm", variant="secondary", elem_id="play")
        ui.fwd_btn = gr.Button("step forward ▶", size="sm", elem_id="step-forward")
        ui.pace = gr.Radio(list(PACES), value="2 steps/s", show_label=False, container=False, elem_id="pace")
    ui.timer = gr.Timer(PACES["2 steps/s"], active=False)
    ui.trees, ui.sliders, ui.captions, ui.texts = {}, {}, {}, {}
    with gr.Row(equal_height=False):
        for side, m in zip(("left", "right"), TREE_METHODS):
            with gr.Column(min_width=380):
                ui.trees[m] = gr.Plot(tree_view(Session(), m), show_label=False, elem_id=f"tree-{m}")
                ui.sliders[m] = gr.Slider(0, 1, value=0, step=1, label=f"{side} panel (by default {LABELS[m]}): step",
                                              elem_id=f"step-{m}")
                ui.captions[m] = gr.Markdown(elem_classes=["step-caption"], elem_id=f"caption-{m}")
                ui.texts[m] = gr.HTML(text_view(Session(), m), elem_id=f"text-{m}", elem_classes=["out-text"])
    ui.latest_btn = gr.Button("Show the latest steps", size="sm")
    ui.metrics = gr.Markdown(metrics_markdown(Session()), elem_id="metrics")
    with gr.Accordion("Unfold a step: how EAGLE-2 built it, beside EAGLE-1's fixed tree", open=False,
                      elem_id="unfold"):
        gr.Markdown("Replays the step each panel shows (after Play, Pause, the step buttons or a slider) from its "
                    "record alone: the root, each drafted level (which nodes were expanded and what they drafted), "
                    "the rerank that kept the best nodes, and the target's verdict. EAGLE-1's tree goes through the "
                    "same frames. Drag the frame slider, type a frame number or use the arrow keys on it.")
        with gr.Row():
            ui.unfold_btn = gr.Button("Unfold the step shown", size="sm", elem_id="unfold-go")
            ui.frame_back = gr.Button("◀ frame", size="sm", elem_id="frame-back")
            ui.stage = gr.Slider(0, 1, value=0, step=1, label="frame", elem_id="unfold-stage")
            ui.frame_fwd = gr.Button("frame ▶", size="sm", elem_id="frame-forward")
        with gr.Row(equal_height=False):
            ui.unfold_figs = {m: gr.Plot(show_label=False, elem_id=f"unfold-{m}") for m in TREE_METHODS}
        with gr.Row(equal_height=False):
            ui.unfold_texts = {m: gr.Markdown(elem_id=f"unfold-text-{m}") for m in TREE_METHODS}


def _extras(ui: SimpleNamespace) -> None:
    """Below: analysis charts, trace export / replay with the serving flags, and the explanation."""
    empty = analysis_views(Session())
    with gr.Accordion("Analysis, measured on this prompt", open=True):
        ui.analysis = [gr.Plot(empty[0], show_label=False)]
        with gr.Row():
            ui.analysis += [gr.Plot(fig, show_label=False) for fig in empty[1:3]]
        ui.analysis += [gr.Plot(empty[3], show_label=False), gr.Plot(empty[4], show_label=False, elem_id="tree-size"),
                        gr.Plot(empty[5], show_label=False, elem_id="tree-costs")]
    with gr.Accordion("Trace and serving", open=True):
        d = DecodeConfig()
        first = next(iter(load_presets().values()))
        ui.flags = gr.Code(page_flags(first, d.depth, d.top_k, d.total_tokens), language="shell",
                           label="SGLang launch flags for the same dynamic tree", interactive=False,
                           elem_id="sglang-flags")
        with gr.Row():
            with gr.Column():
                ui.export_btn = gr.Button("Export this run's trace (JSON)")
                ui.trace_out = gr.File(label="Trace file", interactive=False)
            ui.trace_in = gr.File(label="Replay a trace file (no model needed)", file_types=[".json"],
                                  type="filepath")
    with gr.Accordion("What am I looking at?", open=True):
        gr.Markdown((ASSETS / "explainer.md").read_text())


def _workload(ui: SimpleNamespace) -> None:
    """The workload tab: diagnose a prompt file (eagle2/tools/diagnose.py), bounded for a public page."""
    gr.Markdown(f"Upload a prompt file (`.jsonl` or a JSON list: rows with `turns`, `prompt` or `instruction`, "
                f"optionally `category`; at most {workload.MAX_PROMPTS} prompts, {workload.MAX_BYTES // 1000} kB). "
                "Each prompt is decoded once with a 60-node tree and every smaller tree shape replayed from those "
                "steps: τ by size for EAGLE-2, EAGLE-1's cut tree and chains, acceptance by position, where "
                "acceptance collapsed, and the shape to serve it with. `python -m eagle2 diagnose` does the same "
                "without limits.")
    with gr.Row():
        ui.wl_file = gr.File(label="prompt file", file_types=[".jsonl", ".json"], type="filepath", elem_id="wl-file")
        with gr.Column():
            ui.wl_max_new = gr.Slider(1, workload.MAX_NEW_TOKENS, value=32, step=1,
                                          label="max new tokens per prompt",
                                      elem_id="wl-max-new")
            with gr.Row():
                ui.wl_run = gr.Button("Diagnose", variant="primary", elem_id="wl-run")
                ui.wl_stop = gr.Button("Stop", variant="stop", elem_id="wl-stop")
            ui.wl_status = gr.Markdown("Ready.", elem_id="wl-status")
    empty = workload.empty_views()
    with gr.Row():
        ui.wl_curves = gr.Plot(empty[0], show_label=False, elem_id="wl-curves")
        ui.wl_positions = gr.Plot(empty[1], show_label=False, elem_id="wl-positions")
    ui.wl_summary = gr.Markdown(elem_id="wl-summary")
    ui.wl_flags = gr.Code(language="shell", label="serving settings for the GPU profile", interactive=False)
    ui.wl_files = gr.File(label="the report (JSON and HTML)", file_count="multiple", interactive=False,
                          elem_id="wl-files")
    ui.wl_control = gr.State(RunControl())


def _show(ui: SimpleNamespace, u: Update) -> dict:
    """An Update as {component: value}; a component left out keeps what the page shows."""
    if u.error:
        gr.Warning(u.error)
    s = u.session
    out: dict = {ui.status: u.status}
    if s is not None:
        out[ui.state] = s
        for m in TREE_METHODS:
            upd: dict = {"maximum": max(s.last_step(m), 1)}
            if s.follow.get(m, True):
                upd["value"] = s.last_step(m)
            out[ui.sliders[m]] = gr.update(**upd)
    if u.model_info:
        out[ui.info] = u.model_info
    for views, parts in ((u.trees, ui.trees), (u.captions, ui.captions), (u.texts, ui.texts)):
        out.update({parts[m]: v for m, v in (views or {}).items()})
    if u.metrics is not None:
        out[ui.metrics] = u.metrics
    if u.analysis:
        out.update(dict(zip(ui.analysis, u.analysis)))
    out.update({ui.req[k]: gr.update(value=v) for k, v in (u.sizes or {}).items()})
    return out


def _by_name(fn: Callable, names: tuple[str, ...], *extra: str) -> Callable:
    """`fn(values: dict, *extra)` as a function of the named parameters `names` then `extra`, so that Gradio (and
    its API) sees one parameter per control, named as RunRequest names the field."""
    if inspect.isgeneratorfunction(fn):  # Gradio streams only what it sees to be a generator function
        def wrapped(*args):
            yield from fn(dict(zip(names, args[:len(names)])), *args[len(names):])
    else:
        def wrapped(*args):
            return fn(dict(zip(names, args[:len(names)])), *args[len(names):])
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in (*names, *extra)]
    wrapped.__signature__ = inspect.Signature(params)
    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def _request(values: dict) -> RunRequest:
    """A RunRequest from the controls' values by field name (`LINKED`: every field, each as its control sent it)."""
    return RunRequest(**values)


def _generate_handler(ui: SimpleNamespace) -> Callable:
    @_on_gpu
    def on_generate(values: dict, show_pruned: bool, control: RunControl) -> Iterator[dict]:
        """Generate: the live pass draws both trees as they grow; the timed pass then times each method."""
        req = _request(values)

        def loader(preset: ModelPreset, say) -> Bundle:
            return CACHE.get(preset, say)

        def profile(preset: ModelPreset, bundle: Bundle, say) -> dict | None:
            return CACHE.profile(preset, bundle, say)

        run = generate(req, loader, show_pruned=bool(show_pruned), control=control, get_profile=profile,
                       budget_s=_run_budget(), profile_stale=CACHE.forget_profile)
        for u in on_one_thread(run, waiting=lambda line: Update(session=None, status=line)):
            yield _show(ui, u)

    return _by_name(on_generate, LINKED, "show_pruned", "control")


def _on_export(session: Session) -> str | None:
    """Export: write this visitor's trace file, or warn that there is nothing to export."""
    path, err = actions.export(session)
    if err:
        gr.Warning(err)
    return path


def _on_tree(choice: str, tree_json: str, total: float, lookup: bool = False, depth: float = 0,
             min_prob: float = 0.0, expand_prob: float = 0.0) -> tuple:
    """Show the JSON box for 'custom'; match EAGLE-2's budget to a chosen static tree; the sliders now rule."""
    if choice != CUT:
        try:
            n = len(static_tree(choice, tree_json)) + 1
            total = min(max(n, LIMITS["total_tokens"][0]), LIMITS["total_tokens"][1])
        except ValueError:
            pass
    return (gr.update(visible=choice == CUSTOM), gr.update(value=total), "custom",
            _budget(total, choice, tree_json, lookup, depth, min_prob, expand_prob, "custom"))


def _budget(total, choice, tree_json, lookup, depth, min_prob, expand_prob, sizing, left_policy=DYNAMIC,
            left_arg="", right_policy=STATIC, right_arg="") -> str:
    """The comparison line, with this machine's profile once it has been measured."""
    presets = load_presets()
    loaded = next((p for p in presets.values() if CACHE.loaded(p.name)), None)
    profile = CACHE.cached_profile(loaded.name) if loaded else None
    return budget_markdown(total, choice, tree_json, lookup, depth, min_prob, expand_prob, sizing, profile,
                           left_policy, left_arg, right_policy, right_arg)


def _flags(preset_name: str, depth, top_k, total) -> str:
    """The serving flags for the dynamic tree, named for the selected preset's head kind."""
    preset = load_presets().get(preset_name)
    return page_flags(preset, depth, top_k, total, CACHE.loaded(preset_name) if preset else None)


def _on_load(ui: SimpleNamespace) -> Callable:
    def on_load(preset_name: str, request: gr.Request) -> dict:
        """A page opens: the model line, and the settings its link carries (each checked as its control is)."""
        out: dict = {ui.info: model_info(load_presets()[preset_name], CACHE)}
        query = dict(request.query_params) if request is not None else {}
        if not query:
            line, _ = warmup.page_status(CACHE.preparation, "Ready.", loaded=_any_loaded())
            if line is not None:
                out[ui.status] = line
            return out
        kept, ignored = read_link(query, RunRequest(prompt="", preset=preset_name))
        if kept:
            if "sizing" not in kept and {"total_tokens", "depth", "top_k", "tree_choice"} & set(kept):
                kept["sizing"] = "custom"
            out.update({ui.req[k]: gr.update(value=v) for k, v in kept.items()})
            if kept.get("tree_choice") == CUSTOM:
                out[ui.req["tree_json"]] = gr.update(value=kept.get("tree_json", CUSTOM_EXAMPLE), visible=True)
            if "preset" in kept:
                out[ui.info] = model_info(load_presets()[kept["preset"]], CACHE)
        said = "Opened from a link: the prompt and settings are filled in; press Generate." if kept else "Ready."
        if ignored:
            said += " ⚠ The link's values that did not pass the page's checks were ignored: " + "; ".join(ignored)
            said += "."
        out[ui.status] = said
        return out

    return on_load


def _view_outputs(ui: SimpleNamespace) -> list:
    """The components an Update may change (`_show` fills those it has, by component)."""
    return [ui.state, ui.status, ui.info, *ui.trees.values(), *ui.sliders.values(), *ui.captions.values(),
            *ui.texts.values(), ui.metrics, *ui.analysis]


def _wire_generate(ui: SimpleNamespace) -> None:
    """Generate (button or Enter) and Stop."""
    handler = _generate_handler(ui)
    inputs = [*(ui.req[k] for k in LINKED), ui.show_pruned, ui.control]
    outputs = [*_view_outputs(ui), *(ui.req[k] for k in ("total_tokens", "depth", "top_k"))]
    # One decode at a time on the shared model: both triggers share a queue; other sessions wait their turn.
    # A click first counts the run as waiting (unqueued, instant), so that Stop can take it out of the queue.
    # Progress shows on the status line only ("minimal": the queue's place and estimate, no overlay elsewhere).
    # preprocess=False (here and on every API endpoint that takes a control's value): the handler gets each value
    # as it was sent and checks it as the engine does (app_parts/settings.py, eagle2/inputs.py), answering with
    # the field, its limit and what to do; Gradio's own checks would answer an API call with a message naming
    # neither the field nor the fix, or a generic upstream error for a value of the wrong type.
    for trigger, api in ((ui.run_btn.click, "generate"), (ui.req["prompt"].submit, False)):
        trigger(lambda: {ui.timer: gr.Timer(active=False), ui.play_btn: gr.update(value="▶ Play")}, None,
                [ui.timer, ui.play_btn], queue=False, api_name=False,
                show_progress="hidden").then(
            actions.enqueue, ui.control, ui.status, queue=False, api_name=False, show_progress="hidden").then(
            handler, inputs, outputs, api_name=api, show_progress="minimal", show_progress_on=[ui.status],
            preprocess=False, concurrency_id="decode", concurrency_limit=1)
    # Stop flips this visitor's RunControl; the run ends after its current step and draws what it made.
    ui.stop_btn.click(actions.request_stop, ui.control, ui.status, api_name="stop", concurrency_limit=None,
                      show_progress="hidden")


def _wire_steps(ui: SimpleNamespace) -> None:
    """Step sliders, Play/Pause, step back and forward, and unfolding a step."""
    step_out = [*ui.trees.values(), *ui.sliders.values(), *ui.texts.values(), *ui.captions.values(), ui.state]

    def step_views(s: Session, views: dict[str, playback.StepView]) -> dict:
        out: dict = {ui.state: s}
        for m, v in views.items():
            out.update({ui.trees[m]: v.tree, ui.texts[m]: v.text, ui.captions[m]: v.caption,
                        ui.sliders[m]: gr.update(value=v.step)})
        return out

    # A slider redraws on `input`: a drag, a typed number and the arrow keys all fire it (`release` fires only on a
    # mouse release or when the number box loses focus). Play and Generate set the sliders' values from the server,
    # which fires `change` but never `input`, so playback causes no redraw storm; "always_last" keeps a fast drag
    # to one pending redraw and ends on the value the slider was left at.
    for m in TREE_METHODS:  # the session goes back to its State, which restarts its idle time
        ui.sliders[m].input(lambda s, v, p, m=m: (*actions.scrub(s, m, v, p), s),
                            [ui.state, ui.sliders[m], ui.show_pruned],
                            [ui.trees[m], ui.texts[m], ui.captions[m], ui.state], api_name=f"scrub_{m}",
                            preprocess=False, trigger_mode="always_last", show_progress="hidden")
        # and on release too: a typed number that `always_last` folded into a redraw already under way is drawn
        # when the box is left, so the panel always ends on the value shown (seen: 1 browser run in 8 stuck)
        ui.sliders[m].release(lambda s, v, p, m=m: (*actions.scrub(s, m, v, p), s),
                              [ui.state, ui.sliders[m], ui.show_pruned],
                              [ui.trees[m], ui.texts[m], ui.captions[m], ui.state], api_name=False,
                              preprocess=False, trigger_mode="always_last", show_progress="hidden")
    for btn, delta, api in ((ui.back_btn, -1, "step_back"), (ui.fwd_btn, 1, "step_forward")):
        btn.click(lambda s, p, d=delta: step_views(*playback.move(s, d, p)), [ui.state, ui.show_pruned], step_out,
                  api_name=api, show_progress="hidden", concurrency_limit=None, preprocess=False)

    def toggle(s: Session, pace: str) -> dict:
        playing = playback.toggle(s)
        return {ui.timer: gr.Timer(_pace(pace), active=playing), ui.state: s,
                ui.play_btn: gr.update(value="⏸ Pause" if playing else "▶ Play")}

    ui.play_btn.click(toggle, [ui.state, ui.pace], [ui.timer, ui.state, ui.play_btn], api_name="play", preprocess=False,
                      show_progress="hidden", concurrency_limit=None)
    ui.pace.change(lambda pace: gr.Timer(_pace(pace)), ui.pace, ui.timer, api_name=False,
                   show_progress="hidden")

    def tick(s: Session, p: bool) -> dict:
        s, views, more = playback.tick(s, p)
        out = step_views(s, views)
        if not more:
            out.update({ui.timer: gr.Timer(active=False), ui.play_btn: gr.update(value="▶ Play")})
        return out

    ui.timer.tick(tick, [ui.state, ui.show_pruned], [*step_out, ui.timer, ui.play_btn], api_name=False,
                  show_progress="hidden", concurrency_limit=None)

    def _unfolded(u: playback.Unfolded, s: Session) -> dict:
        out = {ui.stage: gr.update(maximum=max(len(u.names) - 1, 1), value=u.stage), ui.state: s}
        out.update({ui.unfold_figs[m]: u.figures[m] for m in TREE_METHODS})
        out.update({ui.unfold_texts[m]: u.texts[m] for m in TREE_METHODS})
        return out

    unfold_out = [ui.stage, ui.state, *ui.unfold_figs.values(), *ui.unfold_texts.values()]
    ui.unfold_btn.click(lambda s: _unfolded(playback.unfold(s), s), ui.state, unfold_out, api_name="unfold",
                        show_progress="hidden")
    ui.stage.input(lambda s, v: _unfolded(playback.unfold(s, v), s), [ui.state, ui.stage], unfold_out,
                   api_name="unfold_stage", preprocess=False, trigger_mode="always_last", show_progress="hidden")
    for btn, delta, api in ((ui.frame_back, -1, "unfold_back"), (ui.frame_fwd, 1, "unfold_forward")):
        btn.click(lambda s, v, d=delta: _unfolded(playback.unfold_frame(s, v, d), s), [ui.state, ui.stage],
                  unfold_out, api_name=api, preprocess=False, show_progress="hidden")


def _wire(ui: SimpleNamespace, demo: gr.Blocks) -> None:
    """Connect the events."""
    _wire_generate(ui)
    _wire_steps(ui)
    show = _view_outputs(ui)
    ui.latest_btn.click(lambda s, p: _show(ui, actions.follow_latest(s, p)), [ui.state, ui.show_pruned], show,
                        api_name=False)
    ui.show_pruned.change(lambda s, a, b, p: list(actions.redraw(s, {"eagle2": a, "eagle1": b}, p).values()),
                          [ui.state, *ui.sliders.values(), ui.show_pruned], list(ui.trees.values()),
                          api_name=False, show_progress="hidden")
    ui.export_btn.click(_on_export, ui.state, ui.trace_out, api_name="export_trace")
    ui.trace_in.upload(lambda path, p: _show(ui, actions.load_trace(path, p)), [ui.trace_in, ui.show_pruned], show,
                       api_name="load_trace")
    r = ui.req
    tree_in = [r["tree_choice"], r["tree_json"], r["total_tokens"], r["lookup"], r["depth"], r["min_prob"],
               r["expand_prob"]]
    tree_out = [r["tree_json"], r["total_tokens"], r["sizing"], ui.budget]
    r["tree_choice"].input(_on_tree, tree_in, tree_out, api_name=False)
    r["tree_json"].blur(_on_tree, tree_in, tree_out, api_name=False)
    budget_in = [r["total_tokens"], r["tree_choice"], r["tree_json"], r["lookup"], r["depth"], r["min_prob"],
                 r["expand_prob"], r["sizing"], r["left_policy"], r["left_arg"], r["right_policy"], r["right_arg"]]
    for w in (r["total_tokens"], r["lookup"], r["depth"], r["min_prob"], r["expand_prob"], r["sizing"],
              r["left_policy"], r["right_policy"]):
        w.change(_budget, budget_in, ui.budget, api_name=False, show_progress="hidden")
    for w in (r["left_arg"], r["right_arg"]):  # typed text: judged when the box is left, not at each key
        w.blur(_budget, budget_in, ui.budget, api_name=False, show_progress="hidden")
    for w in (r["total_tokens"], r["depth"], r["top_k"]):  # moving a size slider by hand compares at your settings
        w.input(lambda: "custom", None, r["sizing"], api_name=False, show_progress="hidden")
    for w in (r["preset"], r["depth"], r["top_k"], r["total_tokens"]):
        w.change(_flags, [r["preset"], r["depth"], r["top_k"], r["total_tokens"]], ui.flags, api_name=False,
                 show_progress="hidden")
    ui.link_btn.click(_by_name(lambda values: gr.update(value=link_query(_request(values)), visible=True), LINKED),
                      [r[k] for k in LINKED], ui.link, api_name="link", show_progress="hidden",
                      preprocess=False).then(
        None, ui.link, ui.link, api_name=False, js="(q) => { const u = window.location.origin + "
        "window.location.pathname + '?' + q; if (navigator.clipboard) { navigator.clipboard.writeText(u)"
        ".catch(() => {}); } return u; }")
    _wire_workload(ui)
    r["preset"].change(lambda name: model_info(load_presets()[name], CACHE), r["preset"], ui.info, api_name=False)
    demo.load(_on_load(ui), r["preset"], [ui.info, ui.status, *r.values()], api_name=False)
    _wire_preparation(ui)
    demo.unload(_forget_visitor(demo, ui))


def _any_loaded() -> bool:
    """Whether a model is loaded (a failed preparation at start is then no longer news)."""
    return any(CACHE.loaded(name) is not None for name in load_presets())


def _wire_preparation(ui: SimpleNamespace) -> None:
    """Each second while the server prepares at start: the step on the status line (unless a run owns the line),
    and the model line once loaded; the timer stops when the preparation has ended."""
    def tick(shown: str | None, control: RunControl, preset_name: str) -> dict:
        busy = isinstance(control, RunControl) and (control.running or control.waiting > 0)
        line, again = warmup.page_status(CACHE.preparation, shown or "", busy, _any_loaded())
        out: dict = {ui.status: line if line is not None else gr.skip(), ui.prep_timer: gr.Timer(active=again)}
        preset = load_presets().get(preset_name)
        out[ui.info] = model_info(preset, CACHE) if preset is not None and not again else gr.skip()
        return out

    ui.prep_timer.tick(tick, [ui.status, ui.control, ui.req["preset"]], [ui.status, ui.prep_timer, ui.info],
                       api_name=False, show_progress="hidden", concurrency_limit=None)


def _wire_workload(ui: SimpleNamespace) -> None:
    """The workload tab's Diagnose and Stop."""
    @_on_gpu
    def on_diagnose(path: object, max_new_tokens: object, preset_name: object, control: RunControl,
                    progress=gr.Progress()) -> Iterator[list]:
        """Diagnose: decode the uploaded prompts, then show the curves, positions, summary, settings and files."""
        def report(fraction: float, message: str) -> None:
            progress(fraction, desc=message)

        if isinstance(path, dict):  # the upload as sent (this event takes raw values): its path on the server
            path = path.get("path")
        for u in on_one_thread(workload.diagnose(path, max_new_tokens, preset_name, lambda p: CACHE.get(p, report),
                                                 lambda p, b: CACHE.profile(p, b, report), control)):
            if u.error:
                gr.Warning(u.error)
            yield [u.status, *[v if v is not None else gr.skip()
                               for v in (u.curves, u.positions, u.summary, u.flags, u.files)]]

    ui.wl_run.click(on_diagnose, [ui.wl_file, ui.wl_max_new, ui.req["preset"], ui.wl_control],
                    [ui.wl_status, ui.wl_curves, ui.wl_positions, ui.wl_summary, ui.wl_flags, ui.wl_files],
                    api_name="diagnose", concurrency_id="decode", concurrency_limit=1, show_progress="minimal",
                    preprocess=False,
                    show_progress_on=[ui.wl_status])
    ui.wl_stop.click(actions.request_stop, ui.wl_control, ui.wl_status, api_name=False, concurrency_limit=None,
                     show_progress="hidden")


def _forget_visitor(demo: gr.Blocks, ui: SimpleNamespace):
    """The handler for a closed page: stop the visitor's decode and free their session now.

    Gradio 6.31 keeps a closed session's state for an hour (StateHolder's STATE_TTL_WHEN_CLOSED, whatever the
    State's own time_to_live) and each session's last outputs (figures, text) until it evicts the session, so
    the session is dropped here; an event still running holds its own reference and finishes unharmed.
    """
    def forget(request: gr.Request) -> None:
        holder = demo.state_holder
        sid = request.session_hash
        with holder.lock:
            gone = holder.session_data.pop(sid, None)
            holder.time_last_used.pop(sid, None)
        if gone is None:
            return
        control = gone.state_data.get(ui.control._id)
        if isinstance(control, RunControl):
            control.skip, control.stop_requested = control.waiting, True
        del gone, control
        release_freed_memory()

    return forget


def build_demo() -> gr.Blocks:
    """The whole page; building it loads nothing (a served page's model is prepared by `__main__`, below, or on
    the first Generate)."""
    warm_up()
    ui = SimpleNamespace()
    with gr.Blocks(title="EAGLE-2 draft trees", fill_width=True) as demo:
        # idle time: every write restarts it; when it runs out the session is emptied and its memory given back
        ui.state = gr.State(Session(), time_to_live=session_ttl_s(), delete_callback=free_session)
        ui.control = gr.State(RunControl())
        gr.Markdown(HEADER)
        with gr.Tabs():
            with gr.Tab("One prompt, step by step"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=330):
                        _controls(ui)
                    with gr.Column(scale=3):
                        _live_panel(ui)
                _extras(ui)
            with gr.Tab("Workload", elem_id="workload-tab"):
                _workload(ui)
        _wire(ui, demo)
    return demo


def calm_queue(demo: gr.Blocks) -> gr.Blocks:
    """Poll Gradio's queue every 20 ms instead of every 1 ms (call after the last .queue()).

    The 1 ms poll costs an idle server about 7% of a core (2% at 20 ms, measured on two cores),
    CPU and GIL time taken from the decode. A 20 ms pickup delay is invisible on the page.
    """
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = 0.02
        queue.progress_update_sleep_when_free = 0.05
    return demo


if __name__ == "__main__":
    # the model, the row kernel and the machine profile are prepared while the page is served, not during a
    # visitor's first Generate (which waits only for what is left): app_parts/warmup.py. On ZeroGPU the GPU exists
    # only inside a Generate's slot, so there only the files are made ahead (the conversion and the kernel).
    warmup.start(CACHE, next(iter(load_presets().values())), load=spaces is None)
    calm_queue(build_demo().queue(default_concurrency_limit=1)).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_options())
