#!/usr/bin/env bash
# cli.sh — end-to-end checks of the coti command on the shipped model and generated ones:
# each check runs a real subcommand and asserts on its exit code and output.
# Usage: bash tests/cli.sh path/to/coti     (run from the repository root)
set -u
COTI=${1:-./coti}
MODEL=models/coti-tiny-qwen35-mtp-q8_0.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

check() { # name, then a command that must succeed
    local name=$1; shift
    if "$@" >"$TMP/out" 2>"$TMP/err"; then pass=$((pass + 1)); echo "ok   $name"
    else fail=$((fail + 1)); echo "FAIL $name"; tail -n 5 "$TMP/err" "$TMP/out"; fi
}

gguf_lists_model() { "$COTI" gguf "$MODEL" | grep -q 'qwen35'; }
check "coti gguf prints the architecture" gguf_lists_model

run_generates() {
    "$COTI" run -p $'#include <stdio.h>\nint main(void)\n{\n' -n 24 -t 1 > "$TMP/run.txt" 2> "$TMP/run.err" &&
    [ "$(wc -c < "$TMP/run.txt")" -gt 40 ] && grep -q 'decode 24 tokens' "$TMP/run.err"
}
check "coti run generates and reports speed" run_generates

spec_outputs_equal() {
    local p=$'static int foo(struct device *dev)\n{\n'
    "$COTI" run -p "$p" -n 48 -t 1 --spec off > "$TMP/off.txt" 2>/dev/null &&
    "$COTI" run -p "$p" -n 48 -t 1 --spec mtp --spec-n-max 3 > "$TMP/mtp.txt" 2>/dev/null &&
    "$COTI" run -p "$p" -n 48 -t 1 --spec ngram > "$TMP/ngram.txt" 2>/dev/null &&
    cmp -s "$TMP/off.txt" "$TMP/mtp.txt" && cmp -s "$TMP/off.txt" "$TMP/ngram.txt"
}
check "coti run: greedy text identical with --spec off, mtp, ngram" spec_outputs_equal

equiv_passes() { "$COTI" equiv --spec mtp --prompts tests/data-prompts.json -n 16 -t 1 | grep -q 'real disagreements 0'; }
check "coti equiv: 0 real disagreements on the default model" equiv_passes

equiv_grammar_passes() {
    "$COTI" equiv --spec mtp --prompts tests/data-prompts.json -n 32 -t 1 --grammar-file grammars/json.gbnf > "$TMP/eqg.txt" &&
    grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' "$TMP/eqg.txt"
}
check "coti equiv --grammar-file: 0 real disagreements, delta 0, grammar on both sides" equiv_grammar_passes

grammar_run_matches() {
    local g='root ::= "{\"id\": " [1-9] [0-9]{0,3} ", \"tags\": [" ("\"" [a-z]{1,8} "\"" (", \"" [a-z]{1,8} "\""){0,2})? "]}"'
    "$COTI" run -p 'A record:' -n 64 -t 1 --spec off --grammar "$g" > "$TMP/g-off.txt" 2>/dev/null &&
    "$COTI" run -p 'A record:' -n 64 -t 1 --spec mtp --grammar "$g" > "$TMP/g-mtp.txt" 2>/dev/null &&
    cmp -s "$TMP/g-off.txt" "$TMP/g-mtp.txt" &&
    grep -Eq '^A record:\{"id": [1-9][0-9]{0,3}, "tags": \[("[a-z]{1,8}"(, "[a-z]{1,8}"){0,2})?\]\}$' "$TMP/g-off.txt" &&
    "$COTI" run -p 'A person:' -n 64 -t 1 --spec mtp --json-schema '{"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]}' \
        > "$TMP/js.txt" 2>/dev/null &&
    sed 's/^A person://' "$TMP/js.txt" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert set(d)=={"age"} and type(d["age"]) is int'
}
check "coti run --grammar / --json-schema: output in the grammar, identical with --spec off and mtp" grammar_run_matches

grammar_errors_are_clear() {
    ! "$COTI" run -p x -t 1 --grammar 'root ::= "a" bad' 2> "$TMP/ge.txt" && grep -q "1:14: undefined rule 'bad'" "$TMP/ge.txt" &&
    ! "$COTI" run -p x -t 1 --json-schema '{"type":"string","format":"date"}' 2> "$TMP/ge.txt" && grep -q "unsupported keyword 'format'" "$TMP/ge.txt"
}
check "coti run: a bad grammar or schema is a clear error" grammar_errors_are_clear

equiv_flags_injected() {
    "$COTI" equiv --spec mtp -p 'int main(int argc' -n 16 -t 1 --inject-divergence 4 > "$TMP/inj.txt" 2>/dev/null
    [ $? -eq 1 ] && grep -q 'real disagreements 1' "$TMP/inj.txt"
}
check "coti equiv flags an injected divergence (exit 1)" equiv_flags_injected

# the speculative pass over a batch of sequences (spec_step_batch, as serve steps its slots):
# every verify row of every sequence equals plain decoding (delta 0), and a divergence is caught
equiv_batched() {
    for spec in "mtp --spec-n-max 3" "ngram"; do
        # shellcheck disable=SC2086
        "$COTI" equiv --spec $spec --prompts tests/data-prompts.json -n 24 -t 2 --parallel 4 2>/dev/null |
            grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
    "$COTI" equiv --spec mtp --prompts tests/data-prompts.json -n 16 -t 2 --parallel 3 --inject-divergence 4 > /dev/null 2>&1
    [ $? -eq 1 ]
}
check "coti equiv --parallel: batched verify rows equal plain decoding; divergence caught" equiv_batched

