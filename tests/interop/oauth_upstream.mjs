// An OAuth-protected MCP upstream for the per-user upstream OAuth leg (scripts/interop leg k): a
// TypeScript SDK v2 server (`@modelcontextprotocol/server` 2.4.0) over Streamable HTTP on
// 127.0.0.1, whose tool calls need a token of its own authorization server.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node oauth_upstream.mjs PORT AS_ISSUER
//
// - /.well-known/oauth-protected-resource/mcp (and the root document): RFC 9728 metadata,
//   resource http://127.0.0.1:PORT/mcp, authorization_servers [AS_ISSUER], scope files:read.
// - POST /mcp: initialize, server/discover and tools/list need no token (the gateway lists the
//   catalog without any person's token). tools/call needs `Authorization: Bearer <JWT>` signed by
//   AS_ISSUER (its JWKS), `typ: at+jwt`, iss = AS_ISSUER, aud = this URL: else 401 with
//   `WWW-Authenticate: Bearer resource_metadata="…"` (plus error="invalid_token" when a token was
//   sent); a valid token without the scope files:read: 403 error="insufficient_scope".
// - Tool `whoami` answers "UPSTREAM-USER: <sub of the token>".
// - GET /calls: {"calls": [{sub, scope}], "refused": {"401": n, "403": n}} (never a token).
// Prints "listening on http://127.0.0.1:PORT/mcp" once it accepts connections.
import { AsyncLocalStorage } from 'node:async_hooks';
import { createRequire } from 'node:module';
import http from 'node:http';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pathToFileURL } from 'node:url';

const port = Number(process.argv[2]);
const asIssuer = process.argv[3];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!Number.isInteger(port) || port <= 0 || !asIssuer || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node oauth_upstream.mjs PORT AS_ISSUER');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { McpServer, createMcpHandler } = require('@modelcontextprotocol/server');
const { z } = require('zod');
const { jwtVerify, createRemoteJWKSet } = await import(pathToFileURL(require.resolve('jose')).href);

const origin = `http://127.0.0.1:${port}`;
const resource = `${origin}/mcp`;
const metadataUrl = `${origin}/.well-known/oauth-protected-resource/mcp`;
const SCOPE = 'files:read';
const metadata = JSON.stringify({
  resource,
  authorization_servers: [asIssuer],
  scopes_supported: [SCOPE],
  bearer_methods_supported: ['header'],
});
const jwks = createRemoteJWKSet(new URL(`${asIssuer}/jwks`));
const caller = new AsyncLocalStorage();
const seen = { calls: [], refused: { 401: 0, 403: 0 } };

function factory() {
  const server = new McpServer({ name: 'palisade-interop-oauth-upstream', version: '0.0.0' });
  server.registerTool(
    'whoami',
    { description: 'Answers who the upstream thinks is calling (the subject of its access token).', inputSchema: z.object({}) },
    async () => ({ content: [{ type: 'text', text: `UPSTREAM-USER: ${caller.getStore()?.sub ?? '(nobody)'}` }] }),
  );
  return server;
}
const handler = createMcpHandler(factory, { onerror: (e) => console.error(`oauth upstream: ${e?.message ?? e}`) });

// The JSON-RPC method of a body (undefined when it is not one request object).
function methodOf(body) {
  try {
    const message = JSON.parse(body.toString('utf8'));
    return typeof message?.method === 'string' ? message.method : undefined;
  } catch {
    return undefined;
  }
}

function challenge(res, status, error) {
  seen.refused[status] += 1;
  const parts = [];
  if (error) parts.push(`error="${error}"`);
  if (status === 403) parts.push(`scope="${SCOPE}"`);
  parts.push(`resource_metadata="${metadataUrl}"`);
  res.writeHead(status, { 'www-authenticate': `Bearer ${parts.join(', ')}`, 'content-type': 'application/json' })
    .end(JSON.stringify({ error: error ?? 'unauthorized' }));
}

const httpServer = http.createServer(async (req, res) => {
  try {
    const { pathname } = new URL(req.url, origin);
    if (req.method === 'GET' && (pathname === '/.well-known/oauth-protected-resource/mcp' || pathname === '/.well-known/oauth-protected-resource')) {
      res.writeHead(200, { 'content-type': 'application/json' }).end(metadata);
      return;
    }
    if (req.method === 'GET' && pathname === '/calls') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(seen));
      return;
    }
    if (pathname !== '/mcp') {
      res.writeHead(404).end();
      return;
    }
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = chunks.length && req.method !== 'GET' && req.method !== 'HEAD' ? Buffer.concat(chunks) : undefined;
    let who;
    if (body && methodOf(body) === 'tools/call') {
      const auth = req.headers.authorization ?? '';
      const token = /^Bearer ([A-Za-z0-9\-._~+/]+=*)$/.exec(auth)?.[1];
      if (!token) return challenge(res, 401);
      let claims;
      try {
        ({ payload: claims } = await jwtVerify(token, jwks, { issuer: asIssuer, audience: resource, typ: 'at+jwt', algorithms: ['RS256'] }));
      } catch (error) {
        console.error(`oauth upstream: token refused: ${error?.code ?? error?.message}`);
        return challenge(res, 401, 'invalid_token');
      }
      const scopes = String(claims.scope ?? '').split(' ');
      if (!scopes.includes(SCOPE)) return challenge(res, 403, 'insufficient_scope');
      who = { sub: claims.sub, scope: claims.scope };
      seen.calls.push(who);
      console.log(`oauth upstream: tools/call as sub=${claims.sub} scope=${claims.scope}`);
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (Array.isArray(value)) value.forEach((v) => headers.append(name, v));
      else if (value !== undefined) headers.set(name, value);
    }
    const controller = new AbortController();
    res.on('close', () => controller.abort());
    const response = await caller.run(who, () => handler.fetch(
      new Request(`${origin}${req.url}`, { method: req.method, headers, body, signal: controller.signal }),
    ));
    res.writeHead(response.status, Object.fromEntries(response.headers));
    if (response.body) {
      Readable.fromWeb(response.body).on('error', () => res.destroy()).pipe(res);
    } else {
      res.end();
    }
  } catch (e) {
    console.error(`oauth upstream: ${e?.message ?? e}`);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
httpServer.listen(port, '127.0.0.1', () => console.log(`listening on ${resource}`));
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    httpServer.close();
    handler.close().finally(() => process.exit(0));
  });
}
