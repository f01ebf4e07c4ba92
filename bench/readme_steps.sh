#!/bin/bash
# The README quick start's steps 2, 4 and 5 timed as written, with the STS data from ../shared/data/sts (a machine
# without the Hub), each a whole process, one after the other; run alone on the machine (nothing else running).
# Writes bench/results/readme_steps.md. Step 3 (the suite) is timed by pytest itself (its last line).
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/sts
work=$(mktemp -d)
out=bench/results/readme_steps.md
step() {
    local name=$1
    shift
    local start end
    start=$(date +%s.%N)
    "$@" >"$work/$name.log" 2>&1
    end=$(date +%s.%N)
    echo "| $name | $(python -c "print(f'{$end - $start:.1f}')") | $(cut -d' ' -f1 /proc/loadavg) |" >>"$out"
}
{
    echo "# The README's quick start, timed"
    echo
    echo "\`bash bench/readme_steps.sh\` at commit $(git rev-parse --short HEAD), $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%FT%TZ); 1-minute load average $(cut -d' ' -f1 /proc/loadavg) at the start (the steps use both cores themselves)."
    echo
    echo "| step | seconds | load average at its end |"
    echo "|---|---|---|"
} >"$out"
step "2: train.py (CLS)" python train.py --config configs/quickstart_minilm.yaml --eval_file $data/stsb.jsonl --output_dir "$work/quickstart_minilm"
step "4: eval/sts.py, two baselines" python eval/sts.py --model "$work/quickstart_minilm" --data_dir $data --baseline builtin:all-MiniLM-L6-v2 --baseline builtin:all-MiniLM-L6-v2:cls
step "5: train.py (mean pooling)" python train.py --config configs/quickstart_minilm_mean.yaml --eval_file $data/stsb.jsonl --output_dir "$work/quickstart_minilm_mean"
step "5: eval/sts.py, one baseline" python eval/sts.py --model "$work/quickstart_minilm_mean" --data_dir $data --baseline builtin:all-MiniLM-L6-v2
{
    echo
    echo "Scores as the steps printed them:"
    echo
    grep -h "STS-B dev Spearman x 100 of the saved model" "$work"/2*.log "$work"/5*train*.log | sed 's/.*INFO simcse_hn.train: /* /' | cut -d'(' -f1-3
    grep -h "^| quickstart" "$work"/4*.log "$work"/5*sts*.log | sed 's/^/    /'
} >>"$out"
rm -rf "$work"
cat "$out"
