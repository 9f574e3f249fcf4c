// api.test.mjs — the endpoints through the official openai client: chat and completions,
// streamed and not, stop strings, seeds, timings and usage, and the llama.cpp extras.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { metric, postJson, rawRequest, readSse, startServer } from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--spec', 'mtp', '--spec-n-min', '1', '-np', '2']);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

const greedy = { temperature: 0 };
const PROMPT = 'int main(';
const MESSAGES = [{ role: 'user', content: 'Write a C function that adds two numbers.' }];

function checkTimings(t, usage) {
  for (const k of ['cache_n', 'prompt_n', 'prompt_ms', 'prompt_per_token_ms', 'prompt_per_second', 'predicted_n',
    'predicted_ms', 'predicted_per_token_ms', 'predicted_per_second']) {
    assert.equal(typeof t[k], 'number', `timings.${k}`);
  }
  assert.ok(t.prompt_ms > 0 && t.predicted_ms > 0);
  assert.ok(Math.abs(t.prompt_per_second - (1000 * t.prompt_n) / t.prompt_ms) < 1e-6 * t.prompt_per_second + 1e-9);
  assert.ok(Math.abs(t.predicted_per_token_ms - t.predicted_ms / t.predicted_n) < 1e-9 + 1e-9 * t.predicted_ms);
  if (t.draft_n !== undefined) {
    assert.ok(t.draft_n > 0, 'draft_n is only present when something was drafted');
    assert.ok(Number.isInteger(t.draft_n_accepted) && t.draft_n_accepted >= 0 && t.draft_n_accepted <= t.draft_n);
  }
  if (usage) {
    assert.equal(t.predicted_n, usage.completion_tokens);
    assert.equal(t.prompt_n + t.cache_n, usage.prompt_tokens);
    assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
    assert.equal(usage.prompt_tokens_details.cached_tokens, t.cache_n);
  }
}

describe('informational endpoints', () => {
  test('health, models, props, slots, metrics', async () => {
    assert.deepEqual((await rawRequest(srv.base, '/health', { method: 'GET' })).json, { status: 'ok' });
    const models = await srv.client.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0].id, 'coti-tiny-qwen35-mtp-q8_0.gguf');
    assert.equal(models.data[0].object, 'model');
    const legacy = await rawRequest(srv.base, '/models', { method: 'GET' });
    assert.equal(legacy.json.models[0].name, 'coti-tiny-qwen35-mtp-q8_0.gguf');
    const props = (await rawRequest(srv.base, '/props', { method: 'GET' })).json;
    assert.equal(props.total_slots, 2);
    assert.equal(props.default_generation_settings.n_ctx, 4096);
    assert.match(props.chat_template, /im_start/);
    assert.equal(props.kv_cache.type_k, 'f16');
    assert.equal(props.kv_cache.type_v, 'f16');
    assert.ok(props.kv_cache.k_bytes_per_slot > 0 && props.kv_cache.k_bytes_per_slot === props.kv_cache.v_bytes_per_slot);
    const slots = (await rawRequest(srv.base, '/slots', { method: 'GET' })).json;
    assert.equal(slots.length, 2);
    assert.deepEqual(slots.map((s) => s.id), [0, 1]);
    assert.equal(slots[0].speculative, true);
    const m = await rawRequest(srv.base, '/metrics', { method: 'GET' });
    assert.match(m.headers.get('content-type'), /^text\/plain/);
    for (const name of ['prompt_tokens_total', 'tokens_predicted_total', 'requests_total', 'requests_deferred',
      'requests_processing', 'spec_decode_num_draft_tokens_total', 'spec_decode_num_accepted_tokens_total',
      'predicted_tokens_seconds']) {
      assert.match(m.text, new RegExp(`^# TYPE llamacpp:${name} (counter|gauge)$`, 'm'), name);
    }
  });

  test('tokenize and detokenize round-trip; apply-template', async () => {
    const tok = await postJson(srv.base, '/tokenize', { content: 'Hello world <|im_start|>' });
    assert.equal(tok.status, 200);
    assert.ok(tok.json.tokens.length >= 3);
    assert.equal(tok.json.tokens.at(-1), 1, '<|im_start|> is one special token');
    const det = await postJson(srv.base, '/detokenize', { tokens: tok.json.tokens });
    assert.equal(det.json.content, 'Hello world <|im_start|>');
    const pieces = await postJson(srv.base, '/tokenize', { content: 'héllo', with_pieces: true });
    // a piece that is not valid UTF-8 by itself (half of 'é') comes as an array of bytes
    const bytes = pieces.json.tokens.map((t) => (typeof t.piece === 'string' ? Buffer.from(t.piece) : Buffer.from(t.piece)));
    assert.equal(Buffer.concat(bytes).toString(), 'héllo');
    assert.ok(pieces.json.tokens.some((t) => Array.isArray(t.piece)), 'é is split over byte tokens by this vocabulary');
    const tpl = await postJson(srv.base, '/apply-template', { messages: [{ role: 'system', content: 'S' }, { role: 'user', content: 'U' }] });
    assert.equal(tpl.json.prompt, '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n');
  });
});

