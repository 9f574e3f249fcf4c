// transport.test.mjs — the connection layer under abuse (issue 30): idle and trickling
// sockets do not lock out a normal client and are closed at the header deadline, the
// per-client cap answers 503 JSON with Retry-After, a half-closed client gets its answer, an
// announced oversized body gets an early 413, limits inside the transport answer JSON, CORS
// is off unless --cors names an origin, and SIGTERM under load answers every request.
// Loopback only; attacker sockets come from other 127/8 source addresses (Linux routes the
// whole block to lo) so the per-client cap does not apply to the normal client.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { rawRequest, startServer } from './helpers.mjs';

const MAX_BODY = 65536;
const HEADER_DEADLINE_S = 10; // HTTP_HEADER_DEADLINE_S
const PER_IP = 128; // HTTP_PER_IP_CONNECTIONS
const chatBody = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 });

// Open a socket from localAddress; resolves once connected. Records when the server closes it
// (its FIN: 'end', as the socket is half-open capable; or a reset: 'close').
function openSocket(port, localAddress) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress, allowHalfOpen: true });
    s.closedAt = null;
    s.on('error', () => {});
    const closed = () => (s.closedAt ??= Date.now());
    s.on('end', closed);
    s.on('close', closed);
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

// Send raw bytes on a fresh socket and read until the server closes or `until` matches the
// text so far. halfClose: shut down our sending side after the request.
function rawExchange(port, bytes, { halfClose = false, localAddress, until, timeoutMs = 10000 } = {}) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress, allowHalfOpen: true });
    let text = '';
    const t0 = Date.now();
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no complete answer in ${timeoutMs} ms; got:\n${text}`));
    }, timeoutMs);
    const done = () => {
      clearTimeout(timer);
      s.destroy();
      resolve({ text, ms: Date.now() - t0 });
    };
    s.on('connect', () => {
      s.write(bytes);
      if (halfClose) s.end();
    });
    s.on('data', (d) => {
      text += d.toString('latin1');
      if (until && until(text)) done();
    });
    s.on('end', done);
    s.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
  });
}

// The final (non-1xx) response in raw text: {status, headers, body}.
function parseFinal(text) {
  let rest = text;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    assert.ok(end >= 0, `no complete response head in:\n${text}`);
    const head = rest.slice(0, end).split('\r\n');
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head[0])?.[1]);
    rest = rest.slice(end + 4);
    if (status >= 100 && status < 200) continue;
    const headers = {};
    for (const h of head.slice(1)) {
      const i = h.indexOf(':');
      headers[h.slice(0, i).trim().toLowerCase()] = h.slice(i + 1).trim();
    }
    return { status, headers, body: rest };
  }
}

const completeBody = (t) => {
  try {
    const r = parseFinal(t);
    const n = Number(r.headers['content-length']);
    return Number.isFinite(n) && Buffer.byteLength(r.body, 'latin1') >= n;
  } catch {
    return false;
  }
};

const post = (path, body, extra = '') =>
  `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;

