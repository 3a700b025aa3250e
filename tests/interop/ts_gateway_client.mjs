// Interop driver: the TypeScript `@modelcontextprotocol/client` 2.4.0 against a Palisade gateway.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node ts_gateway_client.mjs URL MODE CHECK...
//   MODE   2026-07-28 (versionNegotiation pin) or auto
//   CHECK  NAME ARGS_JSON EXPECTED_TEXT   NAME is listed, and tools/call NAME ARGS_JSON answers
//                                         a first text block equal to EXPECTED_TEXT
//          --absent NAME                  NAME is not listed, and calling it is refused
//
// Prints one line per check ("ok - ts: ..." or "FAIL - ts: ...") and exits non-zero if any failed.
import { createRequire } from 'node:module';
import path from 'node:path';

const CHECK_TIMEOUT_MS = 20_000;
const [url, mode, ...rest] = process.argv.slice(2);
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!url || !mode || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node ts_gateway_client.mjs URL MODE [NAME ARGS_JSON EXPECTED_TEXT | --absent NAME]...');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

const calls = [];
const absent = [];
for (let i = 0; i < rest.length; ) {
  if (rest[i] === '--absent' && i + 1 < rest.length) {
    absent.push(rest[i + 1]);
    i += 2;
  } else if (i + 2 < rest.length) {
    const args = JSON.parse(rest[i + 1]);
    if (typeof args !== 'object' || args === null || Array.isArray(args)) {
      console.error(`ts_gateway_client: ${rest[i]}: ARGS_JSON is not a JSON object`);
      process.exit(2);
    }
    calls.push({ name: rest[i], args, expected: rest[i + 2] });
    i += 3;
  } else {
    console.error(`ts_gateway_client: incomplete check at ${JSON.stringify(rest.slice(i))}`);
    process.exit(2);
  }
}

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
const texts = blocks => (blocks ?? []).filter(b => typeof b?.text === 'string').map(b => b.text);

async function run() {
  const negotiation = mode === 'auto' ? 'auto' : { pin: mode };
  const client = new Client(
    { name: 'palisade-interop-ts-gateway', version: '0.0.0' },
    { capabilities: {}, versionNegotiation: { mode: negotiation } },
  );
  try {
    await withTimeout(client.connect(new StreamableHTTPClientTransport(new URL(url))), 'connect');
  } catch (e) {
    report(false, 'connect', e?.message ?? String(e));
    return;
  }
  const negotiated = client.getNegotiatedProtocolVersion();
  report(negotiated === '2026-07-28', 'connect', `negotiated ${negotiated}`);

  try {
    const listed = [];
    let cursor;
    do {
      const page = await withTimeout(client.listTools(cursor ? { cursor } : undefined), 'tools/list');
      listed.push(...page.tools.map(t => t.name));
      cursor = page.nextCursor;
    } while (cursor);
    const missing = calls.map(c => c.name).filter(n => !listed.includes(n));
    const shown = absent.filter(n => listed.includes(n));
    let detail = `${listed.length} tools: ${[...listed].sort().join(', ')}`;
    if (missing.length) detail = `${missing.join(', ')} not listed in ${JSON.stringify(listed)}`;
    else if (shown.length) detail = `${shown.join(', ')} listed but must not be, in ${JSON.stringify(listed)}`;
    report(!missing.length && !shown.length && listed.length > 0, 'tools/list', detail);
  } catch (e) {
    report(false, 'tools/list', e?.message ?? String(e));
  }

  for (const { name, args, expected } of calls) {
    try {
      const result = await withTimeout(client.callTool({ name, arguments: args }), `tools/call ${name}`);
      const got = texts(result.content);
      const ok = !result.isError && got[0] === expected;
      report(ok, `tools/call ${name}`, ok ? JSON.stringify(got[0]) : `isError=${result.isError} text=${JSON.stringify(got)}, expected ${JSON.stringify(expected)}`);
    } catch (e) {
      report(false, `tools/call ${name}`, e?.message ?? String(e));
    }
  }
  for (const name of absent) {
    try {
      const result = await withTimeout(client.callTool({ name, arguments: {} }), `tools/call ${name}`);
      report(Boolean(result.isError), `tools/call ${name} (not approved) refused`, `isError=${result.isError}`);
    } catch (e) {
      const message = String(e?.message ?? e);
      report(!message.includes('no answer in'), `tools/call ${name} (not approved) refused`, message.slice(0, 160));
    }
  }
  try {
    await withTimeout(client.close(), 'close');
  } catch (e) {
    report(false, 'close', e?.message ?? String(e));
  }
}

await run();
console.log(`ts client (${mode}): ${failures ? 'FAILED' : 'passed'} (${failures} failed check(s))`);
process.exit(failures ? 1 : 0);
