#!/usr/bin/env bash
# The GPU checks of docs/performance.md ("On a GPU"), as one call on a machine with an NVIDIA
# GPU: correctness first, then the timings, each step under its own time limit so that one
# stuck step does not take the others' time. Never part of CI: the CPU tests carry correctness.
#
#   bash scripts/gpu-check.sh build   # on any machine (no GPU needed, ~15 min on 2 cores):
#                                     # the CUDA builds of fedshard and of the training crate's
#                                     # tests, stripped and compressed into target/gpu (17 MB)
#   bash scripts/gpu-check.sh run [checks] [rounds] [job] [step]
#                                     # on the GPU machine, from the repository root, with
#                                     # target/gpu copied there (all four parts by default;
#                                     # name fewer to fit a shorter call, the step limits add
#                                     # up to 22 minutes): writes gpu-check.log (into $OUT
#                                     # when set)
#
# `run` needs the NVIDIA driver, the CUDA toolkit's libnvrtc (CUDA_PATH, default
# /usr/local/cuda-13.0, then /usr/local/cuda) and, for the PyTorch rows, a python3 with torch
# (scripts/torch_reference.py, run in the same call on the same card).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=target/gpu

build() {
    set -e
    mkdir -p "$gpu"
    # A target folder of its own: the CUDA features would otherwise rebuild, and replace, the
    # CPU build's binaries in target/release.
    local dir=target/cuda
    cargo build --release --target-dir "$dir" --features cuda,profile -p fedshard
    cp "$dir/release/fedshard" "$gpu/fedshard"
    local tests
    tests=$(cargo test --release --target-dir "$dir" --features cuda -p fedshard-training --lib \
        --no-run --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])')
    cp "$tests" "$gpu/training-tests"
    strip "$gpu/fedshard" "$gpu/training-tests"
    xz -T0 -f "$gpu/fedshard" "$gpu/training-tests"
    git rev-parse HEAD > "$gpu/BUILT_FROM"
    ls -l "$gpu"
}

run() {
    local out="${OUT:-.}"
    local log="$out/gpu-check.log"
    export CUDA_PATH="${CUDA_PATH:-$([ -d /usr/local/cuda-13.0 ] && echo /usr/local/cuda-13.0 || echo /usr/local/cuda)}"
    export LD_LIBRARY_PATH="$CUDA_PATH/lib64:${LD_LIBRARY_PATH:-}"
    # Unpacked outside target/gpu, afresh each run: a copy left there would be stale after the
    # next build and would travel with target/gpu (three times its packed size).
    local bin
    bin=$(mktemp -d)
    for f in fedshard training-tests; do
        xz -dc "$gpu/$f.xz" > "$bin/$f"
        chmod +x "$bin/$f"
    done
    local fedshard="$bin/fedshard" tests="$bin/training-tests"
    step() { # step SECONDS COMMAND...: runs it under a limit, logs its output and status
        local limit=$1
        shift
        echo "== $* (limit ${limit} s)"
        local started=$SECONDS
        timeout "$limit" "$@" 2>&1
        echo "-- exit $?, $((SECONDS - started)) s"
    }
    parts=("$@")
    [ ${#parts[@]} -gt 0 ] || parts=(checks rounds job step)
    {
        echo "built from $(cat "$gpu/BUILT_FROM" 2>/dev/null || echo unknown); checked $(date -u +%FT%TZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 -c 'import torch; print("PyTorch", torch.__version__)' 2>&1
        for part in "${parts[@]}"; do
            case "$part" in
            checks)
                # Correctness: the CUDA kernels against the CPU's; then the kernels' timings
                # (the convolution passes, the cohorts' batched products per strategy).
                step 150 "$tests" --ignored --test-threads 1 cuda_
                step 120 "$fedshard" bench kernels
                ;;
            rounds)
                # The issue's rounds: 10 clients × 500 samples × 2 epochs at batch 8, fedshard
                # and the PyTorch loop on the same card; then a sharded cohort (no PyTorch
                # counterpart).
                for model in resnet18 cct; do
                    step 90 "$fedshard" bench round --model "$model" --device cuda --cohorts on --rounds 1
                    step 90 python3 scripts/torch_reference.py --round --model "$model" --device cuda --repeats 1
                    step 90 "$fedshard" bench round --model "$model" --device cuda --cohorts on --rounds 1 --keep-ratio 0.5
                done
                ;;
            job)
                # The main job, cohorts on and off, against two of the host's CPU cores.
                step 120 "$fedshard" bench job config/digits-cnn.toml --device cuda --cohorts on
                step 120 "$fedshard" bench job config/digits-cnn.toml --device cuda --cohorts off
                step 60 taskset -c 0,1 "$fedshard" bench job config/digits-cnn.toml
                ;;
            step)
                # One client's step, against PyTorch's.
                step 60 "$fedshard" bench train --model resnet18 --batch 8 --device cuda --seconds 3
                step 60 "$fedshard" bench train --model cct --batch 8 --device cuda --seconds 3
                step 60 python3 scripts/torch_reference.py --device cuda --runs resnet18:8,cct:8 --seconds 3
                ;;
            *) echo "unknown part $part (expected checks, rounds, job, step)" ;;
            esac
        done
    } 2>&1 | tee "$log"
}

case "${1:-}" in
build) build ;;
run)
    shift
    run "$@"
    ;;
*)
    echo "usage: bash scripts/gpu-check.sh build | run [checks] [rounds] [job] [step]" >&2
    exit 2
    ;;
esac
