// Tool calling and structured output with real clients against a live arbor server that runs a
// random-weight model with Qwen 3's vocabulary and chat template (server_js_test.cc): nothing but
// arbor's grammar makes the answers valid.
//   * the official openai client: streamed tool calls, assembled by the client's own stream
//     helper, equal the non-streamed ones;
//   * LangChain's ChatOpenAI: withStructuredOutput (jsonSchema and functionCalling methods) and
//     bindTools return schema-valid results, invoked and streamed.
// ARBOR_BASE_URL: the server's /v1 URL; ARBOR_MODEL: its served model name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { ChatOpenAI } from '@langchain/openai';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';

const baseURL = process.env.ARBOR_BASE_URL;
assert.ok(baseURL, 'ARBOR_BASE_URL must be set');
const model = process.env.ARBOR_MODEL ?? 'random_qwen3';
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

// Bounded on purpose: a random model stops only where the grammar leaves it nothing else.
const weather = z.object({
  city: z.string().min(1).max(12),
  unit: z.enum(['celsius', 'fahrenheit']),
});
const sum = z.object({ a: z.number().int().min(-100).max(100), b: z.number().int().min(0).max(99) });

const openaiTools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather',
    parameters: z.toJSONSchema(weather) } },
  { type: 'function', function: { name: 'add', description: 'Adds two integers',
    parameters: z.toJSONSchema(sum) } },
];
const schemas = { get_weather: weather, add: sum };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  const schema = schemas[call.function.name];
  assert.ok(schema, `unknown function ${call.function.name}`);
  schema.parse(JSON.parse(call.function.arguments));
}

for (const tool_choice of ['required', { type: 'function', function: { name: 'add' } }]) {
  test(`openai: streamed tool calls equal the whole answer (tool_choice ${JSON.stringify(tool_choice)})`,
    async () => {
      for (const seed of [1, 2, 3]) {
        // One call: with parallel calls a random model may go on calling until max_tokens.
        const request = { model, messages, tools: openaiTools, tool_choice, seed, temperature: 1,
          max_tokens: 160, parallel_tool_calls: false };
        const whole = await client.chat.completions.create(request);
        const message = whole.choices[0].message;
        assert.equal(whole.choices[0].finish_reason, 'tool_calls');
        assert.equal(message.content, null);
        assert.equal(message.tool_calls.length, 1);
        message.tool_calls.forEach(checkCall);
        const stream = client.chat.completions.stream(request);
        const assembled = await stream.finalChatCompletion();
        const calls = assembled.choices[0].message.tool_calls;
        assert.deepEqual(calls.map((c) => [c.function.name, c.function.arguments]),
          message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
        calls.forEach(checkCall);
        assert.equal(assembled.choices[0].finish_reason, 'tool_calls');
      }
    });
}

// ChatOpenAI does not send a `seed` given to its constructor; modelKwargs does.
function chatModel({ seed, ...extra } = {}) {
  return new ChatOpenAI({
    model, apiKey: 'unused', temperature: 1, maxTokens: 160, maxRetries: 0,
    configuration: { baseURL }, modelKwargs: seed === undefined ? {} : { seed }, ...extra,
  });
}

const Person = z.object({
  name: z.string().min(1).max(10),
  age: z.number().int().min(0).max(120),
  role: z.enum(['engineer', 'teacher', 'pilot']),
}).describe('A person');

for (const method of ['jsonSchema', 'functionCalling']) {
  test(`langchain: withStructuredOutput (${method}) returns a schema-valid object`, async () => {
    for (const seed of [1, 2, 3]) {
      const structured = chatModel({ seed }).withStructuredOutput(Person, { method, name: 'Person' });
      const person = await structured.invoke('Describe a person.');
      assert.deepEqual(Person.parse(person), person);
    }
  });
}

test('langchain: withStructuredOutput includeRaw keeps the raw message', async () => {
  const structured = chatModel({ seed: 4 }).withStructuredOutput(Person,
    { method: 'functionCalling', name: 'Person', includeRaw: true });
  const { raw, parsed } = await structured.invoke('Describe a person.');
  assert.equal(raw.tool_calls.length, 1);
  assert.equal(raw.tool_calls[0].name, 'Person');
  Person.parse(parsed);
});

const tools = [
  tool(async ({ city }) => `sunny in ${city}`, { name: 'get_weather', description: 'Current weather', schema: weather }),
  tool(async ({ a, b }) => String(a + b), { name: 'add', description: 'Adds two integers', schema: sum }),
];

test('langchain: bindTools calls the tools with valid arguments, invoked and streamed', async () => {
  for (const seed of [1, 2, 3]) {
    const bound = chatModel({ seed }).bindTools(tools,
      { tool_choice: 'any', parallel_tool_calls: false });
    const ai = await bound.invoke('What is the weather in Paris?');
    assert.ok(ai.tool_calls.length >= 1, JSON.stringify(ai));
    for (const call of ai.tool_calls) schemas[call.name].parse(call.args);
    let merged;
    for await (const chunk of await bound.stream('What is the weather in Paris?')) {
      merged = merged === undefined ? chunk : merged.concat(chunk);
    }
    assert.deepEqual(merged.tool_calls.map((c) => [c.name, c.args]),
      ai.tool_calls.map((c) => [c.name, c.args]));
  }
});

test('langchain: a tool loop feeds results back (role tool) and the model answers', async () => {
  const bound = chatModel({ seed: 5 }).bindTools(tools, { tool_choice: 'add' });
  const history = [{ role: 'user', content: 'What is 2 + 3?' }];
  const ai = await bound.invoke(history);
  assert.equal(ai.tool_calls.length, 1);
  assert.equal(ai.tool_calls[0].name, 'add');
  const result = await tools[1].invoke(ai.tool_calls[0]);
  const answer = await chatModel({ seed: 5, maxTokens: 8 }).bindTools(tools)
    .invoke([...history, ai, result]);
  assert.equal(typeof answer.content, 'string');
});
