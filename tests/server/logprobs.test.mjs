// logprobs.test.mjs — token log-probabilities (issue 26 item 1): chat `logprobs` + `top_logprobs`,
// completions `logprobs`, native `n_probs`, streamed and not, for every emitted token including
// those accepted from a draft: at temperature 0 the values are identical with speculation off,
// mtp and ngram (the verify row is the row plain decoding computes). logit_bias (OpenAI map,
// llama.cpp pairs, false bans) changes the text alike with and without speculation. n = 3 gives
// three choices, reproducible with a seed.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let servers;
before(async () => {
  // drafts forced on (--spec-n-min 1): this is about speculation's results, and the depth policy
  // pauses a drafter whose drafts do not pay on a busy machine
  servers = await Promise.all(['off', 'mtp', 'ngram'].map((spec) => startServer(['--spec', spec, ...(spec === 'off' ? [] : ['--spec-n-min', '1']), '-np', '1'])));
});
after(async () => {
  const r = await Promise.all(servers.map((s) => s.stop()));
  for (const x of r) assert.deepEqual(x, { code: 0, signal: null });
});

const MESSAGES = [{ role: 'user', content: 'Write a C function that sums an array of ints.' }];
// cache_prompt false: every request prefills alike, so even the first token's row is the same
const chat = { model: 'm', messages: MESSAGES, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3, cache_prompt: false };

function checkEntries(content, n) {
  assert.equal(content.length, n);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Array.isArray(e.bytes));
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob, 'sorted');
    // greedy: the chosen token is the most likely one
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
  }
}

