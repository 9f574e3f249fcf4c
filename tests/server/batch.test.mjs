// batch.test.mjs — one forward for all busy slots (issue 24): 16 requests decoding together
// give the same greedy outputs as the same requests sent one by one, with speculation off, mtp
// and ngram (and a mix of them, a sampled request and a grammar among them), and the cycles
// were batched (the metrics say so). A slot's verify rows do not depend on the rows beside it.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { metric, postJson, sleep, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['-np', '16', '-c', '1024']);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

const PROMPTS = JSON.parse(readFileSync('tests/data-prompts.json', 'utf8')).slice(0, 16);
const ask = (prompt, extra) => postJson(srv.base, '/v1/completions',
  { prompt, max_tokens: 40, temperature: 0, ignore_eos: true, ...extra });
const text = (r) => { assert.equal(r.status, 200, r.text); return r.json.choices[0].text; };

for (const spec of ['off', 'mtp', 'ngram']) {
  test(`16 concurrent requests equal the same sent one by one (spec ${spec})`, async () => {
    const extra = { speculative: { type: spec } };
    const alone = [];
    for (const p of PROMPTS) alone.push(text(await ask(p, extra)));
    const cycles0 = await metric(srv.base, 'batched_cycles_total');
    const together = (await Promise.all(PROMPTS.map((p) => ask(p, extra)))).map(text);
    for (let i = 0; i < PROMPTS.length; i++) assert.equal(together[i], alone[i], `prompt ${i}`);
    assert.ok(await metric(srv.base, 'batched_cycles_total') > cycles0, 'the cycles were batched');
  });
}

test('a mixed batch: each request as it is alone (speculation, sampling, grammar, logprobs)', async () => {
  const kinds = [
    { speculative: { type: 'mtp', n_max: 4 } },
    { speculative: { type: 'ngram' } },
    { speculative: { type: 'off' } },
    { speculative: { type: 'mtp', n_max: 1 }, temperature: 0.8, seed: 11 },
    { speculative: { type: 'mtp' }, grammar: 'root ::= [a-z ]+' },
    { speculative: { type: 'mtp' }, logprobs: 2 },
    { speculative: { type: 'mtp' }, max_tokens: 3 },
    { speculative: { type: 'mtp' }, frequency_penalty: 0.5 },
  ];
  const reqs = PROMPTS.map((p, i) => [p, kinds[i % kinds.length]]);
  const alone = [];
  for (const [p, k] of reqs) alone.push((await ask(p, k)).json.choices[0]);
  const together = (await Promise.all(reqs.map(([p, k]) => ask(p, k)))).map((r) => r.json.choices[0]);
  for (let i = 0; i < reqs.length; i++) {
    assert.equal(together[i].text, alone[i].text, `prompt ${i}: ${JSON.stringify(reqs[i][1])}`);
    assert.deepEqual(together[i].logprobs, alone[i].logprobs, `prompt ${i} logprobs`);
  }
});

test('a long prompt arriving while others decode is processed in chunks: every answer as alone', async () => {
  const long = PROMPTS.slice(0, 8).join('\n').repeat(2).slice(0, 3000); // several hundred tokens: > one chunk
  const others = PROMPTS.slice(8, 11);
  const spec = { speculative: { type: 'mtp' }, cache_prompt: false }; // each prompt processed whole
  const aloneLong = text(await ask(long, spec));
  const aloneOthers = [];
  for (const p of others) aloneOthers.push(text(await ask(p, { ...spec, max_tokens: 80 })));
  const running = others.map((p) => ask(p, { ...spec, max_tokens: 80 }));
  await sleep(60); // the others decoding by now (else the long prompt is processed whole)
  const [l, ...o] = await Promise.all([ask(long, spec), ...running]);
  assert.equal(l.json.timings.prompt_n > 300, true, `prompt_n ${l.json.timings.prompt_n}`);
  assert.equal(text(l), aloneLong);
  o.forEach((r, i) => assert.equal(text(r), aloneOthers[i], `other ${i}`));
});

test('more busy slots than one batched cycle takes (SPEC_MAX_BATCH 64): every answer as alone', async () => {
  // its start calibrates verify costs up to 64 sequences x 5 rows (~9.5k rows, best of 5): 5.6 s
  // here, ~100 s under AddressSanitizer (make asan), past the default 60 s
  const wide = await startServer(['-np', '72', '-c', '256'], { startTimeoutMs: 300000 });
  try {
    const prompts = Array.from({ length: 72 }, (_, i) => PROMPTS[i % PROMPTS.length].slice(0, 40 + i));
    const one = (p) => postJson(wide.base, '/v1/completions', { prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true });
    const alone = [];
    for (const p of prompts.slice(0, 6)) alone.push(text(await one(p)));
    const together = (await Promise.all(prompts.map(one))).map(text);
    alone.forEach((t, i) => assert.equal(together[i], t, `prompt ${i}`));
  } finally {
    const r = await wide.stop();
    assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${wide.log().slice(-4000)}`);
  }
});
