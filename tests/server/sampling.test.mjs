// sampling.test.mjs — llama.cpp's sampling parameters through the server: the penalties and
// typical_p change the text and speculation never changes what they produce; the samplers
// coti lacks are refused naming the field unless set to their off value; wrong types are 400;
// a drawn seed is an exact integer that replays the text when sent back (speculation off and
// on); timings_per_token; stream_options.include_usage on /v1/completions.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, readSse, startServer } from './helpers.mjs';

let srv, sampledDrafts;
before(async () => {
  [srv, sampledDrafts] = await Promise.all([
    startServer(['--spec', 'mtp', '--spec-n-min', '1', '-np', '2']),
    startServer(['--spec', 'mtp', '--spec-sample-drafts', '-np', '1']),
  ]);
});
after(async () => {
  const r = await Promise.all([srv.stop(), sampledDrafts.stop()]);
  assert.deepEqual(r, [{ code: 0, signal: null }, { code: 0, signal: null }], `server exit:\n${srv.log().slice(-4000)}`);
});

const PROMPT = 'int main(';
const PENALTIES = { repeat_penalty: 1.3, frequency_penalty: 0.3, presence_penalty: 0.2 };
const native = async (s, body) => {
  const r = await postJson(s.base, '/completion', { prompt: PROMPT, n_predict: 48, ...body });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json;
};

describe('honoured parameters', () => {
  test('each changes the greedy text; off values and repeat_last_n 0 change nothing', async () => {
    const base = (await native(srv, { temperature: 0 })).content;
    for (const p of [{ repeat_penalty: 1.5 }, { frequency_penalty: 1.0 }, { presence_penalty: 1.5 }, { typical_p: 0.5 }]) {
      const r = await native(srv, { temperature: 0, ...p });
      assert.notEqual(r.content, base, JSON.stringify(p));
      for (const [k, v] of Object.entries(p)) assert.equal(r.generation_settings[k], v, `generation_settings.${k}`);
    }
    const off = { repeat_penalty: 1, frequency_penalty: 0, presence_penalty: 0, typical_p: 1, repeat_last_n: 64 };
    assert.equal((await native(srv, { temperature: 0, ...off })).content, base);
    assert.equal((await native(srv, { temperature: 0, repeat_penalty: 1.5, repeat_last_n: 0 })).content, base, 'window 0 is off');
    // -1 is the whole context: a longer window than the default 64 sees more of the text
    const whole = await native(srv, { temperature: 0, frequency_penalty: 0.3, repeat_last_n: -1, n_predict: 96 });
    assert.equal(whole.generation_settings.repeat_last_n, -1);
    // and through the openai client, which passes the OpenAI names on as they are
    const c = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 48, temperature: 0, frequency_penalty: 1.0 });
    assert.equal(c.choices[0].text, (await native(srv, { temperature: 0, frequency_penalty: 1.0 })).content);
    const props = (await (await fetch(`${srv.base}/props`)).json()).default_generation_settings.params;
    assert.deepEqual(props.samplers, ['penalties', 'top_k', 'typ_p', 'top_p', 'min_p', 'temperature']);
    assert.equal(props.repeat_last_n, 64);
    assert.equal(props.repeat_penalty, 1);
  });

  test('greedy with penalties and typical_p is identical with speculation off, mtp and ngram', async () => {
    for (const prompt of [PROMPT, 'The quick brown fox', '#include <stdio.h>\n']) {
      for (const extra of [PENALTIES, { ...PENALTIES, typical_p: 0.8 }, { frequency_penalty: 0.3 }]) {
        const req = { prompt, temperature: 0, ...extra };
        const [off, mtp, ngram] = await Promise.all(['off', 'mtp', 'ngram'].map((t) => native(srv, { ...req, 'speculative.type': t })));
        assert.equal(mtp.content, off.content, `mtp: ${JSON.stringify(req)}`);
        assert.equal(ngram.content, off.content, `ngram: ${JSON.stringify(req)}`);
        assert.equal(off.timings.draft_n, undefined);
        assert.ok(mtp.timings.draft_n > 0, 'mtp drafts');
      }
    }
  });

  test('at temperature > 0 with greedy drafts, speculation replays plain sampling exactly', async () => {
    const req = { temperature: 0.9, seed: 11, ...PENALTIES, typical_p: 0.9 };
    const [off, mtp] = await Promise.all(['off', 'mtp'].map((t) => native(srv, { ...req, 'speculative.type': t })));
    assert.equal(mtp.content, off.content);
    assert.ok(mtp.timings.draft_n_accepted > 0);
  });
});

