// grammar.test.mjs — constrained decoding through the npm `openai` client: a json_schema answer
// parses and validates against its schema (a small validator for the subset below), a GBNF
// grammar's answer matches the grammar (checked with the equivalent JS regex), json_object
// gives a JSON object; with --spec mtp and --spec off, greedy text identical; bad grammars
// and schemas are 400s naming their field.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let mtp, off;
before(async () => {
  [mtp, off] = await Promise.all([
    startServer(['--spec', 'mtp', '--spec-n-max', '4', '--spec-n-min', '1', '-np', '2']),
    startServer(['--spec', 'off', '-np', '2']),
  ]);
});
after(async () => {
  const r = await Promise.all([mtp.stop(), off.stop()]);
  assert.deepEqual(r, [{ code: 0, signal: null }, { code: 0, signal: null }]);
});

// Validate v against schema (type, properties, required, additionalProperties false, items,
// minItems, maxItems, maxLength, enum, const, anyOf); returns a list of problems.
function validate(v, s, path = '$') {
  const errs = [];
  if (s.anyOf) {
    if (!s.anyOf.some((t) => validate(v, t, path).length === 0)) errs.push(`${path}: no anyOf branch matches`);
    return errs;
  }
  if (s.const !== undefined && JSON.stringify(v) !== JSON.stringify(s.const)) errs.push(`${path}: not the const`);
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) errs.push(`${path}: not in enum`);
  const types = s.type === undefined ? [] : [].concat(s.type);
  const typeOf = (x) => (x === null ? 'null' : Array.isArray(x) ? 'array' : Number.isInteger(x) ? 'integer' : typeof x);
  if (types.length && !types.some((t) => t === typeOf(v) || (t === 'number' && typeof v === 'number'))) {
    errs.push(`${path}: type ${typeOf(v)}, want ${types}`);
    return errs;
  }
  if (typeof v === 'string' && s.maxLength !== undefined && [...v].length > s.maxLength) errs.push(`${path}: too long`);
  if (Array.isArray(v)) {
    if (s.minItems !== undefined && v.length < s.minItems) errs.push(`${path}: too few items`);
    if (s.maxItems !== undefined && v.length > s.maxItems) errs.push(`${path}: too many items`);
    if (s.items) v.forEach((x, i) => errs.push(...validate(x, s.items, `${path}[${i}]`)));
  }
  if (typeOf(v) === 'object') {
    for (const r of s.required ?? []) if (!(r in v)) errs.push(`${path}: missing ${r}`);
    for (const [k, x] of Object.entries(v)) {
      if (s.properties?.[k]) errs.push(...validate(x, s.properties[k], `${path}.${k}`));
      else if (s.additionalProperties === false) errs.push(`${path}: extra key ${k}`);
    }
  }
  return errs;
}

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 16 },
    age: { type: 'integer' },
    pet: { enum: ['cat', 'dog', 'none'] },
    scores: { type: 'array', items: { type: 'number' }, minItems: 1, maxItems: 3 },
    home: { anyOf: [{ type: 'null' }, { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false }] },
  },
  required: ['name', 'age', 'pet', 'scores', 'home'],
  additionalProperties: false,
};

test('validator self-check: it rejects what the schema forbids', () => {
  const good = { name: 'Ann', age: 3, pet: 'cat', scores: [1.5], home: null };
  assert.deepEqual(validate(good, SCHEMA), []);
  assert.ok(validate({ ...good, age: 1.5 }, SCHEMA).length);
  assert.ok(validate({ ...good, pet: 'cow' }, SCHEMA).length);
  assert.ok(validate({ ...good, scores: [] }, SCHEMA).length);
  assert.ok(validate({ ...good, extra: 1 }, SCHEMA).length);
  assert.ok(validate({ ...good, home: { town: 'x' } }, SCHEMA).length);
});