describe('chat', () => {
  test('non-streamed answer with usage and timings', async () => {
    const r = await srv.client.chat.completions.create({ model: 'anything', messages: MESSAGES, max_tokens: 12, ...greedy });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-[A-Za-z0-9]{32}$/);
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.completion_tokens <= 12 && r.usage.completion_tokens >= 1);
    if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 12);
    checkTimings(r.timings, r.usage);
    assert.ok(r.timings.draft_n > 0, 'the MTP server drafts');
  });

  test('streamed deltas equal the non-streamed answer', async () => {
    const ref = await srv.client.chat.completions.create({ model: 'm', messages: MESSAGES, max_tokens: 16, ...greedy });
    const stream = await srv.client.chat.completions.create({
      model: 'm', messages: MESSAGES, max_tokens: 16, stream: true, stream_options: { include_usage: true }, ...greedy,
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    assert.equal(text, ref.choices[0].message.content);
    const fin = chunks.at(-2);
    assert.equal(fin.choices[0].finish_reason, ref.choices[0].finish_reason);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, ref.usage);
    checkTimings(last.timings, last.usage);
    for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  });

  test('raw SSE framing ends with [DONE]', async () => {
    const r = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: MESSAGES, max_tokens: 4, stream: true, ...greedy }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const ev = await readSse(r);
    assert.equal(ev.at(-1), '[DONE]');
    assert.ok(ev.at(-2).choices[0].finish_reason);
    assert.ok(ev.at(-2).timings);
  });
});

describe('completions', () => {
  test('non-streamed and streamed agree', async () => {
    const ref = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 16, ...greedy });
    assert.equal(ref.object, 'text_completion');
    assert.equal(ref.choices[0].finish_reason, 'length');
    assert.equal(ref.usage.completion_tokens, 16);
    checkTimings(ref.timings, ref.usage);
    const stream = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 16, stream: true, ...greedy });
    let text = '';
    let last;
    for await (const c of stream) {
      text += c.choices[0].text;
      last = c;
    }
    assert.equal(text, ref.choices[0].text);
    assert.equal(last.choices[0].finish_reason, 'length');
    // the same prompt again resumes from the checkpoint its first run left before its last token
    assert.deepEqual({ ...last.usage, prompt_tokens_details: null }, { ...ref.usage, prompt_tokens_details: null });
    assert.equal(last.usage.prompt_tokens_details.cached_tokens, ref.usage.prompt_tokens - 1);
    // stream_options.include_usage, as chat honours it: a last chunk with no choices and the usage
    const withUsage = await srv.client.completions.create({
      model: 'm', prompt: PROMPT, max_tokens: 16, stream: true, stream_options: { include_usage: true }, ...greedy,
    });
    const chunks = [];
    for await (const c of withUsage) chunks.push(c);
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), ref.choices[0].text);
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'length');
    assert.equal(chunks.at(-2).usage, undefined, 'usage only in its own chunk');
    assert.deepEqual(chunks.at(-1).choices, []);
    assert.deepEqual({ ...chunks.at(-1).usage, prompt_tokens_details: null }, { ...ref.usage, prompt_tokens_details: null });
    assert.equal(chunks.at(-1).usage.prompt_tokens_details.cached_tokens, ref.usage.prompt_tokens - 1);
    checkTimings(chunks.at(-1).timings, chunks.at(-1).usage);
    for (const c of chunks) assert.equal(c.object, 'text_completion');
  });

  test('prompt as token ids gives the same text', async () => {
    const ids = (await postJson(srv.base, '/tokenize', { content: PROMPT })).json.tokens;
    const a = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 8, ...greedy });
    const b = await srv.client.completions.create({ model: 'm', prompt: ids, max_tokens: 8, ...greedy });
    assert.equal(b.choices[0].text, a.choices[0].text);
  });

  test('native /completion: answer, tokens and stream', async () => {
    const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 8, return_tokens: true, ...greedy });
    assert.equal(r.status, 200);
    const j = r.json;
    assert.equal(j.stop, true);
    assert.equal(j.stop_type, 'limit');
    assert.equal(j.tokens.length, 8);
    assert.equal(j.tokens_predicted, 8);
    assert.equal(j.timings.predicted_n, j.tokens_predicted);
    assert.equal(j.timings.prompt_n + j.timings.cache_n, j.tokens_evaluated);
    assert.equal(j.prompt, PROMPT);
    const det = await postJson(srv.base, '/detokenize', { tokens: j.tokens });
    assert.equal(det.json.content, j.content);
    const s = await fetch(`${srv.base}/completion`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: PROMPT, n_predict: 8, stream: true, ...greedy }),
    });
    const ev = await readSse(s);
    assert.notEqual(ev.at(-1), '[DONE]', 'the native stream has no [DONE]');
    const tokens = ev.slice(0, -1);
    assert.equal(tokens.length, 8, 'one event per token');
    assert.deepEqual(tokens.map((e) => e.tokens[0]), j.tokens);
    assert.equal(tokens.map((e) => e.content).join(''), j.content);
    assert.equal(ev.at(-1).stop, true);
    assert.equal(ev.at(-1).content, '');
  });

  test('n_predict 0 evaluates the prompt only', async () => {
    const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 0 });
    assert.equal(r.status, 200);
    assert.equal(r.json.content, '');
    assert.equal(r.json.tokens_predicted, 0);
    assert.equal(r.json.timings.predicted_per_token_ms, null, 'a division by zero is written as null');
  });
});

