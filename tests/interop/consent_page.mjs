// Interop driver: the development issuer's authorization (consent) page in headless Chromium,
// driven by playwright-core, against `palisade serve` (the demo, dev issuer WITHOUT auto_approve).
//
// Usage: INTEROP_NODE_MODULES=DIR node consent_page.mjs http://127.0.0.1:PORT/mcp [OUT_DIR]
//   CHROMIUM (default /usr/bin/chromium) is the browser; a screenshot of the page goes to
//   OUT_DIR/consent.png (default: a new temporary folder).
//
// Like a client: discovery from the 401 challenge (protected-resource metadata, then RFC 8414
// metadata), Dynamic Client Registration with a redirect URI on a loopback callback server of
// this script, then real authorization URLs (PKCE S256, state, resource) opened in the browser:
//   1. the page: pick subject, tenant and scopes (tick shop:basket, which the client did not
//      ask for), approve; the redirect carries code, state and iss; the code exchanged at the
//      token endpoint gives a token whose payload has that subject, tenant and scopes, and
//      the resource server accepts it for basket_create (needs shop:basket);
//   2. the same form submitted with its csrf field removed: 403, no redirect to the client;
//   3. a page on another loopback origin (the callback server) that frames the authorization
//      URL: the response says X-Frame-Options: DENY and CSP frame-ancestors 'none', and the
//      frame shows none of the page.
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const url = process.argv[2];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!url || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node consent_page.mjs URL [OUT_DIR]');
  process.exit(2);
}
const outDir = process.argv[3] ?? fs.mkdtempSync(path.join(os.tmpdir(), 'consent-'));
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { chromium } = require('playwright-core');

const PROTOCOL = '2026-07-28';
const STEP_TIMEOUT_MS = 15000;
let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - consent page: ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
const b64url = (buf) => Buffer.from(buf).toString('base64url');
const payload = (jwt) => JSON.parse(Buffer.from(jwt.split('.')[1], 'base64url').toString());

// The loopback callback server: the client's redirect URI, and the framing page.
const callbacks = [];
let framed = '';
const callbackServer = http.createServer((req, res) => {
  const u = new URL(req.url, 'http://127.0.0.1');
  if (u.pathname === '/callback') {
    callbacks.push(Object.fromEntries(u.searchParams));
    res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>callback</title><p>done</p>');
  } else if (u.pathname === '/framer') {
    res.writeHead(200, { 'content-type': 'text/html' })
      .end(`<!doctype html><title>framer</title><iframe id="victim" width="600" height="400" src="${framed.replaceAll('&', '&amp;').replaceAll('"', '&quot;')}"></iframe>`);
  } else {
    res.writeHead(404).end();
  }
});
await new Promise((resolve) => callbackServer.listen(0, '127.0.0.1', resolve));
const callbackOrigin = `http://127.0.0.1:${callbackServer.address().port}`;
const redirectUri = `${callbackOrigin}/callback`;

async function getJson(u) {
  const r = await fetch(u);
  if (!r.ok) throw new Error(`GET ${u}: ${r.status}`);
  return r.json();
}

// callTool(token, name, args): a 2026-07-28 tools/call on the server under test.
function callTool(token, name, args) {
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream',
    'mcp-protocol-version': PROTOCOL, 'mcp-method': 'tools/call', 'mcp-name': name };
  if (token) headers.authorization = `Bearer ${token}`;
  return fetch(url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: args,
      _meta: { 'io.modelcontextprotocol/protocolVersion': PROTOCOL, 'io.modelcontextprotocol/clientCapabilities': {} } } }),
  });
}

