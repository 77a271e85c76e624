"""Plain mistakes on the command line get a message that names the flag, before any model loads or any folder
is made, and leave nothing behind: no traceback, no half-made output folder, no overwritten shipped head."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eagle2.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "smollm2-135m-eagle"


def _refused(argv: list[str], capsys, words: str) -> str:
    """Run argv; it must end with status 2 (argparse's SystemExit(2) or main's 2) and say `words`, no traceback."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, (argv, err)
    assert words in err and "Traceback" not in err, err
    return err


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    return path


def test_counts_must_be_whole_numbers_of_at_least_one(prompts, tmp_path, capsys):
    for bad in ("0", "-1", "two"):
        _refused(["bench", "--prompts", str(prompts), "--limit", bad], capsys, "--limit")
        _refused(["train", "generate", "--prompts", str(prompts), "--out", str(tmp_path / "g"), "--limit", bad],
                 capsys, "--limit")
        _refused(["train", "instructions", "--out", str(tmp_path / "i.jsonl"), "--count", bad], capsys, "--count")
    assert not (tmp_path / "g").exists() and not (tmp_path / "i.jsonl").exists()


def test_bench_needs_a_method(prompts, capsys):
    _refused(["bench", "--prompts", str(prompts), "--methods", " , "], capsys, "--methods names no method")


def test_bench_makes_the_json_folder_before_it_runs(prompts, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "res.json"
    _refused(["bench", "--prompts", str(prompts), "--methods", "nosuch", "--json", str(out)], capsys, "nosuch")
    assert out.parent.is_dir()  # a whole run would not end in "No such file or directory"


def test_training_commands_check_their_data_first(tmp_path, capsys):
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    empty.mkdir()
    for data, words in ((missing, "does not exist"), (empty, "holds no manifest.json")):
        _refused(["train", "fit", "--data", str(data), "--out", str(tmp_path / "ckpt")], capsys, words)
        _refused(["train", "evaluate", "--data", str(data), "--ckpt", str(SHIPPED)], capsys, words)
        _refused(["train", "heldout", "--data", str(data), "--out", str(tmp_path / "rows.json")], capsys, words)
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "rows.json").exists()


def test_export_never_writes_over_the_shipped_head_by_default(tmp_path, capsys):
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in SHIPPED.iterdir()}
    _refused(["train", "export", "--data", str(tmp_path), "--ckpt", str(tmp_path)], capsys, "--save-head")
    assert before == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in SHIPPED.iterdir()}


def test_eagle3_refuses_a_run_with_no_time_or_nothing_to_answer(tmp_path, capsys):
    for bad in ("-1", "0", "nan", "soon"):
        _refused(["train", "eagle3", "--out", str(tmp_path / "a"), "--minutes", bad], capsys, "--minutes")
    _refused(["train", "eagle3", "--out", str(tmp_path / "b"), "--minutes", "1"], capsys, "nothing to answer")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
