"""The project's text speaks of the project, not of how it was made.

Every text file git tracks (or would track: new files that are not ignored) is scanned for numbered
development sessions, "run NN" narratives, throwaway work paths and absolute paths of a machine; and no README or
Makefile may point at `../shared`, which a fresh clone does not have. The patterns are assembled from pieces
and this file is skipped, so the scan does not find itself.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".webp", ".pdf", ".safetensors", ".bin", ".pt", ".pth",
          ".gguf", ".npy", ".npz", ".woff", ".woff2", ".ttf", ".zip", ".gz"}

_S, _R = "[Ss]ession", "[Rr]un"
PATTERNS = {
    "numbered development session": re.compile(rf"\b{_S}s? \d"),
    # not a flag such as `--runs 10`, nor a rate (runs 2.79x greedy; thirty per cent slower)
    '"run NN" narrative': re.compile(rf"(?<![-\w]){_R}s? \d{{1,3}}\b(?![%×]|[.,]\d|x\b)"),
    "throwaway work path": re.compile("scr" + "atch", re.IGNORECASE),
    "absolute machine path": re.compile(r"(?<![\w.~-])/(?:" + "|".join(["wo" + "rk", "ho" + "me", "ro" + "ot",
                                                                         "t" + "mp", "Us" + "ers"]) + r")/"
                                        + r"|\b[A-Z]:" + r"\\\\"),
}
SHARED = re.compile(r"\.\./" + "sha" + "red")


def _text_files() -> list[str]:
    """Tracked files and new, non-ignored ones that exist and are text (no NUL byte, no binary suffix)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    out = []
    for name in sorted(set(filter(None, listed))):
        path = ROOT / name
        if name == SELF or path.suffix.lower() in BINARY or not path.is_file():
            continue
        if b"\0" in path.read_bytes()[:8192]:
            continue
        out.append(name)
    return out


def _hits(names: list[str], pattern: re.Pattern) -> list[str]:
    found = []
    for name in names:
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), start=1):
            for m in pattern.finditer(line):
                lo = max(m.start() - 40, 0)
                found.append(f"{name}:{n}: {m.group(0)!r} in ...{line[lo:m.end() + 40]}...")
    return found


def test_the_scan_finds_what_it_looks_for():
    """Each pattern catches its kind and lets ordinary text through (a broken pattern would pass everything)."""
    caught = {"numbered development session": "measured in " + "ses" + "sion 21",
              '"run NN" narrative': "head " + "ru" + "n 22, the shipped one",
              "throwaway work path": "a " + "scr" + "atch script",
              "absolute machine path": "cd /" + "work/main"}
    for kind, text in caught.items():
        assert PATTERNS[kind].search(text), kind
    for text in ["`--runs 10` repeats the measurement", "each run streams both trees", "runs on 2 cores",
                 "the draft runs in bf16", "~/.cache/eagle2-viz", "https://example.org/home/page",
                 "pytest's tmp_path", "12 runs in all", "the branch runs 2.79x greedy", "it has " + "ru" + "n 30% slower"]:
        assert not any(p.search(text) for p in PATTERNS.values()), text
    assert SHARED.search("--prompts .." + "/shared/data/mt_bench.jsonl")


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_tracked_text_has_no(kind):
    hits = _hits(_text_files(), PATTERNS[kind])
    assert not hits, f"{len(hits)} {kind} hit(s):\n" + "\n".join(hits)


def test_no_readme_or_makefile_refers_to_the_shared_folder():
    names = [n for n in _text_files() if Path(n).name in ("Makefile", "README.md") or n.endswith(".md")]
    hits = _hits(names, SHARED)
    assert not hits, "a fresh clone has no ../shared:\n" + "\n".join(hits)