describe('stop strings', () => {
  let ref; // greedy text, its tokens and their pieces
  before(async () => {
    const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 24, return_tokens: true, ...greedy });
    const pieces = await postJson(srv.base, '/tokenize', { content: r.json.tokens, with_pieces: true });
    ref = { text: r.json.content, pieces: pieces.json.tokens.map((t) => t.piece) };
  });

  // A stop string from the last character of one generated token, through the next token, to
  // the first character of the one after: it can only match across token boundaries.
  function straddlingStop() {
    for (let i = 1; i + 2 < ref.pieces.length; i++) {
      const [p, q, r] = ref.pieces.slice(i, i + 3);
      if ([p, q, r].every((x) => typeof x === 'string' && x.length > 0)) {
        const stop = p.slice(-1) + q + r.slice(0, 1);
        return { stop, expect: ref.text.slice(0, ref.text.indexOf(stop)) };
      }
    }
    throw new Error(`no straddling stop in ${JSON.stringify(ref.pieces)}`);
  }

  test('matched across token boundaries and never emitted', async () => {
    const { stop, expect } = straddlingStop();
    const r = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 24, stop, ...greedy });
    assert.equal(r.choices[0].text, expect);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(!r.choices[0].text.includes(stop));
    const native = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 24, stop: [stop], ...greedy });
    assert.equal(native.json.stop_type, 'word');
    assert.equal(native.json.stopping_word, stop);
    assert.equal(native.json.content, expect);
  });

  test('streamed with a stop string, in chat too', async () => {
    const { stop, expect } = straddlingStop();
    const stream = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 24, stop: ['zzz-never', stop], stream: true, ...greedy });
    let text = '';
    for await (const c of stream) text += c.choices[0].text;
    assert.equal(text, expect);
    const chatRef = await srv.client.chat.completions.create({ model: 'm', messages: MESSAGES, max_tokens: 12, ...greedy });
    const content = chatRef.choices[0].message.content;
    if (content.length >= 6) {
      const s = content.slice(3, 6);
      const chat = await srv.client.chat.completions.create({ model: 'm', messages: MESSAGES, max_tokens: 12, stop: s, ...greedy });
      assert.equal(chat.choices[0].message.content, content.slice(0, content.indexOf(s)));
      assert.equal(chat.choices[0].finish_reason, 'stop');
    }
  });

  test('a stop string that never matches changes nothing', async () => {
    const r = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 24, stop: ['\u0001never'], ...greedy });
    assert.equal(r.choices[0].text, ref.text);
    assert.equal(r.choices[0].finish_reason, 'length');
  });
});

describe('sampling', () => {
  const hot = { temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, max_tokens: 10 };
  test('the same seed reproduces the same text at temperature > 0', async () => {
    const a = await srv.client.completions.create({ model: 'm', prompt: PROMPT, seed: 42, ...hot });
    const b = await srv.client.completions.create({ model: 'm', prompt: PROMPT, seed: 42, ...hot });
    assert.equal(a.choices[0].text, b.choices[0].text);
    // ... concurrently on two slots as well
    const [c, d] = await Promise.all([42, 42].map((seed) => srv.client.completions.create({ model: 'm', prompt: PROMPT, seed, ...hot })));
    assert.equal(c.choices[0].text, a.choices[0].text);
    assert.equal(d.choices[0].text, a.choices[0].text);
    const others = await Promise.all([1, 2, 3].map((seed) => srv.client.completions.create({ model: 'm', prompt: PROMPT, seed, ...hot })));
    assert.ok(others.some((o) => o.choices[0].text !== a.choices[0].text), 'different seeds sample differently');
  });
});

describe('metrics count the work', () => {
  test('counters move', async () => {
    const before = await metric(srv.base, 'tokens_predicted_total');
    const reqs = await metric(srv.base, 'requests_total');
    await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 5, ...greedy });
    assert.equal(await metric(srv.base, 'tokens_predicted_total'), before + 5);
    assert.equal(await metric(srv.base, 'requests_total'), reqs + 1);
    assert.ok((await metric(srv.base, 'spec_decode_num_draft_tokens_total')) >= (await metric(srv.base, 'spec_decode_num_accepted_tokens_total')));
  });
});
