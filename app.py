"""eagle2-viz: the Gradio page. Wiring only; the page's logic lives in app_parts/, the decoder in eagle2/.

`python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override).
Every visitor's runs live in their own gr.State; the only module-level object is the model cache. A visitor's
state is freed when their page closes or after EAGLE2_SESSION_TTL_S without use; a Generate decodes for at
most EAGLE2_RUN_BUDGET_S (app_parts/settings.py has the defaults).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import gradio as gr

from app_parts import actions, workload
from app_parts.presets import CACHE, ModelPreset, default_sizing, load_presets, model_info, page_token_limit
from app_parts.runner import Update, generate
from app_parts.session import TREE_METHODS, RunControl, Session, free_session, release_freed_memory, session_ttl_s
from app_parts.settings import (CUSTOM, CUT, MAX_PROMPT_CHARS, PAGE_MAX_NEW, SIZINGS, RunRequest, budget_markdown,
                                load_examples, run_budget_s, sglang_flags, static_tree, tree_choices)
from app_parts.views import LABELS, analysis_views, metrics_markdown, text_view, tree_view, warm_up
from eagle2.config import ASSETS, LIMITS, DecodeConfig
from eagle2.loading import Bundle

try:  # ZeroGPU on Hugging Face Spaces; a plain CPU or GPU machine has no `spaces` package
    import spaces
except ImportError:
    spaces = None

HEADER = """# EAGLE-2 draft trees, step by step
A real model decodes your prompt twice with speculative decoding: **EAGLE-2** builds a new draft tree
at every step from the draft head's confidence, **EAGLE-1** uses one fixed tree. Both use the same
head and, by default, the same number of verified nodes: the size that runs fastest on this machine.
See each step's tree, what the target accepted and what it pruned, and scrub back through the steps."""
CUSTOM_EXAMPLE = "[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]"
GPU_SLOT_S = 180  # a ZeroGPU slot for one Generate: loading, the decodes within their time limit, the drawing


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
    """Left column: model, prompt, buttons, examples and every decoding setting."""
    presets, d = load_presets(), DecodeConfig()
    names = list(presets)
    ui.model_dd = gr.Dropdown(names, value=names[0], label="Model and draft head (operator presets)")
    ui.info = gr.Markdown(model_info(presets[names[0]], CACHE), elem_id="model-info")
    ui.prompt = gr.Textbox(label="Prompt (the chat template is applied)", lines=4, max_lines=12,
                           max_length=MAX_PROMPT_CHARS, elem_id="prompt",
                           placeholder="Ask anything, or pick an example below")
    with gr.Row():
        ui.run_btn = gr.Button("Generate", variant="primary", elem_id="generate")
        ui.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
    ui.status = gr.Markdown("Ready.", elem_id="status")
    examples = load_examples()
    gr.Examples([[e["prompt"]] for e in examples], inputs=[ui.prompt], label="Examples",
                example_labels=[f"{e['kind']}: {e['prompt'][:38]}…" for e in examples])
    with gr.Accordion("Decoding", open=True):
        ui.max_new = gr.Slider(LIMITS["max_new_tokens"][0], page_token_limit(), value=PAGE_MAX_NEW, step=1,
                               label=f"max new tokens (a Generate decodes for at most {_run_budget():g} s, shared "
                                     "between the methods)", elem_id="max-new")
        ui.temperature = gr.Slider(*LIMITS["temperature"], value=d.temperature, step=0.05,
                                   label="temperature (0 = greedy)")
        ui.top_p = gr.Slider(*LIMITS["top_p"], value=d.top_p, step=0.01, label="top-p")
        ui.seed = gr.Number(value=d.seed, precision=0, minimum=0, label="seed")
    with gr.Accordion("Tree sizes", open=True):
        ui.sizing = gr.Radio([(text, key) for key, text in SIZINGS.items()], value=default_sizing(),
                             label="compare the trees at", elem_id="sizing")
    with gr.Accordion("Dynamic tree (EAGLE-2)", open=True):
        ui.total = gr.Slider(*LIMITS["total_tokens"], value=d.total_tokens, step=1,
                             label="total tokens (verified per step, root included)")
        ui.depth = gr.Slider(*LIMITS["depth"], value=d.depth, step=1, label="depth")
        ui.top_k = gr.Slider(*LIMITS["top_k"], value=d.top_k, step=1, label="top-k")
        ui.min_prob = gr.Slider(*LIMITS["min_prob"], value=d.min_prob, step=0.01, elem_id="min-prob",
                                label="confidence sizing (ours, eagle2_sized): keep only nodes at least this likely "
                                      "(cumulative draft probability; 0 = off, the paper's EAGLE-2)")
        ui.expand_prob = gr.Slider(*LIMITS["expand_prob"], value=d.expand_prob, step=0.01,
                                   label="confidence sizing (ours): expand only nodes at least this likely (0 = off)")
        ui.lookup = gr.Checkbox(d.lookup, label=f"prompt-lookup branch (ours, eagle2_lookup): up to {d.lookup_tokens} "
                                "tokens copied from the text so far join the tree", elem_id="lookup")
    with gr.Accordion("Static tree (EAGLE-1)", open=True):
        ui.tree_dd = gr.Dropdown(tree_choices(), value=CUT, label="tree (with 'my settings below')")
        ui.tree_json = gr.Textbox(CUSTOM_EXAMPLE, label="custom tree: JSON list of child-rank paths", lines=3,
                                  visible=False)
    ui.budget = gr.Markdown(budget_markdown(d.total_tokens, CUT, "", sizing=default_sizing()), elem_id="budget")
    ui.with_vanilla = gr.Checkbox(True, label="also run plain decoding (for the speedup)")
    ui.show_pruned = gr.Checkbox(True, label="show pruned branches")


