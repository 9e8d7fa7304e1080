#!/usr/bin/env bash
# One prepared check of bertlab's CUDA path, for a lent GPU machine (bench/README.md, "GPU check").
#
#   on the GPU machine (the device tool's `run`, carry [".gpu"]):   bash bench/gpu_check.sh
#   a CPU dry run here, tiny sizes:   GPU_CHECK_DEVICE=cpu GPU_CHECK_TINY=1 OUT=/tmp/gpucheck-out bash bench/gpu_check.sh
#
# Needs .gpu/bundle.tar.xz (bench/gpu_prepare.sh, run here first). Runs bertlab from this source tree
# (PYTHONPATH, nothing installed) with the machine's own python, in this order, each step time-boxed and
# recorded whatever it returns (a failed step never stops the next):
#   tests      pytest -m cuda tests/test_cuda.py
#   sst2       bertlab finetune --task sst2 on every SST-2 training sentence: wall time, dev accuracy
#   qa         bertlab finetune --task qa (SQuAD articles, the recipe's epochs), under a time cap
#   bench_ft   bench/bench_finetune.py, BERT-base shape: bertlab against HF Trainer (bf16), same sentences
#   bench_pt   bench/bench_pretrain.py, MiniLM and BERT-base shapes: tokens/s, MFU against the GPU's bf16 peak,
#              and 3 profiled steps per variant (where a step's GPU time goes, kernel launches per step)
#   heads      bertlab train-default-heads continuing the shipped heads, as many steps as the time left allows
#              (at most HEADS_MAX_S), a new seed and lr 3e-4 as the shipped file's later continuations
#              (GPU_CHECK_HEADS_ARGS), the new heads file brought back in parts under 16 MiB
# GPU_CHECK_STEPS="qa heads" repeats only those steps (a rerun with the time left).
# Into $OUT (at most 8 files come back): log.txt, summary.json, junit.xml, bench_finetune.json,
# bench_pretrain.json, heads.json, heads.safetensors.part-00, -01. bench/gpu_results.py reads them here.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEVICE=${GPU_CHECK_DEVICE:-cuda}
TINY=${GPU_CHECK_TINY:-0}
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}  # the whole script; the run's timeout_s leaves room above it
HEADS_MAX_S=${GPU_CHECK_HEADS_MAX_S:-300}
CAP_SCALE=${GPU_CHECK_CAP_SCALE:-1}  # a CPU dry run on a busy machine: the steps' caps times this
STEPS_ON=" ${GPU_CHECK_STEPS:-tests sst2 qa bench_ft bench_pt heads} "  # a rerun can name the steps it repeats
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/out/gpu-check}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
: >"$WORK/steps.jsonl"
START=$(date +%s)

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false BERTLAB_DATA=$WORK/data BERTLAB_DEFAULT_MODEL_DIR=$WORK/minilm
export BERTLAB_MODELS=$WORK/models BERTLAB_TEST_DEVICE=$DEVICE GPU_CHECK_DEVICE=$DEVICE GPU_CHECK_TINY=$TINY
if [ "${GPU_CHECK_SIMULATE:-0}" = 1 ]; then  # a dry run: import as the GPU machine's python can (bench/gpu_sim)
  export PYTHONPATH="$ROOT/bench/gpu_sim:$PYTHONPATH"
fi

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME CAP_S CMD...: run CMD under `timeout` (at most CAP_S, at most the time left), its output into
# the log and its last line into $WORK/NAME.json; one line per step into steps.jsonl.
step() {
  local name=$1 cap=$2
  shift 2
  local l
  if [[ "$STEPS_ON" != *" $name "* ]]; then
    echo "{\"step\": \"$name\", \"rc\": null, \"skipped\": \"not asked\", \"wall_s\": 0}" >>"$WORK/steps.jsonl"
    return
  fi
  l=$(left)
  if [ "$l" -lt 20 ]; then
    say "$name: skipped, ${l}s left of ${BUDGET_S}s"
    echo "{\"step\": \"$name\", \"rc\": null, \"skipped\": \"time\", \"wall_s\": 0}" >>"$WORK/steps.jsonl"
    return
  fi
  cap=$((cap * CAP_SCALE))
  [ "$cap" -gt "$l" ] && cap=$l
  say "$name (at most ${cap}s): $*"
  local t0 rc
  t0=$(date +%s.%N)
  set -o pipefail
  timeout -k 10 "$cap" "$@" 2>>"$LOG" | tee -a "$LOG" >"$WORK/$name.out"
  rc=$?
  set +o pipefail
  local wall
  wall=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
  tail -n 1 "$WORK/$name.out" >"$WORK/$name.json"
  say "$name: exit $rc after ${wall}s"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"timed_out\": $([ $rc = 124 ] && echo true || echo false), \"cap_s\": $cap, \"wall_s\": $wall, \"command\": \"${*//\"/}\"}" >>"$WORK/steps.jsonl"
}

say "gpu check: device $DEVICE, tiny $TINY, budget ${BUDGET_S}s, python $($PY -c 'import sys;print(sys.version.split()[0])')"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true; } >>"$LOG"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" 2>&1 | tee -a "$LOG"
# python's tarfile, not tar -J: the machine need not have xz
if ! $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
    "$ROOT/.gpu/bundle.tar.xz" "$WORK" 2>>"$LOG"; then
  say "no .gpu/bundle.tar.xz: run bench/gpu_prepare.sh here first and carry .gpu"
  exit 2