# tensor parallelism on the CPU (issue 25 step 2): 2 ranks in one process, each with its share of
# the heads and widths, all-reduced after the split matmuls; the speculative cycle over them
tensor_parallel_ranks() {
    local p=$'static int foo(struct device *dev)\n{\n'
    "$COTI" run -p "$p" -n 48 -t 2 > "$TMP/tp1.txt" 2>/dev/null &&
    "$COTI" run -p "$p" -n 48 -t 2 -tp 2 > "$TMP/tp2.txt" 2> "$TMP/tp2.err" &&
    "$COTI" run -p "$p" -n 48 -t 2 --tensor-parallel-size 2 --spec mtp > "$TMP/tp2m.txt" 2>/dev/null &&
    cmp -s "$TMP/tp1.txt" "$TMP/tp2.txt" && cmp -s "$TMP/tp1.txt" "$TMP/tp2m.txt" && grep -q 'split into 2 ranks' "$TMP/tp2.err" || return 1
    for par in 1 3; do
        "$COTI" equiv -tp 2 --spec mtp --spec-n-max 3 --prompts tests/data-prompts.json -n 16 -t 2 --parallel $par 2>/dev/null |
            grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
    ! "$COTI" run -p x -n 4 -tp 4 2> "$TMP/tp4.err" > /dev/null && grep -q 'do not divide' "$TMP/tp4.err" &&
    ! "$COTI" run -p x -n 4 -tp 9 2> /dev/null > /dev/null
}
check "coti run / equiv -tp 2: the whole model's text, speculation lossless over ranks; bad splits refused" tensor_parallel_ranks

equiv_random_models() {
    for t in q8_0 q4_0 f16; do
        "$COTI" mkmodel --arch qwen35 -o "$TMP/r-$t.gguf" --type "$t" --seed 3 >/dev/null 2>&1 || return 1
        "$COTI" equiv -m "$TMP/r-$t.gguf" --spec mtp --spec-n-max 4 -p 'hello world, hello world, hello' -n 24 -t 1 | grep -q 'real disagreements 0' || return 1
        "$COTI" equiv -m "$TMP/r-$t.gguf" --spec ngram -p 'abc abc abc abc' -n 24 -t 1 | grep -q 'real disagreements 0' || return 1
    done
}
check "coti equiv: 0 real disagreements on random q8_0/q4_0/f16 models" equiv_random_models

# qwen35moe: verify rows share their experts' matmuls; each must equal the decode row (n_max 1..4)
equiv_random_moe_models() {
    # q4_K 256 wide: the K-quants need rows of 256 (at the default 64 a q4_K file is q8_0)
    for t in q8_0 q4_0 f16 q4_K; do
        w=""
        [ "$t" = q4_K ] && w="--n-embd 256 --n-ff-exp 256 --n-ff-shexp 256"
        # shellcheck disable=SC2086
        "$COTI" mkmodel --arch qwen35moe -o "$TMP/m-$t.gguf" --type "$t" $w --seed 5 >/dev/null 2>&1 || return 1
        "$COTI" gguf "$TMP/m-$t.gguf" | grep -q " $t " || return 1 # the type was written, not a fallback
        for n in 1 2 3 4; do
            "$COTI" equiv -m "$TMP/m-$t.gguf" --spec mtp --spec-n-max "$n" -p 'hello world, hello world, hello' -n 24 -t 2 |
                grep -q 'real disagreements 0' || return 1
        done
    done
}
check "coti equiv: 0 real disagreements on random qwen35moe models, n_max 1..4" equiv_random_moe_models
# quantized KV caches (-ctk / -ctv, K and V alike or not): a verify's rows are stored as plain
# decoding stores them, so speculation stays lossless at every draft length; the load summary
# names the types and their bytes per token; a type coti has no cache of is refused by name.
equiv_quantized_kv() {
    local p=$'static int foo(struct device *dev)\n{\n'
    for kv in "q8_0 q8_0" "q4_0 q4_0" "q8_0 q4_0"; do
        set -- $kv
        for n in 1 2 3 4; do
            "$COTI" equiv --spec mtp --spec-n-max $n -p "$p" -n 32 -t 1 -c 256 -ctk $1 -ctv $2 2>/dev/null |
                grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
        done
    done
    "$COTI" run -p x -n 1 -t 1 -c 256 --cache-type-k q8_0 --cache-type-v=q4_0 2>&1 >/dev/null |
        grep -q 'KV K q8_0 [0-9.]* MiB = 408 B/token, V q4_0 [0-9.]* MiB = 216 B/token' || return 1
    "$COTI" run -p x -n 1 -ctv q5_1 2>"$TMP/ctv.err"; [ $? -ne 0 ] && grep -q -- '--ctv expects f16|bf16|q8_0|q4_0' "$TMP/ctv.err"
}
check "-ctk/-ctv q8_0, q4_0, q8_0/q4_0: equiv Δ 0 at mtp n_max 1-4; summary and bad type" equiv_quantized_kv

bench_runs() {
    printf '["int main(void)\\n{\\n", {"prompt": "static void f(int x)\\n{\\n"}]' > "$TMP/p.json"
    "$COTI" bench --spec off,mtp:2,ngram --prompts "$TMP/p.json" -n 24 --repeat 1 -t 1 --json "$TMP/b.json" > "$TMP/b.txt" &&
    python3 -c "
import json,sys
b=json.load(open('$TMP/b.json'))
c=b['configs']
assert [x['config'] for x in c]==['off','mtp:2','ngram:3'], c
assert all(x['output_equals_first'] for x in c), 'outputs differ'
assert c[1]['drafted']>0 and 0<=c[1]['accepted']<=c[1]['drafted']
"
}
check "coti bench: configurations side by side, same outputs, JSON" bench_runs

