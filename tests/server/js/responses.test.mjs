// OpenAI's Responses API with the official openai client (responses.create and
// responses.stream) against a live arbor server that runs the script model of
// server_reasoning_test.cc: Qwen 3's vocabulary and chat template, greedy output
// "<think>\n\nLet me think.</think> Sure!" (and '{"answer": "yes"}' where a grammar refuses
// " Sure"; after a forced call the grammar alone decides). Text with a reasoning item, a
// function-call loop (with previous_response_id and with the whole input sent back), structured
// output, and streams whose final response equals the created one.
// ARBOR_BASE_URL: the server's /v1 URL; ARBOR_MODEL: its served model name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBOR_BASE_URL;
assert.ok(baseURL, 'ARBOR_BASE_URL must be set');
const model = process.env.ARBOR_MODEL ?? 'script';
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
// Greedy: after a forced call's opening the grammar chooses among tokens the model does not rank.
const base = { model, temperature: 0 };

const tools = [{
  type: 'function', name: 'get_weather', description: 'Current weather', strict: true,
  parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] } },
    required: ['city'], additionalProperties: false },
}];
const answerFormat = {
  type: 'json_schema', name: 'answer', strict: true,
  schema: { type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'],
    additionalProperties: false },
};

// The items without the ids the server draws at random.
function shape(output) {
  return output.map(({ id, call_id, parsed_arguments, ...rest }) => ({
    ...rest,
    ...(call_id ? { call_id: 'call' } : {}),
    ...(rest.content ? { content: rest.content.map(({ parsed, ...c }) => c) } : {}),
  }));
}

function reasoningText(response) {
  const item = response.output.find((o) => o.type === 'reasoning');
  return item?.content?.map((c) => c.text).join('');
}

test('responses.create: a reasoning item, then the text', async () => {
  const r = await client.responses.create({ ...base, input: 'Hi' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.equal(reasoningText(r), 'Let me think.');
  assert.equal(r.output_text, 'Sure!');
  assert.equal(r.output[1].role, 'assistant');
  assert.equal(r.usage.output_tokens, 10);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 10);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
});

test('responses.stream: the events add up to the created response', async () => {
  const whole = await client.responses.create({ ...base, input: 'Hi' });
  const stream = client.responses.stream({ ...base, input: 'Hi' });
  let text = '';
  let reasoning = '';
  const types = [];
  let sequence = 0;
  for await (const event of stream) {
    types.push(event.type);
    assert.equal(event.sequence_number, sequence++);
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.reasoning_text.delta') reasoning += event.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(text, 'Sure!');
  assert.equal(reasoning, 'Let me think.');
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(shape(final.output), shape(whole.output));
  assert.deepEqual(final.usage, whole.usage);
});

test('max_output_tokens inside the thinking: incomplete, all reasoning', async () => {
  const r = await client.responses.create({ ...base, input: 'Hi', max_output_tokens: 4 });
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning']);
  assert.equal(reasoningText(r), 'Let me');
  assert.equal(r.output_text, '');
});

test('a function-call loop: previous_response_id, and the whole input sent back', async () => {
  const input = [{ role: 'user', content: 'What is the weather?' }];
  const first = await client.responses.create({ ...base, input, tools, tool_choice: 'required' });
  assert.equal(first.status, 'completed');
  assert.deepEqual(first.output.map((o) => o.type), ['reasoning', 'function_call']);
  const call = first.output[1];
  assert.equal(call.name, 'get_weather');
  assert.match(call.call_id, /^call_/);
  assert.ok(['Paris', 'Rome'].includes(JSON.parse(call.arguments).city), call.arguments);
  const result = { type: 'function_call_output', call_id: call.call_id, output: '18 C, sunny' };
  // The stored conversation continues...
  const next = await client.responses.create({
    ...base, previous_response_id: first.id, input: [result], tools });
  assert.equal(next.previous_response_id, first.id);
  assert.equal(next.output_text, 'Sure!');
  assert.equal(reasoningText(next), 'Let me think.');
  // ... exactly as the whole conversation sent again (the reasoning item included).
  const manual = await client.responses.create({
    ...base, input: [...input, ...first.output, result], tools, store: false });
  assert.equal(manual.output_text, 'Sure!');
  assert.equal(manual.usage.input_tokens, next.usage.input_tokens);
  // Streamed, the call's arguments arrive as deltas and equal the created call.
  const stream = client.responses.stream({ ...base, input, tools, tool_choice: 'required' });
  let args = '';
  for await (const event of stream) {
    if (event.type === 'response.function_call_arguments.delta') args += event.delta;
  }
  const streamed = (await stream.finalResponse()).output[1];
  assert.equal(args, call.arguments);
  assert.equal(streamed.arguments, call.arguments);
  assert.equal(streamed.name, 'get_weather');
  // A stored response that store: false made is not there.
  await assert.rejects(
    client.responses.create({ ...base, previous_response_id: manual.id, input: 'Again' }),
    (e) => e.status === 404 && e.error?.param === 'previous_response_id');
});

test('text.format json_schema: the text is valid JSON after free thinking', async () => {
  const r = await client.responses.create({ ...base, input: 'Hi', text: { format: answerFormat } });
  assert.equal(reasoningText(r), 'Let me think.');
  assert.deepEqual(JSON.parse(r.output_text), { answer: 'yes' });
  assert.deepEqual(r.text.format, answerFormat);
  const stream = client.responses.stream({ ...base, input: 'Hi', text: { format: answerFormat } });
  const final = await stream.finalResponse();
  assert.deepEqual(JSON.parse(final.output[1].content[0].text), { answer: 'yes' });
});

test('unsupported fields are 400s naming them, in OpenAI\'s error shape', async () => {
  await assert.rejects(
    client.responses.create({ ...base, input: 'Hi', tools: [{ type: 'web_search' }] }),
    (e) => e.status === 400 && e.error?.param === 'tools[0].type' &&
      e.error?.type === 'invalid_request_error');
  await assert.rejects(client.responses.create({ ...base, input: 'Hi', background: true }),
    (e) => e.status === 400 && e.error?.param === 'background');
});
