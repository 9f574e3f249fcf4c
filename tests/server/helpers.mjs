// helpers.mjs — start `coti serve` on a free loopback port for a test file, talk to it with
// the official `openai` client (and plain fetch where a client would refuse to send the
// request: malformed JSON, oversized bodies, wrong methods), and stop it.
// COTI_BIN picks the binary (default ./coti; e.g. COTI_BIN=build-asan/coti to run the suite
// under AddressSanitizer: stop() then also reports the leak check's exit status).
import { spawn } from 'node:child_process';
import OpenAI from 'openai';

export const COTI = process.env.COTI_BIN || './coti';

// Start a server; extra command-line arguments in args. Resolves once /health answers.
export async function startServer(args = [], { bin = COTI, startTimeoutMs = 60000, clientTimeoutMs = 120000 } = {}) {
  const child = spawn(bin, ['serve', '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    });
  });
  // stderr is drained for the whole life of the server: a full pipe would block its log
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => {
    log += d;
  });
  const port = await new Promise((resolve, reject) => {
    // a server that did not start is killed: alive, it would hold the test file's process open
    const timer = setTimeout(() => {
      clearInterval(poll);
      child.kill('SIGKILL');
      reject(new Error(`server did not start in time:\n${log}`));
    }, startTimeoutMs);
    const poll = setInterval(() => {
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) {
        clearInterval(poll);
        clearTimeout(timer);
        resolve(Number(m[1]));
      } else if (exited) {
        clearInterval(poll);
        clearTimeout(timer);
        reject(new Error(`server exited (${JSON.stringify(exited)}):\n${log}`));
      }
    }, 20);
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      const r = await fetch(`${base}/health`);
      if (r.ok) break;
    } catch (e) {
      if (i > 500) throw e;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-unused', maxRetries: 0, timeout: clientTimeoutMs });
  return {
    port,
    base,
    client,
    log: () => log,
    // SIGTERM, then wait; SIGKILL after a grace period. Resolves to {code, signal}.
    async stop(graceMs = 30000) {
      if (!exited) child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
      const r = await exitPromise;
      clearTimeout(t);
      return r;
    },
  };
}

// POST (or another method) with a raw body; resolves to {status, headers, json, text}.
export async function rawRequest(base, path, { method = 'POST', body, headers = {} } = {}) {
  const r = await fetch(base + path, {
    method,
    body,
    headers: body !== undefined ? { 'content-type': 'application/json', ...headers } : headers,
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: r.status, headers: r.headers, json, text };
}

export const postJson = (base, path, obj) => rawRequest(base, path, { body: JSON.stringify(obj) });

// Server-sent events of a response body: the JSON (or "[DONE]") payload of each `data:` event.
export async function readSse(response) {
  const text = await response.text();
  const events = [];
  for (const block of text.split('\n\n')) {
    if (!block) continue;
    if (block.startsWith(':')) continue; // keep-alive comment
    if (!block.startsWith('data: ')) throw new Error(`not an SSE data event: ${JSON.stringify(block)}`);
    const payload = block.slice(6);
    events.push(payload === '[DONE]' ? '[DONE]' : JSON.parse(payload));
  }
  return events;
}

// The Prometheus value of a metric (first sample), or NaN.
export async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = new RegExp(`^llamacpp:${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
