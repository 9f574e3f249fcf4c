// choices.test.mjs — OpenAI's n > 1 streamed (issue 26 item 2): one SSE stream whose chunks carry
// each choice's index as its tokens arrive (interleaved), a role chunk and a last chunk with its
// finish_reason per choice, one usage chunk counting every choice, then [DONE]. Sampled with a
// seed, the streamed choices are the non-streamed ones, with speculation off and mtp, log-
// probabilities included. A client that goes away cancels every choice.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { metric, rawRequest, readSse, sleep, startServer } from './helpers.mjs';

const SPECS = ['off', 'mtp'];
let servers;
before(async () => {
  servers = await Promise.all(SPECS.map((spec) => startServer(['--spec', spec, '-np', '3'])));
});
after(async () => {
  const r = await Promise.all(servers.map((s) => s.stop()));
  for (const x of r) assert.deepEqual(x, { code: 0, signal: null });
});

const N = 3;
const CHAT = {
  model: 'm', messages: [{ role: 'user', content: 'Write a C function that sums an array of ints.' }],
  max_tokens: 24, temperature: 0.8, seed: 1234, n: N,
};
const COMPLETION = {
  model: 'm', prompt: 'static int sum(const int *a, int n)\n{\n', max_tokens: 24, temperature: 0.8, seed: 99, n: N, logprobs: 2,
};
const KINDS = [['chat', '/v1/chat/completions', CHAT], ['completions', '/v1/completions', COMPLETION]];

// The text of a chunk's choice (chat delta or completion text) and its log-probability entries.
const textOf = (kind, c) => (kind === 'chat' ? c.delta?.content ?? '' : c.text ?? '');
const probsOf = (c) => c.logprobs?.content ?? [];
const entry = (e) => [e.id, e.token, e.logprob];

// Stream body with the openai client: per index its text, log-probabilities, role chunks and
// finish reasons, and the usage chunk (which must come after every finish_reason).
async function streamWithClient(client, kind, body) {
  const api = kind === 'chat' ? client.chat.completions : client.completions;
  const stream = await api.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const got = Array.from({ length: body.n }, () => ({ text: '', probs: [], roles: 0, finish: [] }));
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) {
      assert.equal(usage, null, 'one usage chunk');
      assert.ok(got.every((g) => g.finish.length === 1), 'the usage chunk comes after every choice has finished');
      usage = chunk.usage;
      continue;
    }
    assert.equal(usage, null, 'nothing after the usage chunk');
    assert.equal(chunk.choices.length, 1, 'one choice per chunk');
    const c = chunk.choices[0];
    assert.ok(Number.isInteger(c.index) && c.index >= 0 && c.index < body.n, `index ${c.index}`);
    const g = got[c.index];
    assert.equal(g.finish.length, 0, `choice ${c.index} has nothing after its last chunk`);
    if (c.delta?.role) g.roles++;
    g.text += textOf(kind, c);
    g.probs.push(...probsOf(c).map(entry));
    if (c.finish_reason) g.finish.push(c.finish_reason);
  }
  return { got, usage };
}

