// slots.test.mjs — requests beyond the slots wait in the queue and all complete; a client
// that goes away (streamed or not) frees its slot at once.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { metric, rawRequest, sleep, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['-np', '1', '--spec', 'mtp']);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

const LONG = { model: 'm', prompt: 'int main(', max_tokens: 100000, ignore_eos: true, temperature: 0 };
const SHORT = { model: 'm', prompt: 'int main(', max_tokens: 4, temperature: 0 };
const JSON_TYPE = { 'content-type': 'application/json' }; // the server answers 415 to anything else

async function waitIdle() {
  for (let i = 0; i < 200; i++) {
    const slots = (await rawRequest(srv.base, '/slots', { method: 'GET' })).json;
    if (!slots[0].is_processing) return;
    await sleep(25);
  }
  assert.fail('the slot stays busy');
}

test('requests beyond the slots queue and all complete', async () => {
  // long enough (ignore_eos) that the queue is still there when we look
  const req = { ...SHORT, max_tokens: 256, ignore_eos: true };
  const ref = (await srv.client.completions.create(req)).choices[0].text;
  const jobs = Array.from({ length: 5 }, () => srv.client.completions.create(req));
  let deferred = 0;
  for (let i = 0; i < 200 && deferred === 0; i++) {
    deferred = await metric(srv.base, 'requests_deferred');
    if (!deferred) await sleep(5);
  }
  const results = await Promise.all(jobs);
  for (const r of results) assert.equal(r.choices[0].text, ref);
  assert.ok(deferred >= 1, 'the queue depth showed waiting requests');
  assert.equal(await metric(srv.base, 'requests_deferred'), 0);
});

test('a streaming client that aborts frees its slot', async () => {
  const cancelled = await metric(srv.base, 'requests_cancelled_total');
  const ac = new AbortController();
  const stream = await srv.client.completions.create({ ...LONG, stream: true }, { signal: ac.signal });
  let n = 0;
  // the client ends the iteration quietly once aborted
  for await (const c of stream) {
    if (++n === 3) ac.abort();
  }
  assert.ok(n >= 3);
  const t0 = Date.now();
  const r = await srv.client.completions.create(SHORT);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.ok(Date.now() - t0 < 20000, 'the next request did not wait for the aborted one');
  await waitIdle();
  assert.equal(await metric(srv.base, 'requests_cancelled_total'), cancelled + 1);
});

test('a non-streaming client that aborts frees its slot', async () => {
  const cancelled = await metric(srv.base, 'requests_cancelled_total');
  const ac = new AbortController();
  const p = fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: JSON_TYPE, body: JSON.stringify(LONG), signal: ac.signal });
  await sleep(400);
  ac.abort();
  await assert.rejects(p);
  const r = await srv.client.completions.create(SHORT);
  assert.equal(r.usage.completion_tokens, 4);
  await waitIdle();
  assert.equal(await metric(srv.base, 'requests_cancelled_total'), cancelled + 1);
});

test('a queued client that aborts never occupies a slot', async () => {
  const ac1 = new AbortController();
  const ac2 = new AbortController();
  const busy = srv.client.completions.create({ ...LONG, stream: true }, { signal: ac1.signal });
  const s = await busy;
  const queued = fetch(`${srv.base}/v1/completions`, { method: 'POST', headers: JSON_TYPE, body: JSON.stringify(SHORT), signal: ac2.signal });
  await sleep(200);
  ac2.abort();
  await assert.rejects(queued);
  ac1.abort();
  for await (const c of s) { /* ends at the abort */ }
  await waitIdle();
  const r = await srv.client.completions.create(SHORT);
  assert.equal(r.usage.completion_tokens, 4);
});
