#!/usr/bin/env bash
# gpu-ab.sh — A/B of coti CUDA builds on a device machine: ROUNDS rounds of the 9B-shaped Q8_0
# decode (bench --spec off, 4 short code prompts) and the default model's off / mtp:2 decode
# (12 code prompts), the variants taking turns inside each round so that the machine's drift
# reaches them alike. Prints every run, then the median of each variant's runs.
#   scripts/gpu-ab.sh ROUNDS NAME=[VAR=VALUE,...]COTI [NAME=...]
# e.g. scripts/gpu-ab.sh 3 base=/tmp/coti-base new=/tmp/coti-new off=COTI_MV_WHOLE=0,/tmp/coti-new
# The 9B file is made once (/tmp/gpu-check-9b.gguf, the one gpu-check.sh makes, when present).
set -u
[ $# -ge 2 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
rounds=$1; shift
M9=/tmp/gpu-check-9b.gguf
first=${1#*=}; first=${first##*,}
[ -s "$M9" ] || "$first" mkmodel --arch qwen35 --shape 9b --type q8_0 --seed 1 -o "$M9" > /dev/null || exit 1
log=$(mktemp)
for r in $(seq "$rounds"); do
    for v in "$@"; do
        name=${v%%=*} spec=${v#*=}
        bin=${spec##*,} envs=()
        [ "$bin" != "$spec" ] && IFS=, read -r -a envs <<< "${spec%,*}"
        r9=$(env "${envs[@]}" "$bin" bench -m "$M9" --device cuda --spec off --prompts bench/prompts-short.json \
             -n 128 --repeat 2 2>&1 | awk '$1 == "off" {print $2}')
        rt=$(env "${envs[@]}" "$bin" bench --device cuda --spec off,mtp:2 --prompts bench/prompts-code.json \
             -n 128 --repeat 2 2>&1 | awk '$1 == "off" || $1 ~ /^mtp/ {printf "%s ", $2}')
        echo "round $r $name: 9B ${r9:-?} tiny off / mtp:2 ${rt:-? ?}"
        echo "$name ${r9:-nan} ${rt:-nan nan}" >> "$log"
    done
done
python3 - "$log" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, *vals = line.split()
    runs.setdefault(name, []).append([float(x) for x in vals[:3]])
print("median        9B   tiny off  tiny mtp:2")
for name, rs in runs.items():
    print(f"{name:8s} " + "  ".join(f"{statistics.median(c):8.1f}" for c in zip(*rs)))
PY
rm -f "$log"
