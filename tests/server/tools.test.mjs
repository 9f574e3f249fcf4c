// tools.test.mjs — tool calling (issue 26 item 3): with a template that defines tools (a
// Qwen3-style ChatML template given by --chat-template-file), `tools` are listed in the prompt as
// the template writes them and a history's tool calls and results render; with the shipped model's
// plain template `tools` is a 400 naming the field; tool_choice "required" or a named function
// forces calls through a grammar built from the tools' parameter schemas, so even the tiny model
// answers with `tool_calls` whose arguments satisfy their schema, speculation on or off.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let withTools, plain;
before(async () => {
  [withTools, plain] = await Promise.all([
    // drafts forced on: the depth policy pauses a drafter that does not pay on a busy machine
    startServer(['--chat-template-file', 'tests/qwen3-tools.jinja', '--spec', 'mtp', '--spec-n-min', '1', '-np', '1']),
    startServer(['-np', '1']),
  ]);
});
after(async () => {
  const r = await Promise.all([withTools.stop(), plain.stop()]);
  assert.deepEqual(r, [{ code: 0, signal: null }, { code: 0, signal: null }]);
});

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

describe('tool calling', () => {
  test('declarations are listed in the system turn as tojson writes them', async () => {
    const r = await postJson(withTools.base, '/apply-template', {
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' }],
      tools: [WEATHER],
    });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.json.prompt.startsWith('<|im_start|>system\nBe brief.\n\n# Tools\n\n'), r.json.prompt);
    assert.ok(r.json.prompt.includes('<tools>\n{"type": "function", "function": {"name": "get_weather", "description": '
      + '"Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
      + '"required": ["city"]}}}\n</tools>'), r.json.prompt);
    assert.ok(r.json.prompt.endsWith('<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n'));
  });

  test('a history of calls and results renders as the template does', async () => {
    const r = await postJson(withTools.base, '/apply-template', {
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [
          { id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: '18C, sunny' },
      ],
      tools: [WEATHER],
    });
    assert.equal(r.status, 200, r.text);
    assert.ok(r.json.prompt.endsWith('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
      + '{"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C, sunny\n'
      + '</tool_response><|im_end|>\n<|im_start|>assistant\n'), r.json.prompt);
  });

  test('with tools the answer comes back through the client; no call written: content and "stop"', async () => {
    const c = await withTools.client.chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [WEATHER], max_tokens: 8, temperature: 0,
    });
    assert.equal(c.choices[0].message.role, 'assistant');
    assert.equal(typeof c.choices[0].message.content, 'string');
    assert.equal(c.choices[0].message.tool_calls, undefined);
    assert.ok(['stop', 'length'].includes(c.choices[0].finish_reason));
    // streamed: the same text
    const s = await withTools.client.chat.completions.create({
      model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [WEATHER], max_tokens: 8, temperature: 0,
      stream: true,
    });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.delta?.content ?? '';
    assert.equal(text, c.choices[0].message.content);
  });

  test('n = 2 streamed: each choice holds back its own call; the same calls as not streamed', async () => {
    // a grammar makes the model write a call (a city of 2-3 letters varies with the seed)
    const grammar = 'root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" '
      + '[A-Z] [a-z] [a-z]? "\\"}}\\n</tool_call>"';
    const body = {
      model: 'x', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: [WEATHER], max_tokens: 64,
      temperature: 0.8, seed: 3, n: 2, grammar,
    };
    const whole = await postJson(withTools.base, '/v1/chat/completions', body);
    assert.equal(whole.status, 200, whole.text);
    assert.ok(whole.json.choices.some((c) => c.finish_reason === 'tool_calls'), whole.text);
    const s = await withTools.client.chat.completions.create({ ...body, stream: true });
    const got = [0, 1].map(() => ({ content: '', calls: [], finish: null }));
    for await (const ch of s) {
      const c = ch.choices[0];
      const g = got[c.index];
      g.content += c.delta?.content ?? '';
      for (const tc of c.delta?.tool_calls ?? []) g.calls.push([tc.function.name, tc.function.arguments]);
      if (c.finish_reason) g.finish = c.finish_reason;
    }
    for (const [i, w] of whole.json.choices.entries()) {
      assert.equal(got[i].finish, w.finish_reason, `choice ${i}`);
      assert.deepEqual(got[i].calls, (w.message.tool_calls ?? []).map((tc) => [tc.function.name, tc.function.arguments]));
      assert.equal(got[i].content, w.message.content ?? '', 'a call goes out as tool_calls, not as content');
    }
  });

  test('tool_choice "none" leaves the tools out of the prompt', async () => {
    const r = await postJson(withTools.base, '/apply-template', {
      messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER], tool_choice: 'none',
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.prompt, '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
  });

  test('refusals name their field', async () => {
    const cases = [
      [plain, { messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER] }, /'tools'.*does not define tool calls/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: {} }] }, /tools\[0\]\.function\.name/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'retrieval' }] }, /tools\[0\]\.type/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER], tool_choice: 'maybe' }, /tool_choice/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tool_choice: 'required' }, /tool_choice.*needs 'tools'/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER],
        tool_choice: { type: 'function', function: { name: 'get_time' } } }, /no tool named 'get_time'/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER], tool_choice: 'required',
        response_format: { type: 'json_object' } }, /tool_choice.*cannot be combined/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tool_choice: 'required', tools: [{ type: 'function',
        function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'string', pattern: 'a+' } } } } }] },
        /'tools'.*pattern/],
      [withTools, { messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', tool_calls: [{ function: { name: 1 } }] }] },
        /messages\[1\]\.tool_calls\[0\]\.function\.name/],
    ];
    for (const [srv, body, re] of cases) {
      const r = await postJson(srv.base, '/v1/chat/completions', { ...body, max_tokens: 2 });
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, re);
    }
    const r = await postJson(withTools.base, '/v1/completions', { prompt: 'x', tools: [WEATHER], max_tokens: 2 });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /chat\/completions/);
  });

  // forced calls: the grammar admits only <tool_call> blocks naming a declared tool, with
  // arguments valid under its schema (enums keep the tiny model's answers short)
  const TOOLS = [
    { type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'London'] }, unit: { type: 'string', enum: ['C', 'F'] } },
      required: ['city', 'unit'] } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
      properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } } },
  ];
  const ASK = [{ role: 'user', content: 'Weather in Paris?' }];
  const checkCall = (call, name) => {
    assert.equal(call.type, 'function');
    assert.equal(typeof call.id, 'string');
    if (name) assert.equal(call.function.name, name);
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') {
      assert.deepEqual(Object.keys(args), ['city', 'unit']);
      assert.ok(['Paris', 'London'].includes(args.city) && ['C', 'F'].includes(args.unit), call.function.arguments);
    } else {
      assert.equal(call.function.name, 'get_time');
      assert.deepEqual(Object.keys(args), ['zone']);
      assert.ok(['UTC', 'CET'].includes(args.zone), call.function.arguments);
    }
  };

  for (const spec of ['mtp', 'off']) {
    test(`tool_choice naming a function comes back as tool_calls (spec ${spec})`, async () => {
      const req = { model: 'x', messages: ASK, tools: TOOLS, max_tokens: 64, temperature: 0,
        tool_choice: { type: 'function', function: { name: 'get_time' } }, speculative: { type: spec } };
      const c = await withTools.client.chat.completions.create(req);
      const m = c.choices[0].message;
      assert.equal(c.choices[0].finish_reason, 'tool_calls');
      assert.equal(m.content, null);
      assert.equal(m.tool_calls.length, 1);
      checkCall(m.tool_calls[0], 'get_time');
      // streamed: the same call, as delta.tool_calls
      const s = await withTools.client.chat.completions.create({ ...req, stream: true });
      const calls = [];
      let finish = null;
      for await (const ch of s) {
        for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) calls.push(tc);
        finish = ch.choices[0]?.finish_reason ?? finish;
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(calls.length, 1);
      assert.equal(calls[0].function.name, 'get_time');
      assert.equal(calls[0].function.arguments, m.tool_calls[0].function.arguments);
    });
  }

  test('tool_choice "required" without parallel calls gives one call of a declared tool', async () => {
    for (const temperature of [0, 0.9]) {
      // (sampled, the JSON may take the whitespace the grammar allows: room for it)
      const c = await withTools.client.chat.completions.create({ model: 'x', messages: ASK, tools: TOOLS, max_tokens: 256,
        temperature, seed: 7, tool_choice: 'required', parallel_tool_calls: false });
      assert.equal(c.choices[0].finish_reason, 'tool_calls', JSON.stringify(c.choices[0]));
      assert.equal(c.choices[0].message.tool_calls.length, 1);
      checkCall(c.choices[0].message.tool_calls[0]);
    }
  });

  test('a forced call is lossless under speculation: the same answer with mtp and off', async () => {
    const ask = (spec) => postJson(withTools.base, '/v1/chat/completions', { messages: ASK, tools: TOOLS, max_tokens: 48,
      temperature: 0, tool_choice: 'required', speculative: { type: spec } });
    const [on, off] = [await ask('mtp'), await ask('off')];
    assert.equal(on.status, 200, on.text);
    assert.deepEqual(on.json.choices[0].message.content, off.json.choices[0].message.content);
    assert.deepEqual(on.json.choices[0].message.tool_calls?.map((t) => t.function),
      off.json.choices[0].message.tool_calls?.map((t) => t.function));
    assert.ok(on.json.timings.draft_n > 0, 'speculation ran');
  });
});
