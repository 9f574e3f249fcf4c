#!/usr/bin/env node
// load.mjs — bounded load test of `coti serve` on loopback (not part of `make test`).
//
//   node tests/server/load.mjs [--bin ./coti] [--slots 8] [--clients 64] [--requests 500]
//                              [--max-tokens 32] [--spec mtp] [--threads N] [--time-limit-s 1800] [--md]
//
// Starts the server on 127.0.0.1 (a free port), computes greedy reference answers one at a
// time, then lets `clients` concurrent clients send `requests` requests in total: chat and
// completions, streamed and not, greedy (checked against the references: slots must not
// leak into each other) and sampled, plus clients that abort mid-stream or before a
// non-streamed answer arrives. Every request that is not aborted on purpose must succeed.
// Prints throughput and latency percentiles (as a markdown table with --md), then stops the
// server and checks its exit status (under ASan a leak makes it non-zero). Exit 0 = pass.
import { performance } from 'node:perf_hooks';
import { metric, startServer } from './helpers.mjs';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
    return acc;
  }, []),
);
const BIN = args.bin || process.env.COTI_BIN || './coti';
const SLOTS = Number(args.slots || 8);
const CLIENTS = Number(args.clients || 64);
const REQUESTS = Number(args.requests || 500);
const GEN = Number(args['max-tokens'] || 32);
const SPEC = args.spec || 'mtp';
const THREADS = args.threads ? Number(args.threads) : null; // null: the server's default
const TIME_LIMIT_S = Number(args['time-limit-s'] || 1800);

const PROMPTS = [
  'int main(int argc, char **argv) {\n',
  'The history of the city begins',
  'def quicksort(xs):\n',
  '#include <stdio.h>\n#include <stdlib.h>\n',
  'static void list_add(struct list *l, void *item)',
  'In this chapter we describe',
];
const CHATS = [
  'Write a C function that reverses a string.',
  'What is a pointer?',
  'Explain recursion in one sentence.',
];

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

