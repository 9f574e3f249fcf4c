// tools.test.mjs — tool calling (issue 26 item 3): with a template that defines tools (a
// Qwen3-style ChatML template given by --chat-template-file), `tools` are listed in the prompt as
// the template writes them and a history's tool calls and results render; with the shipped model's
// plain template `tools` is a 400 naming the field; forced calls (tool_choice "required" or a
// function) are refused until constrained decoding can make them.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { postJson, startServer } from './helpers.mjs';

let withTools, plain;
before(async () => {
  [withTools, plain] = await Promise.all([
    startServer(['--chat-template-file', 'tests/qwen3-tools.jinja', '--spec', 'mtp', '-np', '1']),
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
      [withTools, { messages: [{ role: 'user', content: 'hi' }], tools: [WEATHER], tool_choice: 'required' }, /tool_choice/],
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
});
