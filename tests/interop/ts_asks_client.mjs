// Interop driver: the TypeScript `@modelcontextprotocol/client` 2.4.0 answering what an upstream
// behind a Palisade gateway asks during a call (server-everything's elicitation, sampling and
// roots tools).
//
// Usage: INTEROP_TOKEN=... INTEROP_NODE_MODULES=DIR node ts_asks_client.mjs URL MODE PREFIX ROOT
//   MODE    2026-07-28 (a pin: the questions come as input_required rounds) or legacy (2025-11-25:
//           they come as requests on the call's stream)
//   PREFIX  the exposed names' prefix (e.g. `ev_`)
//   ROOT    the root the operator granted that upstream: get-roots-list must show it, and never
//           the root this client's own handler offers (`-`: get-roots-list is not called)
//
// The client declares sampling, elicitation and roots, with handlers: sampling answers
// "sampled-by-ts", elicitation accepts name "Ada from ts", roots offers file:///caller-private.
// Prints one line per check ("ok - ts: ..." or "FAIL - ts: ...") and exits non-zero if any failed.
import { createRequire } from 'node:module';
import path from 'node:path';

const CHECK_TIMEOUT_MS = 30_000;
const [url, mode, prefix, root] = process.argv.slice(2);
const nodeModules = process.env.INTEROP_NODE_MODULES;
const token = process.env.INTEROP_TOKEN;
if (!url || !mode || prefix === undefined || !root || !nodeModules || !token) {
  console.error('usage: INTEROP_TOKEN=... INTEROP_NODE_MODULES=DIR node ts_asks_client.mjs URL MODE PREFIX ROOT');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - ts (${mode}): ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
function withTimeout(promise, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name}: no answer in ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
const textOf = result => (result?.content ?? []).filter(b => typeof b?.text === 'string').map(b => b.text).join('\n');

async function run() {
  const negotiation = mode === 'legacy' ? 'legacy' : { pin: mode };
  const client = new Client(
    { name: 'palisade-interop-ts-asks', version: '0.0.0' },
    {
      capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: false } },
      versionNegotiation: { mode: negotiation },
    },
  );
  client.setRequestHandler('sampling/createMessage', async () => ({
    model: 'interop-model',
    role: 'assistant',
    content: { type: 'text', text: 'sampled-by-ts' },
  }));
  client.setRequestHandler('elicitation/create', async () => ({
    action: 'accept',
    content: { name: 'Ada from ts' },
  }));
  client.setRequestHandler('roots/list', async () => ({ roots: [{ uri: 'file:///caller-private', name: 'mine' }] }));
  try {
    const transport = new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    });
    await withTimeout(client.connect(transport), 'connect');
  } catch (e) {
    report(false, 'connect', e?.message ?? String(e));
    return;
  }
  report(true, 'connect', `negotiated ${client.getNegotiatedProtocolVersion()}`);
  const checks = [
    ['trigger-elicitation-request', {}, text => text.includes('- Name: Ada from ts')],
    ['trigger-sampling-request', { prompt: 'palisade', maxTokens: 8 }, text => text.includes('sampled-by-ts')],
  ];
  if (root !== '-') checks.push(['get-roots-list', {}, text => text.includes(root) && !text.includes('caller-private')]);
  for (const [tool, args, expected] of checks) {
    const name = `${prefix}${tool}`;
    try {
      const result = await withTimeout(client.callTool({ name, arguments: args }), name);
      const text = textOf(result);
      report(!result.isError && expected(text), `tools/call ${name}`, JSON.stringify(text.slice(0, 300)));
    } catch (e) {
      report(false, `tools/call ${name}`, e?.message ?? String(e));
    }
  }
  await client.close();
}

try {
  await run();
} catch (e) {
  report(false, 'client', e?.message ?? String(e));
}
console.log(`ts client (${mode}): ${failures ? 'FAILED' : 'passed'} (${failures} failed check(s))`);
process.exit(failures ? 1 : 0);