describe('n > 1 streamed', () => {
  for (const [si, spec] of SPECS.entries()) {
    for (const [kind, path, body] of KINDS) {
      test(`${kind}, --spec ${spec}: the streamed choices are the non-streamed ones; usage counts them all`, async () => {
        const srv = servers[si];
        const whole = await postJsonOk(srv.base, path, body);
        assert.equal(whole.choices.length, N);
        const { got, usage } = await streamWithClient(srv.client, kind, body);
        for (let i = 0; i < N; i++) {
          const w = whole.choices[i];
          assert.equal(got[i].text, kind === 'chat' ? w.message.content : w.text, `choice ${i}'s text`);
          assert.deepEqual(got[i].finish, [w.finish_reason], `choice ${i}'s one finish_reason`);
          if (kind === 'chat') assert.equal(got[i].roles, 1, `choice ${i}'s role chunk`);
          else {
            assert.equal(got[i].probs.length, w.logprobs.content.length);
            assert.ok(got[i].probs.length > 0);
            assert.deepEqual(got[i].probs, probsOf(w).map(entry), `choice ${i}'s log-probabilities`);
          }
        }
        assert.ok(new Set(got.map((g) => g.text)).size > 1, 'three samples, not one');
        assert.ok(usage, 'a usage chunk');
        assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
        assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
        assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
        assert.ok(usage.completion_tokens > body.max_tokens, 'usage counts more than one choice');
      });
    }
  }

  test('the choices interleave as their tokens arrive; the stream ends with usage, then [DONE]', async () => {
    const body = { ...CHAT, ignore_eos: true, stream: true, stream_options: { include_usage: true } };
    const r = await fetch(`${servers[0].base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(r.status, 200);
    const events = await readSse(r);
    assert.equal(events.at(-1), '[DONE]');
    const usage = events.at(-2);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, N * body.max_tokens);
    assert.ok(usage.timings, 'the timings move to the usage chunk');
    const chunks = events.slice(0, -2);
    assert.ok(chunks.every((e) => e.choices.length === 1 && !e.usage && !e.timings));
    const ends = chunks.map((e, k) => [e.choices[0], k]).filter(([c]) => c.finish_reason);
    assert.deepEqual(ends.map(([c]) => c.index).sort(), [0, 1, 2]);
    assert.ok(ends.every(([c]) => c.finish_reason === 'length'));
    // with three slots, the later choices run alongside the first, not after it
    const firstEnd = ends.find(([c]) => c.index === 0)[1];
    assert.ok(chunks.slice(0, firstEnd).some((e) => e.choices[0].index > 0 && e.choices[0].delta.content),
      'text of another choice before the first one ends');
  });

  test('completions without include_usage: each last chunk carries its own choice\'s usage and timings', async () => {
    const body = { ...COMPLETION, ignore_eos: true, stream: true };
    const r = await fetch(`${servers[1].base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const events = await readSse(r);
    assert.equal(events.at(-1), '[DONE]');
    const ends = events.slice(0, -1).filter((e) => e.choices[0].finish_reason);
    assert.equal(ends.length, N);
    for (const e of ends) {
      assert.equal(e.usage.completion_tokens, body.max_tokens);
      assert.equal(e.timings.predicted_n, body.max_tokens);
    }
    assert.ok(events.slice(0, -1).every((e) => e.choices.length === 1), 'no usage chunk');
  });

  test('n above the limit is a 400, streamed or not; /completion has no n', async () => {
    for (const stream of [true, false]) {
      const r = await rawRequest(servers[0].base, '/v1/chat/completions', { body: JSON.stringify({ ...CHAT, n: 17, stream }) });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.match(r.json.error.message, /Field 'n'/);
    }
    const r = await rawRequest(servers[0].base, '/completion', { body: JSON.stringify({ prompt: 'x', n: 2, stream: true }) });
    assert.equal(r.status, 400, r.text);
    assert.match(r.json.error.message, /Field 'n'/);
  });

  test('a client that leaves a streamed n = 3 cancels every choice', async () => {
    const srv = servers[0];
    const cancelled = await metric(srv.base, 'requests_cancelled_total');
    const ac = new AbortController();
    const body = { ...COMPLETION, max_tokens: 100000, ignore_eos: true, stream: true };
    const stream = await srv.client.completions.create(body, { signal: ac.signal });
    const seen = new Set();
    for await (const c of stream) {
      seen.add(c.choices[0].index);
      if (seen.size === N) ac.abort(); // the client ends the iteration quietly once aborted
    }
    assert.equal(seen.size, N);
    for (let i = 0; ; i++) {
      const slots = (await rawRequest(srv.base, '/slots', { method: 'GET' })).json;
      if (slots.every((s) => !s.is_processing)) break;
      assert.ok(i < 400, 'the slots stay busy');
      await sleep(25);
    }
    assert.equal(await metric(srv.base, 'requests_cancelled_total'), cancelled + N);
    // and the server goes on serving
    const after = await srv.client.completions.create({ ...COMPLETION, n: 2, max_tokens: 4 });
    assert.equal(after.choices.length, 2);
  });
});

async function postJsonOk(base, path, body) {
  const r = await rawRequest(base, path, { body: JSON.stringify(body) });
  assert.equal(r.status, 200, r.text);
  return r.json;
}
