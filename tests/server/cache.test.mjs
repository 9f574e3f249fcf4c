// cache.test.mjs — prompt cache reuse per slot (cache_prompt): a prompt that continues what a
// slot holds only prefills the new suffix, gives the same greedy text as a full prefill, and
// reports the reuse in timings.cache_n and usage.prompt_tokens_details.cached_tokens.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['-np', '2', '--spec', 'mtp']);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

const tokenize = async (content) => (await postJson(srv.base, '/tokenize', { content })).json.tokens;

test('a continuation reuses the slot that holds its prefix', async () => {
  const p = await tokenize('int main(int argc, char **argv) {\n');
  const a = await postJson(srv.base, '/completion', { prompt: p, n_predict: 8, temperature: 0, return_tokens: true });
  assert.equal(a.json.timings.cache_n, 0);
  assert.equal(a.json.stop_type, 'limit');
  // another request in between takes the other (least recently used) slot
  const other = await postJson(srv.base, '/completion', { prompt: 'The quick brown fox', n_predict: 4, temperature: 0 });
  assert.notEqual(other.json.id_slot, a.json.id_slot);
  // the slot holds the prompt and all generated tokens but the last (still pending)
  const held = p.length + a.json.tokens.length - 1;
  const b = [...p, ...a.json.tokens, ...(await tokenize('    return 0;\n'))];
  const cached = await srv.client.completions.create({ model: 'm', prompt: b, max_tokens: 12, temperature: 0 });
  assert.equal(cached.timings.cache_n, held);
  assert.equal(cached.timings.prompt_n, b.length - held);
  assert.equal(cached.usage.prompt_tokens, b.length);
  assert.equal(cached.usage.prompt_tokens_details.cached_tokens, held);
  const full = await srv.client.completions.create({ model: 'm', prompt: b, max_tokens: 12, temperature: 0, cache_prompt: false });
  assert.equal(full.timings.cache_n, 0);
  assert.equal(full.timings.prompt_n, b.length);
  assert.equal(full.choices[0].text, cached.choices[0].text, 'reuse gives the same greedy text');
});

test('a prompt that diverges from the held tokens resumes from the checkpoint before it', async () => {
  const p = await tokenize('static int add(int a, int b) {');
  const a = await postJson(srv.base, '/completion', { prompt: p, n_predict: 4, temperature: 0, return_tokens: true });
  const b = [...p, ...a.json.tokens.slice(0, -2), 5, 6, 7];
  const r = await postJson(srv.base, '/completion', { prompt: b, n_predict: 4, temperature: 0 });
  // the recurrent state is known where the prefill of p left a checkpoint: before p's last token
  assert.equal(r.json.timings.cache_n, p.length - 1);
  assert.equal(r.json.timings.prompt_n, b.length - (p.length - 1));
  const cold = await postJson(srv.base, '/completion', { prompt: b, n_predict: 4, temperature: 0, cache_prompt: false });
  assert.equal(cold.json.timings.cache_n, 0);
  assert.equal(r.json.content, cold.json.content);
});

test('another speculation type reuses what it can continue from, and results stay equal', async () => {
  const p = await tokenize('#include <stdlib.h>\n');
  const a = await postJson(srv.base, '/completion', { prompt: p, n_predict: 6, temperature: 0, return_tokens: true });
  const b = [...p, ...a.json.tokens, ...(await tokenize('\n'))];
  // speculation off needs no drafter state: the slot's whole held state serves
  const r = await postJson(srv.base, '/completion', { prompt: b, n_predict: 6, temperature: 0, 'speculative.type': 'off' });
  assert.equal(r.json.timings.cache_n, p.length + a.json.tokens.length - 1);
  const again = await postJson(srv.base, '/completion', { prompt: b, n_predict: 6, temperature: 0, 'speculative.type': 'off', cache_prompt: false });
  assert.equal(r.json.content, again.json.content);
  // back to mtp: the head's state resumes only where a checkpoint holds the hidden row it needs
  const m = await postJson(srv.base, '/completion', { prompt: b, n_predict: 6, temperature: 0 });
  const mCold = await postJson(srv.base, '/completion', { prompt: b, n_predict: 6, temperature: 0, cache_prompt: false });
  assert.equal(m.json.content, mCold.json.content);
  assert.ok(m.json.timings.cache_n < b.length);
});

test('four clients sharing a long system prompt: the first prefills it, the others only their own part', async () => {
  const s4 = await startServer(['-np', '4', '--spec', 'mtp', '-c', '2048']);
  try {
    const lines = [];
    for (let i = 0; lines.join('\n').length < 3600; i++) lines.push(`int f${i}(int x) { return x * ${i} + ${i % 7}; }`);
    const system = `You are a C assistant. Here is the code base:\n${lines.join('\n')}`;
    const questions = ['What does f3 return?', 'Write f2 in Rust.', 'Is f5 pure?', 'Explain f1 briefly.'];
    const body = (q, extra = {}) => ({
      model: 'm', messages: [{ role: 'system', content: system }, { role: 'user', content: q }], max_tokens: 8,
      temperature: 0, ...extra,
    });
    // the system turn's tokens: where every request's prompt stops being shared
    const head = await postJson(s4.base, '/apply-template', { messages: [{ role: 'system', content: system }], add_generation_prompt: false });
    const nHead = (await postJson(s4.base, '/tokenize', { content: head.json.prompt, parse_special: true })).json.tokens.length;
    assert.ok(nHead >= 1000, `the system prompt has ${nHead} tokens`);
    const first = await s4.client.chat.completions.create(body(questions[0]));
    assert.equal(first.timings.cache_n, 0);
    const rest = await Promise.all(questions.slice(1).map((q) => s4.client.chat.completions.create(body(q))));
    for (const r of rest) {
      assert.equal(r.timings.cache_n, nHead, 'the shared system turn is taken, not prefilled');
      assert.equal(r.timings.prompt_n, r.usage.prompt_tokens - nHead);
    }
    // the same answers as cold prefills
    for (const [i, r] of [first, ...rest].entries()) {
      const cold = await s4.client.chat.completions.create(body(questions[i], { cache_prompt: false }));
      assert.equal(cold.timings.cache_n, 0);
      assert.equal(r.choices[0].message.content, cold.choices[0].message.content, questions[i]);
    }
    // an identical request runs only its last prompt token
    const again = await s4.client.chat.completions.create(body(questions[0]));
    assert.equal(again.timings.prompt_n, 1);
    assert.equal(again.choices[0].message.content, first.choices[0].message.content);
  } finally {
    const r = await s4.stop();
    assert.deepEqual(r, { code: 0, signal: null });
  }
});