describe('samplers coti does not have', () => {
  test('refused naming the field when they would be on', async () => {
    const cases = [
      [{ mirostat: 1 }, 'mirostat'], [{ mirostat: 2 }, 'mirostat'], [{ dry_multiplier: 0.8 }, 'dry_multiplier'],
      [{ xtc_probability: 0.5 }, 'xtc_probability'], [{ top_n_sigma: 1.5 }, 'top_n_sigma'], [{ dynatemp_range: 0.5 }, 'dynatemp_range'],
    ];
    for (const [p, name] of cases) {
      const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 4, ...p });
      assert.equal(r.status, 400, JSON.stringify(p));
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.ok(r.json.error.message.includes(`'${name}'`), r.json.error.message);
    }
    // the OpenAI endpoints pass the native fields through, as llama-server does
    await assert.rejects(
      srv.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, mirostat: 2 }),
      (e) => e.status === 400 && /'mirostat'/.test(e.message),
    );
  });

  test('accepted at their off values, companions included', async () => {
    const off = [
      {
        mirostat: 0, mirostat_tau: 5, mirostat_eta: 0.1, dry_multiplier: 0, dry_base: 1.75, dry_allowed_length: 2,
        dry_penalty_last_n: 64, dry_sequence_breakers: ['\n', ':'], xtc_probability: 0, xtc_threshold: 0.1,
        top_n_sigma: -1, dynatemp_range: 0, dynatemp_exponent: 1, timings_per_token: false,
      },
      { dry_multiplier: 0.8, dry_penalty_last_n: 0 }, // DRY without a window is off
      { xtc_probability: 0.5, xtc_threshold: 0.6 }, // XTC with a threshold above 0.5 is off
      { top_n_sigma: 0 },
      { mirostat_tau: 3, dry_base: 2 }, // companions of samplers that are off
    ];
    const base = (await native(srv, { temperature: 0, n_predict: 8 })).content;
    for (const p of off) {
      const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 8, temperature: 0, ...p });
      assert.equal(r.status, 200, `${JSON.stringify(p)}: ${r.text}`);
      assert.equal(r.json.content, base, JSON.stringify(p));
    }
  });
});

describe('wrong types and ranges', () => {
  test('are 400 naming the field', async () => {
    const fields = ['frequency_penalty', 'presence_penalty', 'repeat_penalty', 'repeat_last_n', 'typical_p', 'mirostat',
      'mirostat_tau', 'mirostat_eta', 'dry_multiplier', 'dry_base', 'dry_allowed_length', 'dry_penalty_last_n',
      'dry_sequence_breakers', 'xtc_probability', 'xtc_threshold', 'top_n_sigma', 'dynatemp_range', 'dynatemp_exponent',
      'timings_per_token'];
    for (const f of fields) {
      const r = await postJson(srv.base, '/v1/completions', { prompt: PROMPT, max_tokens: 4, [f]: 'high' });
      assert.equal(r.status, 400, f);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.ok(r.json.error.message.includes(`'${f}'`), r.json.error.message);
    }
    const bad = [
      { repeat_penalty: 0 }, { repeat_penalty: -1 }, { repeat_last_n: -2 }, { repeat_last_n: 1.5 }, { mirostat: 3 },
      { mirostat: 0.5 }, { dry_sequence_breakers: [1] }, { frequency_penalty: 1e39 },
    ];
    for (const p of bad) {
      const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 4, ...p });
      assert.equal(r.status, 400, JSON.stringify(p));
      assert.ok(r.json.error.message.includes(`'${Object.keys(p)[0]}'`), r.json.error.message);
    }
    await assert.rejects(
      srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 4, frequency_penalty: 'high' }),
      (e) => e.status === 400 && /'frequency_penalty'/.test(e.message),
    );
  });
});

