#!/usr/bin/env bash
# FSDP and DeepSpeed ZeRO-2/3 on this machine's GPUs (1, and 2 when present), tiny and BERT-base-shaped encoders,
# every saved folder checked: bench/gpu_scale.py says what runs and what is checked.
#   bash bench/gpu_scale.sh            # results: bench/results/gpu_scale.{json,md}; exit 1 if any check failed
#   bash bench/gpu_scale.sh --quick    # tiny model, 1 GPU
# Runs on a fresh GPU machine with this checkout and PyPI: installs the package with its LoRA extra and DeepSpeed
# (DS_BUILD_OPS=0: nothing compiled ahead; the Trainer's own torch AdamW needs no DeepSpeed kernel). torch comes
# from PyPI too unless one is installed (PyPI's Linux wheels are CUDA builds). SKIP_INSTALL=1 skips the installs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  "$PYTHON" -m pip install -q -e ".[lora]"
  DS_BUILD_OPS=0 "$PYTHON" -m pip install -q deepspeed
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false   # everything is built in code or bundled
"$PYTHON" -c "import torch, deepspeed; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.__version__, deepspeed.__version__, torch.cuda.device_count(), 'GPU(s)')"
exec "$PYTHON" -m bench.gpu_scale "$@"
