#!/usr/bin/env python3
"""concurrency.py — aggregate decode throughput of an OpenAI-compatible server under 1, 4, 16
concurrent streams (issue 24), for `coti serve` and llama-server alike. Standard library only,
so it runs wherever python3 does (the GPU machine has no node).

  python3 bench/concurrency.py --url http://127.0.0.1:8080 [--streams 1,4,16] [--rounds 2]
       [--max-tokens 128] [--spec off|mtp|ngram] [--prompts bench/prompts-code.json] [--label NAME] [--md]
       [--warmup W]

N streams each send `rounds` streamed /v1/completions requests one after another, greedy,
max_tokens tokens with ignore_eos, cache_prompt false (every request fresh), a different prompt
per request (the file's prompts in turn). --spec adds coti's per-request `speculative.type`
(leave it out for llama-server: its speculation is set at start-up). Prints per N: aggregate
tok/s (generated tokens of all streams / wall time from the first request to the last answer),
p50/p99 time to first token, p50/p99 time per output token (each request's (last - first
token) / (tokens - 1)), and the server's draft acceptance when its timings report it.

Before each N, one request warms the server; --warmup W also runs W uncounted rounds of N
streams first (cache_prompt stays false: nothing of them is reused), so that what a server
learns once per process (GPU graphs of N sequences' batch shapes, a draft-depth policy's costs)
is not in a short run's figure. Every counted request is still a fresh prompt.
"""
import argparse
import http.client
import itertools
import json
import threading
import time
import urllib.parse


def one(url, prompt, gen, spec):
    """One streamed request: (ttft ms, ms per later token, tokens, drafted, accepted)."""
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
            "stream": True}
    if spec:
        body["speculative"] = {"type": spec}
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    res = conn.getresponse()
    if res.status != 200:
        raise RuntimeError(f"HTTP {res.status}: {res.read()[:300]!r}")
    first = last = 0.0
    pieces = 0
    timings = None
    for raw in res:  # SSE: one `data: {...}` line per event
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        timings = j.get("timings") or timings
        ch = j.get("choices") or []
        if ch and ch[0].get("text"):
            now = time.perf_counter()
            first = first or now
            last = now
            pieces += 1
    conn.close()
    n = (timings or {}).get("predicted_n", pieces)
    return ((first - t0) * 1e3, (last - first) * 1e3 / (n - 1) if n > 1 else 0.0, n,
            (timings or {}).get("draft_n", 0), (timings or {}).get("draft_n_accepted", 0))


def pct(v, p):
    s = sorted(v)
    return s[min(len(s) - 1, int(p * len(s)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--spec")
    ap.add_argument("--prompts", default="bench/prompts-code.json")
    ap.add_argument("--label")
    ap.add_argument("--md", action="store_true")
    ap.add_argument("--warmup", type=int, default=0)
    a = ap.parse_args()
    prompts = json.load(open(a.prompts))
    label = a.label or (f"spec {a.spec}" if a.spec else "server")
    counter = itertools.count()
    rows = []
    for n in map(int, a.streams.split(",")):
        one(a.url, prompts[0], a.max_tokens, a.spec)  # warm: not counted
        results, errors, lock = [], [], threading.Lock()

        def stream(rounds, out):
            try:
                for _ in range(rounds):
                    r = one(a.url, prompts[next(counter) % len(prompts)], a.max_tokens, a.spec)
                    with lock:
                        out.append(r)
            except Exception as e:  # reported after the round: a failed request is a failed measurement
                with lock:
                    errors.append(e)

        def run(rounds, out):
            threads = [threading.Thread(target=stream, args=(rounds, out)) for _ in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        run(a.warmup, [])
        t0 = time.perf_counter()
        run(a.rounds, results)
        wall = time.perf_counter() - t0
        if errors:
            raise SystemExit(f"error: {len(errors)} stream(s) failed, first: {errors[0]}")
        rows.append({"streams": n, "tps": sum(r[2] for r in results) / wall,
                     "ttft": (pct([r[0] for r in results], 0.5), pct([r[0] for r in results], 0.99)),
                     "tpot": (pct([r[1] for r in results], 0.5), pct([r[1] for r in results], 0.99)),
                     "drafted": sum(r[3] for r in results), "accepted": sum(r[4] for r in results)})
    base = rows[0]["tps"]
    if a.md:
        print(f"| {label} | streams | aggregate tok/s | x 1 stream | TTFT p50 / p99 ms | per token p50 / p99 ms "
              "| accepted/drafted |")
        print("|---|---|---|---|---|---|---|")
    for r in rows:
        acc = f"{r['accepted']}/{r['drafted']} ({r['accepted'] / r['drafted']:.3f})" if r["drafted"] else "-"
        if a.md:
            print(f"| {label} | {r['streams']} | {r['tps']:.1f} | {r['tps'] / base:.2f} | {r['ttft'][0]:.1f} / "
                  f"{r['ttft'][1]:.1f} | {r['tpot'][0]:.2f} / {r['tpot'][1]:.2f} | {acc} |")
        else:
            print(f"{label:<14} streams {r['streams']:>3}  {r['tps']:8.1f} tok/s  x{r['tps'] / base:.2f}  "
                  f"ttft p50 {r['ttft'][0]:.1f} p99 {r['ttft'][1]:.1f} ms  tpot p50 {r['tpot'][0]:.2f} "
                  f"p99 {r['tpot'][1]:.2f} ms  acc {acc}")


if __name__ == "__main__":
    main()