fi
[ "$TINY" = 1 ] && $PY bench/gpu_bundle.py shrink "$WORK"

BERTLAB=("$PY" -m bertlab.cli)
# the benchmarks' variants; a rerun that asks one question gives other lists (GPU_CHECK_PT_VARIANTS,
# GPU_CHECK_FT_VARIANTS: e.g. bertlab-padded, bertlab-shuffled-padded for packing, bench/README.md)
read -r -a PT_VARIANTS <<<"${GPU_CHECK_PT_VARIANTS:-hf bertlab bertlab-lean bertlab-full-head}"
read -r -a FT_VARIANTS <<<"${GPU_CHECK_FT_VARIANTS:-bertlab hf-grouped-bf16 hf}"
if [ "$TINY" = 1 ]; then
  FT_SIZE=(--max-train-examples 64 --max-eval-examples 32 --epochs 1 --batch-size 16)
  SST2=(--max-length 32) QA=(--max-length 96 --doc-stride 32)
  BENCH_FT=(--presets tiny --examples 64 --warmup 1 --rounds 1 --batch 16)
  BENCH_PT=(--presets tiny --batch 2 --seq 32 --steps 2 --warmup 1 --profile 1 --variants "${PT_VARIANTS[@]}")
else
  FT_SIZE=() SST2=() QA=()
  BENCH_FT=(--presets base --examples "${GPU_CHECK_FT_EXAMPLES:-9600}" --warmup 20 --rounds 1 --batch 32
    --no-count-work)  # counting would train each variant once more: the step has 180 s
  BENCH_PT=(--presets minilm base --profile "${GPU_CHECK_PT_PROFILE:-3}" --variants "${PT_VARIANTS[@]}")
fi

# 1. the CUDA tests
step tests 150 "$PY" -m pytest -m cuda tests/test_cuda.py -q -p no:cacheprovider --junitxml="$OUT/junit.xml"

# 2. fine-tunes from the offline default (the bundle carries its embeddings; see bench/gpu_bundle.py)
step sst2 180 "${BERTLAB[@]}" finetune --task sst2 --device "$DEVICE" --model default --out "$WORK/runs/sst2" \
  --no-progress "${FT_SIZE[@]}" "${SST2[@]}"
step qa 150 "${BERTLAB[@]}" finetune --task qa --device "$DEVICE" --model default --out "$WORK/runs/qa" \
  --no-progress "${FT_SIZE[@]}" "${QA[@]}"

# 3. the speed benchmarks (their own JSON files, the same schema as bench/results/)
step bench_ft 180 "$PY" bench/bench_finetune.py --device "$DEVICE" --variants "${FT_VARIANTS[@]}" \
  "${BENCH_FT[@]}" --out "$OUT/bench_finetune.json"
step bench_pt 120 "$PY" bench/bench_pretrain.py --device "$DEVICE" "${BENCH_PT[@]}" --out "$OUT/bench_pretrain.json"

# 4. with the time left: continue the default's heads, as many steps as fit
HEADS_S=$(left)
[ "$HEADS_S" -gt "$HEADS_MAX_S" ] && HEADS_S=$HEADS_MAX_S
HEADS_S=$((HEADS_S - 15))
if [ "$TINY" = 1 ]; then STEPS=4; else STEPS=$($PY bench/gpu_bundle.py heads-steps "$OUT/bench_pretrain.json" "$HEADS_S"); fi
if [[ "$STEPS_ON" != *" heads "* ]]; then
  STEPS=0
fi
if [ "${STEPS:-0}" -gt 0 ]; then
  PREC=bf16
  [ "$DEVICE" = cpu ] && PREC=auto
  step heads "$HEADS_S" "${BERTLAB[@]}" train-default-heads --device "$DEVICE" --precision "$PREC" \
    --init-heads bertlab/assets/default_heads.safetensors --corpus "$WORK/corpus/wiki-offline.jsonl" \
    --steps "$STEPS" --out "$WORK/heads/default_heads.safetensors" ${GPU_CHECK_HEADS_ARGS:---seed 15 --lr 3e-4}
  if [ -f "$WORK/heads/default_heads.safetensors" ]; then
    split -b 15M -d -a 2 "$WORK/heads/default_heads.safetensors" "$OUT/heads.safetensors.part-"
    # the figures come after the file: a step stopped by its cap still brings the heads back, without them
    [ -f "$WORK/heads/default_heads.json" ] && cp "$WORK/heads/default_heads.json" "$OUT/heads.json"
  fi
elif [[ "$STEPS_ON" == *" heads "* ]]; then
  say "heads: skipped, ${HEADS_S}s left is too little"
  echo "{\"step\": \"heads\", \"rc\": null, \"skipped\": \"time\", \"wall_s\": 0}" >>"$WORK/steps.jsonl"
fi

$PY bench/gpu_bundle.py summarize "$WORK" "$OUT" 2>>"$LOG" || say "summary failed"
say "done in $(($(date +%s) - START))s; files in $OUT:"
ls -l "$OUT" | tee -a "$LOG"
rm -rf "$WORK"