bench_op_cost() {
    printf '["int main(void)\\n{\\n"]' > "$TMP/p1.json"
    "$COTI" bench --op-cost --prompts "$TMP/p1.json" -n 8 --repeat 1 -t 1 > "$TMP/oc.txt" || return 1
    for f in 'nothing' 'matmul, <= n_in outputs' 'matmul, wider' 'matmul, LM head' 'norms' 'attention' \
             'rope, kv store, gate' 'delta-net' 'add, swiglu' 'embedding rows' 'argmax, accept'; do
        grep -q "^$f  " "$TMP/oc.txt" || { echo "no row '$f'" >&2; return 1; }
    done
    # a speculative configuration too (its verify rolls back through every backend member)
    "$COTI" bench --op-cost --spec mtp:2 --prompts "$TMP/p1.json" -n 8 --repeat 1 -t 1 > "$TMP/oc2.txt" || return 1
    grep -q "^nothing  " "$TMP/oc2.txt" || { echo "no row 'nothing' with --spec mtp:2" >&2; return 1; }
    # one configuration only; a plain bench afterwards is unaffected
    ! "$COTI" bench --op-cost --spec off,mtp --prompts "$TMP/p1.json" -n 8 --repeat 1 -t 1 2>/dev/null || return 1
    # a prefill's costs: one size; its delta-net and attention ops go through the families
    # (counted calls, not times: a share is a timing, noise on a busy 2-core machine)
    "$COTI" bench --op-cost --prefill 24 --repeat 1 -t 1 > "$TMP/oc3.txt" 2>/dev/null || return 1
    grep -q "^# op cost | prefill of 24 random tokens" "$TMP/oc3.txt" || { echo "no prefill header" >&2; return 1; }
    awk '/^(delta-net|attention) / && $NF + 0 > 0 { n++ } END { exit n != 2 }' "$TMP/oc3.txt" ||
        { echo "no delta-net or attention calls in a prefill" >&2; return 1; }
    ! "$COTI" bench --op-cost --prefill 8,16 --repeat 1 -t 1 2>/dev/null || return 1
    # a verify's costs: a 1-row and a 3-row forward, each with a row per family; K >= 2
    "$COTI" bench --verify-cost 3 --op-cost --repeat 1 -t 1 > "$TMP/oc4.txt" 2>/dev/null || return 1
    for n in '1 row' '3 rows'; do
        awk -v h="# op cost | a forward of $n |" 'index($0, h) == 1 { on = 1; next } /^# op cost/ { on = 0 }
             on && /^(nothing|delta-net|attention) / { rows++ } END { exit rows == 3 ? 0 : 1 }' "$TMP/oc4.txt" ||
            { echo "no op cost table of a forward of $n" >&2; return 1; }
    done
    ! "$COTI" bench --verify-cost 1 --op-cost --repeat 1 -t 1 2>/dev/null
}
check "coti bench --op-cost: a row per op family; one configuration, prefill size or verify" bench_op_cost

logits_json() {
    "$COTI" logits --tokens 1,200,300,400 --top 5 --json > "$TMP/l.json" &&
    "$COTI" logits --tokens 1,200,300,400 --top 5 --json --mtp > "$TMP/lm.json" &&
    python3 -c "
import json,math
for f in ['$TMP/l.json','$TMP/lm.json']:
    r=json.load(open(f))['rows']
    assert len(r)==4 and all(len(x['top'])==5 for x in r)
    for x in r:
        lp=[t[1] for t in x['top']]
        assert lp==sorted(lp,reverse=True) and lp[0]<=0 and sum(math.exp(v) for v in lp)<=1.0001
"
}
check "coti logits: main and NextN heads as JSON" logits_json

# the NextN head's chained rows (--draft-step K): from position K-1, fed the head's own hidden;
# the chain is dropped from the head's cache after each start, so step 1 rows equal --mtp's
logits_nextn_chain() {
    local ids=1,200,300,400,500,600,700
    "$COTI" logits --tokens $ids --top 5 --json --mtp -t 1 > "$TMP/lcm.json" &&
    "$COTI" logits --tokens $ids --top 5 --json --mtp --draft-step 1 -t 1 > "$TMP/lc1.json" &&
    "$COTI" logits --tokens $ids --top 5 --json --mtp --draft-step 3 -t 1 > "$TMP/lc3.json" &&
    python3 -c "
import json, sys
m, c1, c3 = (json.load(open(f))['rows'] for f in sys.argv[1:4])
assert c1 == m, 'step 1 is the batched rows'
assert [r['pos'] for r in c3] == list(range(2, 7)) and [r['token'] for r in c3] == [300, 400, 500, 600, 700]
assert all(a['top'] != b['top'] for a, b in zip(c3, m[2:])), 'chained rows equal the teacher-forced ones'
" "$TMP/lcm.json" "$TMP/lc1.json" "$TMP/lc3.json"
}
check "coti logits --mtp --draft-step K: the NextN head's chained rows" logits_nextn_chain

bad_inputs_fail_cleanly() {
    "$COTI" run -m /nonexistent.gguf -p x -n 2 2>"$TMP/e1"; [ $? -eq 1 ] && grep -qi 'error' "$TMP/e1" || return 1
    head -c 100000 "$MODEL" > "$TMP/trunc.gguf"
    "$COTI" run -m "$TMP/trunc.gguf" -p x -n 2 2>"$TMP/e2"; [ $? -eq 1 ] && grep -qi 'error' "$TMP/e2" || return 1
    "$COTI" run -p x -n -3 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" run -p x --spec-n-max 99 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" run -p "$(head -c 20000 /dev/zero | tr '\0' a)" -c 64 -n 4 2>"$TMP/e3"; [ $? -eq 1 ] && grep -q 'context' "$TMP/e3"
}
check "bad model files and parameters fail with a message, no crash" bad_inputs_fail_cleanly

