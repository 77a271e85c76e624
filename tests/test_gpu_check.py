"""scripts/gpu_check.sh, rehearsed on the CPU with a tiny model: the same script and check a lent GPU runs, with
small settings, must bench every size with greedy equality, write a profile the page can read, and drive one
Generate through the served page's API with the live pass, the timed pass and the same tokens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def tiny_dirs(folder: Path) -> tuple[Path, Path]:
    """A tiny random Llama with a character tokenizer, and a random head for it, saved as `load` reads them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from eagle2.heads.eagle import new_head, save_head
    from tests.conftest import tiny_target

    target = tiny_target(vocab=32)
    chars = "abcdefghijklmnopqrstuvwxyz .,?!"
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)} | {"<unk>": 31}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    model, head = folder / "model", folder / "head"
    target.save_pretrained(model)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(model)
    save_head(new_head(target, seed=1), head, dtype=next(target.parameters()).dtype)
    return model, head


def test_the_cpu_rehearsal_benches_profiles_and_drives_the_page(tmp_path):
    model, head = tiny_dirs(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "DEVICE": "cpu", "OUT": str(out), "MODEL": str(model),
           "HEAD": str(head), "KERNELS": "torch", "SIZES": "3,5", "PROMPTS": "1", "MAX_NEW": "6",
           "VERIFY_SIZES": "2,4", "DEPTHS": "1,2", "WIDTHS": "1,2", "PAGE_TOKENS": "5",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    r = subprocess.run(["bash", str(SCRIPT), "check"], env=env, capture_output=True, text=True, cwd=ROOT,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"] and all(report["checks"].values())
    assert [row["nodes"] for row in report["bench"]] == [3, 5] and all(row["greedy_equal"] for row in report["bench"])
    assert report["page"]["checks"]["live_pass_drew"] and report["page"]["checks"]["live_and_timed_same_tokens"]
    assert "cpu float32" in report["page"]["setup"]

    from eagle2.tools.device_profiles import stored_profiles

    (profile,) = stored_profiles(out)  # the page reads the written profile as it stands
    assert report["profile"] == next(out.glob("*-20*.json")).name
    assert set(profile["verify_ms"]) == {1, 2, 4} and set(profile["rest_ms"]) == {1, 2}
    assert set(profile["rest_ms_by_width"]) == {1, 2} and profile["rest_ms"] == profile["rest_ms_by_width"][2]
    assert (out / "run.log").read_text().rstrip().endswith(")") and "all checks hold" in (out / "run.log").read_text()


def test_a_run_stops_before_the_check_when_the_carried_parts_do_not_add_up(tmp_path):
    carry = tmp_path / "carry"
    for i in (1, 2):
        (carry / str(i)).mkdir(parents=True)
        (carry / str(i) / f"part.{i - 1}").write_bytes(os.urandom(1000))
    (carry / "2" / "parts.sha256").write_text("0" * 64 + "\n")
    (carry / "2" / "parts.count").write_text("2\n")
    env = {**os.environ, "EAGLE2_GPU_STASH": str(tmp_path / "stash"), "OUT": str(tmp_path / "out"), "PY": "true"}
    run = ["bash", str(SCRIPT)]
    missing = subprocess.run(run + ["run", str(carry / "2")], env=env, capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode != 0 and "part.0 missing" in missing.stderr
    assert subprocess.run(run + ["stash", str(carry / "1")], env=env, capture_output=True, cwd=ROOT).returncode == 0
    damaged = subprocess.run(run + ["run", str(carry / "2")], env=env, capture_output=True, text=True, cwd=ROOT)
    assert damaged.returncode != 0 and "do not add up" in damaged.stderr
    assert not (tmp_path / "out" / "run.log").exists()  # nothing ran
