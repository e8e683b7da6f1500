// gpt-oss's harmony format with the official openai client against two live arbor servers that
// run the harmony script models of server_harmony_test.cc (Qwen 3's vocabulary plus harmony's
// markers, the shared gpt-oss template). ARBOR_BASE_URL's model writes an analysis message
// ("Let me think.") then a final one ("Sure!"); ARBOR_TOOL_BASE_URL's an analysis message
// ("Need weather.") then a call to functions.get_weather with {"city": "Paris"}. The client reads
// reasoning_content, content and tool_calls, streamed and whole alike, and sends reasoning_effort.
// ARBOR_MODEL: the served model name of both.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBOR_BASE_URL;
const toolURL = process.env.ARBOR_TOOL_BASE_URL;
assert.ok(baseURL && toolURL, 'ARBOR_BASE_URL and ARBOR_TOOL_BASE_URL must be set');
const model = process.env.ARBOR_MODEL ?? 'script';
const answer = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const caller = new OpenAI({ baseURL: toolURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

async function collect(stream) {
  let reasoning = '';
  let content = '';
  let finish = null;
  const calls = [];
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    const d = choice.delta;
    if (typeof d.reasoning_content === 'string') reasoning += d.reasoning_content;
    if (typeof d.content === 'string') {
      assert.ok(!d.content.includes('<|'), `harmony markup in a content delta: ${d.content}`);
      content += d.content;
    }
    for (const c of d.tool_calls ?? []) {
      if (!calls[c.index]) calls[c.index] = { id: c.id, name: c.function.name, arguments: '' };
      calls[c.index].arguments += c.function.arguments ?? '';
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { reasoning, content, calls, finish };
}

test('analysis is reasoning_content, final is content', async () => {
  const r = await answer.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'Let me think.');
  assert.equal(m.content, 'Sure!');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collect(await answer.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, stream: true }));
  assert.equal(s.reasoning, m.reasoning_content);
  assert.equal(s.content, m.content);
  assert.equal(s.finish, 'stop');
});

test('reasoning_effort is accepted, and checked', async () => {
  const r = await answer.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, reasoning_effort: 'high' });
  assert.equal(r.choices[0].message.content, 'Sure!');
  await assert.rejects(
    answer.chat.completions.create({ model, messages, max_tokens: 4, reasoning_effort: 'maximal' }),
    (e) => e.status === 400 && /reasoning_effort/.test(e.message));
});

test('commentary calls are tool_calls, streamed and whole', async () => {
  const r = await caller.chat.completions.create({ model, messages, tools, max_tokens: 40, temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'Need weather.');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris' });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const s = await collect(await caller.chat.completions.create({
    model, messages, tools, max_tokens: 40, temperature: 0, stream: true }));
  assert.equal(s.reasoning, 'Need weather.');
  assert.equal(s.content, '');
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].name, 'get_weather');
  assert.match(s.calls[0].id, /^call_/);
  assert.equal(s.calls[0].arguments, m.tool_calls[0].function.arguments);
  assert.equal(s.finish, 'tool_calls');
});

test('the call and its result go back through the template', async () => {
  const first = await caller.chat.completions.create({ model, messages, tools, max_tokens: 40, temperature: 0 });
  const call = first.choices[0].message.tool_calls[0];
  const r = await caller.chat.completions.create({
    model, tools, max_tokens: 40, temperature: 0,
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '18 C' }] });
  // The script model answers the same way whatever the conversation: the request renders.
  assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
});