# A model the GGUF reader accepts but the loader must refuse (a tensor renamed in place): exit
# 1 with the tensor's name, not an abort (test_load_errors.c edits shapes, types, hparams).
bad_model_is_refused() {
    "$COTI" mkmodel --arch qwen35 -o "$TMP/good.gguf" --vocab-from none --n-vocab 300 --n-embd 64 \
        --n-layer 1 --n-ff 128 > /dev/null 2>&1 || return 1
    LC_ALL=C sed 's/blk\.0\.ffn_up\.weight/blk.0.ffn_up.weighX/' "$TMP/good.gguf" > "$TMP/missing.gguf"
    "$COTI" run -m "$TMP/missing.gguf" -p x -n 2 2>"$TMP/e4"; [ $? -eq 1 ] && grep -q 'missing tensor blk.0.ffn_up.weight' "$TMP/e4"
}
check "a model with a missing tensor is refused with its name (exit 1)" bad_model_is_refused

# coti quantize: dequantizing and requantizing Q8_0 gives back the file byte for byte (the same
# codes, records and order); the f32 copy is the same model (logits close, and with no activation
# rounding at all); another quantized type needs --allow-requantize and then loads and runs;
# keeps norms, ssm_conv1d and rows that are not whole blocks (q4_K falls back to q8_0 at 384)
quantize_round_trip() {
    "$COTI" quantize "$MODEL" "$TMP/f32.gguf" f32 -t 2 > /dev/null 2>&1 &&
    "$COTI" quantize "$TMP/f32.gguf" "$TMP/rt.gguf" Q8_0 > /dev/null 2>&1 && cmp "$MODEL" "$TMP/rt.gguf" || return 1
    # stacked experts (3-D) too, the router left F32
    "$COTI" mkmodel --arch qwen35moe --type q8_0 --seed 5 -o "$TMP/moe.gguf" > /dev/null 2>&1 &&
    "$COTI" quantize "$TMP/moe.gguf" "$TMP/moe32.gguf" f32 > /dev/null 2>&1 &&
    "$COTI" quantize "$TMP/moe32.gguf" "$TMP/moert.gguf" q8_0 > /dev/null 2>&1 && cmp "$TMP/moe.gguf" "$TMP/moert.gguf" || return 1
    "$COTI" gguf "$TMP/f32.gguf" > "$TMP/f32.txt" &&
    grep -q 'general.file_type: uint32 0$' "$TMP/f32.txt" && grep -Eq 'blk\.0\.ffn_down\.weight +f32 ' "$TMP/f32.txt" || return 1
    local ids=5,300,17,9000,42,7,1234,88,11,2000
    "$COTI" logits -m "$MODEL" --tokens $ids --top 20 --json -t 1 > "$TMP/lq.json" &&
    "$COTI" logits -m "$TMP/f32.gguf" --tokens $ids --top 20 --json -t 1 > "$TMP/lf.json" || return 1
    python3 scripts/compare_logits.py "$TMP/lq.json" "$TMP/lf.json" | tail -1 > "$TMP/cmp.txt" &&
    python3 -c "
import sys
f = open(sys.argv[1]).read().split()
med = float(f[f.index('median') + 1])
assert 0 < med < 0.1, f   # the same weights; only the CPU's Q8 activation codes differ
" "$TMP/cmp.txt" || return 1
    "$COTI" quantize "$MODEL" "$TMP/k.gguf" q4_K 2> "$TMP/qe" && return 1
    grep -q 'allow-requantize' "$TMP/qe" || return 1
    "$COTI" quantize --allow-requantize "$MODEL" "$TMP/k.gguf" q4_K > /dev/null 2>&1 &&
    "$COTI" gguf "$TMP/k.gguf" > "$TMP/k.txt" &&
    grep -Eq 'blk\.0\.ssm_out\.weight +q4_K ' "$TMP/k.txt" && grep -Eq 'blk\.0\.attn_qkv\.weight +q8_0 ' "$TMP/k.txt" &&
    grep -Eq 'blk\.0\.ssm_conv1d\.weight +f32 ' "$TMP/k.txt" && grep -Eq 'output_norm\.weight +f32 ' "$TMP/k.txt" &&
    "$COTI" run -m "$TMP/k.gguf" -p "Once upon a time" -n 8 -t 1 > /dev/null 2>&1
}
check "coti quantize: Q8_0 -> f32 -> Q8_0 byte-identical; requantizing asks first; the result runs" quantize_round_trip

quantize_errors_are_clear() {
    "$COTI" quantize "$MODEL" "$TMP/x.gguf" q9_9 2> "$TMP/qe1"; [ $? -eq 1 ] && grep -q "not a weight type" "$TMP/qe1" || return 1
    head -c 5000 "$MODEL" > "$TMP/trunc.gguf"
    "$COTI" quantize "$TMP/trunc.gguf" "$TMP/x.gguf" f16 2> "$TMP/qe2"; [ $? -eq 1 ] && grep -q 'coti quantize: ' "$TMP/qe2" || return 1
    "$COTI" quantize "$MODEL" "$TMP/x.gguf" 2> "$TMP/qe3"; [ $? -eq 1 ] && grep -q 'IN.gguf OUT.gguf TYPE' "$TMP/qe3" || return 1
    "$COTI" quantize "$MODEL" "$TMP/nodir/x.gguf" f16 2> "$TMP/qe4"; [ $? -eq 1 ] && grep -q 'coti quantize: ' "$TMP/qe4"
}
check "coti quantize: an unknown type, a truncated file, a missing argument, an unwritable path: exit 1 and a message" quantize_errors_are_clear

