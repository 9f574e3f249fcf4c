#!/usr/bin/env bash
# greedy-md5.sh — the behaviour fingerprint a refactor must keep: for each speculation mode, the
# md5 of the greedy outputs of every prompt of a prompts file (n tokens each), one line per mode.
# Run it before and after a change (same model, device) and diff the two outputs.
#   scripts/greedy-md5.sh [COTI (./coti)] [DEVICE (cpu)] [PROMPTS (bench/prompts-code.json)] [N (128)]
set -eu
C=${1:-./coti} D=${2:-cpu} P=${3:-bench/prompts-code.json} N=${4:-128}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$P" "$dir" <<'PY'
import json, sys
for i, p in enumerate(json.load(open(sys.argv[1]))):
    open(f"{sys.argv[2]}/{i:03d}.txt", "w").write(p if isinstance(p, str) else p["prompt"])
PY
for spec in off "mtp --spec-n-max 1" "mtp --spec-n-max 2" "mtp --spec-n-max 3" ngram; do
    h=$(for f in "$dir"/*.txt; do
            # shellcheck disable=SC2086
            "$C" run --device "$D" -f "$f" -n "$N" --spec $spec 2>/dev/null
        done | md5sum | cut -d' ' -f1)
    echo "$spec: $h"
done
