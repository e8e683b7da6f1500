// Drives arbor's web page (src/server/web) in headless Chromium through the DevTools protocol,
// against a live `arbor serve` of the script model (server_web_browser_test.cc starts both):
//
//   1. the page loads, names the served model and connects its engine view;
//   2. "Why?" streams reasoning and content apart ("Let me think." / "Sure!");
//   3. a JSON Schema in the structured-output box makes the answer {"answer": "yes"};
//   4. "Go on" starts a long generation: the text grows while it streams, the engine view shows a
//      running request and KV blocks in use (a screenshot is written), Stop ends it, the text stops
//      growing and the server frees the request (running 0, no KV block, one more abort);
//   5. with tools and every sampling field set, the request the page sends is checked field by
//      field, and a tool-call stream (served by the DevTools Fetch domain) shows the call and
//      sends the result back as a "tool" message;
//   6. on a second server with --api-key, the page loads without the key, says the API needs it,
//      and once it is typed in names the model, connects the engine view and chats.
//
// The protocol runs over a pipe (--remote-debugging-pipe: the browser reads fd 3 and writes fd 4,
// NUL-separated JSON), so Node's standard library is all it needs: no WebSocket, no npm package.
// Environment: ARBOR_ROOT_URL (http://127.0.0.1:PORT), ARBOR_MODEL (the served name),
// ARBOR_KEYED_URL and ARBOR_KEYED_MODEL (the --api-key server and its model), ARBOR_API_KEY,
// ARBOR_SCREENSHOT_DIR (where the PNGs go), ARBOR_CHROMIUM (default: chromium).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';

const ROOT = process.env.ARBOR_ROOT_URL;
const MODEL = process.env.ARBOR_MODEL;
const OUT = process.env.ARBOR_SCREENSHOT_DIR;
const KEYED = process.env.ARBOR_KEYED_URL;
const KEYED_MODEL = process.env.ARBOR_KEYED_MODEL;
const KEY = process.env.ARBOR_API_KEY;
const CHROME = process.env.ARBOR_CHROMIUM || 'chromium';
assert.ok(ROOT && MODEL && OUT && KEYED && KEYED_MODEL && KEY,
  'set ARBOR_ROOT_URL, ARBOR_MODEL, ARBOR_KEYED_URL, ARBOR_KEYED_MODEL, ARBOR_API_KEY and ARBOR_SCREENSHOT_DIR');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Waits are long because a loaded 2-core machine (make test runs two tests at once) can make a
// headless browser slow; a broken page fails on an assertion, not on time.

// One DevTools connection over the pipe; commands for a page carry its sessionId.
class Cdp {
  constructor(child) {
    this.child = child;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = new Set();
    this.buffer = Buffer.alloc(0);
    child.stdio[4].on('data', (chunk) => this.receive(chunk));
  }
  receive(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    let end;
    while ((end = this.buffer.indexOf(0)) >= 0) {
      const message = JSON.parse(this.buffer.subarray(0, end).toString('utf8'));
      this.buffer = this.buffer.subarray(end + 1);
      if (message.id !== undefined) {
        const p = this.pending.get(message.id);
        this.pending.delete(message.id);
        if (message.error) p.reject(new Error(p.method + ': ' + message.error.message));
        else p.resolve(message.result);
      } else {
        for (const listener of this.listeners) listener(message);
      }
    }
  }
  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    const message = { id, method, params };
    if (sessionId) message.sessionId = sessionId;
    this.child.stdio[3].write(JSON.stringify(message) + '\0');
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, method }));
  }
  // The next event named `method` (of `sessionId`) for which `accept(params)` holds.
  waitEvent(method, sessionId, accept = () => true, timeoutMs = 30000) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.listeners.delete(listener);
        reject(new Error('timed out waiting for ' + method));
      }, timeoutMs);
      const listener = (m) => {
        if (m.method === method && m.sessionId === sessionId && accept(m.params)) {
          clearTimeout(timer);
          this.listeners.delete(listener);
          resolve(m.params);
        }
      };
      this.listeners.add(listener);
    });
  }
}