def _live_panel(ui: SimpleNamespace) -> None:
    """Right column: the two trees side by side, each with its step slider, caption and text; metrics."""
    ui.trees, ui.sliders, ui.captions, ui.texts = {}, {}, {}, {}
    with gr.Row(equal_height=False):
        for m in TREE_METHODS:
            with gr.Column(min_width=380):
                ui.trees[m] = gr.Plot(tree_view(Session(), m), show_label=False, elem_id=f"tree-{m}")
                ui.sliders[m] = gr.Slider(0, 1, value=0, step=1, label=f"{LABELS[m]}: step", elem_id=f"step-{m}")
                ui.captions[m] = gr.Markdown(elem_classes=["step-caption"])
                ui.texts[m] = gr.HTML(text_view(Session(), m), elem_id=f"text-{m}", elem_classes=["out-text"])
    ui.latest_btn = gr.Button("Show the latest steps", size="sm")
    ui.metrics = gr.Markdown(metrics_markdown(Session()), elem_id="metrics")


def _extras(ui: SimpleNamespace) -> None:
    """Below: analysis charts, trace export / replay with the SGLang flags, and the explanation."""
    d = DecodeConfig()
    with gr.Accordion("Analysis, measured on this prompt", open=True):
        empty = analysis_views(Session())
        ui.calib = gr.Plot(empty[0], show_label=False)
        with gr.Row():
            ui.heat = {m: gr.Plot(fig, show_label=False) for m, fig in zip(TREE_METHODS, empty[1:3])}
        ui.accept = gr.Plot(empty[3], show_label=False)
        ui.size = gr.Plot(empty[4], show_label=False, elem_id="tree-size")
        ui.costs = gr.Plot(empty[5], show_label=False, elem_id="tree-costs")
    with gr.Accordion("Trace and serving", open=True):
        ui.flags = gr.Code(sglang_flags(d.depth, d.top_k, d.total_tokens), language="shell",
                           label="SGLang launch flags for the same dynamic tree", interactive=False)
        with gr.Row():
            with gr.Column():
                ui.export_btn = gr.Button("Export this run's trace (JSON)")
                ui.trace_out = gr.File(label="Trace file", interactive=False)
            ui.trace_in = gr.File(label="Replay a trace file (no model needed)", file_types=[".json"],
                                  type="filepath")
    with gr.Accordion("What am I looking at?", open=True):
        gr.Markdown((ASSETS / "explainer.md").read_text())


