#!/usr/bin/env bash
# kv-depth.sh — decode speed at deep context positions per KV cache type (issue 23): coti
# `bench --depth D` (off and mtp, greedy, 128 tokens after D random tokens and the prompt) beside
# llama-bench `-d D -n 128` (flash attention on, which its quantized caches need) on the same
# file, when LLAMA_BENCH names a llama-bench binary. One line per (cache type, depth); the
# quantized types' cost is read against f16 at the same depth.
#   scripts/kv-depth.sh COTI MODEL [DEPTHS (4096,32768)] [TYPES (f16,q8_0,q4_0,q8_0/q4_0)] [OUT_DIR]
# DEVICE (cuda) picks coti's backend; REPEAT (3) the runs per measurement.
set -u
C=$1 M=$2 DEPTHS=${3:-4096,32768} TYPES=${4:-f16,q8_0,q4_0,q8_0/q4_0} O=${5:-${OUT:-/tmp/kv-depth}}
DEV=${DEVICE:-cuda} R=${REPEAT:-3}
mkdir -p "$O"
printf '["def fib(n):\\n", "The capital of France is"]' > "$O/prompts.json"
printf '%-10s %7s %12s %12s %8s %14s %10s\n' "K/V" depth "coti off" "coti mtp" "mtp/off" "llama.cpp tg" "coti/llama"
for d in ${DEPTHS//,/ }; do
    for t in ${TYPES//,/ }; do
        k=${t%/*} v=${t#*/}
        f="$O/coti-$k-$v-$d.json"
        "$C" bench -m "$M" --device "$DEV" --depth "$d" -c $((d + 1024)) -ctk "$k" -ctv "$v" --spec off,mtp \
            --prompts "$O/prompts.json" -n 128 --repeat "$R" --json "$f" > "$O/coti-$k-$v-$d.txt" 2>&1
        l="$O/llama-$k-$v-$d.json"
        if [ -n "${LLAMA_BENCH:-}" ]; then
            timeout 300 "$LLAMA_BENCH" -m "$M" -ngl 99 -fa 1 -ctk "$k" -ctv "$v" -d "$d" -p 0 -n 128 -r "$R" -o json \
                > "$l" 2> "$O/llama-$k-$v-$d.err"
        fi
        python3 - "$f" "$l" "$k/$v" "$d" <<'PY'
import json, sys
def load(p):
    try: return json.load(open(p))
    except Exception: return None
c, l = load(sys.argv[1]), load(sys.argv[2])
tps = {x['config']: x['tok_per_s_median'] for x in c['configs']} if c else {}
off, mtp = tps.get('off', 0.0), next((v for k, v in tps.items() if k.startswith('mtp')), 0.0)
lt = l[0]['avg_ts'] if l else 0.0
print('%-10s %7s %12.1f %12.1f %8.3f %14.1f %10s' % (sys.argv[3], sys.argv[4], off, mtp, mtp / off if off else 0,
      lt, '%.3f' % (off / lt) if lt else '-'))
PY
    done
done