class Page {
  constructor(cdp, sessionId) {
    this.cdp = cdp;
    this.sessionId = sessionId;
  }
  send(method, params) {
    return this.cdp.send(method, params, this.sessionId);
  }
  waitEvent(method, accept, timeoutMs) {
    return this.cdp.waitEvent(method, this.sessionId, accept, timeoutMs);
  }
  async eval(expression) {
    const r = await this.send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) {
      throw new Error('evaluate ' + expression + ': ' +
        (r.exceptionDetails.exception ? r.exceptionDetails.exception.description : r.exceptionDetails.text));
    }
    return r.result.value;
  }
  // Polls `expression` until it is truthy; the error names `what` and the page's status lines.
  async waitFor(expression, what, timeoutMs = 30000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const v = await this.eval(expression);
      if (v) return v;
      if (Date.now() > deadline) {
        const status = await this.eval(`[...document.querySelectorAll('.status, .error')].map((e) => e.id + ': ' + e.textContent).join(' | ')`);
        throw new Error('timed out waiting for ' + what + '; page: ' + status);
      }
      await sleep(50);
    }
  }
  async setValue(id, value) {
    await this.eval(`(() => { const e = document.getElementById(${JSON.stringify(id)}); e.value = ${JSON.stringify(String(value))}; e.dispatchEvent(new Event('change')); })()`);
  }
  click(id) {
    return this.eval(`document.getElementById(${JSON.stringify(id)}).click()`);
  }
  async screenshot(name) {
    const { data } = await this.send('Page.captureScreenshot', { format: 'png' });
    const path = join(OUT, name);
    writeFileSync(path, Buffer.from(data, 'base64'));
    console.log('screenshot: ' + path);
  }
}

async function launch() {
  const profile = mkdtempSync(join(tmpdir(), 'arbor-chromium-'));
  const args = ['--headless=new', '--remote-debugging-pipe', '--disable-gpu', '--no-first-run',
    '--no-default-browser-check', '--disable-extensions', '--disable-background-networking',
    '--disable-dev-shm-usage', '--window-size=1280,1000', '--user-data-dir=' + profile, 'about:blank'];
  // Chromium's sandbox refuses to start as root (containers, CI).
  if (process.getuid && process.getuid() === 0) args.unshift('--no-sandbox');
  const child = spawn(CHROME, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  child.on('error', (e) => { stderr += 'spawn failed: ' + e.message; });
  const cdp = new Cdp(child);
  const version = await Promise.race([
    cdp.send('Browser.getVersion'),
    exited.then((code) => { throw new Error(CHROME + ' exited with ' + code + ': ' + stderr.slice(-2000)); }),
    sleep(60000).then(() => { throw new Error(CHROME + ' did not answer within 60 s: ' + stderr.slice(-2000)); }),
  ]);
  console.log('browser: ' + version.product);
  const { targetId } = await cdp.send('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await cdp.send('Target.attachToTarget', { targetId, flatten: true });
  const close = async () => {
    try { await Promise.race([cdp.send('Browser.close'), sleep(3000)]); } catch (_) { /* gone */ }
    if (await Promise.race([exited, sleep(5000).then(() => 'running')]) === 'running') child.kill('SIGKILL');
    // Its helper processes may still be writing to the profile for a moment.
    try { rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 }); } catch (e) {
      console.log('note: could not remove ' + profile + ': ' + e.message);
    }
  };
  return { page: new Page(cdp, sessionId), close };
}

// The text of the last assistant message's parts.
const LAST = `[...document.querySelectorAll('#messages .msg.assistant')].at(-1)`;
const lastContent = `(${LAST}?.querySelector('.content').textContent ?? '')`;

async function sendMessage(page, text) {
  await page.setValue('prompt', text);
  await page.click('send');
}

async function metric(name) {
  const text = await (await fetch(ROOT + '/metrics')).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line === undefined ? NaN : Number(line.split(' ').at(-1));
}

async function loads(page, problems) {
  await page.send('Page.enable');
  await page.send('Runtime.enable');
  await page.send('Log.enable');
  page.cdp.listeners.add((m) => {
    if (m.sessionId !== page.sessionId) return;
    if (m.method === 'Runtime.exceptionThrown') problems.push('exception: ' + m.params.exceptionDetails.exception?.description);
    if (m.method === 'Log.entryAdded' && /Content Security Policy/i.test(m.params.entry.text)) problems.push('CSP: ' + m.params.entry.text);
  });
  const loaded = page.waitEvent('Page.loadEventFired');
  await page.send('Page.navigate', { url: ROOT + '/' });
  await loaded;
  assert.equal(await page.eval('document.title'), 'arbor');
  await page.waitFor(`document.getElementById('model-name').textContent === ${JSON.stringify(MODEL)}`, 'the model name');
  await page.waitFor(`document.getElementById('engine-status').textContent === 'Live'`, 'the engine view to connect');
  await page.waitFor(`document.getElementById('engine-kv-usable').textContent !== '–'`, 'a first engine event');
  await page.setValue('temperature', 0);
  await page.setValue('max-tokens', 64);
}