def _workload(ui: SimpleNamespace) -> None:
    """The workload tab: diagnose a prompt file (eagle2/diagnose.py), bounded for a public page."""
    gr.Markdown(f"Upload a prompt file (`.jsonl` or a JSON list: rows with `turns`, `prompt` or `instruction`, "
                f"optionally `category`; at most {workload.MAX_PROMPTS} prompts, {workload.MAX_BYTES // 1000} kB). "
                "Each prompt is decoded once with a 60-node tree and every smaller tree shape replayed from those "
                "steps: τ by size for EAGLE-2, EAGLE-1's cut tree and chains, acceptance by position, where "
                "acceptance collapsed, and the shape to serve it with. `python -m eagle2 diagnose` does the same "
                "without limits.")
    with gr.Row():
        ui.wl_file = gr.File(label="prompt file", file_types=[".jsonl", ".json"], type="filepath", elem_id="wl-file")
        with gr.Column():
            ui.wl_max_new = gr.Slider(1, workload.MAX_NEW_TOKENS, value=32, step=1, label="max new tokens per prompt",
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


@_on_gpu
def _on_diagnose(path: str | None, max_new_tokens: float, preset_name: str, control: RunControl,
                 progress=gr.Progress()) -> Iterator[list]:
    """Diagnose: decode the uploaded prompts, then show the curves, positions, summary, settings and files."""
    def report(fraction: float, message: str) -> None:
        progress(fraction, desc=message)

    for u in workload.diagnose(path, max_new_tokens, preset_name, lambda p: CACHE.get(p, report),
                               lambda p, b: CACHE.profile(p, b, report), control):
        if u.error:
            gr.Warning(u.error)
        yield [u.status, *[v if v is not None else gr.skip()
                           for v in (u.curves, u.positions, u.summary, u.flags, u.files)]]


def _show(u: Update) -> list:
    """An Update as one value per output of OUTPUTS; gr.skip() keeps what the page shows."""
    if u.error:
        gr.Warning(u.error)
    s = u.session
    vals: list = [gr.skip() if s is None else s, u.status, u.model_info or gr.skip()]
    vals += [u.trees[m] if u.trees and m in u.trees else gr.skip() for m in TREE_METHODS]
    for m in TREE_METHODS:
        upd: dict = {"maximum": max(s.last_step(m), 1)} if s is not None else {}
        if s is not None and s.follow.get(m, True):
            upd["value"] = s.last_step(m)
        vals.append(gr.update(**upd) if upd else gr.skip())
    vals += [u.captions[m] if u.captions and m in u.captions else gr.skip() for m in TREE_METHODS]
    vals += [u.texts[m] if u.texts and m in u.texts else gr.skip() for m in TREE_METHODS]
    vals.append(u.metrics if u.metrics is not None else gr.skip())
    vals += list(u.analysis) if u.analysis else [gr.skip()] * 6
    sizes = u.sizes or {}
    vals += [gr.update(value=sizes[k]) if k in sizes else gr.skip() for k in ("total_tokens", "depth", "top_k")]
    return vals


def _outputs(ui: SimpleNamespace) -> list:
    """The components _show fills, in its order."""
    return [ui.state, ui.status, ui.info, *ui.trees.values(), *ui.sliders.values(), *ui.captions.values(),
            *ui.texts.values(), ui.metrics, ui.calib, *ui.heat.values(), ui.accept, ui.size, ui.costs,
            ui.total, ui.depth, ui.top_k]


@_on_gpu
def _on_generate(prompt_text: str, preset_name: str, max_new_tokens: float, temperature_value: float,
                 top_p_value: float, seed_value: float, total_tokens: float, tree_depth: float, tree_top_k: float,
                 lookup_branch: bool, keep_floor: float, expand_floor: float,
                 static_tree_name: str, custom_tree_json: str, run_plain: bool, show_pruned_nodes: bool,
                 control: RunControl, tree_sizing: str = "tuned", progress=gr.Progress()) -> Iterator[list]:
    """Generate: decode with each method in turn, then draw both trees, text and metrics on this visitor's page."""
    req = RunRequest(prompt=prompt_text, preset=preset_name, max_new_tokens=max_new_tokens,
                     temperature=temperature_value, top_p=top_p_value, seed=seed_value, total_tokens=total_tokens,
                     depth=tree_depth, top_k=tree_top_k, tree_choice=static_tree_name, tree_json=custom_tree_json,
                     with_vanilla=bool(run_plain), lookup=bool(lookup_branch), min_prob=keep_floor,
                     expand_prob=expand_floor, sizing=tree_sizing)

    def report(fraction: float, message: str) -> None:
        progress(fraction, desc=message)

    def loader(preset: ModelPreset) -> Bundle:
        return CACHE.get(preset, report)

    def profile(preset: ModelPreset, bundle: Bundle) -> dict | None:
        return CACHE.profile(preset, bundle, report)

    for u in generate(req, loader, show_pruned=bool(show_pruned_nodes), control=control, get_profile=profile,
                      budget_s=_run_budget()):
        yield _show(u)


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


def _budget(total, choice, tree_json, lookup, depth, min_prob, expand_prob, sizing) -> str:
    """The comparison line, with this machine's profile once it has been measured."""
    presets = load_presets()
    loaded = next((p for p in presets.values() if CACHE.loaded(p.name)), None)
    profile = CACHE.cached_profile(loaded.name) if loaded else None
    return budget_markdown(total, choice, tree_json, lookup, depth, min_prob, expand_prob, sizing, profile)


def _wire(ui: SimpleNamespace, demo: gr.Blocks) -> None:
    """Connect the events."""
    outputs = _outputs(ui)
    inputs = [ui.prompt, ui.model_dd, ui.max_new, ui.temperature, ui.top_p, ui.seed, ui.total, ui.depth, ui.top_k,
              ui.lookup, ui.min_prob, ui.expand_prob, ui.tree_dd, ui.tree_json, ui.with_vanilla, ui.show_pruned,
              ui.control, ui.sizing]
    # One decode at a time on the shared model: both triggers share a queue; other sessions wait their turn.
    # A click first counts the run as waiting (unqueued, instant), so that Stop can take it out of the queue.
    # "minimal" keeps the trees visible during a run and still prints "queue: position/size | elapsed/estimate s"
    # on each output while the run waits (Gradio 6.31's status tracker; "full" also greys the outputs out).
    for trigger, api in ((ui.run_btn.click, "generate"), (ui.prompt.submit, False)):
        trigger(actions.enqueue, ui.control, ui.status, queue=False, api_name=False, show_progress="hidden").then(
            _on_generate, inputs, outputs, api_name=api, show_progress="minimal", concurrency_id="decode",
            concurrency_limit=1)
    # Stop flips this visitor's RunControl; the run ends after its current step and draws what it made.
    # (`cancels=` raced with a step in flight on Gradio 6.31: an empty completion arrived after the redraw
    # and left the outputs showing "Error".)
    ui.stop_btn.click(actions.request_stop, ui.control, ui.status, api_name="stop", concurrency_limit=None,
                      show_progress="hidden")
    for m in TREE_METHODS:  # the session goes back to its State, which restarts its idle time
        ui.sliders[m].release(lambda s, v, p, m=m: (*actions.scrub(s, m, v, p), s),
                              [ui.state, ui.sliders[m], ui.show_pruned],
                              [ui.trees[m], ui.texts[m], ui.captions[m], ui.state], api_name=f"scrub_{m}",
                              show_progress="hidden")
    ui.latest_btn.click(lambda s, p: _show(actions.follow_latest(s, p)), [ui.state, ui.show_pruned], outputs,
                        api_name=False)
    ui.show_pruned.change(lambda s, a, b, p: list(actions.redraw(s, {"eagle2": a, "eagle1": b}, p).values()),
                          [ui.state, *ui.sliders.values(), ui.show_pruned], list(ui.trees.values()),
                          api_name=False, show_progress="hidden")
    ui.export_btn.click(_on_export, ui.state, ui.trace_out, api_name="export_trace")
    ui.trace_in.upload(lambda path, p: _show(actions.load_trace(path, p)), [ui.trace_in, ui.show_pruned], outputs,
                       api_name="load_trace")
    tree_io = ([ui.tree_dd, ui.tree_json, ui.total, ui.lookup, ui.depth, ui.min_prob, ui.expand_prob],
               [ui.tree_json, ui.total, ui.sizing, ui.budget])
    ui.tree_dd.input(_on_tree, *tree_io, api_name=False)
    ui.tree_json.blur(_on_tree, *tree_io, api_name=False)
    budget_in = [ui.total, ui.tree_dd, ui.tree_json, ui.lookup, ui.depth, ui.min_prob, ui.expand_prob, ui.sizing]
    for w in (ui.total, ui.lookup, ui.depth, ui.min_prob, ui.expand_prob, ui.sizing):
        w.change(_budget, budget_in, ui.budget, api_name=False, show_progress="hidden")
    for w in (ui.total, ui.depth, ui.top_k):  # moving a size slider by hand compares at your settings
        w.input(lambda: "custom", None, ui.sizing, api_name=False, show_progress="hidden")
    for w in (ui.depth, ui.top_k, ui.total):
        w.change(sglang_flags, [ui.depth, ui.top_k, ui.total], ui.flags, api_name=False, show_progress="hidden")
    def describe(name: str) -> str:
        """The model line for a preset: what is in use, or what will load."""
        return model_info(load_presets()[name], CACHE)

    ui.wl_run.click(_on_diagnose, [ui.wl_file, ui.wl_max_new, ui.model_dd, ui.wl_control],
                    [ui.wl_status, ui.wl_curves, ui.wl_positions, ui.wl_summary, ui.wl_flags, ui.wl_files],
                    api_name="diagnose", concurrency_id="decode", concurrency_limit=1, show_progress="minimal")
    ui.wl_stop.click(actions.request_stop, ui.wl_control, ui.wl_status, api_name=False, concurrency_limit=None,
                     show_progress="hidden")
    ui.model_dd.change(describe, ui.model_dd, ui.info, api_name=False)
    demo.load(describe, ui.model_dd, ui.info, api_name=False)
    demo.unload(_forget_visitor(demo, ui))


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
    """The whole page; nothing is loaded until the first Generate."""
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
    calm_queue(build_demo().queue(default_concurrency_limit=1)).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_options())