async function main() {
  const t0 = performance.now();
  const srv = await startServer(['--spec', SPEC, '-np', String(SLOTS), ...(THREADS ? ['-t', String(THREADS)] : []), '-c', '1024'], {
    bin: BIN,
    clientTimeoutMs: TIME_LIMIT_S * 1000, // a slow (sanitizer) build queues long: only the overall bound applies
  });
  console.error(`load: ${BIN} on port ${srv.port}`);
  const deadline = Date.now() + TIME_LIMIT_S * 1000;
  const c = srv.client;

  // greedy references, one request at a time
  const refs = new Map();
  const key = (kind, i, n) => `${kind}/${i}/${n}`;
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await c.completions.create({ model: 'm', prompt: PROMPTS[i], max_tokens: GEN, temperature: 0 });
    refs.set(key('cmpl', i, GEN), r.choices[0].text);
  }
  for (let i = 0; i < CHATS.length; i++) {
    const r = await c.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: CHATS[i] }], max_tokens: GEN, temperature: 0 });
    refs.set(key('chat', i, GEN), r.choices[0].message.content);
  }

  const stats = { ok: 0, failed: 0, aborted: 0, mismatched: 0, tokens: 0, lat: [], ttft: [], errors: [] };
  let next = 0;
  const tLoad = performance.now();

  async function one(n) {
    const r = n % 10; // the mix: 0-2 chat, 3-4 chat stream, 5-6 completion, 7 completion stream, 8 abort stream, 9 abort plain
    const greedy = n % 3 !== 0;
    const sampling = greedy ? { temperature: 0 } : { temperature: 0.8, seed: n };
    const max_tokens = greedy ? GEN : 4 + (n % GEN);
    const pi = n % PROMPTS.length;
    const ci = n % CHATS.length;
    const started = performance.now();
    if (r <= 4) {
      const req = { model: 'm', messages: [{ role: 'user', content: CHATS[ci] }], max_tokens, ...sampling };
      let text = '';
      let usage;
      if (r <= 2) {
        const res = await c.chat.completions.create(req);
        text = res.choices[0].message.content;
        usage = res.usage;
      } else {
        const s = await c.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
        for await (const ch of s) {
          const piece = ch.choices[0]?.delta?.content ?? '';
          if (piece && !text) stats.ttft.push(performance.now() - started);
          text += piece;
          if (ch.usage) usage = ch.usage;
        }
      }
      if (!usage || usage.completion_tokens < 1) throw new Error('no usage');
      stats.tokens += usage.completion_tokens;
      if (greedy && text !== refs.get(key('chat', ci, GEN))) stats.mismatched++;
    } else if (r <= 7) {
      const req = { model: 'm', prompt: PROMPTS[pi], max_tokens, ...sampling };
      let text = '';
      let usage;
      if (r <= 6) {
        const res = await c.completions.create(req);
        text = res.choices[0].text;
        usage = res.usage;
      } else {
        const s = await c.completions.create({ ...req, stream: true });
        for await (const ch of s) {
          text += ch.choices[0]?.text ?? '';
          if (ch.usage) usage = ch.usage;
        }
      }
      if (!usage || usage.completion_tokens < 1) throw new Error('no usage');
      stats.tokens += usage.completion_tokens;
      if (greedy && text !== refs.get(key('cmpl', pi, GEN))) stats.mismatched++;
    } else if (r === 8) {
      // a client that goes away mid-stream
      const ac = new AbortController();
      const s = await c.completions.create({ model: 'm', prompt: PROMPTS[pi], max_tokens: 200, ignore_eos: true, stream: true, temperature: 0 },
        { signal: ac.signal });
      let k = 0;
      for await (const ch of s) if (++k === 2) ac.abort();
      stats.aborted++;
      return;
    } else {
      // a client that gives up before a non-streamed answer
      const ac = new AbortController();
      const p = fetch(`${srv.base}/v1/completions`, {
        method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: PROMPTS[pi], max_tokens: 200, ignore_eos: true, temperature: 0 }),
      });
      setTimeout(() => ac.abort(), 50 + (n % 7) * 30);
      try {
        await (await p).text();
      } catch { /* aborted, as intended */ }
      stats.aborted++;
      return;
    }
    stats.lat.push(performance.now() - started);
    stats.ok++;
  }

  async function client() {
    while (next < REQUESTS && Date.now() < deadline) {
      const n = next++;
      try {
        await one(n);
      } catch (e) {
        stats.failed++;
        if (stats.errors.length < 10) stats.errors.push(`#${n}: ${e?.status ?? ''} ${e?.message ?? e}`);
      }
    }
  }
  await Promise.all(Array.from({ length: CLIENTS }, client));
  const wall = (performance.now() - tLoad) / 1000;
  const timedOut = next < REQUESTS;

  // the last clients may have just aborted: the server notices within its 100 ms poll
  for (let i = 0; i < 100 && (await metric(srv.base, 'requests_processing')) > 0; i++) await new Promise((r) => setTimeout(r, 50));
  const m = {
    requests_total: await metric(srv.base, 'requests_total'),
    cancelled: await metric(srv.base, 'requests_cancelled_total'),
    drafted: await metric(srv.base, 'spec_decode_num_draft_tokens_total'),
    accepted: await metric(srv.base, 'spec_decode_num_accepted_tokens_total'),
    deferred_now: await metric(srv.base, 'requests_deferred'),
    processing_now: await metric(srv.base, 'requests_processing'),
  };
  const exit = await srv.stop();
  const leakFree = exit.code === 0 && exit.signal === null;
  const good = stats.ok + stats.failed;
  const res = {
    binary: BIN, slots: SLOTS, clients: CLIENTS, requests: next, max_tokens: GEN, spec: SPEC, threads: THREADS,
    good_requests: good, ok: stats.ok, failed: stats.failed, mismatched_greedy: stats.mismatched, aborted_on_purpose: stats.aborted,
    wall_s: +wall.toFixed(2), req_per_s: +(next / wall).toFixed(2), gen_tok_per_s: +(stats.tokens / wall).toFixed(1),
    latency_ms_p50: +pct(stats.lat, 50).toFixed(0), latency_ms_p99: +pct(stats.lat, 99).toFixed(0),
    ttft_ms_p50: +pct(stats.ttft, 50).toFixed(0),
    ttft_ms_p99: +pct(stats.ttft, 99).toFixed(0),
    server_metrics: m, server_exit: exit, total_s: +((performance.now() - t0) / 1000).toFixed(1), timed_out: timedOut,
  };
  console.log(JSON.stringify(res, null, 2));
  if (stats.errors.length) console.error('errors:\n  ' + stats.errors.join('\n  '));
  if (args.md) {
    console.log(`\n| binary | -t | slots | clients | requests | ok | failed | mismatched | aborted (on purpose) | wall s | req/s | gen tok/s | p50 ms | p99 ms | TTFT p50/p99 ms | server exit |`);
    console.log(`|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|`);
    console.log(`| ${BIN} | ${THREADS ?? 'default'} | ${SLOTS} | ${CLIENTS} | ${next} | ${stats.ok} | ${stats.failed} | ${stats.mismatched} | ${stats.aborted} | ${res.wall_s} | ${res.req_per_s} | ${res.gen_tok_per_s} | ${res.latency_ms_p50} | ${res.latency_ms_p99} | ${res.ttft_ms_p50}/${res.ttft_ms_p99} | ${exit.code === 0 ? 'clean (0)' : JSON.stringify(exit)} |`);
  }
  const pass = !timedOut && stats.failed === 0 && stats.mismatched === 0 && leakFree && m.deferred_now === 0 && m.processing_now === 0;
  if (!pass) {
    console.error(`FAIL${timedOut ? ' (time limit)' : ''}; server log tail:\n${srv.log().slice(-3000)}`);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
