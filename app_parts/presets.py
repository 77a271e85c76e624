"""Model presets the operator configures, and the one-per-process cache of loaded bundles.

The page offers only the pairs listed in `assets/models.json` (or the file named by EAGLE2_MODELS):
it never loads a path or hub id typed by a visitor. A preset may need CUDA or the hub; when either is
missing it is still listed, and choosing it gives a message instead of a failed download.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle2.config import ASSETS
from eagle2.loading import DTYPES, Bundle, load, pick_device
from eagle2.tools.profile import forget_profile, load_profile, machine_profile, warm_up

NEEDS = ("cuda", "hub")
HEAD_KINDS = ("eagle1", "eagle3")
HALF_NOTE = ("In {dtype}, a tree forward over many rows rounds differently from a one-row forward, so the text can "
             "differ from plain decoding's after a near tie; in float32 it has matched on every prompt tested.")


def default_sizing() -> str:
    """The page's opening comparison: the size tuned for this machine on a CPU, the paper's settings on CUDA."""
    return "paper" if pick_device("auto")[0].type == "cuda" else "tuned"


def page_token_limit() -> int:
    """The token slider's maximum: on two idle CPU cores all three methods decoded 1,024 new tokens in 79 s at the
    sliders' 26-node trees, so 512 fit the default time limit with room for a busy server (which may still cut
    them); a GPU decodes 1,024 in less. The command line keeps the engine's limits."""
    return 1024 if pick_device("auto")[0].type == "cuda" else 512


@dataclass(frozen=True)
class ModelPreset:
    """One model + draft head pair the page may load."""

    name: str
    model: str
    head: str | None = None
    needs: tuple[str, ...] = ()
    note: str = ""
    device: str = "auto"
    dtype: str = "float32"  # float32 keeps greedy output equal to plain decoding; half precision can differ
    head_kind: str = "eagle1"  # the head's layout, as the operator declares it: "eagle1" (EAGLE-1/2) or "eagle3"


def presets_path() -> Path:
    """assets/models.json, or the file named by the EAGLE2_MODELS environment variable."""
    return Path(os.environ.get("EAGLE2_MODELS") or ASSETS / "models.json")


def load_presets(path: Path | None = None) -> dict[str, ModelPreset]:
    """Name -> preset, in file order; raises ValueError naming what is wrong with the file."""
    path = path or presets_path()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model presets file {path} is unreadable: {e}") from None
    entries = data.get("presets") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"model presets file {path} needs a non-empty 'presets' list")
    out: dict[str, ModelPreset] = {}
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not isinstance(e.get("model"), str):
            raise ValueError(f"model preset {e!r} in {path} needs string 'name' and 'model' fields")
        needs = tuple(e.get("needs") or ())
        if any(n not in NEEDS for n in needs):
            raise ValueError(f"model preset {e['name']!r}: 'needs' may only list {', '.join(NEEDS)}")
        dtype = str(e.get("dtype", "float32"))
        if dtype not in DTYPES:
            raise ValueError(f"model preset {e['name']!r}: 'dtype' may only be {', '.join(DTYPES)}")
        kind = str(e.get("head_kind", "eagle1"))
        if kind not in HEAD_KINDS:
            raise ValueError(f"model preset {e['name']!r}: 'head_kind' may only be {', '.join(HEAD_KINDS)}")
        out[e["name"]] = ModelPreset(name=e["name"], model=e["model"], head=e.get("head"), needs=needs,
                                     note=str(e.get("note", "")), device=str(e.get("device", "auto")), dtype=dtype,
                                     head_kind=kind)
    return out


def unavailable_reason(preset: ModelPreset) -> str | None:
    """Why this machine cannot run the preset, or None when it can (as far as can be told without loading)."""
    if "cuda" in preset.needs:
        try:
            pick_device("cuda")
        except ValueError:
            return f"“{preset.name}” needs a CUDA GPU, and this machine has none."
    if "hub" in preset.needs and os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return f"“{preset.name}” downloads from the Hugging Face hub, which is switched off here (HF_HUB_OFFLINE)."
    return None


def describe_preset(preset: ModelPreset) -> str:
    """A one-paragraph markdown note on a preset: what it is and whether it can run here."""
    head = preset.head or "the model's default head"
    text = f"**{preset.name}**: model `{preset.model}`, head `{head}`, {preset.dtype}."
    if preset.note:
        text += f" {preset.note}"
    if preset.dtype != "float32":
        text += " " + HALF_NOTE.format(dtype=preset.dtype)
    reason = unavailable_reason(preset)
    return text + (f"\n\n⚠ {reason}" if reason else "")