describe('transport', () => {
  let srv;
  before(async () => {
    srv = await startServer(['-np', '2', '-c', '256', '--max-body', String(MAX_BODY)]);
  });
  after(async () => {
    const r = await srv.stop();
    assert.deepEqual(r, { code: 0, signal: null }, `server exit:\n${srv.log().slice(-4000)}`);
  });

  test('500 idle and 300 trickling sockets: a normal client answers within 2 s; the deadline closes them', async () => {
    const idle = [];
    const trickle = [];
    const t_open = Date.now();
    // 25 + 15 source addresses, 20 sockets each: under the per-client cap
    for (let a = 0; a < 25; a++)
      idle.push(...(await Promise.all(Array.from({ length: 20 }, () => openSocket(srv.port, `127.0.1.${a + 1}`)))));
    for (let a = 0; a < 15; a++)
      trickle.push(...(await Promise.all(Array.from({ length: 20 }, () => openSocket(srv.port, `127.0.2.${a + 1}`)))));
    const header = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ';
    let k = 0;
    const dribble = setInterval(() => {
      for (const s of trickle) if (!s.closedAt) s.write(header[Math.min(k, header.length - 1)]);
      k++;
    }, 500);
    try {
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(idle.filter((s) => s.closedAt).length + trickle.filter((s) => s.closedAt).length, 0, 'sockets closed early');
      const t0 = Date.now();
      const r = await rawRequest(srv.base, '/v1/chat/completions', { body: chatBody });
      const ms = Date.now() - t0;
      assert.equal(r.status, 200, r.text);
      assert.ok(ms < 2000, `the normal client waited ${ms} ms`);
      // bytes do not extend the header deadline: every socket is closed by it
      const limit = t_open + (HEADER_DEADLINE_S + 3) * 1000;
      while (Date.now() < limit && [...idle, ...trickle].some((s) => !s.closedAt)) await new Promise((r) => setTimeout(r, 100));
      const open = [...idle, ...trickle].filter((s) => !s.closedAt).length;
      assert.equal(open, 0, `${open} sockets still open ${HEADER_DEADLINE_S + 3} s after opening`);
      const earliest = Math.min(...trickle.map((s) => s.closedAt));
      assert.ok(earliest - t_open >= (HEADER_DEADLINE_S - 1) * 1000, 'a trickling socket was closed before the deadline');
    } finally {
      clearInterval(dribble);
      for (const s of [...idle, ...trickle]) s.destroy();
    }
  });

  test('a client over its connection cap gets 503 JSON with Retry-After, and is served once under it', async () => {
    const held = await Promise.all(Array.from({ length: PER_IP }, () => openSocket(srv.port, '127.0.3.1')));
    try {
      const { text } = await rawExchange(srv.port, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', { localAddress: '127.0.3.1', until: completeBody });
      const r = parseFinal(text);
      assert.equal(r.status, 503, text);
      assert.equal(r.headers['retry-after'], '1');
      assert.match(r.headers['content-type'], /application\/json/);
      const j = JSON.parse(r.body);
      assert.equal(j.error.type, 'unavailable_error');
      assert.match(j.error.message, /too many connections from this client/);
    } finally {
      for (const s of held) s.destroy();
    }
    await new Promise((r) => setTimeout(r, 200));
    const { text } = await rawExchange(srv.port, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', { localAddress: '127.0.3.1', until: completeBody });
    assert.equal(parseFinal(text).status, 200, text);
  });

  test('a client that half-closes after its request still gets its answer', async () => {
    for (const req of [post('/v1/chat/completions', chatBody), 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n',
      post('/v1/chat/completions', chatBody, 'Connection: close\r\n')]) {
      const { text } = await rawExchange(srv.port, req, { halfClose: true, until: completeBody });
      const r = parseFinal(text);
      assert.equal(r.status, 200, text);
      JSON.parse(r.body);
    }
    assert.doesNotMatch(srv.log(), /status=499/);
  });

  test('an announced Content-Length over the limit gets 413 before the body is sent', async () => {
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${MAX_BODY * 100}\r\n\r\n`;
    const { text, ms } = await rawExchange(srv.port, head, { until: completeBody, timeoutMs: 3000 });
    const r = parseFinal(text);
    assert.equal(r.status, 413, text);
    assert.match(JSON.parse(r.body).error.message, /exceeds the limit of 65536 bytes/);
    assert.ok(ms < 2000, `413 took ${ms} ms`);
  });

  test('transport limits answer JSON: long URL 414, large headers 431', async () => {
    const cases = [
      [`GET /${'a'.repeat(9000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 414],
      [`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(20000)}\r\n\r\n`, 431],
    ];
    for (const [req, status] of cases) {
      const { text } = await rawExchange(srv.port, req, { until: completeBody });
      const r = parseFinal(text);
      assert.equal(r.status, status, text.slice(0, 400));
      assert.match(r.headers['content-type'], /application\/json/);
      assert.equal(JSON.parse(r.body).error.code, status);
    }
  });

  test('CORS is off by default: no Access-Control-Allow-Origin, OPTIONS is no preflight', async () => {
    const r = await fetch(`${srv.base}/health`, { headers: { origin: 'http://evil.example' } });
    assert.equal(r.headers.get('access-control-allow-origin'), null);
    const p = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://evil.example', 'access-control-request-method': 'POST' },
    });
    assert.equal(p.status, 204);
    assert.equal(p.headers.get('access-control-allow-origin'), null);
    assert.equal(p.headers.get('access-control-allow-headers'), null);
    assert.equal(p.headers.get('allow'), 'POST');
  });
});

test('--cors ORIGIN allows that origin only, with Content-Type and Authorization', async () => {
  const srv = await startServer(['-np', '1', '-c', '128', '--cors', 'http://app.example']);
  try {
    const r = await fetch(`${srv.base}/health`, { headers: { origin: 'http://app.example' } });
    assert.equal(r.headers.get('access-control-allow-origin'), 'http://app.example');
    const p = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://app.example', 'access-control-request-method': 'POST' },
    });
    assert.equal(p.status, 204);
    assert.equal(p.headers.get('access-control-allow-origin'), 'http://app.example');
    assert.equal(p.headers.get('access-control-allow-headers'), 'Content-Type, Authorization');
    assert.equal(p.headers.get('access-control-allow-methods'), 'POST');
  } finally {
    assert.deepEqual(await srv.stop(), { code: 0, signal: null });
  }
});

test('SIGTERM with 32 requests in flight answers every one of them', async () => {
  const srv = await startServer(['-np', '2', '-c', '256']);
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'count' }], max_tokens: 64, temperature: 0 });
  const reqs = Array.from({ length: 32 }, (_, i) =>
    rawExchange(srv.port, post(i % 2 ? '/v1/chat/completions' : '/completion', i % 2 ? body : '{"prompt":"a","n_predict":64}'), {
      until: completeBody,
      timeoutMs: 20000,
    }).then(
      ({ text }) => parseFinal(text).status,
      (e) => `no answer: ${e.message}`,
    ));
  await new Promise((r) => setTimeout(r, 300));
  const stopped = srv.stop();
  const statuses = await Promise.all(reqs);
  for (const s of statuses) assert.ok(s === 200 || s === 503, `a request got ${s}`);
  assert.deepEqual(await stopped, { code: 0, signal: null }, srv.log().slice(-3000));
});
