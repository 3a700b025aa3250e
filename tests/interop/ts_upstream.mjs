// Interop upstream: a server written with the TypeScript SDK v2 (`@modelcontextprotocol/server`
// 2.4.0), served over Streamable HTTP on 127.0.0.1 for the gateway leg of scripts/interop.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node ts_upstream.mjs PORT
//
// It speaks 2026-07-28 (per-request envelope) and, through the SDK's stateless fallback, the
// 2025-era wire, on one endpoint, /mcp. Its one tool:
//   shout {text} -> "TS-UPSTREAM: <TEXT IN CAPITALS>"
// Prints "listening on http://127.0.0.1:PORT/mcp" once it accepts connections.
//
// The SDK hands back a web-standard fetch handler; the few lines below adapt node:http to it
// (the SDK's own Node adapter is a separate package we do not need for one endpoint).
import { createRequire } from 'node:module';
import http from 'node:http';
import path from 'node:path';
import { Readable } from 'node:stream';

const port = Number(process.argv[2]);
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!Number.isInteger(port) || port <= 0 || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node ts_upstream.mjs PORT');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { McpServer, createMcpHandler } = require('@modelcontextprotocol/server');
const { z } = require('zod');

function factory() {
  const server = new McpServer({ name: 'palisade-interop-ts-upstream', version: '0.0.0' });
  server.registerTool(
    'shout',
    {
      description: 'Answers the text in capitals, marked as coming from the TypeScript upstream.',
      inputSchema: z.object({ text: z.string() }),
    },
    async ({ text }) => ({ content: [{ type: 'text', text: `TS-UPSTREAM: ${text.toUpperCase()}` }] }),
  );
  return server;
}

const handler = createMcpHandler(factory, { onerror: e => console.error(`ts upstream: ${e?.message ?? e}`) });

const httpServer = http.createServer(async (req, res) => {
  try {
    if (new URL(req.url, 'http://x').pathname !== '/mcp') {
      res.writeHead(404).end();
      return;
    }
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = chunks.length && req.method !== 'GET' && req.method !== 'HEAD' ? Buffer.concat(chunks) : undefined;
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (Array.isArray(value)) value.forEach(v => headers.append(name, v));
      else if (value !== undefined) headers.set(name, value);
    }
    const controller = new AbortController();
    res.on('close', () => controller.abort());
    const response = await handler.fetch(
      new Request(`http://127.0.0.1:${port}${req.url}`, { method: req.method, headers, body, signal: controller.signal }),
    );
    res.writeHead(response.status, Object.fromEntries(response.headers));
    if (response.body) {
      Readable.fromWeb(response.body).on('error', () => res.destroy()).pipe(res);
    } else {
      res.end();
    }
  } catch (e) {
    console.error(`ts upstream: ${e?.message ?? e}`);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
httpServer.listen(port, '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${port}/mcp`));
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    httpServer.close();
    handler.close().finally(() => process.exit(0));
  });
}
