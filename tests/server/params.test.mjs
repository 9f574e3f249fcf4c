// params.test.mjs — llama.cpp samplers coti does not implement (DRY, Mirostat, XTC, top-n-sigma,
// dynamic temperature) are refused by name
// unless they carry the value that switches them off (then the text is what it is without
// them), wrong types are 400, and a drawn seed survives its JSON round trip: sent back, it
// replays the sampled text, with speculation off and on (issue 27, items 1-2).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let mtp, off;
before(async () => {
  [mtp, off] = await Promise.all([startServer(['--spec', 'mtp', '--spec-n-min', '1', '-np', '2']), startServer(['--spec', 'off', '-np', '2'])]);
});
after(async () => {
  const r = await Promise.all([mtp.stop(), off.stop()]);
  assert.deepEqual(r, [{ code: 0, signal: null }, { code: 0, signal: null }]);
});

const base = { prompt: 'int main(', n_predict: 16, temperature: 0 };

// every field at the value that switches its sampler off, as llama-server's defaults send them
const NEUTRAL = {
  presence_penalty: 0, frequency_penalty: 0, repeat_penalty: 1.0, repeat_last_n: 64, typical_p: 1.0,
  dry_multiplier: 0, dry_base: 1.75, dry_allowed_length: 2, dry_penalty_last_n: -1, dry_sequence_breakers: ['\n', ':'],
  mirostat: 0, mirostat_tau: 5, mirostat_eta: 0.1, xtc_probability: 0, xtc_threshold: 0.1, top_n_sigma: -1,
  dynatemp_range: 0, dynatemp_exponent: 1, timings_per_token: false,
};

describe('sampling parameters', () => {
  test('their off values are accepted and change nothing', async () => {
    const plain = await postJson(off.base, '/completion', base);
    const withOff = await postJson(off.base, '/completion', { ...base, ...NEUTRAL });
    assert.equal(plain.status, 200);
    assert.equal(withOff.status, 200, withOff.text);
    assert.equal(withOff.json.content, plain.json.content);
  });

  // (penalties, typical_p and timings_per_token are implemented: sampling.test.mjs)
  const REFUSED = [
    ['dry_multiplier', 0.8], ['mirostat', 2], ['xtc_probability', 0.5], ['top_n_sigma', 1.5], ['dynatemp_range', 0.5],
  ];
  for (const [name, value] of REFUSED)
    test(`${name}: ${JSON.stringify(value)} is refused by name`, async () => {
      for (const path of ['/completion', '/v1/completions']) {
        const r = await postJson(off.base, path, { ...base, [name]: value });
        assert.equal(r.status, 400, `${path}: ${r.text}`);
        assert.equal(r.json.error.type, 'invalid_request_error');
        assert.match(r.json.error.message, new RegExp(`Field '${name}': .* is not supported by this server`));
      }
    });

  const WRONG_TYPE = [
    ['frequency_penalty', 'high', /expected a number/], ['mirostat', 1.5, /expected an integer/],
    ['timings_per_token', 'yes', /expected a boolean/], ['dry_sequence_breakers', [1], /expected an array of strings/],
    ['dry_base', 'x', /expected a number/],
  ];
  for (const [name, value, re] of WRONG_TYPE)
    test(`${name}: ${JSON.stringify(value)} is the wrong type`, async () => {
      const r = await postJson(off.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], [name]: value });
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, new RegExp(`Field '${name}': ${re.source}`));
    });
});

describe('seed', () => {
  for (const [name, get] of [['off', () => off], ['mtp', () => mtp]])
    test(`a drawn seed, sent back, replays the sampled text (speculation ${name})`, async () => {
      const s = get();
      const hot = { prompt: 'The quick brown fox', n_predict: 32, temperature: 1.0 };
      const first = await postJson(s.base, '/completion', hot);
      assert.equal(first.status, 200, first.text);
      const seed = first.json.generation_settings.seed;
      assert.ok(Number.isSafeInteger(seed) && seed >= 0 && seed < 4294967295, `seed ${seed}`);
      const again = await postJson(s.base, '/completion', { ...hot, seed });
      assert.equal(again.status, 200, again.text);
      assert.equal(again.json.generation_settings.seed, seed);
      assert.equal(again.json.content, first.json.content);
      if (name === 'mtp') assert.ok(again.json.timings.draft_n > 0, 'speculation ran');
    });
});
