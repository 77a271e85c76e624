"""Our own float32 matmul for a few rows (eagle2/csrc/rows_linear.cpp), built on first use.

Decoding multiplies one row, and verifying a tree a handful, by weights far larger than the caches. The
kernel streams each weight block once and multiplies it with every row while it is in L1, so a few more
rows cost little more than one; and each output is the same sum in the same order whatever the row count,
so a verified row is bit for bit what a one-row step computes. It needs AVX-512 and a C++ compiler (with
`ninja`, a pinned requirement); it is compiled once (about 30 s) into PyTorch's extension cache
(~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR). Where it cannot be built, `load` says why and the
layers keep PyTorch's and oneDNN's kernels (eagle2/cpu/linear.py).

An interrupted build must not block later starts: torch guards its build folder with an empty `lock` file
that a process killed mid-build (SIGKILL, SIGTERM, the OOM killer) never removes, and every later build waits
on it forever. So a build here also holds an flock on OWNER beside it, which the kernel drops when the process
dies however it dies: a `lock` found while we hold OWNER was left by a dead build; it is cleared, with that
build's files, and the kernel built afresh by a process of its own in the background (about 30 s), while this
start goes on at once with the stock kernels; the next start uses the kernel. A live build elsewhere is waited
for at most `wait_s()`; past that the stock kernels run too. Either way `failure()` says why.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

MAX_ROWS = 32  # FastLinear never offers it more rows (prefill goes to oneDNN, a blocked GEMM)
NAME = "eagle2_rows"
OWNER = "eagle2.owner"  # flocked by the process building or loading the kernel; its pid inside, for people
WAIT_S = 180.0          # how long to wait for another live process's build (EAGLE2_ROW_KERNEL_WAIT_S overrides)
SOURCE = Path(__file__).with_name("csrc") / "rows_linear.cpp"
log = logging.getLogger(__name__)

_state: dict[str, object] = {}
_lock = threading.Lock()  # one build or load per process (a page's background build and its first run)


def why_not() -> str | None:
    """Why the kernel cannot run here (None when it can be tried)."""
    if os.environ.get("EAGLE2_ROW_KERNEL", "1") == "0":
        return "turned off by EAGLE2_ROW_KERNEL=0"
    cap = torch.backends.cpu.get_cpu_capability()
    if "AVX512" not in cap.upper():
        return f"needs AVX-512 (this CPU: {cap})"
    return None


def wait_s() -> float:
    """Seconds to wait for another live process's build: EAGLE2_ROW_KERNEL_WAIT_S, else WAIT_S."""
    try:
        return max(float(os.environ.get("EAGLE2_ROW_KERNEL_WAIT_S", WAIT_S)), 0.0)
    except ValueError:
        return WAIT_S


def build_dir() -> Path:
    """torch's build folder for the kernel ($TORCH_EXTENSIONS_DIR or its cache, then the kernel's name)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(NAME, verbose=False))


@contextmanager
def build_turn(folder: Path, wait: float) -> Iterator[bool]:
    """Hold OWNER in `folder` for a build or load; yields whether a dead build's lock was found (and cleared,
    with its files). TimeoutError when another live process holds OWNER for more than `wait` seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another process has been building it in {folder} for over {wait:.0f} s "
                                       "(EAGLE2_ROW_KERNEL_WAIT_S sets the wait)") from None
                time.sleep(0.2)
        stale = (folder / "lock").exists()  # no live build holds OWNER, so whoever left this is dead
        if stale:
            for p in folder.iterdir():  # its half-written objects are not to be trusted either
                if p.name != OWNER:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield stale
    finally:
        os.close(fd)  # drops the flock


