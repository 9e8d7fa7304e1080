#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs on the GPU machine into .gpu/ (ignored by git; the run carries it):
# the SST-2, SQuAD and WikiText-2 copies from BERTLAB_DATA, the offline default's tokenizer and embeddings
# (float16), and the heads recipe's corpus split as bertlab splits it. See bench/gpu_bundle.py for what and
# why, and bench/README.md ("GPU check") for the run.
#
#     BERTLAB_DATA=../shared/data bash bench/gpu_prepare.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
: "${BERTLAB_DATA:?set BERTLAB_DATA to the shared data folder (sst2, squad, wikitext2), e.g. ../shared/data}"
cd "$ROOT"
rm -rf .gpu
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" bench/gpu_bundle.py pack --dest .gpu
ls -l .gpu
