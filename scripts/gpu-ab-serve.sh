#!/usr/bin/env bash
# gpu-ab-serve.sh — two `coti serve` builds side by side on a device machine: specbench paired
# runs (A = the first build, B = the second, alternating request by request, --fresh) on the
# default model's 12 code prompts, speculation off and mtp, ROUNDS repeats each. Prints each
# configuration's mean decode tok/s over every measured request and the per-request B/A ratios.
#   scripts/gpu-ab-serve.sh A_COTI B_COTI [ROUNDS (3)] [SPECBENCH (../shared/tools/specbench/specbench.py)]
set -u
[ $# -ge 2 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
A=$1 B=$2 R=${3:-3} H=${4:-../shared/tools/specbench/specbench.py}
P=bench/prompts-code.json
for spec in off mtp; do
    out=$(mktemp)
    python3 "$H" paired --a-label A --b-label B --a-cmd "$A serve --device cuda --spec $spec" --b-cmd "$B serve --device cuda --spec $spec" \
        --prompts "$P" --endpoint completion --fresh --max-tokens 128 --ignore-eos --repeats "$R" --warmup 1 \
        --out "$out" > /dev/null 2>&1
    python3 - "$out" "$spec" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a, b = (d["configs"][k]["summary"]["all"] for k in ("A", "B"))
r = d["paired"]["decode_tps_ratio"]
print(f"{sys.argv[2]:4s} A {a['mean_decode_tps']:8.1f}  B {b['mean_decode_tps']:8.1f} tok/s  accept A {a['accept']} B {b['accept']}  "
      f"B/A per request: {r}")
PY
    rm -f "$out"
done
