"""The prepared check for a lent GPU (`scripts/gpu_check.sh` runs it there; docs/benchmarks.md, "GPU check"): in one
process on one device it benches plain decoding, EAGLE-1 and EAGLE-2 at 8, 26 and 60 nodes with greedy equality
checked, measures the device's cost profile for the page (`eagle2.tools.device_profiles`), then serves the page on
that device and runs one Generate through its HTTP API, checking that the live pass drew, the timed pass ran and
both gave the same tokens as plain decoding. Everything goes to one folder: `gpu_check.json` (the results and
every check), the profile as `<device>-<date>.json` (to copy into assets/profiles/). Exit status 1 when a check
fails.

    python -m checks.gpucheck --out DIR                    # the embedded model on CUDA, the real settings
    python -m checks.gpucheck --device cpu --model DIR --head DIR --sizes 3,4 --prompts 1 --max-new-tokens 8 \\
        --depths 1,2 --widths 1,2 --verify-sizes 1,2,4 --out DIR   # a rehearsal in seconds with a tiny model
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

METHODS = ["vanilla", "eagle1", "eagle2"]
SIZES = (8, 26, 60)
DEPTH, TOP_K = 6, 10  # the paper's EAGLE-2 shape; EAGLE-1 runs mc_sim_7b_63 cut to the size (whole from 26)
PAGE_PROMPT = "Explain in three sentences why the sky is blue."
SAME_TOKENS = "The live pass and the timed pass gave the same tokens."


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def bench_sizes(bundle, prompts: list[str], sizes, max_new: int, say=print) -> list[dict]:
    """Per size: each method's tokens/s, τ and speedup over plain decoding on `prompts` (the bench's own loop,
    methods taking turns), and whether both trees gave plain decoding's tokens on every prompt."""
    from eagle2.decode.methods import Shared, config_for
    from eagle2.tools.bench import run_bench

    rows = []
    for n in sizes:
        shared = Shared(max_new_tokens=max_new, total_tokens=n, depth=DEPTH, top_k=TOP_K)
        res = run_bench(bundle, prompts, METHODS, lambda m: config_for(m, shared), max_new, progress=say)
        got = {m: {k: res["methods"][m][k] for k in ("tokens_per_s", "mean_accept_length", "speedup_vs_vanilla",
                                                     "matches_vanilla", "new_tokens", "wall_s")} for m in METHODS}
        rows.append({"nodes": n, "eagle1_nodes": config_for("eagle1", shared).total_tokens, "methods": got,
                     "greedy_equal": all(got[m]["matches_vanilla"] == 1.0 for m in METHODS)})
        each = (f"{m} {got[m]['tokens_per_s']:.1f} tok/s τ {got[m]['mean_accept_length'] or 1:.2f}" for m in METHODS)
        say(f"{n} nodes: {', '.join(each)}; greedy equal: {rows[-1]['greedy_equal']}")
    return rows


def device_name(bundle) -> str:
    """The accelerator's name (or the processor's, on a CPU rehearsal)."""
    import torch

    if bundle.device.type == "cuda":
        return torch.cuda.get_device_name(bundle.device)
    from eagle2.cpu.plan import cpu_name

    return cpu_name()


def measure_profile(bundle, verify_sizes, depths, widths, say=print) -> dict:
    """The device's cost profile, measured by the tuner's own timers on the first tuning prompt."""
    from eagle2.api import decoder_for
    from eagle2.config import DecodeConfig
    from eagle2.decode.engine import encode_prompt
    from eagle2.tools.autotune import time_drafting_by_width, time_verify, warmup_texts
    from eagle2.tools.device_profiles import make_profile

    import torch

    dec = decoder_for(bundle)
    ids = encode_prompt(bundle.tokenizer, warmup_texts(1)[0])
    say("profile: timing verify at " + ", ".join(map(str, verify_sizes)) + " rows")
    verify = time_verify(dec, ids, tuple(sorted({1, *verify_sizes})))
    say("profile: timing drafting at depths " + ", ".join(map(str, depths)) + " and widths " +
        ", ".join(map(str, widths)))
    by_width = time_drafting_by_width(dec, ids, DecodeConfig(total_tokens=2), tuple(depths), tuple(widths))
    return make_profile(device_name(bundle), time.strftime("%Y-%m-%d"), verify, by_width, max(widths),
                        setup=bundle.describe(), torch=torch.__version__)