# gemma4 with its separate assistant drafter: lossless at every draft length, and the drafter
# refused with a reason when it does not fit (wrong target, a target as drafter, truncated).
G4=models/coti-tiny-gemma4-q8_0.gguf
G4A=models/coti-tiny-gemma4-assistant-q8_0.gguf
# the assistant's rows (llama.cpp's draft-mtp convention): one per position from 1, its own
# distribution (not the target's), the same for any thread count; it needs --mtp and a gemma4 target
logits_assistant() {
    local ids=5,300,17,9000,42,7,1234,88
    "$COTI" logits -m "$G4" -md "$G4A" --mtp --tokens $ids --top 5 --json -t 1 > "$TMP/la.json" &&
    "$COTI" logits -m "$G4" -md "$G4A" --mtp --tokens $ids --top 5 --json -t 2 > "$TMP/la2.json" &&
    "$COTI" logits -m "$G4" --tokens $ids --top 5 --json -t 1 > "$TMP/lg.json" &&
    "$COTI" logits -m "$G4" -md "$G4A" --mtp --draft-step 2 --tokens $ids --top 5 --json -t 1 > "$TMP/la3.json" || return 1
    python3 -c "
import json, sys
a, a2, g, s2 = (json.load(open(f)) for f in sys.argv[1:5])
assert a['head'] == 'assistant' and a['rows'] == a2['rows']
ra = a['rows']
assert [r['pos'] for r in ra] == list(range(1, 8)) and [r['token'] for r in ra] == [300, 17, 9000, 42, 7, 1234, 88]
assert all(r['top'] != x['top'] for r, x in zip(ra, g['rows'][1:])), 'the target rows again'
assert all([t[1] for t in r['top']] == sorted((t[1] for t in r['top']), reverse=True) for r in ra)
# a round's second step: rows from position 2, fed the drafter's own hidden, not step 1's rows
r2 = s2['rows']
assert [r['pos'] for r in r2] == list(range(2, 8)) and all(r['top'] != x['top'] for r, x in zip(r2, ra[1:]))
" "$TMP/la.json" "$TMP/la2.json" "$TMP/lg.json" "$TMP/la3.json" || return 1
    "$COTI" logits -m "$G4" -md "$G4A" --tokens $ids 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" logits -m "$G4" --draft-step 2 --tokens $ids 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" logits -md "$G4A" --mtp --tokens $ids 2>"$TMP/la.err"; [ $? -eq 1 ] && grep -q error "$TMP/la.err"
}
check "coti logits --mtp -md [--draft-step K]: the gemma4 assistant's rows, llama.cpp's draft-mtp convention" logits_assistant

assistant_is_lossless() {
    local p=$'static int foo(struct device *dev)\n{\n'
    "$COTI" run -m "$G4" -p "$p" -n 48 -t 1 --spec off > "$TMP/g4off.txt" 2>/dev/null &&
    "$COTI" run -m "$G4" -p "$p" -n 48 -t 1 --spec assistant --spec-draft "$G4A" > "$TMP/g4a.txt" 2>"$TMP/g4a.err" &&
    "$COTI" run -m "$G4" -p "$p" -n 48 -t 1 -md "$G4A" --spec-type draft-mtp > "$TMP/g4l.txt" 2>/dev/null &&
    cmp -s "$TMP/g4off.txt" "$TMP/g4a.txt" && cmp -s "$TMP/g4off.txt" "$TMP/g4l.txt" &&
    grep -q 'spec assistant n_max 3: drafted [1-9]' "$TMP/g4a.err" || return 1
    for n in 1 2 3 4; do
        "$COTI" equiv -m "$G4" --spec assistant --spec-draft "$G4A" --spec-n-max $n --prompts tests/data-prompts.json \
            -n 16 -t 1 | grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
}
check "gemma4 + assistant: greedy text identical, equiv Δ 0 at n_max 1-4" assistant_is_lossless

# the assistant reads the target's q8_0 cache (sliding and full layers) as it is stored
assistant_on_q8_0_cache_is_lossless() {
    for n in 1 3; do
        "$COTI" equiv -m "$G4" --spec assistant --spec-draft "$G4A" --spec-n-max $n -ctk q8_0 -ctv q8_0 \
            -p $'static int foo(struct device *dev)\n{\n' -n 32 -t 1 | grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
}
check "gemma4 + assistant, q8_0 cache: equiv Δ 0 at n_max 1 and 3" assistant_on_q8_0_cache_is_lossless

# an E-series target (per-layer embeddings, shared-KV layers) with a window of 8 and 16 rows
# per forward: its sliding layers keep a ring of 23 positions, which every prompt wraps. The
# shipped assistant fits its widths once its own window is made 8 too (a copy, the u32 patched).
# Lossless at every draft length, with the assistant and ngram; the same text as with every
# position kept (-b 512: no ring).
assistant_on_e2b_is_lossless() {
    "$COTI" mkmodel --arch gemma4 --shape e2b-tiny --window 8 --vocab-from "$G4" -o "$TMP/e2b.gguf" > /dev/null 2>&1 || return 1
    python3 scripts/assistant-window.py "$G4A" "$TMP/a8.gguf" 8 || return 1
    for n in 1 2 3 4; do
        "$COTI" equiv -m "$TMP/e2b.gguf" --spec assistant --spec-draft "$TMP/a8.gguf" --spec-n-max $n -b 16 \
            --prompts tests/data-prompts.json -n 24 -t 1 | grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
    "$COTI" equiv -m "$TMP/e2b.gguf" --spec ngram -b 16 --prompts tests/data-prompts.json -n 24 -t 1 |
        grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    "$COTI" run -m "$TMP/e2b.gguf" -p 'int main(void) { return' -n 40 -t 1 -b 16 --spec assistant --spec-draft "$TMP/a8.gguf" \
        > "$TMP/ring.txt" 2>/dev/null &&
    "$COTI" run -m "$TMP/e2b.gguf" -p 'int main(void) { return' -n 40 -t 1 -b 512 > "$TMP/noring.txt" 2>/dev/null &&
        cmp -s "$TMP/ring.txt" "$TMP/noring.txt" || return 1
    "$COTI" run -m "$TMP/e2b.gguf" --spec assistant --spec-draft "$G4A" -p x -n 2 2>"$TMP/e9"; [ $? -eq 1 ] &&
        grep -q 'wider than the target' "$TMP/e9"
}
check "gemma4 e2b-tiny (PLE, shared KV, window ring) + assistant: equiv Δ 0 at n_max 1-4, ngram" assistant_on_e2b_is_lossless

