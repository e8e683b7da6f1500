// Bounded streaming load against a local arbor server (outside `make test`).
//
//   node bench/server/stream_load.mjs [--url http://127.0.0.1:8080] [--clients 256]
//        [--seconds 60] [--max-tokens 64]
//
// Each of --clients workers sends streaming /v1/completions requests back to back until
// --seconds have passed (a request in flight then finishes), timing every SSE chunk. Prints
// request/error counts, TTFT and inter-token latency percentiles, and the server's
// arbor_kv_blocks_used gauge after the run (0 = no leaked blocks). Loopback addresses only.
const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const url = args.url ?? 'http://127.0.0.1:8080';
const clients = Number(args.clients ?? 256);
const seconds = Number(args.seconds ?? 60);
const maxTokens = Number(args['max-tokens'] ?? 64);
const host = new URL(url).hostname;
if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(host)) {
  console.error(`refusing non-loopback target ${host}`);
  process.exit(2);
}
const prompts = ['Once upon a time', 'The little dog', 'Lily and Tom went to the park', 'One day, a bird'];
const itl = [], ttft = [];
let ok = 0, errors = 0, tokens = 0;
const deadline = Date.now() + seconds * 1000;

async function oneRequest(i) {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: prompts[i % prompts.length], max_tokens: maxTokens, stream: true,
                           temperature: 0.8, seed: i, ignore_eos: true }),
  });
  if (res.status !== 200) { errors++; await res.text(); return; }
  const decoder = new TextDecoder();
  let last = null, buf = '';
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
      const now = performance.now();
      if (last === null) ttft.push(now - t0); else itl.push(now - last);
      last = now;
      tokens++;
    }
  }
  ok++;
}

async function worker(w) {
  for (let i = w; Date.now() < deadline; i += clients) {
    try { await oneRequest(i); } catch (e) { errors++; }
  }
}

function pct(xs, p) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

const start = performance.now();
await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
const wall = (performance.now() - start) / 1000;
const metrics = await (await fetch(`${url}/metrics`)).text();
const used = metrics.split('\n').find((l) => l.startsWith('arbor_kv_blocks_used'));
const f = (x) => x.toFixed(1);
console.log(`clients ${clients}, ${f(wall)} s: ${ok} requests ok, ${errors} errors, ${tokens} tokens ` +
            `(${f(tokens / wall)} tok/s)`);
console.log(`TTFT ms: p50 ${f(pct(ttft, 50))} p99 ${f(pct(ttft, 99))}`);
console.log(`ITL  ms: p50 ${f(pct(itl, 50))} p90 ${f(pct(itl, 90))} p99 ${f(pct(itl, 99))} (${itl.length} gaps)`);
console.log(`after the run: ${used ?? 'arbor_kv_blocks_used not found'}`);
process.exit(errors === 0 ? 0 : 1);
