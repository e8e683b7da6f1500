// Anthropic's Messages API with the official @anthropic-ai/sdk client (messages.create,
// messages.stream, messages.countTokens) against a live arbor server started with --api-key
// (the client sends it as x-api-key) that runs the script model of server_reasoning_test.cc:
// Qwen 3's vocabulary and chat template, greedy output "<think>\n\nLet me think.</think> Sure!".
// Text after a thinking block, thinking switched on and off, a tool-use loop, stop sequences,
// max_tokens, and streams whose final message equals the created one.
// ARBOR_ROOT_URL: the server's root URL; ARBOR_API_KEY: its key; ARBOR_MODEL: its model name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const baseURL = process.env.ARBOR_ROOT_URL;
assert.ok(baseURL, 'ARBOR_ROOT_URL must be set');
const apiKey = process.env.ARBOR_API_KEY;
assert.ok(apiKey, 'ARBOR_API_KEY must be set');
const model = process.env.ARBOR_MODEL ?? 'script';
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const base = { model, max_tokens: 100, temperature: 0 };
const hi = [{ role: 'user', content: 'Hi' }];
const tools = [{
  name: 'get_weather', description: 'Current weather',
  input_schema: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] } },
    required: ['city'] },
}];

// The blocks without the ids the server draws at random.
const shape = (content) => content.map(({ id, ...rest }) => rest);

test('messages.create: a thinking block, then the text', async () => {
  const m = await client.messages.create({ ...base, messages: hi });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, model);
  assert.deepEqual(m.content, [
    { type: 'thinking', thinking: 'Let me think.', signature: '' },
    { type: 'text', text: 'Sure!' }]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 10);
});

test('messages.stream: the events add up to the created message', async () => {
  const whole = await client.messages.create({ ...base, messages: hi });
  const stream = client.messages.stream({ ...base, messages: hi });
  let text = '';
  let thinking = '';
  stream.on('text', (delta) => { text += delta; });
  stream.on('thinking', (delta) => { thinking += delta; });
  const types = [];
  for await (const event of stream) types.push(event.type);
  const final = await stream.finalMessage();
  assert.equal(text, 'Sure!');
  assert.equal(thinking, 'Let me think.');
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, 'end_turn');
  for (const key of ['input_tokens', 'output_tokens', 'cache_read_input_tokens']) {
    assert.equal(final.usage[key], whole.usage[key], key);
  }
  assert.equal(await stream.finalText(), 'Sure!');
});

test('thinking enabled and disabled', async () => {
  const on = await client.messages.create({
    ...base, max_tokens: 2000, messages: hi, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.deepEqual(on.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(on.content[0].thinking, 'Let me think.');
  // Off: the template closes the block in the prompt, so nothing is read as thinking; this
  // model (which does not know) writes its usual text.
  const off = await client.messages.create({ ...base, messages: hi,
    thinking: { type: 'disabled' } });
  assert.deepEqual(off.content, [{ type: 'text', text: 'Let me think.</think> Sure!' }]);
  // Anthropic's rule: the budget stays below max_tokens.
  await assert.rejects(client.messages.create({ ...base, messages: hi,
    thinking: { type: 'enabled', budget_tokens: 1024 } }),
  (e) => e instanceof Anthropic.BadRequestError && e.error?.type === 'error' &&
    e.error?.error?.type === 'invalid_request_error' && /budget_tokens/.test(e.message));
});

test('a tool-use loop', async () => {
  const messages = [{ role: 'user', content: 'What is the weather?' }];
  const first = await client.messages.create({ ...base, messages, tools,
    tool_choice: { type: 'any' } });
  assert.equal(first.stop_reason, 'tool_use');
  assert.deepEqual(first.content.map((b) => b.type), ['thinking', 'tool_use']);
  const use = first.content[1];
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'get_weather');
  assert.ok(['Paris', 'Rome'].includes(use.input.city), JSON.stringify(use.input));
  const next = await client.messages.create({ ...base, tools, messages: [
    ...messages,
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C' }] }] });
  assert.equal(next.stop_reason, 'end_turn');
  assert.deepEqual(next.content.at(-1), { type: 'text', text: 'Sure!' });
  // Streamed: input_json_delta pieces make the same input.
  const stream = client.messages.stream({ ...base, messages, tools,
    tool_choice: { type: 'tool', name: 'get_weather' } });
  let json = '';
  stream.on('inputJson', (delta) => { json += delta; });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  assert.deepEqual(JSON.parse(json), use.input);
  assert.deepEqual(shape(final.content), shape(first.content));
});

test('stop_sequences and max_tokens', async () => {
  const stopped = await client.messages.create({ ...base, messages: hi, stop_sequences: ['!'] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, '!');
  assert.deepEqual(stopped.content.at(-1), { type: 'text', text: 'Sure' });
  const cut = await client.messages.create({ ...base, max_tokens: 4, messages: hi });
  assert.equal(cut.stop_reason, 'max_tokens');
  assert.deepEqual(cut.content, [{ type: 'thinking', thinking: 'Let me', signature: '' }]);
});

test('messages.countTokens counts the prompt messages.create renders', async () => {
  const system = 'You are terse.';
  const created = await client.messages.create({ ...base, system, messages: hi, tools });
  const counted = await client.messages.countTokens({ model, system, messages: hi, tools });
  assert.deepEqual(counted, { input_tokens: created.usage.input_tokens });
});

test('errors in Anthropic\'s shape: a bad request, a wrong key', async () => {
  await assert.rejects(client.messages.create({ ...base, max_tokens: 0, messages: hi }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 &&
      e.error?.error?.type === 'invalid_request_error' && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create({ ...base, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
  (e) => e.status === 400 && /messages\[0\]\.content\[0\]\.type/.test(e.message));
  const wrong = new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ ...base, messages: hi }),
    (e) => e instanceof Anthropic.AuthenticationError &&
      e.error?.error?.type === 'authentication_error');
});