bad_assistant_is_refused() {
    "$COTI" run -m "$MODEL" --spec assistant --spec-draft "$G4A" -p x -n 2 2>"$TMP/e5"; [ $? -eq 1 ] &&
        grep -q 'needs a gemma4 target' "$TMP/e5" || return 1
    "$COTI" run -m "$G4" --spec assistant --spec-draft "$G4" -p x -n 2 2>"$TMP/e6"; [ $? -eq 1 ] &&
        grep -q 'expected gemma4-assistant' "$TMP/e6" || return 1
    head -c 100000 "$G4A" > "$TMP/trunc.gguf"
    "$COTI" run -m "$G4" --spec assistant --spec-draft "$TMP/trunc.gguf" -p x -n 2 2>"$TMP/e7"; [ $? -eq 1 ] &&
        grep -q 'error' "$TMP/e7" || return 1
    "$COTI" run -m "$G4" --spec assistant -p x -n 2 2>"$TMP/e8"; [ $? -eq 1 ] && grep -q 'not available' "$TMP/e8"
}
check "a drafter that does not fit its target is refused with a reason (exit 1)" bad_assistant_is_refused

# gemma4 with 26B-A4B's routed experts (8 of 64, 2 used, beside the dense FFN) at the shipped
# assistant's widths: lossless with the assistant alone and batched, with ngram; the merged
# gate_up layout is the same model (the same logits, bit for bit)
gemma4_moe_is_lossless() {
    local mk="--arch gemma4 --shape coti-tiny --n-layer 4 --n-expert 8 --n-expert-used 2 --n-ff-exp 64 --vocab-from $G4"
    # shellcheck disable=SC2086
    "$COTI" mkmodel $mk -o "$TMP/g4moe.gguf" > /dev/null 2>&1 &&
        "$COTI" mkmodel $mk --gate-up-merged -o "$TMP/g4moem.gguf" > /dev/null 2>&1 || return 1
    for a in "--spec-n-max 1" "--spec-n-max 3" "--spec-n-max 3 --parallel 4"; do
        # shellcheck disable=SC2086
        "$COTI" equiv -m "$TMP/g4moe.gguf" --spec assistant --spec-draft "$G4A" $a --prompts tests/data-prompts.json -n 24 \
            -t 1 | grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    done
    "$COTI" equiv -m "$TMP/g4moe.gguf" --spec ngram --prompts tests/data-prompts.json -n 24 -t 1 |
        grep -q 'real disagreements 0, mean |dlogprob top-1| 0, max 0' || return 1
    "$COTI" logits -m "$TMP/g4moe.gguf" --tokens 5,900,17,3000,44 --top 5 --json -t 1 > "$TMP/l1.json" 2>/dev/null &&
        "$COTI" logits -m "$TMP/g4moem.gguf" --tokens 5,900,17,3000,44 --top 5 --json -t 1 > "$TMP/l2.json" 2>/dev/null &&
        python3 -c 'import json,sys; a,b=(json.load(open(f))["rows"] for f in sys.argv[1:]); sys.exit(a!=b)' \
            "$TMP/l1.json" "$TMP/l2.json"
}
check "gemma4 with routed experts (26B-A4B's branch) + assistant: equiv Δ 0, merged = separate" gemma4_moe_is_lossless

# random gemma4 models: shared-KV layers, K=V full layers, an untied head, each lossless
mkmodel_gemma4_runs() {
    for args in "--kv-equal --kv-shared 2 --n-layer 6 --type q4_0" "--untied --type q4_K --n-embd 256"; do
        # shellcheck disable=SC2086
        "$COTI" mkmodel --arch gemma4 $args -o "$TMP/g4r.gguf" > /dev/null 2>&1 &&
        "$COTI" equiv -m "$TMP/g4r.gguf" --spec ngram --prompts tests/data-prompts.json -n 12 -t 1 |
            grep -q 'real disagreements 0' || return 1
    done
}
check "coti mkmodel --arch gemma4 writes models that load and pass equiv" mkmodel_gemma4_runs

# --help on stdout with exit 0 for every command; serve's defaults are its own (one source:
# the struct the parser starts from); --version names the build.
help_and_version() {
    for t in run serve bench equiv logits gguf mkmodel; do
        "$COTI" $t --help > "$TMP/h.txt" 2> "$TMP/h.err" || { echo "$t --help: exit $?" >&2; return 1; }
        [ -s "$TMP/h.txt" ] && [ ! -s "$TMP/h.err" ] || { echo "$t --help: not on stdout" >&2; return 1; }
    done
    [ "$("$COTI" serve --help | grep -c .)" -gt 10 ] || return 1
    "$COTI" serve --help > "$TMP/sh.txt" && grep -q 'temperature, 0 = greedy (default 0.8)' "$TMP/sh.txt" &&
        grep -q 'sampling seed (default random per request)' "$TMP/sh.txt" || return 1
    ! grep -q 'temperature 0.8 unless' "$TMP/sh.txt" || return 1
    "$COTI" run --help | grep -q 'temperature, 0 = greedy (default 0)' || return 1
    "$COTI" --help | grep -q '^  serve ' || return 1
    "$COTI" --version > "$TMP/v.txt" || return 1
    grep -Eq '^coti [0-9]+\.[0-9]+\.[0-9]+ \(git [^)]+\)$' "$TMP/v.txt" && grep -Eq '^cpu: (ref|avx2|avx512) ' "$TMP/v.txt" &&
        grep -Eq '^cuda: (compiled in|not compiled in)' "$TMP/v.txt" || { cat "$TMP/v.txt" >&2; return 1; }
    # an unknown option fails with a pointer to the help, not the help itself
    "$COTI" run --no-such-option 2> "$TMP/u.err"; [ $? -eq 1 ] && grep -q "unknown or ambiguous option '--no-such-option'" "$TMP/u.err"
}
check "--help on stdout (exit 0) for every command, serve's own defaults, --version" help_and_version

