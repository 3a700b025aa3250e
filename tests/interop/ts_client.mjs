// Interop driver: the TypeScript `@modelcontextprotocol/client` 2.4.0 against a Palisade server.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node ts_client.mjs http://127.0.0.1:PORT/mcp
//        INTEROP_TOKEN=... INTEROP_NODE_MODULES=... node ts_client.mjs http://127.0.0.1:PORT/mcp legacy
//
// With `legacy`, the client keeps its default version negotiation (the 2025-era initialize
// handshake) and runs ping, logging/setLevel, tools, resources and session DELETE against the
// demo application with a bearer token.
//
// Pins protocol revision 2026-07-28 (`versionNegotiation: { mode: { pin } }`), then checks
// discover, tools/list, tools/call, resources/read, prompts/get and subscriptions/listen
// against the conformance fixture surface (`palisade serve --app conformance`). Prints one
// line per check ("ok - ..." or "FAIL - ...") and exits non-zero if any check failed.
//
// The SDK is installed by scripts/test under .tools/npm, not beside this file, so it is
// loaded from INTEROP_NODE_MODULES with createRequire (the package ships a CJS build next
// to its ESM one; ESM `import` cannot be pointed at another node_modules folder).
//
// API notes (verified against the installed 2.4.0 type declarations):
// - new Client(info, { capabilities, versionNegotiation: { mode: { pin: '2026-07-28' } } });
//   connect() already probes server/discover for a pin and fails loudly if it is not offered.
// - client.discover() sends server/discover again and records it for getDiscoverResult().
// - client.listen(filter) resolves on the acknowledgement with an McpSubscription whose
//   honoredFilter is the acknowledged filter; close() tears it down.
import { createRequire } from 'node:module';
import path from 'node:path';

const PROTOCOL = '2026-07-28';
const SIMPLE_TEXT = 'This is a simple text response for testing.';
const CHECK_TIMEOUT_MS = 20_000;

const url = process.argv[2];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!url || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node ts_client.mjs URL');
  process.exit(2);
}
// Resolve as if from a file directly inside the folder that holds node_modules.
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { Client, StreamableHTTPClientTransport } = require('@modelcontextprotocol/client');

