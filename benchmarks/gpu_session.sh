#!/usr/bin/env bash
# Everything the GPU figures need, in one go on one H200 (or any sm_90 card), about 8 minutes: build cuda_ext
# with its CUDA kernels, the tests that have GPU cases, train_gpu.py (issue 8), train_gpu.py's dense preset
# with plain causal attention, gpu_kernels.py (issue 10), and, in what time is left, the base preset with the
# fused linear + cross-entropy (issue 23). Each step gets its own time limit inside one overall deadline, so a
# slow step costs the later ones, not the whole session.
#
#   benchmarks/gpu_session.sh [OUTPUT_DIR]      # default: $OUT, else benchmarks/out/gpu_session
#   DEADLINE_S=540 PYTHON=python3 benchmarks/gpu_session.sh
#
# Offline: packages the machine's Python lacks (pydantic and its needs) can sit as wheels in .whl/; so can
# the gpu extra's liger-kernel and cut-cross-entropy (pure Python; they use the Triton that CUDA torch brings).
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-benchmarks/out/gpu_session}}
mkdir -p "$out"
py=${PYTHON:-python3}
deadline=$(($(date +%s) + ${DEADLINE_S:-540}))
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | tee "$out/session.log"

# step NAME LIMIT_S COMMAND...: output to $out/NAME.log, its tail and exit status to the session log.
step() {
    local name=$1 limit=$2 left started status
    shift 2
    left=$((deadline - $(date +%s)))
    ((left < limit)) && limit=$left
    if ((limit < 10)); then
        echo "=== $name: skipped, the session's deadline is near" | tee -a "$out/session.log"
        return
    fi
    started=$(date +%s)
    # SIGKILL 15 s after SIGTERM: the trainer answers SIGTERM only after its current step, and a first step
    # that is still compiling can take minutes.
    timeout -k 15 "$limit" "$@" >"$out/$name.log" 2>&1
    status=$?
    {
        echo "=== $name: exit $status after $(($(date +%s) - started)) s (limit $limit s)"
        tail -n 30 "$out/$name.log"
    } | tee -a "$out/session.log"
}

step build 60 env PRETRAIN_BUILD_CUDA=1 PRETRAIN_CUDA_ARCHS=90 "$py" setup.py -q build_ext --inplace
step test_gpu 80 "$py" -m pytest -q -p no:cacheprovider tests/cuda_ext/test_gpu.py \
    tests/model/test_attention.py::test_model_on_cuda_flex_and_dense_mask_agree_forward_and_backward \
    tests/model/test_moe.py::test_compiled_moe_model_matches_eager_with_each_routing_backend \
    tests/model/test_linear_cross_entropy.py::test_backends_on_cuda_match_the_plain_path
step train_gpu 240 "$py" benchmarks/train_gpu.py
step train_gpu_causal 60 "$py" benchmarks/train_gpu.py --presets base --modes compile --no-document-masking
step gpu_kernels 60 "$py" benchmarks/gpu_kernels.py --out "$out/gpu_kernels.json"
# Last, on what time is left: the loss without the logits (liger / cce when their wheels are in .whl/).
step train_gpu_fused_ce 60 "$py" benchmarks/train_gpu.py --presets base --modes compile --fused-cross-entropy auto