def repo_relative(text: str) -> str:
    """Paths inside this repository written relative to it (no machine-specific prefix on the page or in traces)."""
    return text.replace(str(ASSETS.parent) + os.sep, "")


def in_use(bundle: Bundle) -> str:
    """The 'In use' line: model, head, device and dtype."""
    return f"In use: {repo_relative(bundle.describe())}"


def model_info(preset: ModelPreset, cache: "BundleCache") -> str:
    """'In use: …' when the preset is loaded already, else its description and when it will load."""
    bundle = cache.loaded(preset.name)
    if bundle is not None:
        return in_use(bundle)
    if cache.preparing():
        return describe_preset(preset) + " Being prepared at server start."
    return describe_preset(preset) + " Loads on the first Generate."


class BundleCache:
    """Loaded bundles by preset name; one at a time (a new preset evicts the old), loaded under a lock.

    With a `preparation` (app_parts/warmup.py: the server's own first load and profile, in the background), `get`
    and `profile` first wait for it outside the lock, saying on `progress` which step is left, and then find its
    bundle and profile here, made once; when it failed they load as they would without it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bundles: dict[str, Bundle] = {}
        self._profiles: dict[str, dict | None] = {}
        self.preparation = None  # a warmup.Preparation once the server starts one

    def preparing(self) -> bool:
        """Whether the server's preparation at start is still running."""
        return self.preparation is not None and not self.preparation.done.is_set()

    def _await_preparation(self, progress: Callable[[float, str], None] | None) -> None:
        if self.preparation is not None:
            self.preparation.wait(progress)

    def put(self, name: str, bundle: Bundle) -> None:
        """Hand the cache an already loaded bundle (tests load the model once and share it)."""
        with self._lock:
            self._bundles, self._profiles = {name: bundle}, {}

    def cached_profile(self, name: str) -> dict | None:
        """The profile of a loaded preset if it has been measured (in this process or before, on disk)."""
        bundle = self._bundles.get(name)
        if name in self._profiles or bundle is None:
            return self._profiles.get(name)
        return load_profile(bundle) if bundle.device.type == "cpu" else None

    def profile(self, preset: ModelPreset, bundle: Bundle,
                progress: Callable[[float, str], None] | None = None) -> dict | None:
        """This machine's profile for a loaded preset (eagle2/tools/profile.py: the paper's EAGLE-2 at its fastest size
        here, and the costs measured on the way), tuned on first use and cached on disk; None off a CPU, where
        the page uses the paper's settings."""
        if bundle.device.type != "cpu":
            return None
        self._await_preparation(progress)
        with self._lock:
            if preset.name not in self._profiles:
                say = (lambda m: progress(0.5, f"Tuning the tree size for this machine (once, up to a minute): {m}")
                       ) if progress else None
                self._profiles[preset.name] = machine_profile(bundle, progress=say)
            return self._profiles[preset.name]

    def forget_profile(self, preset: ModelPreset, bundle: Bundle) -> None:
        """A run contradicted the preset's profile: drop it (here and on disk), so the next run measures it again."""
        with self._lock:
            self._profiles.pop(preset.name, None)
            forget_profile(bundle)

    def loaded(self, name: str) -> Bundle | None:
        """The bundle for `name` if it is loaded already."""
        return self._bundles.get(name)

    def get(self, preset: ModelPreset, progress: Callable[[float, str], None] | None = None) -> Bundle:
        """The bundle for a preset, loading it on first use; raises RuntimeError with a clear message."""
        reason = unavailable_reason(preset)
        if reason:
            raise RuntimeError(reason)
        self._await_preparation(progress)  # outside the lock: the preparation's own load holds it meanwhile
        with self._lock:
            if preset.name in self._bundles:
                return self._bundles[preset.name]
            if progress:
                progress(0.1, f"Loading {preset.name} (first run only; up to a minute)…")
            self._bundles, self._profiles = {}, {}  # one model at a time: free the old one before the next
            try:
                bundle = load(preset.model, preset.head, preset.device, dtype=preset.dtype)
            except (OSError, ValueError, RuntimeError) as e:
                raise RuntimeError(f"could not load “{preset.name}”: {e}") from None
            if progress:
                progress(0.8, "Warming up each method once, so that the first run is timed like the rest…")
            warm_up(bundle)
            self._bundles[preset.name] = bundle
            if progress:
                progress(1.0, "Model loaded")
            return bundle


CACHE = BundleCache()
