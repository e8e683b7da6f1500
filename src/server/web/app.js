// arbor's web page (docs/web_ui.md): a chat playground over POST /v1/chat/completions (streamed
// with fetch + ReadableStream) and a live engine view over GET /v1/engine/events (server-sent
// events, read the same way so that the API key can travel in a header). No framework, no build
// step, nothing fetched from elsewhere. Text from the model or the server is only ever set with
// textContent.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = 'arbor.apiKey';

// ---- Requests --------------------------------------------------------------------------------

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = $('api-key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// The message of an error answer (OpenAI's {"error": {"message"}} or TGI's {"error": "..."}).
async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const e = body.error;
    if (typeof e === 'string') return response.status + ': ' + e;
    if (e && e.message) return response.status + ': ' + e.message;
  } catch (_) { /* not JSON */ }
  return response.status + ': ' + (text || response.statusText);
}

// Calls onData(payload) for each "data:" payload of a server-sent event stream, until it ends.
async function readSse(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
      const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) onData(data);
    }
  }
}

// ---- Settings --------------------------------------------------------------------------------

function numberField(id) {
  const v = $(id).value.trim();
  return v === '' ? undefined : Number(v);
}

// response_format from the schema box: a whole response_format object, or a JSON Schema.
function responseFormat() {
  const text = $('schema').value.trim();
  if (!text) return undefined;
  let value;
  try { value = JSON.parse(text); } catch (e) { throw new Error('Structured output: not JSON (' + e.message + ')'); }
  if (value && (value.type === 'json_object' || value.type === 'json_schema' || value.type === 'text')) return value;
  return { type: 'json_schema', json_schema: { name: 'output', schema: value, strict: true } };
}

// tools from the tools box: [{type: "function", function: {...}}], bare functions wrapped.
function tools() {
  const text = $('tools').value.trim();
  if (!text) return undefined;
  let value;
  try { value = JSON.parse(text); } catch (e) { throw new Error('Tools: not JSON (' + e.message + ')'); }
  if (!Array.isArray(value)) throw new Error('Tools: expected a JSON array of tools');
  return value.map((t) => (t && t.type === 'function' ? t : { type: 'function', function: t }));
}

function requestBody(history) {
  const messages = [];
  const system = $('system-prompt').value.trim();
  if (system) messages.push({ role: 'system', content: system });
  for (const m of history) {
    const out = { role: m.role, content: m.content };
    if (m.tool_calls && m.tool_calls.length) out.tool_calls = m.tool_calls;
    if (m.tool_call_id) out.tool_call_id = m.tool_call_id;
    messages.push(out);
  }
  // No model name yet (/v1/models refused): the server's default applies.
  const body = { model: state.model || undefined, messages, stream: true, stream_options: { include_usage: true } };
  const fields = { temperature: 'temperature', top_p: 'top-p', top_k: 'top-k', max_tokens: 'max-tokens', seed: 'seed' };
  for (const [name, id] of Object.entries(fields)) {
    const v = numberField(id);
    if (v !== undefined) body[name] = v;
  }
  const format = responseFormat();
  if (format) body.response_format = format;
  const t = tools();
  if (t) {
    body.tools = t;
    body.tool_choice = $('tool-choice').value;
  }
  return body;
}

// ---- Chat ------------------------------------------------------------------------------------

const state = { model: '', history: [], controller: null };

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollToEnd() {
  const box = $('messages');
  box.scrollTop = box.scrollHeight;
}

// A message block: role, reasoning (shown apart when the model thinks), content, tool calls.
function addMessageView(role, text) {
  const view = el('div', 'msg ' + role);
  view.append(el('div', 'role', role));
  const reasoning = el('details', 'reasoning');
  reasoning.hidden = true;
  reasoning.open = true;
  reasoning.append(el('summary', '', 'Reasoning'), el('pre', 'reasoning-text'));
  const content = el('div', 'content', text || '');
  const calls = el('div', 'tool-calls');
  view.append(reasoning, content, calls);
  $('messages').append(view);
  scrollToEnd();
  return { view, reasoning, reasoningText: reasoning.querySelector('pre'), content, calls };
}