describe('logprobs', () => {
  test('chat: every token has its entry, the same with speculation off, mtp and ngram', async () => {
    const answers = await Promise.all(servers.map((s) => s.client.chat.completions.create(chat)));
    const [off, ...spec] = answers;
    checkEntries(off.choices[0].logprobs.content, off.usage.completion_tokens);
    for (const a of spec) {
      assert.equal(a.choices[0].message.content, off.choices[0].message.content);
      assert.deepEqual(a.choices[0].logprobs.content, off.choices[0].logprobs.content);
    }
    assert.ok(spec[0].timings.draft_n_accepted > 0, 'mtp accepted no draft: nothing shown about drafted tokens');
  });

  test('chat streamed: the chunks carry the same entries', async () => {
    const ref = await servers[1].client.chat.completions.create(chat);
    const s = await servers[1].client.chat.completions.create({ ...chat, stream: true });
    const got = [];
    for await (const ch of s) got.push(...(ch.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(got, ref.choices[0].logprobs.content);
  });

  test('completions logprobs: N and native n_probs: N', async () => {
    const body = { model: 'm', prompt: 'int main(void) {', max_tokens: 16, temperature: 0, logprobs: 2, cache_prompt: false };
    const [a, b] = await Promise.all([servers[0].client.completions.create(body), servers[1].client.completions.create(body)]);
    assert.equal(a.choices[0].logprobs.content.length, a.usage.completion_tokens);
    assert.equal(a.choices[0].logprobs.content[0].top_logprobs.length, 2);
    assert.deepEqual(b.choices[0].logprobs.content, a.choices[0].logprobs.content);
    const n = await postJson(servers[1].base, '/completion', { prompt: 'int main(void) {', n_predict: 16, temperature: 0, n_probs: 4, cache_prompt: false });
    assert.equal(n.status, 200, n.text);
    assert.equal(n.json.completion_probabilities.length, n.json.tokens_predicted);
    assert.equal(n.json.completion_probabilities[0].top_logprobs.length, 4);
    assert.deepEqual(n.json.completion_probabilities.map((e) => e.logprob), b.choices[0].logprobs.content.map((e) => e.logprob));
    // without them: null, and none in the native answer
    const plain = await servers[0].client.completions.create({ ...body, logprobs: undefined });
    assert.equal(plain.choices[0].logprobs, null);
  });

  test('sampled tokens get their entries too; bad values are 400', async () => {
    const hot = await servers[1].client.chat.completions.create({ ...chat, temperature: 1.0, seed: 3 });
    assert.equal(hot.choices[0].logprobs.content.length, hot.usage.completion_tokens);
    const bad = [
      [{ ...chat, logprobs: false, top_logprobs: 2 }, /top_logprobs/],
      [{ ...chat, top_logprobs: 21 }, /top_logprobs/],
      [{ ...chat, logprobs: 'yes' }, /logprobs/],
    ];
    for (const [body, re] of bad) {
      const r = await postJson(servers[0].base, '/v1/chat/completions', body);
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, re);
    }
  });
});

describe('logit_bias', () => {
  const base = { model: 'm', prompt: 'int main(void) {', max_tokens: 12, temperature: 0, cache_prompt: false };
  test('a ban and a push change the greedy text alike with speculation off, mtp and ngram', async () => {
    const plain = await servers[0].client.completions.create({ ...base, logprobs: 1 });
    const first = plain.choices[0].logprobs.content[0];
    // OpenAI's map: ban the first greedy token
    const banned = await Promise.all(servers.map((s) => s.client.completions.create({ ...base, logprobs: 1, logit_bias: { [first.id]: -100 } })));
    assert.notEqual(banned[0].choices[0].logprobs.content[0].id, first.id);
    for (const b of banned) assert.equal(b.choices[0].text, banned[0].choices[0].text);
    // llama.cpp's pairs: false bans, a large bias forces
    const forced = await Promise.all(servers.map((s) => postJson(s.base, '/completion', {
      ...base, n_predict: 12, n_probs: 1, logit_bias: [[first.id, false], [42, 50]] })));
    for (const f of forced) {
      assert.equal(f.status, 200, f.text);
      assert.ok(f.json.completion_probabilities.every((e) => e.id === 42), 'token 42 forced every time');
      assert.equal(f.json.content, forced[0].json.content);
    }
    // the reported log-probabilities stay those of the model (before the bias)
    assert.equal(forced[0].json.completion_probabilities[0].top_logprobs[0].id, first.id);
  });

  test('bad biases are 400', async () => {
    const bad = [[{ 999999: 1 }, /outside the vocabulary/], [{ 5: 'x' }, /number or false/], [[[1]], /pairs/], [3, /object or an array/]];
    for (const [logit_bias, re] of bad) {
      const r = await postJson(servers[0].base, '/v1/completions', { ...base, logit_bias });
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, re);
    }
  });
});

describe('n > 1', () => {
  test('n = 3 gives 3 choices; the 2nd and 3rd take the prompt from the memory', async () => {
    const body = { model: 'm', messages: MESSAGES, max_tokens: 10, temperature: 0, n: 3 };
    const a = await servers[1].client.chat.completions.create(body);
    assert.equal(a.choices.length, 3);
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    // greedy: the same answer three times, and usage counts all of them
    for (const c of a.choices) assert.equal(c.message.content, a.choices[0].message.content);
    assert.equal(a.usage.completion_tokens, 30);
    // sampled with a seed: reproducible, choice by choice
    const hot = { model: 'm', prompt: 'The quick brown fox', max_tokens: 16, temperature: 1.0, seed: 11, n: 3 };
    const [x, y] = [await servers[0].client.completions.create(hot), await servers[0].client.completions.create(hot)];
    assert.deepEqual(x.choices.map((c) => c.text), y.choices.map((c) => c.text));
    assert.ok(new Set(x.choices.map((c) => c.text)).size > 1, 'three samples, not one');
    const bad = [[{ ...body, n: 0 }, /'n'/], [{ ...body, n: 17 }, /'n'/], [{ ...body, n: 17, stream: true }, /'n'/]];
    for (const [b, re] of bad) {
      const r = await postJson(servers[0].base, '/v1/chat/completions', b);
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, re);
    }
  });
});