let context;
let userDataDir;
try {
  // Discovery and registration, as a client does them.
  const challenge = await callTool(undefined, 'product_get', { sku: 'TEA-001' });
  const prmUrl = /resource_metadata="([^"]+)"/.exec(challenge.headers.get('www-authenticate') ?? '')?.[1];
  if (challenge.status !== 401 || !prmUrl) throw new Error(`no 401 challenge with resource_metadata (got ${challenge.status})`);
  const prm = await getJson(prmUrl);
  const issuer = prm.authorization_servers[0];
  const asUrl = new URL(issuer);
  const meta = await getJson(`${asUrl.origin}/.well-known/oauth-authorization-server${asUrl.pathname}`);
  const reg = await fetch(meta.registration_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ client_name: 'palisade-interop-consent', redirect_uris: [redirectUri], token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'] }),
  });
  const clientId = (await reg.json()).client_id;
  if (reg.status !== 201 || !clientId) throw new Error(`registration answered ${reg.status}`);

  // authorizationUrl(scope): a fresh authorization request (its verifier and state alongside).
  const authorizationUrl = (scope) => {
    const verifier = b64url(crypto.randomBytes(32));
    const state = b64url(crypto.randomBytes(16));
    const u = new URL(meta.authorization_endpoint);
    u.search = new URLSearchParams({ response_type: 'code', client_id: clientId, redirect_uri: redirectUri, state, scope,
      code_challenge: b64url(crypto.createHash('sha256').update(verifier).digest()), code_challenge_method: 'S256',
      resource: prm.resource }).toString();
    return { href: u.href, verifier, state };
  };

  userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'consent-profile-'));
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    timeout: STEP_TIMEOUT_MS,
  });
  context.setDefaultTimeout(STEP_TIMEOUT_MS);
  const page = context.pages()[0] ?? await context.newPage();
  const isAuthorize = (method) => (r) => r.url().split('?')[0] === meta.authorization_endpoint && r.request().method() === method;

  // 1. Pick subject, tenant and scopes on the page; approve.
  {
    const want = authorizationUrl('shop:read');
    const shown = await page.goto(want.href);
    report(shown.status() === 200 && (await page.locator('form input[name=csrf]').count()) === 1,
      'authorization URL shows the page with a CSRF field', `${shown.status()}, ${await page.title()}`);
    const read = page.locator('input[name=scope][value="shop:read"]');
    const basket = page.locator('input[name=scope][value="shop:basket"]');
    report(await read.isChecked() && !(await basket.isChecked()), 'the requested scopes are ticked, the others not');
    await page.fill('input[name=subject]', 'bob');
    await page.fill('input[name=tenant]', 'globex');
    await basket.check();
    await page.screenshot({ path: path.join(outDir, 'consent.png'), fullPage: true });
    const [answer] = await Promise.all([
      page.waitForResponse(isAuthorize('POST')),
      page.waitForURL((u) => u.href.startsWith(redirectUri)),
      page.click('button[name=decision][value=approve]'),
    ]);
    const back = callbacks.at(-1) ?? {};
    report(answer.status() === 303 && !!back.code && back.state === want.state && back.iss === issuer,
      'approve redirects to the client with code, state and iss', `${answer.status()}, iss=${back.iss}`);
    const token = await fetch(meta.token_endpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ grant_type: 'authorization_code', code: back.code ?? '', redirect_uri: redirectUri, client_id: clientId,
        code_verifier: want.verifier, resource: prm.resource }),
    });
    const tokens = await token.json();
    const claims = tokens.access_token ? payload(tokens.access_token) : {};
    const scopes = (claims.scope ?? '').split(' ').sort().join(' ');
    report(token.status === 200 && claims.sub === 'bob' && claims.tenant === 'globex' && scopes === 'shop:basket shop:read'
      && claims.aud === prm.resource && claims.client_id === clientId,
    'the token carries the subject, tenant and scopes picked on the page',
    JSON.stringify({ status: token.status, sub: claims.sub, tenant: claims.tenant, scope: claims.scope, aud: claims.aud }));
    const call = await callTool(tokens.access_token, 'basket_create', {});
    const text = await call.text();
    report(call.status === 200 && text.includes('"basket"') && !text.includes('"isError":true'),
      'the resource server accepts it for basket_create (shop:basket, ticked on the page)', `${call.status}`);
  }

  // 2. The form without its CSRF field: refused, and the client hears nothing.
  {
    const want = authorizationUrl('shop:read');
    await page.goto(want.href);
    await page.locator('form input[name=csrf]').evaluate((input) => input.remove());
    const before = callbacks.length;
    const [answer] = await Promise.all([
      page.waitForResponse(isAuthorize('POST')),
      page.click('button[name=decision][value=approve]'),
    ]);
    await page.waitForLoadState();
    const message = await page.locator('#error').textContent().catch(() => '');
    report(answer.status() === 403 && callbacks.length === before && !page.url().startsWith(redirectUri),
      'the form without its csrf field is refused (403, no redirect)', `${answer.status()}: ${message}`);
  }

  // 3. Framed by a page on another loopback origin: the browser must not render it.
  {
    framed = authorizationUrl('shop:read').href;
    const [answer] = await Promise.all([
      page.waitForResponse(isAuthorize('GET')),
      page.goto(`${callbackOrigin}/framer`),
    ]);
    const headers = answer.headers();
    const csp = headers['content-security-policy'] ?? '';
    report(headers['x-frame-options'] === 'DENY' && csp.includes("frame-ancestors 'none'"),
      "the framed response says X-Frame-Options: DENY and CSP frame-ancestors 'none'",
      `X-Frame-Options: ${headers['x-frame-options']}`);
    await page.waitForLoadState('load');
    const frame = await (await page.locator('#victim').elementHandle())?.contentFrame();
    let content = '';
    let how = 'no frame';
    if (frame) {
      try {
        content = await frame.content();
        how = `frame at ${frame.url()}, ${content.length} chars`;
      } catch (error) {
        how = `frame.content() failed: ${String(error?.message ?? error).split('\n')[0]}`;
      }
    }
    const rendered = content.includes('name="csrf"') || content.includes('Development issuer');
    report(!rendered && !(frame?.url() ?? '').startsWith(meta.authorization_endpoint), 'the framed page is not rendered', how);
  }
  console.log(`consent page: screenshot in ${path.join(outDir, 'consent.png')}`);
} catch (error) {
  report(false, 'flow', error?.stack ?? String(error));
} finally {
  await context?.close().catch(() => {});
  if (userDataDir) fs.rmSync(userDataDir, { recursive: true, force: true });
  callbackServer.close();
}
process.exit(failures === 0 ? 0 : 1);
