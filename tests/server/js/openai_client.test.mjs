// The official openai npm client against a live arbor server.
// ARBOR_BASE_URL: e.g. http://127.0.0.1:8080/v1 (set by tests/server/server_js_test.cc).
// Chat always works: a model without a chat template is served with the fallback (chatml).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBOR_BASE_URL;
assert.ok(baseURL, 'ARBOR_BASE_URL must be set');
// ARBOR_API_KEY: the server's --api-key (the client sends it as a Bearer token).
const client = new OpenAI({
  baseURL, apiKey: process.env.ARBOR_API_KEY ?? 'unused', maxRetries: 0, timeout: 60_000,
});
const model = 'stories260K';
const greedy = { model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ignore_eos: true };

test('models.list names the served model', async () => {
  const page = await client.models.list();
  assert.equal(page.data[0].id, model);
});

// The server runs with --served-model-name stories260K,org/model (server_js_test.cc).
test('models.retrieve finds every served name, a "/" in it too', async () => {
  for (const id of [model, 'org/model']) {
    const m = await client.models.retrieve(id);
    assert.equal(m.id, id);
    assert.equal(m.object, 'model');
  }
  await assert.rejects(client.models.retrieve('nope'),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  const r = await client.completions.create({ ...greedy, model: 'org/model', max_tokens: 2 });
  assert.equal(r.model, model, 'responses report the first name');
});

test('the X-Request-Id header and the response id agree', async () => {
  const { data, response } = await client.completions.create(greedy).withResponse();
  const id = response.headers.get('x-request-id');
  assert.match(id, /^[0-9a-f]{32}$/);
  assert.equal(data.id, `cmpl-${id}`);
  const mine = await client.completions.create(greedy, { headers: { 'X-Request-Id': 'js-42' } });
  assert.equal(mine.id, 'cmpl-js-42');
});

test('completions non-streaming and streaming agree', async () => {
  const full = await client.completions.create(greedy);
  assert.equal(full.object, 'text_completion');
  assert.equal(full.choices.length, 1);
  assert.equal(full.choices[0].finish_reason, 'length');
  assert.equal(full.usage.completion_tokens, 10);
  assert.ok(full.choices[0].text.length > 0);

  const stream = await client.completions.create({
    ...greedy, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.text;
  }
  assert.equal(text, full.choices[0].text);
  assert.equal(usage.completion_tokens, 10);
});

test('completions n = 2 and logprobs', async () => {
  const r = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 4, n: 2, seed: 3, logprobs: 2, ignore_eos: true });
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
  for (const c of r.choices) assert.equal(c.logprobs.tokens.length, 4);
});

test('bad requests surface as BadRequestError / NotFoundError', async () => {
  await assert.rejects(client.completions.create({ ...greedy, top_p: 7 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /top_p/.test(e.message));
  await assert.rejects(client.completions.create({ ...greedy, model: 'nope' }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
});

const messages = [{ role: 'user', content: 'Tell me a story.' }];
test('chat non-streaming and streaming agree', async () => {
  const full = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(full.object, 'chat.completion');
  assert.equal(full.choices[0].message.role, 'assistant');
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, full.choices[0].message.content);
});
