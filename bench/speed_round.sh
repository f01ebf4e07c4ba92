#!/usr/bin/env bash
# Issue 70's three speed benches, one after the other, on a quiet machine (run it twice; each run is one round of
# records):
#   1. training: ours against sentence-transformers' MNRL recipe (bench.train_throughput --sections versus)
#   2. the STS suite against EmbeddingSimilarityEvaluator, equal scores (bench.eval_speed --our_batch_size 128)
#   3. each loss against the one-matmul floor, the plain calls included (bench.loss_overhead)
# Each bench writes its record (JSON and page) to bench/results/ under NAME_TAG, with the load average and CPU steal
# at its start in the record; this script adds `uptime` before and after each bench, and each bench's wall time, to
# bench/results/speed_round_TAG.log.
#
#   flock /tmp/simcse-cpu.lock bash bench/speed_round.sh round1      # then again with round2
#   bash bench/speed_round.sh round3 training sts                   # only the benches named (training, sts, losses)
#   bash bench/speed_round.sh --quick rehearsal                     # tiny settings: proves the script runs
set -euo pipefail
cd "$(dirname "$0")/.."

quick=()
if [[ "${1:-}" == "--quick" ]]; then
    quick=(--quick)
    shift
fi
tag="${1:?usage: bench/speed_round.sh [--quick] TAG [training] [sts] [losses]}"
shift
if [[ $# -gt 0 ]]; then benches=("$@"); else benches=(training sts losses); fi
for name in "${benches[@]}"; do
    [[ "$name" =~ ^(training|sts|losses)$ ]] || { echo "speed_round.sh: unknown bench '$name' (training, sts, losses)" >&2; exit 2; }
done
wanted() { [[ " ${benches[*]} " == *" $1 "* ]]; }
log="bench/results/speed_round_${tag}.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's simcse_hn, whatever is installed

run() {  # NAME COMMAND...: one bench, its load before and after and its wall time in the log
    local name="$1"
    shift
    echo "== ${name}: $*" | tee -a "$log"
    echo "before: $(uptime)" | tee -a "$log"
    local start=$SECONDS
    "$@"
    echo "after:  $(uptime) (${name}: $((SECONDS - start)) s)" | tee -a "$log"
}

echo "speed round ${tag}: commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty), $(date -u +%FT%TZ)" \
    | tee "$log"
echo "benches: ${benches[*]}" | tee -a "$log"
if wanted training; then
    run training python -m bench.train_throughput --sections versus "${quick[@]}" --name "train_throughput_versus_${tag}"
fi
if wanted sts; then
    run sts python -m bench.eval_speed --our_batch_size 128 "${quick[@]}" --output "bench/results/eval_speed_${tag}"
fi
if wanted losses && [[ ${#quick[@]} -gt 0 ]]; then
    run losses python -m bench.loss_overhead --quick --skip_train_step --name "loss_overhead_${tag}"
elif wanted losses; then
    run losses python -m bench.loss_overhead --name "loss_overhead_${tag}"
fi
echo "records: bench/results/{train_throughput_versus,eval_speed,loss_overhead}_${tag}.{json,md} (those run); log: ${log}" \
    | tee -a "$log"
