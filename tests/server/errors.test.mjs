// errors.test.mjs — every malformed request gets its status and OpenAI's error shape, and a
// burst of them interleaved with good requests loses no good request.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { postJson, rawRequest, startServer } from './helpers.mjs';

const N_CTX = 128;
const MAX_BODY = 65536;
let srv;
before(async () => {
  srv = await startServer(['-np', '2', '-c', String(N_CTX), '--max-body', String(MAX_BODY)]);
});
after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
});

const chat = (extra) => JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...extra });

// [name, method, path, body (string), status, type, message pattern]
const BAD = [
  ['malformed JSON', 'POST', '/v1/chat/completions', '{"messages": [', 400, 'invalid_request_error', /malformed JSON/],
  ['trailing garbage', 'POST', '/v1/completions', '{"prompt": "a"} x', 400, 'invalid_request_error', /malformed JSON/],
  ['not an object', 'POST', '/v1/chat/completions', '[1, 2]', 400, 'invalid_request_error', /JSON object/],
  ['empty body', 'POST', '/completion', '', 400, 'invalid_request_error', /malformed JSON/],
  ['messages missing', 'POST', '/v1/chat/completions', '{"max_tokens": 4}', 400, 'invalid_request_error', /'messages' is required/],
  ['messages not an array', 'POST', '/v1/chat/completions', '{"messages": "hi"}', 400, 'invalid_request_error', /Field 'messages'/],
  ['content wrong type', 'POST', '/v1/chat/completions', '{"messages": [{"role": "user", "content": 5}]}', 400, 'invalid_request_error', /messages\[0\]\.content/],
  ['role missing', 'POST', '/v1/chat/completions', '{"messages": [{"content": "x"}]}', 400, 'invalid_request_error', /messages\[0\]\.role/],
  ['temperature a string', 'POST', '/v1/chat/completions', chat({ temperature: 'hot' }), 400, 'invalid_request_error', /Field 'temperature': expected a number/],
  ['stream a string', 'POST', '/v1/chat/completions', chat({ stream: 'yes' }), 400, 'invalid_request_error', /Field 'stream'/],
  ['stop a number', 'POST', '/v1/chat/completions', chat({ stop: 5 }), 400, 'invalid_request_error', /Field 'stop'/],
  ['stop array with a number', 'POST', '/v1/chat/completions', chat({ stop: ['a', 3] }), 400, 'invalid_request_error', /Field 'stop'/],
  ['max_tokens below -1', 'POST', '/v1/chat/completions', chat({ max_tokens: -2 }), 400, 'invalid_request_error', /Field 'max_tokens': Value must be between -1 and 2147483647/],
  ['max_tokens above 2^31-1', 'POST', '/v1/chat/completions', chat({ max_tokens: 2147483648 }), 400, 'invalid_request_error', /Field 'max_tokens': Value must be between/],
  ['n_predict fractional', 'POST', '/completion', '{"prompt": "a", "n_predict": 1.5}', 400, 'invalid_request_error', /Field 'n_predict': expected an integer/],
  ['max_tokens a string', 'POST', '/v1/completions', '{"prompt": "a", "max_tokens": "8"}', 400, 'invalid_request_error', /Field 'max_tokens'/],
  ['prompt missing', 'POST', '/v1/completions', '{"max_tokens": 4}', 400, 'invalid_request_error', /'prompt' is required/],
  ['prompt an object', 'POST', '/v1/completions', '{"prompt": {}}', 400, 'invalid_request_error', /Field 'prompt'/],
  ['prompt token out of range', 'POST', '/v1/completions', '{"prompt": [1, 999999]}', 400, 'invalid_request_error', /invalid token/],
  ['several prompts', 'POST', '/v1/completions', '{"prompt": ["a", "b"]}', 400, 'invalid_request_error', /several prompts/],
  ['empty prompt', 'POST', '/v1/completions', '{"prompt": ""}', 400, 'invalid_request_error', /empty/],
  ['n = 17 streamed', 'POST', '/v1/chat/completions', chat({ n: 17, stream: true }), 400, 'invalid_request_error', /Field 'n'/],
  ['speculative.n_max too large', 'POST', '/v1/completions', '{"prompt": "a", "speculative.n_max": 99}', 400, 'invalid_request_error', /speculative\.n_max/],
  ['speculative type unknown', 'POST', '/v1/completions', '{"prompt": "a", "speculative": {"type": "magic"}}', 400, 'invalid_request_error', /Field 'type'/],
  ['speculative not an object', 'POST', '/v1/completions', '{"prompt": "a", "speculative": 3}', 400, 'invalid_request_error', /Field 'speculative'/],
  ['model not a string', 'POST', '/v1/chat/completions', chat({ model: 7 }), 400, 'invalid_request_error', /Field 'model'/],
  ['tools requested', 'POST', '/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f' } }] }), 400, 'invalid_request_error', /tool/],
  ['tokenize without content', 'POST', '/tokenize', '{}', 400, 'invalid_request_error', /'content' is required/],
  ['detokenize a bad id', 'POST', '/detokenize', '{"tokens": [-1]}', 400, 'invalid_request_error', /Field 'tokens'/],
  ['unknown endpoint', 'GET', '/v2/nothing', undefined, 404, 'not_found_error', /File Not Found/],
  ['unknown POST endpoint', 'POST', '/v1/embeddings', '{}', 404, 'not_found_error', /File Not Found/],
  ['wrong method', 'GET', '/v1/chat/completions', undefined, 405, 'invalid_request_error', /not allowed/],
  ['wrong method on health', 'DELETE', '/health', undefined, 405, 'invalid_request_error', /not allowed/],
];