function showToolCalls(view, toolCalls) {
  view.calls.replaceChildren();
  for (const call of toolCalls) {
    const box = el('div', 'tool-call');
    box.append(el('strong', 'tool-name', call.function.name), document.createTextNode(' '),
      el('code', 'tool-args', call.function.arguments));
    view.calls.append(box);
  }
}

// After a turn that ended in tool calls: one result box per call, sent back as "tool" messages.
function offerToolResults(view, toolCalls) {
  const inputs = [];
  for (const [i, call] of toolCalls.entries()) {
    const label = el('label', '', 'Result of ' + call.function.name);
    const input = el('textarea', 'tool-result');
    input.rows = 2;
    label.append(input);
    view.calls.children[i].append(label);
    inputs.push(input);
  }
  const send = el('button', 'send-results', 'Send results');
  send.type = 'button';
  send.addEventListener('click', () => {
    send.disabled = true;
    for (const input of inputs) input.readOnly = true;
    toolCalls.forEach((call, i) => {
      state.history.push({ role: 'tool', tool_call_id: call.id, content: inputs[i].value });
      addMessageView('tool', inputs[i].value);
    });
    generate();
  });
  view.calls.append(send);
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

// Applies one streamed chunk to the message being written.
function applyChunk(chunk, msg, view, progress) {
  if (chunk.usage) progress.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    const d = choice.delta || {};
    if (d.reasoning_content) {
      msg.reasoning += d.reasoning_content;
      view.reasoning.hidden = false;
      view.reasoningText.textContent = msg.reasoning;
      progress.chunks++;
    }
    if (d.content) {
      msg.content += d.content;
      view.content.textContent = msg.content;
      progress.chunks++;
    }
    for (const t of d.tool_calls || []) {
      const call = msg.tool_calls[t.index] ||
        (msg.tool_calls[t.index] = { id: '', type: 'function', function: { name: '', arguments: '' } });
      if (t.id) call.id = t.id;
      if (t.function && t.function.name) call.function.name += t.function.name;
      if (t.function && t.function.arguments) call.function.arguments += t.function.arguments;
      showToolCalls(view, msg.tool_calls);
      progress.chunks++;
    }
    if (choice.finish_reason) progress.finish = choice.finish_reason;
  }
}

function progressText(progress, seconds) {
  const rate = seconds > 0 ? ' (' + (progress.chunks / seconds).toFixed(1) + '/s)' : '';
  return progress.chunks + ' chunks' + rate;
}

async function generate() {
  $('settings-error').textContent = '';
  let body;
  try { body = requestBody(state.history); } catch (e) {
    $('settings-error').textContent = e.message;
    return;
  }
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
  const view = addMessageView('assistant', '');
  const progress = { chunks: 0, finish: null, usage: null };
  const started = performance.now();
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  $('chat-status').textContent = 'Generating…';
  let outcome;
  try {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST', signal: controller.signal,
      headers: headers({ 'Content-Type': 'application/json' }), body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readSse(response, (data) => {
      if (data === '[DONE]') return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      applyChunk(chunk, msg, view, progress);
      $('chat-status').textContent = 'Generating… ' + progressText(progress, (performance.now() - started) / 1000);
      scrollToEnd();
    });
    const tokens = progress.usage ? ', ' + progress.usage.completion_tokens + ' tokens' : '';
    outcome = 'Done: finish_reason ' + progress.finish + tokens + ' in ' + ((performance.now() - started) / 1000).toFixed(2) + ' s';
  } catch (e) {
    if (e.name === 'AbortError') {
      outcome = 'Stopped after ' + progressText(progress, 0);
    } else {
      controller.abort();  // an error chunk: stop reading (and the server generating)
      view.view.append(el('p', 'error', e.message));
      outcome = 'Failed';
    }
  }
  state.controller = null;
  setBusy(false);
  $('chat-status').textContent = outcome;
  view.view.dataset.done = outcome.split(':')[0].split(' ')[0].toLowerCase();
  const calls = msg.tool_calls.filter(Boolean);
  if (msg.content || calls.length) {
    state.history.push({ role: 'assistant', content: msg.content, tool_calls: calls });
  }
  if (calls.length && progress.finish === 'tool_calls') offerToolResults(view, calls);
}