async function reasoningApart(page) {
  await sendMessage(page, 'Why?');
  await page.waitFor(`${LAST}?.dataset.done === 'done'`, 'the answer to "Why?"');
  assert.equal(await page.eval(`${LAST}.querySelector('.reasoning-text').textContent`), 'Let me think.');
  assert.equal(await page.eval(`${LAST}.querySelector('.reasoning').hidden`), false);
  assert.equal(await page.eval(lastContent), 'Sure!');
  assert.match(await page.eval(`document.getElementById('chat-status').textContent`), /finish_reason stop/);
  assert.equal(await page.eval(`document.querySelectorAll('#messages .msg.user').length`), 1);
}

async function structuredOutput(page) {
  await page.setValue('schema', JSON.stringify({ type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'] }));
  await sendMessage(page, 'Why?');
  await page.waitFor(`${LAST}?.dataset.done === 'done' && document.querySelectorAll('#messages .msg.assistant').length === 2`, 'the structured answer');
  assert.deepEqual(JSON.parse(await page.eval(lastContent)), { answer: 'yes' });
  await page.setValue('schema', '');
}

async function streamThenStop(page) {
  const maxTokens = 3000;
  const abortedBefore = await metric('arbor_request_aborted_total');
  await page.setValue('max-tokens', maxTokens);
  await sendMessage(page, 'Go on');
  // Streamed: the text is seen growing, several times, before it ends.
  const lengths = [];
  const deadline = Date.now() + 30000;
  while (lengths.length < 4 && Date.now() < deadline) {
    const n = await page.eval(`${LAST}?.dataset.done ? -1 : ${lastContent}.length`);
    assert.notEqual(n, -1, 'the long generation ended before it was seen streaming');
    if (n > 0 && (lengths.length === 0 || n > lengths.at(-1))) lengths.push(n);
    await sleep(30);
  }
  assert.equal(lengths.length, 4, 'the text grew ' + lengths.length + ' times: ' + lengths);
  // The engine view: a running request with KV blocks in use.
  await page.waitFor(`document.getElementById('engine-running').textContent === '1' &&
    [...document.querySelectorAll('#requests-body tr')].some((r) => r.children[1].textContent === 'running') &&
    Number(document.getElementById('engine-kv-used').textContent) > 0`, 'the engine view to show the running request');
  assert.match(await page.eval(`document.getElementById('last-step').textContent`), /^Step \d+: .*decode/);
  await page.screenshot('web_ui.png');
  await page.click('stop');
  await page.waitFor(`${LAST}?.dataset.done === 'stopped'`, 'the page to say it stopped');
  const stopped = await page.eval(lastContent);
  await sleep(600);
  assert.equal(await page.eval(lastContent), stopped, 'the text kept growing after Stop');
  const words = stopped.split(' ').filter((w) => w === 'la').length;
  assert.ok(words > 0 && words < maxTokens - 10, 'stopped after ' + words + ' of ' + maxTokens + ' tokens');
  // The server let go of it: nothing running, no KV block, one more abort; the view agrees.
  for (let i = 0; i < 100; i++) {
    if (await metric('arbor_http_active_requests') === 0 && await metric('arbor_kv_blocks_used') === 0) break;
    await sleep(100);
  }
  assert.equal(await metric('arbor_http_active_requests'), 0);
  assert.equal(await metric('arbor_kv_blocks_used'), 0);
  assert.equal(await metric('arbor_request_aborted_total'), abortedBefore + 1);
  await page.waitFor(`document.getElementById('engine-running').textContent === '0' &&
    document.getElementById('requests-body').children.length === 0 &&
    document.getElementById('engine-kv-used').textContent === '0'`, 'the engine view to show nothing running');
}

const sse = (chunks) => chunks.map((c) => 'data: ' + (typeof c === 'string' ? c : JSON.stringify(c)) + '\n\n').join('');
const chunk = (delta, finish = null) => ({ id: 'chatcmpl-t', object: 'chat.completion.chunk', created: 1, model: MODEL, choices: [{ index: 0, delta, finish_reason: finish }] });

async function fulfill(page, requestId, body) {
  await page.send('Fetch.fulfillRequest', {
    requestId, responseCode: 200,
    responseHeaders: [{ name: 'Content-Type', value: 'text/event-stream' }],
    body: Buffer.from(body).toString('base64'),
  });
}

async function toolsAndSettings(page) {
  await page.click('clear');
  await page.send('Fetch.enable', { patterns: [{ urlPattern: '*/v1/chat/completions', requestStage: 'Request' }] });
  await page.setValue('system-prompt', 'You are terse.');
  await page.setValue('temperature', 0.5);
  await page.setValue('top-p', 0.9);
  await page.setValue('top-k', 40);
  await page.setValue('max-tokens', 77);
  await page.setValue('seed', 1234);
  const weather = { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } };
  await page.setValue('tools', JSON.stringify([weather]));  // a bare function: the page wraps it
  await page.setValue('tool-choice', 'required');
  let paused = page.waitEvent('Fetch.requestPaused');
  await sendMessage(page, 'Weather in Paris?');
  let request = await paused;
  const body = JSON.parse(request.request.postData);
  assert.deepEqual(body, {
    model: MODEL,
    messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Weather in Paris?' }],
    stream: true, stream_options: { include_usage: true },
    temperature: 0.5, top_p: 0.9, top_k: 40, max_tokens: 77, seed: 1234,
    tools: [{ type: 'function', function: weather }], tool_choice: 'required',
  });
  await fulfill(page, request.requestId, sse([
    chunk({ role: 'assistant', content: '' }),
    chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }),
    chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city": ' } }] }),
    chunk({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }),
    chunk({}, 'tool_calls'), '[DONE]']));
  await page.waitFor(`${LAST}?.dataset.done === 'done'`, 'the tool call');
  assert.equal(await page.eval(`${LAST}.querySelector('.tool-name').textContent`), 'get_weather');
  assert.equal(await page.eval(`${LAST}.querySelector('.tool-args').textContent`), '{"city": "Paris"}');
  await page.eval(`${LAST}.querySelector('.tool-result').value = '18 C, sunny'`);
  paused = page.waitEvent('Fetch.requestPaused');
  await page.eval(`${LAST}.querySelector('.send-results').click()`);
  request = await paused;
  const next = JSON.parse(request.request.postData);
  assert.deepEqual(next.messages.slice(1), [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18 C, sunny' },
  ]);
  await fulfill(page, request.requestId, sse([chunk({ content: 'Sunny, ' }), chunk({ content: '18 C.' }, 'stop'), '[DONE]']));
  await page.waitFor(`${LAST}?.dataset.done === 'done' && ${lastContent} === 'Sunny, 18 C.'`, 'the answer after the tool result');
  await page.send('Fetch.disable');
  await page.screenshot('web_ui_tools.png');
}