function checkError(r, status, type, pattern, name) {
  assert.equal(r.status, status, `${name}: status (${r.text})`);
  assert.ok(r.json && r.json.error, `${name}: error object in ${r.text}`);
  assert.equal(r.json.error.code, status, `${name}: code`);
  assert.equal(r.json.error.type, type, `${name}: type`);
  assert.equal(typeof r.json.error.message, 'string');
  assert.match(r.json.error.message, pattern, name);
}

describe('each malformed request', () => {
  for (const [name, method, path, body, status, type, pattern] of BAD) {
    test(name, async () => {
      const r = await rawRequest(srv.base, path, { method, body });
      checkError(r, status, type, pattern, name);
      if (status === 405) assert.ok(r.headers.get('allow'), 'a 405 names the allowed methods');
    });
  }

  test('prompt over the context: exceed_context_size_error', async () => {
    const r = await postJson(srv.base, '/v1/completions', { prompt: 'word '.repeat(400), max_tokens: 4 });
    checkError(r, 400, 'exceed_context_size_error', /context/, 'overflow');
    assert.equal(r.json.error.n_ctx, N_CTX);
    assert.ok(r.json.error.n_prompt_tokens >= N_CTX);
  });

  test('body over the limit: 413', async () => {
    const r = await rawRequest(srv.base, '/v1/completions', { body: JSON.stringify({ prompt: 'x'.repeat(MAX_BODY + 10) }) });
    checkError(r, 413, 'invalid_request_error', /exceeds the limit/, '413');
  });

  test('through the openai client: status, type and message', async () => {
    await assert.rejects(
      srv.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: -5 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.type === 'invalid_request_error' && /max_tokens/.test(e.message),
    );
    await assert.rejects(
      srv.client.completions.create({ model: 'm', prompt: 'word '.repeat(400) }),
      (e) => e.status === 400 && e.type === 'exceed_context_size_error',
    );
    await assert.rejects(
      srv.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true, temperature: 'x' }),
      (e) => e.status === 400 && /temperature/.test(e.message),
      'a stream that fails before it starts is a plain JSON error',
    );
  });

  test('an unknown model name is accepted (llama.cpp ignores the field)', async () => {
    const r = await srv.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(r.model, 'coti-tiny-qwen35-mtp-q8_0.gguf');
  });
});

describe('a burst of bad requests among good ones', () => {
  test('loses no good request', async () => {
    const good = { model: 'm', prompt: 'int main(', max_tokens: 6, temperature: 0 };
    const ref = (await srv.client.completions.create(good)).choices[0].text;
    const jobs = [];
    for (let i = 0; i < 48; i++) {
      if (i % 4 === 0) {
        jobs.push(srv.client.completions.create(good).then((r) => ['good', r.choices[0].text]));
      } else if (i % 4 === 2) {
        jobs.push(srv.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, stream: true })
          .then(async (s) => {
            let n = 0;
            for await (const c of s) n += c.choices.length;
            return ['stream', n];
          }));
      } else {
        const [name, method, path, body, status, type, pattern] = BAD[i % BAD.length];
        jobs.push(rawRequest(srv.base, path, { method, body }).then((r) => {
          checkError(r, status, type, pattern, name);
          return ['bad', r.status];
        }));
      }
    }
    const results = await Promise.all(jobs);
    for (const [kind, v] of results) {
      if (kind === 'good') assert.equal(v, ref);
      if (kind === 'stream') assert.ok(v >= 2);
    }
    assert.equal(results.filter(([k]) => k === 'good').length, 12);
    assert.deepEqual((await rawRequest(srv.base, '/health', { method: 'GET' })).json, { status: 'ok' });
  });
});