function send(event) {
  event.preventDefault();
  const text = $('prompt').value;
  if (!text.trim() || state.controller) return;
  state.history.push({ role: 'user', content: text });
  addMessageView('user', text);
  $('prompt').value = '';
  generate();
}

// ---- Engine view -----------------------------------------------------------------------------

const engine = { controller: null, steps: [], retry: null };

function fmt(x, digits) {
  return x === null || x === undefined ? '–' : Number(x).toFixed(digits);
}

function percent(x) {
  return x === null || x === undefined ? '–' : (100 * x).toFixed(1) + '%';
}

function drawSteps() {
  const canvas = $('steps-chart');
  const ctx = canvas.getContext('2d');
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const steps = engine.steps;
  if (!steps.length) return;
  const total = (s) => s.prefill_tokens + s.decode_requests + s.draft_tokens;
  const max = Math.max(1, ...steps.map(total));
  const bar = w / 64;
  const style = getComputedStyle(document.documentElement);
  const colors = ['--prefill', '--decode', '--accepted', '--draft'].map((c) => style.getPropertyValue(c).trim());
  steps.forEach((s, i) => {
    let y = h;
    const parts = [s.prefill_tokens, s.decode_requests, s.accepted_tokens, s.draft_tokens - s.accepted_tokens];
    parts.forEach((v, k) => {
      const ph = (v / max) * (h - 4);
      ctx.fillStyle = colors[k];
      ctx.fillRect(i * bar, y - ph, Math.max(1, bar - 1), ph);
      y -= ph;
    });
  });
}

function describeStep(s) {
  const parts = [];
  if (s.prefill_requests) parts.push(s.prefill_requests + ' prefill (' + s.prefill_tokens + ' tokens)');
  if (s.decode_requests) parts.push(s.decode_requests + ' decode');
  if (s.draft_tokens) {
    parts.push(s.draft_tokens + ' drafts verified' + (s.tree_nodes ? ' (' + s.tree_nodes + ' tree nodes)' : '') +
      ', ' + s.accepted_tokens + ' accepted');
  }
  if (s.preempted) parts.push(s.preempted + ' preempted');
  return 'Step ' + s.step + ': ' + parts.join(', ') + '; ' + fmt(s.duration_ms, 2) + ' ms, KV ' + s.kv_used_blocks + ' blocks';
}

function requestRow(r) {
  const tr = document.createElement('tr');
  const drafts = r.pending_drafts ? r.step_drafts + ' / ' + r.pending_drafts + (r.draft_tree ? ' tree' : '') : (r.step_drafts || '–');
  const cells = [r.id, r.state, r.prompt_tokens, r.cached_tokens, r.output_tokens,
    r.acceptance === null ? '–' : percent(r.acceptance), drafts, fmt(r.age_s, 1) + ' s'];
  cells.forEach((c, i) => {
    const td = el('td', i === 1 ? 'state-' + r.state : '', String(c));
    tr.append(td);
  });
  return tr;
}

