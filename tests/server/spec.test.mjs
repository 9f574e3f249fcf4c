// spec.test.mjs — speculation never changes greedy output: the same requests against a
// server with --spec mtp and one with --spec off give identical text, and the per-request
// speculative settings switch drafting per slot without changing the text either.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let mtp, off;
before(async () => {
  [mtp, off] = await Promise.all([
    startServer(['--spec', 'mtp', '--spec-n-max', '4', '--spec-n-min', '1', '-np', '2']),
    startServer(['--spec', 'off', '-np', '2', '--no-warmup']), // the flag parses (warmup only runs with graphs)
  ]);
});
after(async () => {
  const r = await Promise.all([mtp.stop(), off.stop()]);
  assert.deepEqual(r, [{ code: 0, signal: null }, { code: 0, signal: null }]);
});

const PROMPTS = ['int main(', 'The quick brown fox', '#include <stdio.h>\n', 'def fib(n):'];

test('greedy completions are identical with --spec mtp and --spec off', async () => {
  for (const prompt of PROMPTS) {
    const req = { model: 'm', prompt, max_tokens: 24, temperature: 0 };
    const [a, b] = await Promise.all([mtp.client.completions.create(req), off.client.completions.create(req)]);
    assert.equal(a.choices[0].text, b.choices[0].text, prompt);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
    assert.ok(a.timings.draft_n > 0, 'mtp drafts');
    assert.ok(a.timings.draft_n_accepted <= a.timings.draft_n);
    assert.equal(b.timings.draft_n, undefined, 'nothing drafted without speculation');
  }
});

test('greedy chat, streamed, is identical too', async () => {
  const req = { model: 'm', messages: [{ role: 'user', content: 'Explain pointers in C.' }], max_tokens: 24, temperature: 0, stream: true };
  const texts = [];
  for (const s of [mtp, off]) {
    let t = '';
    for await (const c of await s.client.chat.completions.create(req)) t += c.choices[0]?.delta?.content ?? '';
    texts.push(t);
  }
  assert.equal(texts[0], texts[1]);
});

test('per-request speculative settings', async () => {
  const base = { prompt: 'int main(', n_predict: 24, temperature: 0 };
  const ref = await postJson(off.base, '/completion', base);
  const variants = [
    { 'speculative.type': 'off' },
    { speculative: { type: 'off' } },
    { 'speculative.n_max': 1 },
    { speculative: { n_max: 8, p_min: 0.5 } },
    { 'speculative.type': 'ngram', 'speculative.n_max': 2 },
  ];
  const results = await Promise.all(variants.map((v) => postJson(mtp.base, '/completion', { ...base, ...v })));
  results.forEach((r, i) => {
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.content, ref.json.content, JSON.stringify(variants[i]));
  });
  assert.equal(results[0].json.timings.draft_n, undefined, 'type off drafts nothing');
  assert.equal(results[1].json.timings.draft_n, undefined);
  assert.equal(results[0].json.generation_settings['speculative.type'], 'off');
  assert.equal(results[2].json.generation_settings['speculative.n_max'], 1);
  assert.ok(results[2].json.timings.draft_n <= results[2].json.timings.predicted_n, 'one draft per cycle at most');
  // the mtp head is only on the mtp server's model, but both load the same model: off can ask for mtp
  const up = await postJson(off.base, '/completion', { ...base, 'speculative.type': 'mtp' });
  assert.equal(up.json.content, ref.json.content);
  assert.ok(up.json.timings.draft_n > 0);
});