def load():
    """The compiled module, or None (and the reason in `failure()`); built once per process. Threads wait for
    one another: a page that starts the build in the background at launch (`in_background`) and its first run
    share one build."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" in _state:
            return _state["module"]
        return _load()


def in_background() -> threading.Thread:
    """Start `load` in a daemon thread (a page at launch: the kernel is built while nobody waits for it)."""
    thread = threading.Thread(target=load, name="eagle2-row-kernel", daemon=True)
    thread.start()
    return thread


def _load():
    module, reason = None, why_not()
    if reason is None:
        try:
            from torch.utils import cpp_extension
            start = time.perf_counter()
            folder = build_dir()
            with build_turn(folder, wait_s()) as stale:
                if not stale:
                    so = folder / f"{NAME}.so"
                    if not so.exists() or so.stat().st_mtime < SOURCE.stat().st_mtime:  # a build, not a load
                        print("eagle2: building the row kernel (once per machine and version, about 30 s)...",
                              file=sys.stderr, flush=True)
                    module = cpp_extension.load(name=NAME, sources=[str(SOURCE)], build_directory=str(folder),
                                                extra_cflags=["-O3", "-mavx512f", "-fopenmp"],
                                                extra_ldflags=["-fopenmp"], verbose=False)
            if stale:  # OWNER is free again: the builder takes it, so later starts wait for it (bounded)
                subprocess.Popen([sys.executable, "-c", "from eagle2.cpu import rows; rows.load()"],
                                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, cwd=str(Path(__file__).resolve().parents[2]))
                reason = ("being built again in the background after an interrupted build (the next start uses "
                          "it)")
                print(f"eagle2: cleared the row kernel's lock left by an interrupted build in {folder}; it is "
                      "being built again in the background, and this run uses the stock kernels", file=sys.stderr)
            took = time.perf_counter() - start
            if took > 3 and module is not None:  # a build, not a cached load: say where the time went
                print(f"eagle2: built the row kernel in {took:.0f} s (once per machine)", file=sys.stderr)
        except TimeoutError as e:
            reason = f"not ready: {e}"
        except Exception as e:  # no compiler, no ninja, a failed build: keep the stock kernels
            reason = f"could not be built ({type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''})"
    _state["module"], _state["failure"] = module, reason
    if reason:
        log.warning("row kernel off: %s", reason)
    return module


def failure() -> str | None:
    """Why `load` returned None (after it ran)."""
    return _state.get("failure")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) through the row kernel; float32 CPU, weight contiguous, `load()` not None."""
    return load().rows_linear(x, weight, bias)


def q8_upper(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """(M, K) float32 x and int8 rows q (N, K) with per-row scale and slack (N,) -> (M, N) upper bounds
    scale_t x.q_t + 2^-22 |that| + |x|_1 slack_t (eagle2/cpu/argmax.py); `load()` not None."""
    return load().q8_upper(x, q, scale, slack)


def q8_greedy(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, slack: torch.Tensor, w: torch.Tensor, k: int,
              spread: float, l1q: torch.Tensor | None = None) -> list[torch.Tensor]:
    """(M, K) float32 x, int8 rows q (V, K) with their scale and slack, the float32 lm_head w -> tokens (M,),
    settled (M,), the shortlist (M, k + 1) and its bounds: `q8_upper`'s bounds kept as a running top-(k + 1), the
    shortlist's exact logits summed as this kernel sums them, the best with ties to the lowest token, settled
    where it beats the (k + 1)-th bound plus `spread` |x|_2 (eagle2/cpu/argmax.py); `load()` not None. With
    `l1q` (float32 |q_t|_1 per row) and a CPU with AVX512-VNNI, the bounds come from exact int16 x int8 sums
    (`int16_sums`)."""
    return load().q8_greedy(x, q, scale, slack, w, k, spread, l1q)


def int16_sums(features: int) -> bool:
    """Whether `q8_greedy` over rows of this many features sums in int16 x int8 here (and is switched on)."""
    return bool(load().int16_sums(features))


def q8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 x @ (scale[:, None] * q).T (+ bias) for int8 rows q (eagle2/cpu/int8.py); `load()` not None."""
    return load().q8_linear(x, q, scale, bias)


def usable(weight: torch.Tensor) -> bool:
    """Whether this weight can go through the kernel (float32, CPU, contiguous) and the kernel is built."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.is_contiguous()
            and load() is not None)


def q4_linear(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
    """float32 x @ w.T (+ bias) for four-bit codes that hold the float32 w exactly (eagle2/cpu/q4.py): the same
    sums as `linear` over w; `load()` not None."""
    return load().q4_linear(x, codes, d, m, bias)


def q4_recode(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, d, m) holding the float32 (N, K) weight exactly (eagle2/cpu/q4.py); empty codes when it cannot;
    `load()` not None."""
    return tuple(load().q4_recode(weight))