function showEvent(ev) {
  $('engine-running').textContent = ev.running;
  $('engine-waiting').textContent = ev.waiting;
  $('engine-prompt-tps').textContent = fmt(ev.throughput.prompt_tokens_per_s, 0);
  $('engine-gen-tps').textContent = fmt(ev.throughput.generation_tokens_per_s, 0);
  $('engine-hit-rate').textContent = percent(ev.prefix_cache_hit_rate);
  const t = ev.totals;
  $('engine-acceptance').textContent = t.draft_tokens ? percent(t.accepted_draft_tokens / t.draft_tokens) : '–';
  const kv = ev.kv;
  $('engine-kv-used').textContent = kv.used_blocks;
  $('engine-kv-usable').textContent = kv.usable_blocks;
  $('engine-kv-shared').textContent = kv.shared_blocks;
  $('engine-kv-cached').textContent = kv.cached_blocks;
  const used = kv.usable_blocks ? (100 * kv.used_blocks) / kv.usable_blocks : 0;
  $('kv-bar-used').style.width = used + '%';
  $('kv-bar-shared').style.width = (kv.usable_blocks ? (100 * kv.shared_blocks) / kv.usable_blocks : 0) + '%';
  $('kv-meter').setAttribute('aria-valuenow', used.toFixed(1));
  engine.steps = engine.steps.concat(ev.steps).slice(-64);
  drawSteps();
  if (ev.steps.length) $('last-step').textContent = describeStep(ev.steps[ev.steps.length - 1]);
  $('requests-body').replaceChildren(...ev.requests.map(requestRow));
}

async function watchEngine() {
  clearTimeout(engine.retry);
  if (engine.controller || document.hidden) return;
  const controller = new AbortController();
  engine.controller = controller;
  let wait = 2000;
  try {
    const response = await fetch('/v1/engine/events', { headers: headers(), signal: controller.signal });
    if (!response.ok) {
      $('engine-status').textContent = 'Engine view unavailable: ' + await errorText(response);
      if (response.status === 401) wait = 0;  // retried when a key is entered
    } else {
      $('engine-status').textContent = 'Live';
      await readSse(response, (data) => showEvent(JSON.parse(data)));
      $('engine-status').textContent = 'The server closed the engine view';
    }
  } catch (e) {
    if (e.name !== 'AbortError') $('engine-status').textContent = 'Engine view disconnected: ' + e.message;
  }
  if (engine.controller === controller) engine.controller = null;
  if (wait && !controller.signal.aborted) engine.retry = setTimeout(watchEngine, wait);
}

function stopWatching() {
  if (engine.controller) engine.controller.abort();
  engine.controller = null;
  clearTimeout(engine.retry);
}

// ---- Start -----------------------------------------------------------------------------------

async function loadModel() {
  try {
    const response = await fetch('/v1/models', { headers: headers() });
    if (!response.ok) {
      $('server-status').textContent = await errorText(response) +
        (response.status === 401 ? ' — enter the API key above' : '');
      if (response.status === 401) $('api-key').closest('details').open = true;
      return;
    }
    const body = await response.json();
    state.model = body.data && body.data.length ? body.data[0].id : '';
    $('model-name').textContent = state.model || '(none)';
    $('server-status').textContent = '';
  } catch (e) {
    $('server-status').textContent = 'Cannot reach the server: ' + e.message;
  }
}

function start() {
  $('api-key').value = sessionStorage.getItem(KEY_STORAGE) || '';
  $('api-key').addEventListener('change', () => {
    sessionStorage.setItem(KEY_STORAGE, $('api-key').value.trim());
    loadModel();
    stopWatching();
    watchEngine();
  });
  $('chat-form').addEventListener('submit', send);
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) send(e);
  });
  $('stop').addEventListener('click', () => { if (state.controller) state.controller.abort(); });
  $('clear').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    $('messages').replaceChildren();
    $('chat-status').textContent = '';
  });
  // A hidden tab holds no event stream (the server allows only a few at once).
  document.addEventListener('visibilitychange', () => (document.hidden ? stopWatching() : watchEngine()));
  loadModel();
  watchEngine();
}

start();