# --opt=value is --opt value; -f - reads the prompt from stdin; --prompts - and --json - are
# stdin and stdout; llama.cpp's single-dash spellings still parse.
option_spellings() {
    local p=$'static int foo(struct device *dev)\n{\n'
    "$COTI" run -p "$p" -n 16 -t 1 --spec mtp --spec-n-max 2 > "$TMP/a.txt" 2>/dev/null &&
    printf '%s' "$p" | "$COTI" run -f - --n-predict=16 --threads=1 --spec-type=mtp --spec-draft-n-max=2 --top-k=40 \
        > "$TMP/b.txt" 2> "$TMP/b.err" &&
    cmp -s "$TMP/a.txt" "$TMP/b.txt" && grep -q 'spec mtp n_max 2' "$TMP/b.err" && grep -q '| threads 1 |' "$TMP/b.err" || return 1
    "$COTI" run -p x -n 2 --temp= 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" run -p x -n 2 --threads=many 2>/dev/null; [ $? -eq 1 ] || return 1
    "$COTI" run -p x -n 2 -ngl 0 -t 1 >/dev/null 2>&1 || return 1
    "$COTI" run -p "$p" -n 16 -t 1 --spec ngram --spec-n-min 1 > "$TMP/c.txt" 2>/dev/null &&
    "$COTI" run -p "$p" -n 16 -t 1 --spec-type ngram-simple --spec-draft-n-min=1 --spec-draft-p-min=0 \
        > "$TMP/d.txt" 2> "$TMP/d.err" && cmp -s "$TMP/c.txt" "$TMP/d.txt" && grep -q 'spec ngram' "$TMP/d.err" || return 1
    printf '["int main(void)\\n{\\n"]' | "$COTI" bench --spec=off,ngram --prompts - -n 8 --repeat=1 -t 1 --json - \
        > "$TMP/bj.json" 2> "$TMP/bj.err" || return 1
    python3 -c "
import json
b=json.load(open('$TMP/bj.json'))
assert [x['config'] for x in b['configs']]==['off','ngram:3'], b
" && grep -q '^config ' "$TMP/bj.err"
}
check "--opt=value, -f -, --prompts - and --json -" option_spellings

bench_prefill() {
    "$COTI" bench --prefill 16,40 --repeat 2 -t 1 > "$TMP/pp.txt" 2>/dev/null || return 1
    awk '$1 == 16 || $1 == 40 { if ($2 > 0 && $3 > 0) n++ } END { exit n == 2 ? 0 : 1 }' "$TMP/pp.txt" || return 1
    "$COTI" bench --prefill 16 --prompts x -t 1 > /dev/null 2>&1; [ $? -eq 1 ] || return 1
    # past the default context (4096): the context grows to hold it
    "$COTI" bench --prefill 4100 --repeat 1 -t 2 > "$TMP/pp2.txt" 2>/dev/null || return 1
    awk '$1 == 4100 && $2 > 0 && $3 > 0 { ok = 1 } END { exit ok ? 0 : 1 }' "$TMP/pp2.txt"
}
check "coti bench --prefill: cold and warm tok/s per size, any size" bench_prefill

# --verify-cost on a random qwen35moe (4 experts per token): one row reads 4 experts per call,
# four rows their union (more than 4, at most 16), and more weight bytes than one
bench_verify_cost() {
    "$COTI" mkmodel --arch qwen35moe -o "$TMP/vc.gguf" --type q8_0 --seed 5 >/dev/null 2>&1 || return 1
    "$COTI" bench -m "$TMP/vc.gguf" --verify-cost 4 --repeat 1 -t 1 > "$TMP/vc.txt" 2>/dev/null || return 1
    awk '$1 == 1 { one = $4; if ($5 == 4.00 && $2 > 0) ok1 = 1 }
         $1 == 4 { if ($5 > 4 && $5 <= 16 && $4 > one && $2 > 0) ok4 = 1 }
         END { exit ok1 && ok4 ? 0 : 1 }' "$TMP/vc.txt" || return 1
    "$COTI" bench --verify-cost 2 --spec off -t 1 > /dev/null 2>&1; [ $? -eq 1 ]
}
check "coti bench --verify-cost: weight bytes and the experts' union per row count" bench_verify_cost

bench_depth() {
    printf '["def fib(n):"]' > "$TMP/pd.json"
    "$COTI" bench --depth 300 -c 512 -ctk q8_0 -ctv q4_0 --spec off,mtp:2 --prompts "$TMP/pd.json" -n 16 --repeat 1 -t 1 \
        --json "$TMP/pd.out" > "$TMP/pd.txt" 2>/dev/null || return 1
    grep -q 'after 300 random tokens (--depth), KV cache K q8_0 V q4_0' "$TMP/pd.txt" || return 1
    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['depth'] == 300 and [c['config'] for c in d['configs']] == ['off', 'mtp:2']
assert all(c['tok_per_s_median'] > 0 and c['output_equals_first'] for c in d['configs'])
" "$TMP/pd.out" || return 1
    # the random tokens must fit the context
    "$COTI" bench --depth 600 -c 512 --prompts "$TMP/pd.json" -n 8 --repeat 1 -t 1 > /dev/null 2>&1; [ $? -eq 1 ]
}
check "coti bench --depth: decode after N random tokens, per cache type" bench_depth

