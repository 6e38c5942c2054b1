#!/usr/bin/env bash
# The project's GPU checks (issue 18) in one call on a lent CUDA machine, e.g. through the
# device tool: run(command="bash tools/gpu_check.sh", carry=[".whl", ".gpucache"], timeout_s=540).
#
# The machine has no network: it runs the repository from its source folders with the
# machine's own python3 (torch, triton, transformers there), and installs what that lacks
# from wheels in .whl/ when the folder exists (pydantic and its three dependencies,
# math-verify, ...; docs/gpu.md lists them and the download command). Results: $OUT (or
# bench_results/) gpu_check.json and gpu_check.log. Extra arguments go to gpu_check.py
# (--smoke: toy sizes, runs on a CPU too).
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/rlpost-site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/rlpost-site${PYTHONPATH:+:$PYTHONPATH}"
fi
for src in kernels/src packages/*/src; do
    PYTHONPATH="$PWD/$src${PYTHONPATH:+:$PYTHONPATH}"
done
export PYTHONPATH PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# the tiny default base, built here beforehand and carried (building it there takes minutes):
# mkdir -p .gpucache/llm && cp -r ~/.cache/rlpost/llm/tiny-arithmetic-* .gpucache/llm/
[ -d .gpucache ] && export RLPOST_CACHE="$PWD/.gpucache"
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-bench_results}
mkdir -p "$OUT_DIR"
command -v nvidia-smi > /dev/null && nvidia-smi -L
"$PY" tools/gpu_check.py --out "$OUT_DIR/gpu_check.json" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
