// kv-cache.test.mjs — a server on quantized KV caches (-ctk q8_0 -ctv q4_0): /props reports the
// types and their bytes per slot (a q8_0 row takes 34 bytes per 32 elements, q4_0 18, f16 64),
// and a speculative greedy completion gives the text of the same server without speculation.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, rawRequest, startServer } from './helpers.mjs';

let srv;
before(async () => {
  // drafts forced on (--spec-n-min 1): this is about speculation's results, and the depth policy
  // pauses a drafter whose drafts do not pay on a busy machine
  srv = await startServer(['-ctk', 'q8_0', '--cache-type-v', 'q4_0', '-np', '1', '--spec', 'mtp', '--spec-n-min', '1']);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

describe('quantized KV cache', () => {
  test('/props names the types and their sizes', async () => {
    const { kv_cache: kv } = (await rawRequest(srv.base, '/props', { method: 'GET' })).json;
    assert.equal(kv.type_k, 'q8_0');
    assert.equal(kv.type_v, 'q4_0');
    assert.equal(kv.k_bytes_per_slot * 18, kv.v_bytes_per_slot * 34);
  });

  test('speculative greedy text equals plain decoding on the same cache', async () => {
    const body = { prompt: 'static int foo(struct device *dev)\n{\n', max_tokens: 32, temperature: 0 };
    const spec = await postJson(srv.base, '/v1/completions', body);
    const plain = await postJson(srv.base, '/v1/completions', { ...body, 'speculative.type': 'off' });
    assert.equal(spec.status, 200);
    assert.equal(plain.status, 200);
    assert.ok(spec.json.choices[0].text.length > 0);
    assert.equal(spec.json.choices[0].text, plain.json.choices[0].text);
    assert.ok(spec.json.timings.draft_n > 0, 'something was drafted');
  });
});
