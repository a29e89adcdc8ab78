#!/bin/bash
# One time-limited training segment on the device machine (see training/README.md).
# Usage: bash training/device_train.sh MINUTES BUDGET_MINUTES
# Resumes from /tmp/ckpt when the machine still holds it, else from
# training/init (a carried HF checkpoint) when present, else from scratch.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.is_available())"
init=""
if [ ! -f /tmp/ckpt/state.pt ] && [ -f training/init/config.json ]; then init="--init training/init"; fi
python3 training/train.py --data training/data --ckpt /tmp/ckpt --out "$OUT" \
    --minutes "$1" --budget-minutes "$2" --steps 3000 $init 2>&1 | grep -v "falling back"
