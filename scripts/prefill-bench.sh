#!/usr/bin/env bash
# prefill-bench.sh — issue 28's measurement in one run: coti's prompt processing of 512 and 4096
# random tokens (`coti bench --prefill`, warm medians) for the tiny model and the 9B shape in
# Q8_0 and Q4_K, where a 512-token prefill's time goes (`--op-cost --prefill 512`), and, when
# LLAMA_BENCH names a llama-bench binary, llama.cpp's pp512 / pp4096 on the same files (flash
# attention on), with coti / llama.cpp per size.
#   scripts/prefill-bench.sh COTI [OUT_DIR]
# DEVICE (cuda) picks coti's backend; REPEAT (3) the runs per measurement; MODELS (the tiny
# model, then 9b q8_0 and q4_K written to /tmp when missing) the files.
set -u
C=$1 O=${2:-${OUT:-/tmp/prefill-bench}}
DEV=${DEVICE:-cuda} R=${REPEAT:-3}
mkdir -p "$O"
MODELS=${MODELS:-"models/coti-tiny-qwen35-mtp-q8_0.gguf /tmp/prefill-9b-q8_0.gguf /tmp/prefill-9b-q4_K.gguf"}
for m in $MODELS; do # the 9B shapes are written when missing
    case "$m" in
    /tmp/prefill-9b-*.gguf)
        t=${m#/tmp/prefill-9b-}; t=${t%.gguf}
        [ -s "$m" ] || "$C" mkmodel --arch qwen35 --shape 9b --type "$t" --seed 1 -o "$m" > "$O/mkmodel-$t.txt" 2>&1 ||
            { tail -1 "$O/mkmodel-$t.txt"; exit 1; } ;;
    esac
done
for m in $MODELS; do
    name=$(basename "$m" .gguf)
    echo "---- $name"
    "$C" bench -m "$m" --device "$DEV" --prefill 512,4096 --repeat "$R" 2> /dev/null | tee "$O/coti-$name.txt" | grep -E '^(512|4096) '
    "$C" bench -m "$m" --device "$DEV" --op-cost --prefill 512 --repeat 2 2> /dev/null > "$O/opcost-$name.txt"
    grep -E '^(nothing|matmul|attention|delta-net)' "$O/opcost-$name.txt"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        "$LLAMA_BENCH" -m "$m" -ngl 99 -fa 1 -p 512,4096 -n 0 -r "$R" -o csv 2> /dev/null > "$O/llama-$name.csv"
        python3 - "$O/coti-$name.txt" "$O/llama-$name.csv" <<'PY'
import csv, sys
coti = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 3 and f[0].isdigit():
        coti[int(f[0])] = float(f[2])
for row in csv.DictReader(open(sys.argv[2])):
    n, ts, sd = int(row['n_prompt']), float(row['avg_ts']), float(row['stddev_ts'])
    if n in coti:
        print(f"pp{n}: coti {coti[n]:.1f}  llama.cpp {ts:.1f} +- {sd:.1f}  ratio {coti[n] / ts:.2f}")
PY
    fi
done
