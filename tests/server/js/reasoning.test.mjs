// Reasoning output with the official openai client against a live arbor server that runs the
// script model of server_reasoning_test.cc: Qwen 3's vocabulary and chat template, greedy output
// "<think>\n\nLet me think.</think> Sure!" (and '{"answer": "yes"}' where a grammar refuses
// " Sure"). The client reads message.reasoning_content and message.content separately; a stream's
// delta.reasoning_content and delta.content add up to the same; a JSON Schema request returns
// valid JSON in content while the thinking stays free text.
// ARBOR_BASE_URL: the server's /v1 URL; ARBOR_MODEL: its served model name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBOR_BASE_URL;
assert.ok(baseURL, 'ARBOR_BASE_URL must be set');
const model = process.env.ARBOR_MODEL ?? 'script';
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const messages = [{ role: 'user', content: 'Hi' }];
const responseFormat = {
  type: 'json_schema',
  json_schema: { name: 'answer', strict: true, schema: {
    type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'],
    additionalProperties: false } },
};

async function collect(stream) {
  let reasoning = '';
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (typeof choice.delta.reasoning_content === 'string') reasoning += choice.delta.reasoning_content;
    if (typeof choice.delta.content === 'string') {
      assert.ok(!choice.delta.content.includes('<think>'), 'markup in a content delta');
      content += choice.delta.content;
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { reasoning, content, finish };
}

test('reasoning_content and content are read separately', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'Let me think.');
  assert.equal(m.content, 'Sure!');
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('a stream adds up to the whole', async () => {
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0 });
  const s = await collect(await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, stream: true }));
  assert.equal(s.reasoning, whole.choices[0].message.reasoning_content);
  assert.equal(s.content, whole.choices[0].message.content);
  assert.equal(s.finish, 'stop');
});

test('a JSON Schema constrains the content, not the thinking', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, response_format: responseFormat });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content, 'Let me think.');
  assert.deepEqual(JSON.parse(m.content), { answer: 'yes' });
  const s = await collect(await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, response_format: responseFormat, stream: true }));
  assert.equal(s.reasoning, 'Let me think.');
  assert.deepEqual(JSON.parse(s.content), { answer: 'yes' });
});

test('enable_thinking reaches the template through chat_template_kwargs', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0,
    chat_template_kwargs: { enable_thinking: false } });
  const m = r.choices[0].message;
  // The template closed the block in the prompt: nothing is read as reasoning.
  assert.equal(m.reasoning_content, undefined);
  assert.equal(m.content, 'Let me think.</think> Sure!');
});

test('max_tokens inside the thinking leaves it all reasoning', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
  assert.equal(r.choices[0].message.reasoning_content, 'Let me');
  assert.equal(r.choices[0].message.content, '');
  assert.equal(r.choices[0].finish_reason, 'length');
});