async function apiKey(page) {
  const loaded = page.waitEvent('Page.loadEventFired');
  await page.send('Page.navigate', { url: KEYED + '/' });
  await loaded;
  await page.waitFor(`document.getElementById('server-status').textContent.includes('401')`, 'the page to say the API needs a key');
  assert.match(await page.eval(`document.getElementById('server-status').textContent`), /enter the API key/);
  assert.equal(await page.eval(`document.querySelector('details.key').open`), true);
  await page.waitFor(`document.getElementById('engine-status').textContent.includes('401')`, 'the engine view to be refused');
  await page.setValue('api-key', KEY);  // 'change': the page retries with the key
  await page.waitFor(`document.getElementById('model-name').textContent === ${JSON.stringify(KEYED_MODEL)}`, 'the model name with the key');
  await page.waitFor(`document.getElementById('engine-status').textContent === 'Live'`, 'the engine view with the key');
  await page.setValue('max-tokens', 8);
  await sendMessage(page, 'Hello');
  await page.waitFor(`${LAST}?.dataset.done === 'done'`, 'an answer with the key');
  assert.ok((await page.eval(lastContent)).length > 0);
  assert.equal(await page.eval(`sessionStorage.getItem('arbor.apiKey')`), KEY);
}

async function main() {
  const { page, close } = await launch();
  const problems = [];
  try {
    for (const [name, fn] of [['loads', () => loads(page, problems)], ['reasoning apart', () => reasoningApart(page)],
      ['structured output', () => structuredOutput(page)], ['stream then stop', () => streamThenStop(page)],
      ['tools and settings', () => toolsAndSettings(page)], ['api key', () => apiKey(page)]]) {
      const t0 = Date.now();
      await fn();
      console.log('ok - ' + name + ' (' + (Date.now() - t0) + ' ms)');
    }
    assert.deepEqual(problems, [], 'the page raised errors');
  } finally {
    await close();
  }
}

main().then(() => process.exit(0), (e) => {
  console.error('FAILED: ' + (e.stack || e));
  process.exit(1);
});