bench_parallel() {
    printf '["def fib(n):", "int main(void)", "The capital of", "Once upon"]' > "$TMP/pp4.json"
    "$COTI" bench --parallel 1,2,4 --spec off,mtp:2 --prompts "$TMP/pp4.json" -n 12 --repeat 1 -t 1 --json "$TMP/ppar.json" \
        > "$TMP/ppar.txt" 2>/dev/null || return 1
    grep -q 'groups batched, depth by verify cost (sequences x rows: 1x1 [0-9]* us, 1x2 [0-9]*, 4x1 [0-9]*' "$TMP/ppar.txt" || return 1
    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
names = [c['config'] for c in d['configs']]
assert names == ['off x1', 'mtp:2 x1', 'off x2', 'mtp:2 x2', 'off x4', 'mtp:2 x4'], names
assert all(c['output_equals_first'] and c['tok_per_s_median'] > 0 for c in d['configs'])
cfg = {c['config']: c for c in d['configs']}
# the MTP head's rows are timed as the draft phase, batched cycles too (where the depth policy
# drafted at all)
drafting = [p for p in (1, 2, 4) if cfg[f'mtp:2 x{p}']['drafted'] > 0]
assert 1 in drafting and all(cfg[f'mtp:2 x{p}']['draft_share'] > 2 * cfg[f'off x{p}']['draft_share'] for p in drafting), cfg
" "$TMP/ppar.json" || return 1
    "$COTI" bench --parallel 65 --prompts "$TMP/pp4.json" -n 8 --repeat 1 -t 1 > /dev/null 2>&1; [ $? -eq 1 ]
}
check "coti bench --parallel: sequences decoding together, the same outputs" bench_parallel

# Loading prints one summary line (on a terminal a progress line before it); every log line
# has a timestamp; the request log escapes quotes as JSON does.
TS='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z '
load_summary_and_log() {
    "$COTI" run -p x -n 2 -t 1 > /dev/null 2> "$TMP/s.err" || return 1
    grep -Eq "${TS}\[info\] model: .*coti-tiny-qwen35-mtp-q8_0.gguf: arch qwen35, [0-9.]+M params, weights q8_0, [0-9.]+ MiB, [0-9.]+ MiB KV\+state per slot x 1 \(KV K f16 [0-9.]+ MiB = 768 B/token, V f16 [0-9.]+ MiB = 768 B/token\), cpu [a-z0-9]+, 1 threads, loaded in" "$TMP/s.err" ||
        { cat "$TMP/s.err" >&2; return 1; }
    grep -q $'\r' "$TMP/s.err" && { echo "a progress line went to a file" >&2; return 1; }
    "$COTI" serve --port 0 -t 1 -np 1 --no-warmup --metrics --slots 2> "$TMP/srv.err" &
    local pid=$! port=
    for _ in $(seq 100); do
        port=$(sed -nE 's|.*listening on http://127\.0\.0\.1:([0-9]+).*|\1|p' "$TMP/srv.err")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] && curl -s -o /dev/null -H 'Content-Type: application/json' \
        -d '{"prompt": "x", "speculative.type": "fast"}' "http://127.0.0.1:$port/v1/completions"
    kill -TERM "$pid"; wait "$pid" || return 1
    grep -Eq "${TS}\[info\] server: request id=[0-9]+ POST /v1/completions status=400 error=\"Field 'speculative.type': expected \\\\\"off\\\\\", " "$TMP/srv.err" ||
        { cat "$TMP/srv.err" >&2; return 1; }
}
check "model load summary line; log timestamps; JSON-escaped request log" load_summary_and_log

# The default model is found from any folder (next to the binary); an IPv6 listen URL is
# bracketed.
defaults_from_anywhere() {
    local bin
    bin=$(realpath "$COTI")
    (cd "$TMP" && "$bin" run -p x -n 2 -t 1 > /dev/null 2>&1) || return 1
    # an installed layout (make install PREFIX=...): PREFIX/bin/coti finds PREFIX/share/coti/models
    mkdir -p "$TMP/inst/bin" "$TMP/inst/share/coti/models"
    cp "$bin" "$TMP/inst/bin/coti" && cp "$MODEL" "$TMP/inst/share/coti/models/"
    (cd / && "$TMP/inst/bin/coti" run -p x -n 2 -t 1 2>&1 >/dev/null | grep -q "model: $TMP/inst/share/coti/models/") || return 1
    rm "$TMP/inst/share/coti/models/$(basename "$MODEL")"
    (cd / && "$TMP/inst/bin/coti" run -p x -n 2 2> "$TMP/nomodel.err"); [ $? -eq 1 ] && grep -q 'share/coti/models' "$TMP/nomodel.err" || return 1
    grep -qE '^0{31}1 ' /proc/net/if_inet6 2>/dev/null || { echo "no IPv6 loopback: URL not checked" >&2; return 0; }
    "$COTI" serve --host ::1 --port 0 -t 1 -np 1 --no-warmup 2> "$TMP/v6.err" &
    local pid=$! ok=1
    for _ in $(seq 100); do
        grep -q 'listening on http://\[::1\]:[0-9]' "$TMP/v6.err" && { ok=0; break; }
        grep -q 'error' "$TMP/v6.err" && break
        sleep 0.1
    done
    kill -TERM "$pid" 2>/dev/null; wait "$pid"
    [ $ok -eq 0 ] || { cat "$TMP/v6.err" >&2; return 1; }
}
check "the default model from another folder and an installed layout; IPv6 URL in brackets" defaults_from_anywhere

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
