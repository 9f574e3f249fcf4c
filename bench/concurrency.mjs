#!/usr/bin/env node
// concurrency.mjs — aggregate decode throughput of an OpenAI-compatible server under 1, 4, 16
// concurrent streams (issue 24), for `coti serve` and llama-server alike.
//
//   node bench/concurrency.mjs --url http://127.0.0.1:8080 [--streams 1,4,16] [--rounds 2]
//        [--max-tokens 128] [--spec off|mtp|ngram] [--prompts bench/prompts-code.json] [--label NAME] [--md]
//
// N streams each send `rounds` streamed /v1/completions requests one after another, greedy,
// max_tokens tokens with ignore_eos, cache_prompt false (every request fresh), a different
// prompt per request (the file's prompts in turn). --spec adds coti's per-request
// `speculative.type` (leave it out for llama-server: its speculation is set at start-up).
// Prints per N: aggregate tok/s (generated tokens of all streams / wall time from the first
// request to the last answer), p50/p99 time to first token, p50/p99 time per output token
// (each request's (last - first token) / (tokens - 1)), and the server's draft acceptance when
// its timings report it.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
    return acc;
  }, []),
);
if (!args.url) {
  console.error('usage: node bench/concurrency.mjs --url URL [--streams 1,4,16] [--rounds 2] [--max-tokens 128] [--spec TYPE] [--label NAME] [--md]');
  process.exit(2);
}
const URL_BASE = args.url.replace(/\/$/, '');
const STREAMS = (args.streams || '1,4,16').split(',').map(Number);
const ROUNDS = Number(args.rounds || 2);
const GEN = Number(args['max-tokens'] || 128);
const PROMPTS = JSON.parse(readFileSync(args.prompts || 'bench/prompts-code.json', 'utf8'));
const LABEL = args.label || (args.spec ? `spec ${args.spec}` : 'server');

// One streamed request: [time to first token ms, time per later token ms, tokens, drafted, accepted].
async function one(prompt) {
  const body = { prompt, max_tokens: GEN, temperature: 0, ignore_eos: true, cache_prompt: false, stream: true };
  if (args.spec) body.speculative = { type: args.spec };
  const t0 = performance.now();
  const res = await fetch(`${URL_BASE}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let buf = '', first = 0, last = 0, pieces = 0, timings = null;
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, at);
      buf = buf.slice(at + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.timings) timings = j.timings;
      if (j.choices?.[0]?.text) {
        const now = performance.now();
        if (!first) first = now;
        last = now;
        pieces++;
      }
    }
  }
  const n = timings?.predicted_n ?? pieces;
  return [first - t0, n > 1 ? (last - first) / (n - 1) : 0, n, timings?.draft_n ?? 0, timings?.draft_n_accepted ?? 0];
}

const pct = (v, p) => { const s = [...v].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

const rows = [];
let next = 0;
for (const n of STREAMS) {
  await one(PROMPTS[0]); // warm: not counted
  const results = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: n }, async () => {
    for (let r = 0; r < ROUNDS; r++) results.push(await one(PROMPTS[next++ % PROMPTS.length]));
  }));
  const wall = (performance.now() - t0) / 1e3;
  const tokens = results.reduce((a, x) => a + x[2], 0);
  const drafted = results.reduce((a, x) => a + x[3], 0), accepted = results.reduce((a, x) => a + x[4], 0);
  rows.push({ streams: n, tps: tokens / wall, ttft50: pct(results.map((x) => x[0]), 0.5), ttft99: pct(results.map((x) => x[0]), 0.99),
    tpot50: pct(results.map((x) => x[1]), 0.5), tpot99: pct(results.map((x) => x[1]), 0.99), drafted, accepted });
}
const base = rows[0].tps;
if (args.md) {
  console.log(`| ${LABEL} | streams | aggregate tok/s | x 1 stream | TTFT p50 / p99 ms | per token p50 / p99 ms | accepted/drafted |`);
  console.log('|---|---|---|---|---|---|---|');
}
for (const r of rows) {
  const acc = r.drafted ? `${r.accepted}/${r.drafted} (${(r.accepted / r.drafted).toFixed(3)})` : '-';
  if (args.md) {
    console.log(`| ${LABEL} | ${r.streams} | ${r.tps.toFixed(1)} | ${(r.tps / base).toFixed(2)} | ${r.ttft50.toFixed(1)} / ${r.ttft99.toFixed(1)} | `
      + `${r.tpot50.toFixed(2)} / ${r.tpot99.toFixed(2)} | ${acc} |`);
  } else {
    console.log(`${LABEL.padEnd(14)} streams ${String(r.streams).padStart(3)}  ${r.tps.toFixed(1).padStart(8)} tok/s  x${(r.tps / base).toFixed(2)}  `
      + `ttft p50 ${r.ttft50.toFixed(1)} p99 ${r.ttft99.toFixed(1)} ms  tpot p50 ${r.tpot50.toFixed(2)} p99 ${r.tpot99.toFixed(2)} ms  acc ${acc}`);
  }
}