describe('seed', () => {
  // A request without a seed gets one drawn by the server; the seed in generation_settings,
  // sent back, gives the same text — with speculation off, with mtp (greedy drafts) and with
  // sampled drafts (rejection sampling), with and without penalties.
  test('a drawn seed survives a JSON round trip and replays the text', async () => {
    const runs = [
      [srv, { 'speculative.type': 'off' }],
      [srv, { 'speculative.type': 'mtp' }],
      [srv, { 'speculative.type': 'ngram', ...PENALTIES }],
      [sampledDrafts, {}],
      [sampledDrafts, PENALTIES],
    ];
    const seeds = new Set();
    for (const [s, extra] of runs) {
      const req = { temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, n_predict: 32, ...extra };
      const first = await native(s, req);
      const seed = first.generation_settings.seed;
      assert.ok(Number.isSafeInteger(seed) && seed >= 0 && seed < 0xffffffff, `seed ${seed}`);
      seeds.add(seed);
      const again = await native(s, { ...req, seed });
      assert.equal(again.generation_settings.seed, seed);
      assert.equal(again.content, first.content, `replay of seed ${seed} with ${JSON.stringify(extra)}`);
      // the same seed through the openai client
      const c = await s.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 32, ...req, n_predict: undefined, seed });
      assert.equal(c.choices[0].text, first.content);
    }
    assert.ok(seeds.size > 1, 'seeds are drawn, not fixed');
    // a seed that is not an integer, or beyond 2^53, is refused rather than rounded
    for (const seed of [1.5, 2 ** 60]) {
      const r = await postJson(srv.base, '/completion', { prompt: PROMPT, n_predict: 4, seed });
      assert.equal(r.status, 400, `seed ${seed}`);
      assert.match(r.json.error.message, /'seed'/);
    }
  });
});

describe('streaming extras', () => {
  test('timings_per_token puts the timings so far in each token event', async () => {
    const stream = async (path, body) => readSse(await fetch(`${srv.base}${path}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
    }));
    const ev = await stream('/completion', { prompt: PROMPT, n_predict: 8, temperature: 0, timings_per_token: true });
    const tokens = ev.slice(0, -1);
    assert.equal(tokens.length, 8);
    let last = 0;
    for (const e of tokens) {
      assert.equal(typeof e.timings.prompt_ms, 'number');
      assert.ok(e.timings.predicted_n >= last && e.timings.predicted_n >= 1 && e.timings.predicted_n <= 8, JSON.stringify(e.timings));
      last = e.timings.predicted_n;
    }
    assert.equal(ev.at(-1).timings.predicted_n, 8);
    const plain = await stream('/completion', { prompt: PROMPT, n_predict: 4, temperature: 0 });
    assert.ok(plain.slice(0, -1).every((e) => e.timings === undefined), 'no timings unless asked');
    const oai = await stream('/v1/completions', { prompt: PROMPT, max_tokens: 4, temperature: 0, timings_per_token: true });
    assert.ok(oai.slice(0, -2).every((e) => e.timings && e.timings.predicted_n >= 1));
  });

  test('/v1/completions honours stream_options.include_usage as chat does', async () => {
    const ref = await srv.client.completions.create({ model: 'm', prompt: PROMPT, max_tokens: 8, temperature: 0 });
    const chunks = [];
    const s = await srv.client.completions.create({
      model: 'm', prompt: PROMPT, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    for await (const c of s) chunks.push(c);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(last.object, 'text_completion');
    assert.deepEqual(last.usage, ref.usage);
    assert.equal(last.timings.predicted_n, 8);
    const fin = chunks.at(-2);
    assert.equal(fin.choices[0].finish_reason, 'length');
    assert.equal(fin.usage, undefined, 'usage moves to its own chunk');
    assert.equal(chunks.slice(0, -1).map((c) => c.choices[0].text).join(''), ref.choices[0].text);
  });
});