def _same_as_plain(metrics: str) -> dict[str, str]:
    """The metrics table's "same text as plain" cell per method row."""
    out = {}
    for line in metrics.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] not in ("method", "---") and not set(cells[0]) <= {"-"}:
            out[cells[0]] = cells[-1]
    return out


def page_generate(bundle, prompt: str, max_new: int) -> dict:
    """One Generate through the served page's API (the paper's sizing, plain decoding too) and its checks."""
    from gradio_client import Client

    from checks.serve import served_app

    t0 = time.perf_counter()
    with served_app(bundle) as url:
        outputs = list(Client(url, verbose=False).submit(prompt, max_new_tokens=max_new, with_vanilla=True,
                                                         sizing="paper", api_name="/generate"))
    final, statuses = outputs[-1], [o[0] for o in outputs if isinstance(o[0], str)]
    drawn = [o for o in outputs if isinstance(o[0], str) and o[0].startswith("Live pass")
             and isinstance(o[2], dict) and o[2].get("type") == "plotly"]
    same = _same_as_plain(final[10] if isinstance(final[10], str) else "")
    setup = next((o[1] for o in outputs if isinstance(o[1], str) and "|" in o[1]), "")
    checks = {"done": final[0].startswith("Done."), "live_pass_drew": bool(drawn),
              "timed_pass": any(s.startswith("Timed pass") for s in statuses),
              "live_and_timed_same_tokens": SAME_TOKENS in final[10],
              "trees_same_as_plain": len(same) == 3 and all(v.startswith("yes") for k, v in same.items()
                                                            if v != "—"),
              "on_device": f"{bundle.device.type} " in setup}
    return {"seconds": round(time.perf_counter() - t0, 1), "updates": len(outputs), "status": final[0],
            "setup": setup, "same_text_as_plain": same, "metrics": final[10], "checks": checks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checks.gpucheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and the profile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--head", default=None, help="default: the shipped head (embedded model)")
    ap.add_argument("--kernels", default="auto")
    ap.add_argument("--prompts", type=int, default=6, help="MT-bench prompts benched at each size")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sizes", type=_ints, default=SIZES)
    ap.add_argument("--verify-sizes", type=_ints, default=None, help="default: the tuner's sizes")
    ap.add_argument("--depths", type=_ints, default=None, help="default: the tuner's depths")
    ap.add_argument("--widths", type=_ints, default=(1, TOP_K))
    ap.add_argument("--page-tokens", type=int, default=64)
    args = ap.parse_args(argv)

    from eagle2.config import ASSETS
    from eagle2.loading import load
    from eagle2.tools.autotune import DEPTHS, SIZES as TUNER_SIZES
    from eagle2.tools.device_profiles import slug
    from eagle2.tools.prompts import read_prompts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(msg, flush=True)  # noqa: E731  (the log is the call's only live view)
    t0 = time.perf_counter()
    bundle = load(args.model, args.head, args.device, args.kernels)
    say(bundle.describe())
    prompts = read_prompts(ASSETS / "bench" / "mt_bench.jsonl", args.prompts)
    report: dict = {"setup": bundle.describe(), "load_s": round(time.perf_counter() - t0, 1)}
    report["bench"] = bench_sizes(bundle, prompts, args.sizes, args.max_new_tokens, say)
    profile = measure_profile(bundle, args.verify_sizes or TUNER_SIZES, args.depths or DEPTHS, args.widths, say)
    name = f"{slug(profile['device'], profile['date'])}.json"
    (out / name).write_text(json.dumps(profile, indent=1))
    report["profile"] = name
    say(f"profile written: {name} (verify 1 row {profile['verify_ms']['1']} ms)")
    report["page"] = page_generate(bundle, PAGE_PROMPT, args.page_tokens)
    report["checks"] = {f"{r['nodes']} nodes greedy equal": r["greedy_equal"] for r in report["bench"]}
    report["checks"].update({f"page {k}": v for k, v in report["page"]["checks"].items()})
    report["ok"] = all(report["checks"].values())
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    for k, v in report["checks"].items():
        say(f"{'ok  ' if v else 'FAIL'} {k}")
    say(f"{'all checks hold' if report['ok'] else 'a check failed'} ({report['seconds']} s)")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
