// The official openai npm client's embeddings.create against a live `arbor serve --task embed`
// (tests/server/server_js_test.cc: a Qwen3-Embedding-style random-weight file, 64-dimensional,
// last pooling). ARBOR_BASE_URL: e.g. http://127.0.0.1:8080/v1; ARBOR_MODEL: the served name.
//
// Without encoding_format the client asks for base64 and decodes it itself: those vectors must
// equal the float ones bit for bit (arbor's base64 read by OpenAI's decoder).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.ARBOR_BASE_URL;
assert.ok(baseURL, 'ARBOR_BASE_URL must be set');
const model = process.env.ARBOR_MODEL ?? 'random_qwen3_embed';
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

test('embeddings.create: one string, the OpenAI shape, unit length', async () => {
  const r = await client.embeddings.create({ model, input: 'The cat sat on the mat.', encoding_format: 'float' });
  assert.equal(r.object, 'list');
  assert.equal(r.model, model);
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].object, 'embedding');
  assert.equal(r.data[0].index, 0);
  assert.equal(r.data[0].embedding.length, 64);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-5);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
});

test('embeddings.create: the client\'s default (base64, decoded by it) equals float bit for bit', async () => {
  const input = ['first text', 'a second, longer text about pandas', 'third'];
  const floats = await client.embeddings.create({ model, input, encoding_format: 'float' });
  const decoded = await client.embeddings.create({ model, input });
  assert.equal(decoded.data.length, 3);
  for (let i = 0; i < 3; ++i) {
    assert.equal(decoded.data[i].index, i);
    const a = Float32Array.from(floats.data[i].embedding);
    const b = Float32Array.from(decoded.data[i].embedding);
    assert.deepEqual(b, a, `input ${i}`);
  }
  const raw = await client.embeddings.create({ model, input: 'third', encoding_format: 'base64' });
  assert.equal(typeof raw.data[0].embedding, 'string');
  const bytes = Buffer.from(raw.data[0].embedding, 'base64');
  assert.deepEqual(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4),
    Float32Array.from(floats.data[2].embedding));
});

test('embeddings.create: dimensions cuts and renormalises (Matryoshka)', async () => {
  const full = (await client.embeddings.create({ model, input: 'pandas', encoding_format: 'float' })).data[0].embedding;
  const cut = (await client.embeddings.create({ model, input: 'pandas', dimensions: 16 })).data[0].embedding;
  assert.equal(cut.length, 16);
  const head = full.slice(0, 16);
  const n = norm(head);
  for (let i = 0; i < 16; ++i) assert.ok(Math.abs(cut[i] - head[i] / n) < 1e-6, `value ${i}`);
});

test('embeddings.create: token ids and lists of them', async () => {
  const r = await client.embeddings.create({ model, input: [[1, 2, 3], [40, 41]], encoding_format: 'float' });
  assert.equal(r.data.length, 2);
  assert.equal(r.usage.prompt_tokens, 5);
  const one = await client.embeddings.create({ model, input: [40, 41], encoding_format: 'float' });
  assert.deepEqual(one.data[0].embedding, r.data[1].embedding);
});

test('embeddings.create: bad requests are BadRequestError naming the field', async () => {
  const cases = [
    [{ model, input: '' }, 'input'],
    [{ model, input: [] }, 'input'],
    [{ model, input: 'x', dimensions: 0 }, 'dimensions'],
    [{ model, input: 'x', dimensions: 65 }, 'dimensions'],
    [{ model, input: 'x', encoding_format: 'int8' }, 'encoding_format'],
  ];
  for (const [body, param] of cases) {
    await assert.rejects(client.embeddings.create(body), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, param);
      return true;
    });
  }
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'task_not_served');
});
