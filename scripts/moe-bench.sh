#!/usr/bin/env bash
# moe-bench.sh — issue 22's H200 measurements of a qwen35moe file in one run: coti's decode
# (off, n-gram, MTP; again on bench/prompts-repeat.json, prompts that repeat themselves, where
# a trained model's continuation does: issue 22's on/off with acceptance), the verify cost of
# 1..5 rows beside the weight bytes each reads (`coti bench --verify-cost`), and, when
# LLAMA_BENCH names a llama-bench binary, llama.cpp's tg128 and pp1..pp5 on the same file
# (flash attention on).
#   scripts/moe-bench.sh COTI [MODEL (written when missing: 35b-a3b Q4_K)] [OUT_DIR]
# DEVICE (cuda) picks coti's backend; REPEAT (3) the runs per measurement.
set -u
C=$1 M=${2:-/tmp/moe-35b-a3b-q4_K.gguf} O=${3:-${OUT:-/tmp/moe-bench}}
DEV=${DEVICE:-cuda} R=${REPEAT:-3}
mkdir -p "$O"
if [ ! -s "$M" ]; then
    "$C" mkmodel --arch qwen35moe --shape 35b-a3b --type q4_K -o "$M" > "$O/mkmodel.txt" 2>&1 || { tail -1 "$O/mkmodel.txt"; exit 1; }
fi
"$C" bench -m "$M" --device "$DEV" --verify-cost 5 --repeat 10 2> /dev/null | tee "$O/verify-cost.txt"
"$C" bench -m "$M" --device "$DEV" --spec off,ngram:3,mtp:1 --prompts bench/prompts-short.json -n 128 --repeat "$R" \
    > "$O/bench.txt" 2>&1
grep -E '^(#|off|ngram|mtp)' "$O/bench.txt" | cut -c1-110
"$C" bench -m "$M" --device "$DEV" --spec off,ngram:3,mtp:3 --prompts bench/prompts-repeat.json -n 128 --repeat "$R" \
    > "$O/bench-repeat.txt" 2>&1
grep -E '^(#|off|ngram|mtp)' "$O/bench-repeat.txt" | cut -c1-150
if [ -n "${LLAMA_BENCH:-}" ]; then
    "$LLAMA_BENCH" -m "$M" -ngl 99 -fa 1 -p 0 -n 128 -r "$R" -o md 2>&1 | grep -E 'tg128' | tee "$O/llama-tg.txt"
    "$LLAMA_BENCH" -m "$M" -ngl 99 -fa 1 -p 1,2,3,4,5 -n 0 -r 5 -o md 2>&1 | grep -E ' pp[0-9]' | tee "$O/llama-pp.txt"
fi