test('chat response_format json_schema: the answer parses and validates, mtp == off', async () => {
  const prompts = ['Describe a person as JSON.', 'Give me a record for Bob, 42, who has a dog.'];
  for (const content of prompts) {
    const req = {
      model: 'm',
      messages: [{ role: 'user', content }],
      max_tokens: 200,
      temperature: 0,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: SCHEMA, strict: true } },
    };
    const [a, b] = await Promise.all([mtp.client.chat.completions.create(req), off.client.chat.completions.create(req)]);
    const text = a.choices[0].message.content;
    assert.equal(text, b.choices[0].message.content, 'greedy text identical with spec on and off');
    assert.equal(a.choices[0].finish_reason, 'stop', `the schema's JSON is finished: ${text}`);
    const v = JSON.parse(text);
    assert.deepEqual(validate(v, SCHEMA), [], text);
    assert.ok(a.timings.draft_n > 0, 'speculation stayed on under the grammar');
  }
});

test('completions with a GBNF grammar: the answer matches the grammar, mtp == off', async () => {
  const grammar = 'root ::= "ID-" [0-9]{3} "-" [A-Z]{2,4} (", " item){1,3} "."\nitem ::= [a-z]{1,8} | [0-9]{1,3} "%"\n';
  const re = /^ID-[0-9]{3}-[A-Z]{2,4}(, ([a-z]{1,8}|[0-9]{1,3}%)){1,3}\.$/u;
  for (const prompt of ['The code is', 'int main(', 'Inventory:']) {
    const req = { model: 'm', prompt, max_tokens: 64, temperature: 0, grammar };
    const [a, b] = await Promise.all([mtp.client.completions.create(req), off.client.completions.create(req)]);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.match(a.choices[0].text, re);
    assert.equal(a.choices[0].finish_reason, 'stop');
  }
});

test('sampled output under a grammar stays in it (spec mtp, greedy drafts, sample-and-match)', async () => {
  const grammar = 'root ::= ("yes" | "no" | "maybe") (" " [a-z]{1,6}){0,4} "!"';
  for (let seed = 1; seed <= 4; seed++) {
    const r = await mtp.client.completions.create({ model: 'm', prompt: 'Answer:', max_tokens: 40, temperature: 1.0, seed, grammar });
    assert.match(r.choices[0].text, /^(yes|no|maybe)( [a-z]{1,6}){0,4}!$/u);
  }
});

test('native /completion with json_schema and streaming chat with json_object', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } }, required: ['ok', 'n'], additionalProperties: false };
  const r = await postJson(mtp.base, '/completion', { prompt: 'Status:', n_predict: 60, temperature: 0, json_schema: schema });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(validate(JSON.parse(r.json.content), schema), [], r.json.content);
  let t = '';
  const stream = await mtp.client.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'A JSON object please.' }], max_tokens: 120, temperature: 0, stream: true,
    response_format: { type: 'json_object' },
  });
  let finish = null;
  for await (const c of stream) {
    t += c.choices[0]?.delta?.content ?? '';
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  if (finish === 'stop') {
    const v = JSON.parse(t);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.equal(t[0], '{', t); // cut by max_tokens: still the start of an object
  }
});

test('bad grammars and schemas are 400s naming the field', async () => {
  const cases = [
    [{ grammar: 'root ::= "a" missing' }, /Field 'grammar': grammar 1:14: undefined rule 'missing'/],
    [{ grammar: 'root ::= root "a"' }, /Field 'grammar': .*left recursion/],
    [{ grammar: 42 }, /Field 'grammar': expected a string/],
    [{ json_schema: { type: 'string', pattern: 'a+' } }, /Field 'json_schema': .*unsupported keyword 'pattern'/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { $ref: '#/$defs/nope' } } } } } }, /Field 'response_format': .*points at nothing/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, /Field 'response_format': .*json_schema.schema/],
    [{ response_format: { type: 'xml' } }, /Field 'response_format'/],
    [{ grammar: 'root ::= "a"', json_schema: { type: 'string' } }, /only one of/],
  ];
  for (const [extra, re] of cases) {
    const r = await postJson(mtp.base, '/v1/completions', { model: 'm', prompt: 'x', max_tokens: 4, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra));
    assert.match(r.json.error.message, re);
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
  // the server still answers
  const ok = await mtp.client.completions.create({ model: 'm', prompt: 'x', max_tokens: 4, grammar: 'root ::= "fine"' });
  assert.equal(ok.choices[0].text, 'fine');
});
