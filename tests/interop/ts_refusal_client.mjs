// Interop driver: what the TypeScript `@modelcontextprotocol/client` 2.4.0 shows its caller when a
// Palisade server refuses a tool call (a kill switch's -32030, a policy refusal).
//
// Usage: INTEROP_TOKEN=... INTEROP_NODE_MODULES=DIR node ts_refusal_client.mjs URL TOOL ARGS_JSON
//
// Connects twice, on both wires: pinned to 2026-07-28 (`versionNegotiation: { mode: { pin } }`)
// and with the default negotiation (the 2025-era initialize handshake and its session), each with
// the bearer token in INTEROP_TOKEN. Calls TOOL with ARGS_JSON once on each and prints one JSON
// line per wire saying what the caller got:
//   {"wire":"2026-07-28","negotiated":"…","outcome":"result","isError":false}
//   {"wire":"…","negotiated":"…","outcome":"error","class":"ProtocolError","code":-32030,"message":"…","status":null}
// where `class` is the thrown error's class (`ProtocolError` for a JSON-RPC error the client read,
// `SdkHttpError` for an HTTP failure, whose `status` is the HTTP status). Exits 0 when every
// connection succeeded (the outcome is for the caller to judge), 1 otherwise.
import { createRequire } from 'node:module';
import path from 'node:path';

const TIMEOUT_MS = 20_000;

const [url, tool, argsJson] = process.argv.slice(2);
const nodeModules = process.env.INTEROP_NODE_MODULES;
const token = process.env.INTEROP_TOKEN;
if (!url || !tool || !nodeModules || !token) {
  console.error('usage: INTEROP_TOKEN=... INTEROP_NODE_MODULES=DIR node ts_refusal_client.mjs URL TOOL [ARGS_JSON]');
  process.exit(2);
}
const args = JSON.parse(argsJson ?? '{}');
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

function withTimeout(promise, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name}: no answer in ${TIMEOUT_MS} ms`)), TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

let failed = false;
for (const wire of ['2026-07-28', 'legacy']) {
  const options = { capabilities: {} };
  if (wire !== 'legacy') options.versionNegotiation = { mode: { pin: wire } };
  const client = new Client({ name: 'palisade-interop-ts-refusal', version: '0.0.0' }, options);
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  try {
    await withTimeout(client.connect(transport), 'connect');
  } catch (e) {
    console.log(JSON.stringify({ wire, outcome: 'connect failed', message: e?.message ?? String(e) }));
    failed = true;
    continue;
  }
  const negotiated = client.getNegotiatedProtocolVersion();
  let line;
  try {
    const result = await withTimeout(client.callTool({ name: tool, arguments: args }), 'tools/call');
    line = { wire, negotiated, outcome: 'result', isError: Boolean(result.isError) };
  } catch (e) {
    line = {
      wire,
      negotiated,
      outcome: 'error',
      class: e?.constructor?.name ?? typeof e,
      code: typeof e?.code === 'number' ? e.code : (e?.code ?? null),
      message: e?.message ?? String(e),
      status: typeof e?.status === 'number' ? e.status : null,
    };
  }
  console.log(JSON.stringify(line));
  await client.close().catch(() => {});
}
process.exit(failed ? 1 : 0);