let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - ts: ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
function assert(cond, message) {
  if (!cond) throw new Error(message);
}
function withTimeout(promise, name) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name}: no answer in ${CHECK_TIMEOUT_MS} ms`)), CHECK_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
// Run one check: `body` returns a short detail, or throws on failure.
async function check(name, body) {
  try {
    report(true, name, await withTimeout(body(), name));
  } catch (e) {
    report(false, name, e?.message ?? String(e));
  }
}
const texts = blocks => (blocks ?? []).filter(b => typeof b?.text === 'string').map(b => b.text);

async function run() {
  const client = new Client(
    { name: 'palisade-interop-ts', version: '0.0.0' },
    { capabilities: {}, versionNegotiation: { mode: { pin: PROTOCOL } } },
  );
  try {
    await withTimeout(client.connect(new StreamableHTTPClientTransport(new URL(url))), 'connect');
  } catch (e) {
    report(false, 'connect (pinned)', e?.message ?? String(e));
    return;
  }
  const negotiated = client.getNegotiatedProtocolVersion();
  report(negotiated === PROTOCOL, 'connect (pinned)', `negotiated ${negotiated}, era ${client.getProtocolEra()}`);

  await check('server/discover', async () => {
    const result = await client.discover();
    assert(result.supportedVersions?.includes(PROTOCOL), `supportedVersions=${JSON.stringify(result.supportedVersions)}`);
    return `supportedVersions=${JSON.stringify(result.supportedVersions)} capabilities=${JSON.stringify(Object.keys(result.capabilities ?? {}).sort())}`;
  });

  await check('tools/list', async () => {
    const names = (await client.listTools()).tools.map(t => t.name);
    assert(names.includes('test_simple_text'), `test_simple_text not listed in ${JSON.stringify(names)}`);
    return `${names.length} tools`;
  });

  await check('tools/call test_simple_text', async () => {
    const result = await client.callTool({ name: 'test_simple_text', arguments: {} });
    assert(!result.isError, `isError=true: ${JSON.stringify(result.content)}`);
    const got = texts(result.content);
    assert(got.length === 1 && got[0] === SIMPLE_TEXT, `text content ${JSON.stringify(got)}, expected [${JSON.stringify(SIMPLE_TEXT)}]`);
    return JSON.stringify(got[0]);
  });

  await check('resources/read test://static-text', async () => {
    const result = await client.readResource({ uri: 'test://static-text' });
    const got = texts(result.contents);
    assert(got.length > 0 && got[0].length > 0, `no non-empty text in ${JSON.stringify(result.contents)}`);
    return `${got[0].length} chars`;
  });

  await check('prompts/get test_simple_prompt', async () => {
    const result = await client.getPrompt({ name: 'test_simple_prompt', arguments: {} });
    assert((result.messages ?? []).length >= 1, 'no messages');
    return `${result.messages.length} message(s)`;
  });

  await check('subscriptions/listen toolsListChanged', async () => {
    const sub = await client.listen({ toolsListChanged: true });
    try {
      const honored = sub.honoredFilter;
      assert(honored?.toolsListChanged === true, `honored filter ${JSON.stringify(honored)}`);
      return `honored ${JSON.stringify(honored)}`;
    } finally {
      await sub.close();
    }
  });

  try {
    await withTimeout(client.close(), 'close');
    report(true, 'close');
  } catch (e) {
    report(false, 'close', e?.message ?? String(e));
  }
}

// The 2025-era session wire: the client's default (legacy) negotiation against the demo, with a
// bearer token from INTEROP_TOKEN on every request.
async function runLegacyDemo() {
  const token = process.env.INTEROP_TOKEN;
  if (!token) {
    report(false, 'legacy: INTEROP_TOKEN', 'no token in the environment');
    return;
  }
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: 'palisade-interop-ts-legacy', version: '0.0.0' }, { capabilities: {} });
  try {
    await withTimeout(client.connect(transport), 'connect');
  } catch (e) {
    report(false, 'legacy: connect (default negotiation)', e?.message ?? String(e));
    return;
  }
  const negotiated = client.getNegotiatedProtocolVersion();
  report(negotiated === '2025-11-25', 'legacy: connect (default negotiation)', `negotiated ${negotiated}, session ${transport.sessionId ? 'issued' : 'MISSING'}`);
  report(Boolean(transport.sessionId), 'legacy: Mcp-Session-Id issued');

  await check('legacy: ping', async () => {
    await client.ping();
    return 'pong';
  });
  await check('legacy: logging/setLevel', async () => {
    await client.setLoggingLevel('info');
    return 'info';
  });
  await check('legacy: tools/list', async () => {
    const names = (await client.listTools()).tools.map(t => t.name);
    assert(names.includes('catalog_search'), `catalog_search not listed in ${JSON.stringify(names)}`);
    return `${names.length} tools`;
  });
  await check('legacy: tools/call catalog_search', async () => {
    const result = await client.callTool({ name: 'catalog_search', arguments: { query: 'tea' } });
    assert(!result.isError, `isError=true: ${JSON.stringify(result.content)}`);
    return `${(result.content ?? []).length} content item(s)`;
  });
  await check('legacy: resources/list + read', async () => {
    const resources = (await client.listResources()).resources;
    assert(resources.length > 0, 'no resources listed');
    const read = await client.readResource({ uri: resources[0].uri });
    assert((read.contents ?? []).length > 0, `no contents for ${resources[0].uri}`);
    return `${resources.length} resources, read ${resources[0].uri}`;
  });
  await check('legacy: session DELETE', async () => {
    await transport.terminateSession();
    return 'terminated';
  });
  try {
    await withTimeout(client.close(), 'close');
    report(true, 'legacy: close');
  } catch (e) {
    report(false, 'legacy: close', e?.message ?? String(e));
  }
}

if (process.argv[3] === 'legacy') {
  await runLegacyDemo();
} else {
  await run();
}
console.log(`ts client: ${failures ? 'FAILED' : 'passed'} (${failures} failed check(s))`);
process.exit(failures ? 1 : 0);
