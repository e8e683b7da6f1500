// Hugging Face's @huggingface/inference client against a live arbor server started with
// --accept-any-model-name (server_js_test.cc): the client sends the endpoint URL as the model, and
// its textGeneration posts TGI parameters (do_sample, max_new_tokens) to /v1/completions.
// ARBOR_ROOT_URL: the server's root, e.g. http://127.0.0.1:8080.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InferenceClient } from '@huggingface/inference';

const root = process.env.ARBOR_ROOT_URL;
assert.ok(root, 'ARBOR_ROOT_URL must be set');
const client = new InferenceClient(undefined, { endpointUrl: root });
const messages = [{ role: 'user', content: 'Tell me a story.' }];

test('chatCompletion and chatCompletionStream give the same greedy answer', async () => {
  const whole = await client.chatCompletion({ messages, max_tokens: 12, temperature: 0 });
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 12);
  let streamed = '';
  for await (const chunk of client.chatCompletionStream({ messages, max_tokens: 12, temperature: 0 })) {
    streamed += chunk.choices[0]?.delta?.content ?? '';
  }
  assert.equal(streamed, whole.choices[0].message.content);
  assert.ok(streamed.length > 0);
});

test('textGeneration with do_sample false is greedy, streamed alike', async () => {
  const parameters = { max_new_tokens: 12, do_sample: false };
  const a = await client.textGeneration({ inputs: 'Once upon a time', parameters });
  const b = await client.textGeneration({ inputs: 'Once upon a time', parameters });
  assert.equal(a.generated_text, b.generated_text);
  assert.ok(a.generated_text.length > 0);
  // The stream yields the /v1/completions chunks as they come.
  let streamed = '';
  for await (const chunk of client.textGenerationStream({ inputs: 'Once upon a time', parameters })) {
    streamed += chunk.choices?.[0]?.text ?? '';
  }
  assert.equal(streamed, a.generated_text);
});
