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
