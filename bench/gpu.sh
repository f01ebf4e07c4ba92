#!/usr/bin/env bash
# The speed checks of issues 15 and 57 on a fresh GPU machine, in under 8 minutes: bench/gpu.py says what runs.
#   python -m bench.minilm_bf16      # before, where the pip package is: .device/minilm_bf16 (44 MiB), to carry
#   bash bench/gpu.sh                # results: $OUT/gpu.{json,md} (else bench/results/gpu/), eval_speed_gpu.*
#   python -m bench.gpu --cpu_check --out /tmp/gpu_check   # the same script on a CPU, tiny sizes
# Installs this checkout (pip install -e .; torch is assumed present); where pip cannot (no index), the scripts run
# from the checkout anyway (PYTHONPATH is the checkout). SKIP_INSTALL=1 skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  "$PYTHON" -m pip install -q -e . || "$PYTHON" -m pip install -q --no-build-isolation --no-deps -e . \
    || echo "pip install failed: running from the checkout" >&2
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -f .device/minilm_bf16/model.safetensors ] || echo "no .device/minilm_bf16: all-MiniLM-L6-v2 is left out" \
  "unless its pip package is installed (python -m bench.minilm_bf16 where it is, and carry .device)" >&2
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print('torch', torch.__version__, torch.cuda.device_count(), 'GPU(s):', torch.cuda.get_device_name(0))"
exec timeout 470 "$PYTHON" -m bench.gpu --out "${OUT:-bench/results/gpu}" "$@"
