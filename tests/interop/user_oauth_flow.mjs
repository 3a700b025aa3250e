// Interop driver of the per-user upstream OAuth leg (scripts/interop leg k): a `palisade gateway`
// with `user_oauth` upstreams, its connect pages in headless Chromium (Debian's, driven by
// playwright-core), two oidc-provider authorization servers (tests/interop/user_oauth_as.mjs: the
// gateway's identity provider, which also issues the callers' tokens, and the upstream's own
// server) and OAuth-protected upstreams (tests/interop/oauth_upstream.mjs).
//
// Usage: INTEROP_NODE_MODULES=DIR node user_oauth_flow.mjs   (everything else by environment)
//   GATEWAY_MCP, GATEWAY_WEB    the gateway's MCP URL (http://…/mcp) and its pages (https://…/)
//   GATEWAY_CONFIG              its configuration (for `palisade connections revoke|list`)
//   SHORT_MCP, SHORT_WEB        a second gateway, flow_ttl_secs = SHORT_TTL (seconds), upstream files
//   IDP, THIRD                  the two issuers (http://127.0.0.1:PORT)
//   UPSTREAM, UPSTREAM2         the upstreams `files` and `files2` (their MCP URLs)
//   WEB_CERT, WEB_KEY           the pages' certificate chain (leaf first) and key: Chromium trusts
//                               the leaf by its key pin (--ignore-certificate-errors-spki-list),
//                               and the framing page of case e is served with them on another port
//   PALISADE_BIN, CHROMIUM, SEP (the tool name separator, default "_"), OUT_DIR (screenshots; the
//   callers' tokens are appended to OUT_DIR/tokens so that the leg can look for them in logs)
//   REVIEW_TOKEN_FILE           the gateway's `[web] review_token_file` (its pin review page)
//   REVIEW_UPSTREAM             an upstream of the gateway (UPSTREAM again under another id) whose
//                               tool is pending: never approved before the gateway started
//   STORE_DB                    the gateway's SQLite store (its audit log, read-only)
//
// Cases (one line each, "ok - user_oauth X: …" or "FAIL - user_oauth X: …"; exit 1 on any FAIL):
//   0  without the elicitation.url capability the call is refused as a missing capability
//   a  full flow: input-required with the connect URL, sign-in as alice, the consent page naming
//      client id, upstream, scope and redirect URI, approve (PKCE S256, resource, state at the
//      third party), its login and consent, the callback's success page, the retry answers
//      UPSTREAM-USER: alice; the cookies are __Host-, Secure, HttpOnly, SameSite=Lax
//   b  a second call needs no browser (and, the access token being short-lived, a refresh with a
//      rotated refresh token happened)
//   c  the same person through mcp-client-2: input-required again (per-client consent); after the
//      approval of that client on the consent page its call goes through
//   d  a forged CSRF field, none at all, and the page's valid token posted by a page of another
//      origin: 403 each, the third party's endpoints never reached
//   e  the consent page framed by a page of another origin: X-Frame-Options DENY, CSP
//      frame-ancestors 'none', and the frame shows nothing of it
//   f  redirect_uri one character off, with a trailing slash, in other case: 400 each, the third
//      party never reached
//   g  a replayed `state` at /oauth/callback: 400; on the short-lived gateway an expired one: 400
//      (and a fresh one there is not refused as unknown: the control)
//   h  an approval record for the client with a consent cookie for another client: the consent
//      page is shown; with the cookie for the same client it is skipped (the control)
//   i  mallory completes the sign-in of alice's connect link for files2: 403, nothing connected
//      (alice's call still input-required, no connection listed, the third party never reached)
//   j  the connect link of a completed flow opened again: refused
//   k  declining the connect request: the tool result is isError "Not connected"
//   l  a 2025-era client on the session wire (2025-11-25, mallory, nothing connected): initialized
//      with elicitation: {} the call answers a JSON-RPC error; with elicitation.url the call's SSE
//      stream opens with an elicitation/create request (mode url, the connect page, an
//      elicitationId); declined (files2) the result is isError "Not connected"; accepted after
//      mallory connects in the browser (files) it is UPSTREAM-USER: mallory
// The pin review page (/review on the same pages), REVIEW_UPSTREAM's tool pending throughout r1-r4:
//   r1 a wrong review token: 403 after about a second, no session cookie
//   r2 the tool is neither listed nor callable; the right token: 303 with the __Host- session
//      cookie, the list shows the pending pin with its definition
//   r3 approve without the form's csrf field, and with a forged one: 403 each, the pin still pending
//   r4 the page framed by a page of another origin: X-Frame-Options DENY, CSP frame-ancestors
//      'none', and the frame shows nothing of it
//   r5 approve with the reviewer's name: 303 back to /review, the pin gone from it, the tool listed
//      by the running gateway within the decision poll, callable (alice connects and it answers)
//   r6 `palisade pins list` says approved; the audit log has pins/approved for the pin with
//      reviewer and via=review-page; `palisade audit verify` passes
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';

const env = process.env;
const need = ['INTEROP_NODE_MODULES', 'GATEWAY_MCP', 'GATEWAY_WEB', 'GATEWAY_CONFIG', 'SHORT_MCP', 'SHORT_WEB', 'SHORT_TTL',
  'IDP', 'THIRD', 'UPSTREAM', 'UPSTREAM2', 'WEB_CERT', 'WEB_KEY', 'PALISADE_BIN', 'REVIEW_TOKEN_FILE', 'REVIEW_UPSTREAM', 'STORE_DB'];
const missing = need.filter((name) => !env[name]);
if (missing.length) {
  console.error(`user_oauth_flow: missing environment: ${missing.join(' ')}`);
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(env.INTEROP_NODE_MODULES), '..', 'resolve-from-here.js'));
const { chromium } = require('playwright-core');

const { GATEWAY_MCP, GATEWAY_WEB, SHORT_MCP, SHORT_WEB, IDP, THIRD, UPSTREAM, UPSTREAM2 } = env;
const SHORT_TTL = Number(env.SHORT_TTL);
const SEP = env.SEP ?? '_';
const TOOL = `files${SEP}whoami`;
const TOOL2 = `files2${SEP}whoami`;
const REVIEW_UPSTREAM = env.REVIEW_UPSTREAM;
const TOOL3 = `${REVIEW_UPSTREAM}${SEP}whoami`;
const REVIEW = `${GATEWAY_WEB}review`;
const OUT_DIR = env.OUT_DIR ?? fs.mkdtempSync(path.join(os.tmpdir(), 'user-oauth-'));
const PROTOCOL = '2026-07-28';
const STEP_TIMEOUT_MS = 15_000;
const CALLBACK = `${GATEWAY_WEB}oauth/callback`;
const URL_CAPS = { elicitation: { url: {} } };

let failures = 0;
function report(ok, id, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - user_oauth ${id}: ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
const watchdog = setTimeout(() => {
  report(false, '-', 'the driver did not finish within 150 s');
  process.exit(1);
}, 150_000);

// ---------------------------------------------------------------------------------------------
// The MCP side: callers' tokens and raw 2026-07-28 JSON-RPC over fetch
// ---------------------------------------------------------------------------------------------

// What the frame #victim of PAGE (a framing page just opened) shows: its content, a description, its URL.
async function framedContent(page) {
  await page.waitForLoadState('load');
  await page.waitForTimeout(300);
  const frame = await (await page.locator('#victim').elementHandle())?.contentFrame();
  if (!frame) return { content: '', how: 'no frame', url: '' };
  try {
    const content = await frame.content();
    return { content, how: `frame at ${frame.url()}, ${content.length} chars`, url: frame.url() };
  } catch (error) {
    return { content: '', how: `frame.content() failed: ${String(error?.message ?? error).split('\n')[0]}`, url: frame.url() };
  }
}
async function mint(subject, client, resource) {
  const r = await fetch(`${IDP}/token`, {
    method: 'POST',
    headers: { authorization: `Basic ${Buffer.from(`${client}:${client}-secret`).toString('base64')}`,
      'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'urn:palisade:interop:user-token', subject, resource }),
    signal: AbortSignal.timeout(STEP_TIMEOUT_MS),
  });
  const body = await r.json();
  if (!body.access_token) throw new Error(`the identity provider minted no token for ${subject}/${client}: ${r.status} ${JSON.stringify(body)}`);
  fs.appendFileSync(path.join(OUT_DIR, 'tokens'), `${body.access_token}\n`);
  return body.access_token;
}

let rpcId = 0;
// call(mcp, token, name, extra, caps): a tools/call; {status, message} with message the JSON-RPC response.
async function call(mcp, token, name, { inputResponses, requestState } = {}, caps = URL_CAPS) {
  const params = { name, arguments: {} };
  if (inputResponses) params.inputResponses = inputResponses;
  if (requestState !== undefined) params.requestState = requestState;
  return rpc(mcp, token, 'tools/call', params, caps, { 'mcp-name': name });
}
// The tool names tools/list answers (all pages), or an error.
async function listTools(mcp, token) {
  const names = [];
  let cursor;
  for (let page = 0; page < 20; page += 1) {
    const reply = await rpc(mcp, token, 'tools/list', cursor ? { cursor } : {});
    const result = reply.message?.result;
    if (!Array.isArray(result?.tools)) throw new Error(`tools/list: ${shown(reply)}`);
    names.push(...result.tools.map((t) => t.name));
    cursor = result.nextCursor;
    if (!cursor) break;
  }
  return names;
}
async function rpc(mcp, token, method, params, caps = URL_CAPS, headers = {}) {
  rpcId += 1;
  params._meta = { 'io.modelcontextprotocol/protocolVersion': PROTOCOL, 'io.modelcontextprotocol/clientCapabilities': caps,
    'io.modelcontextprotocol/clientInfo': { name: 'palisade-interop-user-oauth', version: '0' } };
  const r = await fetch(mcp, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${token}`,
      'mcp-protocol-version': PROTOCOL, 'mcp-method': method, ...headers },
    body: JSON.stringify({ jsonrpc: '2.0', id: rpcId, method, params }),
    signal: AbortSignal.timeout(STEP_TIMEOUT_MS * 2),
  });
  const text = await r.text();
  let messages = [];
  try {
    messages = text.trimStart().startsWith('{') ? [JSON.parse(text)]
      : text.split('\n').filter((l) => l.startsWith('data:') && l.slice(5).trim()).map((l) => JSON.parse(l.slice(5)));
  } catch { /* reported below */ }
  const message = messages.filter((m) => m && (m.result || m.error)).at(-1);
  return { status: r.status, message, raw: text.slice(0, 400) };
}
const resultText = (reply) => reply.message?.result?.content?.find((c) => c.type === 'text')?.text;
const shown = (reply) => (reply.message ? JSON.stringify(reply.message.error ?? reply.message.result).slice(0, 300) : `HTTP ${reply.status} ${reply.raw}`);

// The connect request of an input-required answer: {url, requestState, request}, or undefined.
function connectOf(reply) {
  const result = reply.message?.result;
  if (result?.resultType !== 'input_required') return undefined;
  const request = result.inputRequests?.palisade_connect;
  if (request?.method !== 'elicitation/create' || request.params?.mode !== 'url' || typeof request.params?.url !== 'string') return undefined;
  return { url: request.params.url, requestState: result.requestState, request };
}
function isConnectFor(reply, web) {
  const connect = connectOf(reply);
  return !!connect && connect.url.startsWith(`${web}connect/`) && typeof connect.requestState === 'string';
}
const accept = (connect) => ({ inputResponses: { palisade_connect: { action: 'accept' } }, requestState: connect.requestState });

// ---------------------------------------------------------------------------------------------
// The 2025-era session wire (2025-11-25: initialize, Mcp-Session-Id, server requests on the POST's
// SSE stream, the client's answers as POSTs of their own)
// ---------------------------------------------------------------------------------------------
const LEGACY = '2025-11-25';

// A POST of the session wire: before the session (initialize) without MCP-Protocol-Version.
function sessionPost(mcp, token, session, body, signal = AbortSignal.timeout(STEP_TIMEOUT_MS * 2)) {
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${token}` };
  if (session) Object.assign(headers, { 'mcp-session-id': session, 'mcp-protocol-version': LEGACY });
  return fetch(mcp, { method: 'POST', headers, body: JSON.stringify(body), signal });
}

// The messages of a response, one at a time as they arrive: next(ms) is the next JSON-RPC
// message (a single application/json body counts as one), or undefined at the end or after ms.
function messagesOf(response) {
  const json = (response.headers.get('content-type') ?? '').startsWith('application/json');
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let done = false;
  let reading;
  const seen = [];
  async function next(ms = STEP_TIMEOUT_MS) {
    const deadline = Date.now() + ms;
    for (;;) {
      if (!json) {
        const end = buffer.match(/\r?\n\r?\n/);
        if (end) {
          const block = buffer.slice(0, end.index);
          buffer = buffer.slice(end.index + end[0].length);
          const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
          if (!data.trim()) continue;
          const message = JSON.parse(data);
          seen.push(message);
          return message;
        }
      }
      if (done) {
        if (json && buffer.trim()) {
          const message = JSON.parse(buffer);
          buffer = '';
          seen.push(message);
          return message;
        }
        return undefined;
      }
      const left = deadline - Date.now();
      if (left <= 0) return undefined;
      reading ??= reader.read();
      let timer;
      const chunk = await Promise.race([reading, new Promise((resolve) => { timer = setTimeout(() => resolve('timeout'), left); })]);
      clearTimeout(timer);
      if (chunk === 'timeout') return undefined;
      reading = undefined;
      if (chunk.done) done = true;
      else buffer += decoder.decode(chunk.value, { stream: true });
    }
  }
  return { next, seen, close: () => reader.cancel().catch(() => {}) };
}

// initialize (capabilities `caps`) and notifications/initialized: the session id, or an error.
async function openSession(mcp, token, caps) {
  rpcId += 1;
  const init = await sessionPost(mcp, token, undefined, { jsonrpc: '2.0', id: rpcId, method: 'initialize',
    params: { protocolVersion: LEGACY, capabilities: caps, clientInfo: { name: 'palisade-interop-user-oauth-2025', version: '0' } } });
  const session = init.headers.get('mcp-session-id');
  const answer = await messagesOf(init).next();
  if (init.status !== 200 || !session || answer?.result?.protocolVersion !== LEGACY) {
    throw new Error(`initialize: HTTP ${init.status}, session ${session}, ${JSON.stringify(answer).slice(0, 300)}`);
  }
  const initialized = await sessionPost(mcp, token, session, { jsonrpc: '2.0', method: 'notifications/initialized' });
  await initialized.body?.cancel().catch(() => {});
  if (initialized.status !== 202) throw new Error(`notifications/initialized: HTTP ${initialized.status}`);
  return session;
}
// A tools/call on the session: {id, status, stream, abort}; the stream is read as it arrives.
async function sessionCall(mcp, token, session, name) {
  rpcId += 1;
  const id = rpcId;
  const abort = new AbortController();
  const response = await sessionPost(mcp, token, session, { jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: {} } }, abort.signal);
  return { id, status: response.status, type: response.headers.get('content-type') ?? '', stream: messagesOf(response), abort: () => abort.abort() };
}
// The client's answer to the server request `ask` on the session: the POST's HTTP status.
async function sessionAnswer(mcp, token, session, ask, result) {
  const answered = await sessionPost(mcp, token, session, { jsonrpc: '2.0', id: ask.id, result });
  await answered.body?.cancel().catch(() => {});
  return answered.status;
}
// Whether `message` is the URL-mode elicitation/create request of a connect page of `web`, with
// the elicitationId 2025-11-25 requires.
const isSessionConnect = (message, web) => message?.method === 'elicitation/create' && message.id !== undefined
  && message.params?.mode === 'url' && typeof message.params?.url === 'string' && message.params.url.startsWith(`${web}connect/`)
  && typeof message.params?.elicitationId === 'string' && message.params.elicitationId.length > 0;
const brief = (message) => (message === undefined ? 'nothing within the step timeout' : JSON.stringify(message).slice(0, 300));

async function counts() {
  return (await fetch(`${THIRD}/counts`, { signal: AbortSignal.timeout(STEP_TIMEOUT_MS) })).json();
}
const sameAuthorize = (before, after) => before.authorize === after.authorize && before.token === after.token;

// palisade(...args): runs the CLI; its stdout, or an error with its exit status and output.
function palisade(...args) {
  const run = spawnSync(env.PALISADE_BIN, args, { encoding: 'utf8', timeout: 20_000 });
  if (run.status !== 0) throw new Error(`palisade ${args.slice(0, 2).join(' ')}: exit ${run.status}: ${(run.stdout + run.stderr).trim().slice(0, 300)}`);
  return run.stdout;
}
// `palisade pins list --upstream U [--state S]`: [{id, state}].
function pinRows(upstream, only = undefined) {
  const filter = only ? ['--state', only] : [];
  return palisade('pins', 'list', '--upstream', upstream, ...filter, '--config', env.GATEWAY_CONFIG).split('\n').slice(1)
    .map((line) => line.trim().split(/\s+/)).filter((cols) => cols.length >= 4 && cols[3] === upstream)
    .map(([id, state]) => ({ id, state }));
}
// Removes alice's connection to `upstream` (there must be one).
function revoke(upstream) {
  const out = palisade('connections', 'revoke', '--subject', 'alice', '--upstream', upstream, '--reason', 'interop leg k', '--config', env.GATEWAY_CONFIG);
  if (!/removed 1 connection/.test(out)) throw new Error(`connections revoke: ${out.trim()}`);
}

// ---------------------------------------------------------------------------------------------
// The browser side
// ---------------------------------------------------------------------------------------------
const certPem = fs.readFileSync(env.WEB_CERT, 'utf8');
const leafPin = crypto.createHash('sha256')
  .update(new crypto.X509Certificate(certPem).publicKey.export({ type: 'spki', format: 'der' })).digest('base64');

// Every page records its main-frame navigations ({url, status, headers}) and the third party's
// authorization requests and the gateway's callbacks it made.
function watch(page) {
  page.navs = [];
  page.authorizeRequests = [];
  page.callbacks = [];
  page.on('response', (r) => {
    if (r.request().isNavigationRequest() && r.frame() === page.mainFrame()) {
      page.navs.push({ url: r.url(), status: r.status(), method: r.request().method(), headers: r.headers() });
    }
  });
  page.on('request', (r) => {
    if (r.url().startsWith(`${THIRD}/auth?`)) page.authorizeRequests.push(r.url());
    if (/^https:\/\/[^/]+\/oauth\/callback\?/.test(r.url())) page.callbacks.push(r.url());
  });
  return page;
}
const lastNav = (page) => page.navs.at(-1) ?? {};
const navTrail = (page, from = 0) => page.navs.slice(from).map((n) => `${n.method} ${n.url.split('?')[0]} ${n.status}`).join(' -> ');

async function newPage(browser) {
  const context = await browser.newContext();
  context.setDefaultTimeout(STEP_TIMEOUT_MS);
  return watch(await context.newPage());
}

// Fills the development login of an oidc-provider (IdP or third party) as `who` and submits.
async function login(page, who) {
  await page.fill('input[name=login]', who);
  await page.fill('input[name=password]', 'any-password');
  const from = page.url();
  await Promise.all([page.waitForURL((u) => u.href !== from), page.click('form button[type=submit]')]);
  await page.waitForLoadState();
}

// Goes through whatever the page shows until it leaves `origin`'s interaction pages: the login
// (as `who`) and the consent ("Continue") of an oidc-provider.
async function throughInteractions(page, origin, who) {
  for (let step = 0; step < 6 && page.url().startsWith(`${origin}/interaction/`); step += 1) {
    if (await page.locator('input[name=login]').count()) {
      await login(page, who);
    } else {
      const from = page.url();
      await Promise.all([page.waitForURL((u) => u.href !== from), page.click('form button[type=submit]')]);
      await page.waitForLoadState();
    }
  }
}

// Opens a connect link and signs in at the identity provider if asked: where the browser ends.
async function openLink(page, link, who) {
  const from = page.navs.length;
  await page.goto(link);
  await throughInteractions(page, IDP, who);
  await page.waitForLoadState();
  return { ...lastNav(page), trail: navTrail(page, from) };
}

const onConsentPage = async (page) => /\/connect\/[^/?]+$/.test(page.url()) && (await page.locator('form input[name=csrf]').count()) === 1;

// Submits the consent form (after `edit` ran on the page) with `decision`; the POST's response.
async function submitConsent(page, decision = 'approve', edit = undefined, arg = undefined) {
  if (edit) await page.evaluate(edit, arg);
  const action = page.url();
  const [answer] = await Promise.all([
    page.waitForResponse((r) => r.url() === action && r.request().method() === 'POST'),
    page.click(`button[name=decision][value=${decision}]`),
  ]);
  await page.waitForLoadState();
  return answer;
}

// After an approval: the third party's login and consent as `who`, until back at the gateway.
async function finishAtThirdParty(page, who) {
  await page.waitForURL((u) => !u.href.startsWith(GATEWAY_WEB) || /\/oauth\/callback\?/.test(u.href), { waitUntil: 'commit' }).catch(() => {});
  await throughInteractions(page, THIRD, who);
  await page.waitForLoadState();
  return lastNav(page);
}
const connectedPage = async (page) => (await page.locator('#connected').count()) === 1;

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------
let browser;
// Pages of another origin of the same site (another port, the same certificate): framerHtml.
let framer;
let framerHtml = '';
async function framerOrigin() {
  if (!framer) {
    framer = https.createServer({ cert: certPem, key: fs.readFileSync(env.WEB_KEY) },
      (_req, res) => res.writeHead(200, { 'content-type': 'text/html', 'cache-control': 'no-store' }).end(framerHtml));
    await new Promise((resolve) => framer.listen(0, '127.0.0.1', resolve));
  }
  return `https://127.0.0.1:${framer.address().port}/`;
}
const state = {};
async function step(id, name, body) {
  try {
    await body();
  } catch (error) {
    report(false, id, name, String(error?.stack ?? error).split('\n').slice(0, 4).join(' | '));
  }
}

try {
  browser = await chromium.launch({
    executablePath: env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', `--ignore-certificate-errors-spki-list=${leafPin}`],
    timeout: STEP_TIMEOUT_MS,
  });
  const alice = await newPage(browser);
  const tokenA = await mint('alice', 'mcp-client', GATEWAY_MCP);
  const tokenB = await mint('alice', 'mcp-client-2', GATEWAY_MCP);

  await step('0', 'no elicitation.url capability', async () => {
    const reply = await call(GATEWAY_MCP, tokenA, TOOL, {}, {});
    const error = reply.message?.error;
    report(error?.code === -32021 && JSON.stringify(error?.data ?? {}).includes('"url"'),
      '0', 'without elicitation.url the call is refused as a missing capability (-32021, url mode named)', shown(reply));
  });

  // a. The full flow.
  await step('a', 'full flow', async () => {
    const first = await call(GATEWAY_MCP, tokenA, TOOL);
    const connect = connectOf(first);
    report(isConnectFor(first, GATEWAY_WEB), 'a', 'the call answers input-required with a URL elicitation of the connect page and a requestState',
      connect ? connect.url.replace(/connect\/.*/, 'connect/<id>') : shown(first));
    if (!connect) return;
    state.linkA = connect.url;
    const opened = await openLink(alice, connect.url, 'alice');
    const consent = await onConsentPage(alice);
    const text = (sel) => alice.locator(sel).innerText().catch(() => '');
    const [clientId, upstream, scopes, redirect] = await Promise.all(['#client-id', '#upstream', '#scopes', '#redirect-uri'].map(text));
    const signedInThroughIdp = opened.trail.includes(`${IDP}/auth`) && opened.trail.includes('/signin/callback');
    report(consent && opened.status === 200 && signedInThroughIdp, 'a', 'the link signs alice in at the identity provider and shows the consent page', opened.trail);
    const pageText = await alice.locator('body').innerText().catch(() => '');
    report(clientId.trim() === 'mcp-client' && upstream.trim() === 'files' && scopes.includes('files:read')
      && redirect.trim() === CALLBACK && pageText.includes(UPSTREAM),
    'a', 'the consent page names the MCP client id, the upstream, the scope and the redirect URI',
    JSON.stringify({ clientId, upstream, scopes, redirect }));
    const headers = opened.headers ?? {};
    report(headers['x-frame-options'] === 'DENY' && (headers['content-security-policy'] ?? '').includes("frame-ancestors 'none'"),
      'a', "the consent page says X-Frame-Options: DENY and CSP frame-ancestors 'none'", `${headers['x-frame-options']}; ${headers['content-security-policy']}`);
    await alice.screenshot({ path: path.join(OUT_DIR, 'consent.png'), fullPage: true }).catch(() => {});
    const before = await counts();
    const from = alice.navs.length;
    const answer = await submitConsent(alice, 'approve');
    const authorize = alice.authorizeRequests.at(-1);
    const q = authorize ? new URL(authorize).searchParams : new URLSearchParams();
    report(answer.status() === 303 && q.get('code_challenge_method') === 'S256' && !!q.get('code_challenge')
      && q.get('resource') === UPSTREAM && !!q.get('state') && q.get('redirect_uri') === CALLBACK && q.get('response_type') === 'code',
    'a', 'approve: 303 to the third party\'s authorization endpoint with PKCE S256, resource = the upstream, state and the redirect URI',
    `${answer.status()}, ${authorize ? [...q.keys()].join(',') : `no authorization request (${navTrail(alice, from)})`}`);
    const back = await finishAtThirdParty(alice, 'alice');
    const after = await counts();
    report(await connectedPage(alice) && back.status === 200 && after.authorize > before.authorize && after.token > before.token,
      'a', 'the third party\'s login and consent, then the callback\'s success page', navTrail(alice, from));
    state.callbackA = alice.callbacks.at(-1);
    const cb = state.callbackA ? new URL(state.callbackA).searchParams : new URLSearchParams();
    report(cb.get('iss') === THIRD && !!cb.get('code') && cb.get('state') === q.get('state'), 'a',
      'the callback carried code, the same state and iss (RFC 9207)', state.callbackA ? [...cb.keys()].join(',') : 'no callback seen');
    const cookies = await alice.context().cookies(GATEWAY_WEB);
    const wanted = ['__Host-palisade_session', '__Host-palisade_consent'];
    const got = wanted.map((name) => cookies.find((c) => c.name === name));
    report(got.every((c) => c && c.secure && c.httpOnly && c.sameSite === 'Lax' && c.path === '/' && !c.domain.startsWith('.')),
      'a', 'the session and consent cookies are __Host-, Secure, HttpOnly, SameSite=Lax',
      got.map((c, i) => (c ? `${c.name} secure=${c.secure} httpOnly=${c.httpOnly} sameSite=${c.sameSite}` : `${wanted[i]} missing`)).join('; '));
    const retry = await call(GATEWAY_MCP, tokenA, TOOL, accept(connect));
    report(resultText(retry) === 'UPSTREAM-USER: alice' && !retry.message?.result?.isError, 'a',
      'the retry with the requestState and action accept answers UPSTREAM-USER: alice', shown(retry));
    state.connectedA = resultText(retry) === 'UPSTREAM-USER: alice';
  });

  // b. A second call: no browser; the short-lived access token was refreshed (rotation).
  await step('b', 'stored token', async () => {
    const before = await counts();
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const again = await call(GATEWAY_MCP, tokenA, TOOL);
    const after = await counts();
    report(resultText(again) === 'UPSTREAM-USER: alice', 'b', 'a second call answers at once (the stored token), no connect request', shown(again));
    const refreshed = (after.grants.refresh_token ?? 0) > (before.grants.refresh_token ?? 0);
    const third = await call(GATEWAY_MCP, tokenA, TOOL);
    report(refreshed && resultText(third) === 'UPSTREAM-USER: alice', 'b',
      'the short-lived access token was refreshed at the token endpoint (rotated refresh token), and the next call still works',
      `refresh grants ${before.grants.refresh_token ?? 0} -> ${after.grants.refresh_token ?? 0}; ${shown(third)}`);
  });

  // c. mcp-client-2 for the same person: input-required again.
  await step('c', 'per-client consent', async () => {
    const reply = await call(GATEWAY_MCP, tokenB, TOOL);
    report(isConnectFor(reply, GATEWAY_WEB), 'c', 'alice through mcp-client-2 (connected through mcp-client): input-required again', shown(reply));
    state.connectB = connectOf(reply);
  });

  // d, f, e on mcp-client-2's consent page; then its approval (c, second half) and h.
  await step('d', 'forged CSRF', async () => {
    if (!state.connectB) throw new Error('no connect link for mcp-client-2 (case c)');
    const opened = await openLink(alice, state.connectB.url, 'alice');
    const clientId = await alice.locator('#client-id').innerText().catch(() => '');
    report(await onConsentPage(alice) && clientId.trim() === 'mcp-client-2', 'c',
      'mcp-client-2\'s link shows the consent page, naming mcp-client-2', `${opened.trail}; client ${clientId}`);
    const before = await counts();
    const answer = await submitConsent(alice, 'approve', () => {
      const field = document.querySelector('input[name=csrf]');
      field.value = (field.value[0] === 'A' ? 'B' : 'A') + field.value.slice(1);
    });
    const after = await counts();
    report(answer.status() === 403 && sameAuthorize(before, after) && !alice.url().startsWith(THIRD), 'd',
      'a forged csrf field: 403, the third party\'s endpoints not reached', `${answer.status()}, counts ${JSON.stringify(before)} -> ${JSON.stringify(after)}`);
    const removed = await (async () => {
      await openLink(alice, state.connectB.url, 'alice');
      return submitConsent(alice, 'approve', () => document.querySelector('input[name=csrf]').remove());
    })();
    report(removed.status() === 403 && sameAuthorize(before, await counts()), 'd', 'no csrf field at all: 403', `${removed.status()}`);
    // The page's own csrf token, posted by a page of another origin of the same site (so the
    // SameSite=Lax session cookie goes along): refused by the Origin check alone.
    await openLink(alice, state.connectB.url, 'alice');
    const csrf = await alice.locator('input[name=csrf]').inputValue();
    const attr = (v) => v.replaceAll('&', '&amp;').replaceAll('"', '&quot;');
    framerHtml = `<!doctype html><title>poster</title><form id="f" method="post" action="${attr(state.connectB.url)}">`
      + `<input type="hidden" name="csrf" value="${attr(csrf)}"><input type="hidden" name="redirect_uri" value="${attr(CALLBACK)}">`
      + '<input type="hidden" name="decision" value="approve"></form><script>document.getElementById("f").submit()</script>';
    const [foreign] = await Promise.all([
      alice.waitForResponse((r) => r.url() === state.connectB.url && r.request().method() === 'POST'),
      alice.goto(await framerOrigin()),
    ]);
    const origin = await foreign.request().headerValue('origin');
    report(foreign.status() === 403 && origin !== new URL(GATEWAY_WEB).origin && sameAuthorize(before, await counts()), 'd',
      'a POST from another origin with the session cookie and a valid csrf token: 403 (Origin check)', `${foreign.status()}, Origin: ${origin}`);
  });

  await step('f', 'redirect_uri exact', async () => {
    if (!state.connectB) throw new Error('no connect link for mcp-client-2 (case c)');
    const variants = [
      ['one character off', CALLBACK.replace(/k$/, 'x')],
      ['a trailing slash', `${CALLBACK}/`],
      ['another case', CALLBACK.replace(/^https:/, 'HTTPS:')],
      ['another case in the path', CALLBACK.replace('/oauth/callback', '/OAuth/callback')],
    ];
    const before = await counts();
    for (const [name, value] of variants) {
      await openLink(alice, state.connectB.url, 'alice');
      if (!(await onConsentPage(alice))) throw new Error(`no consent page for the ${name} variant: ${alice.url()}`);
      const answer = await submitConsent(alice, 'approve', (v) => { document.querySelector('input[name=redirect_uri]').value = v; }, value);
      report(answer.status() === 400 && !alice.url().startsWith(THIRD), 'f', `redirect_uri with ${name} (${value}): 400`, `${answer.status()}`);
    }
    const after = await counts();
    report(sameAuthorize(before, after), 'f', 'the third party\'s endpoints were not reached by any of them', `${JSON.stringify(before)} -> ${JSON.stringify(after)}`);
  });

  await step('e', 'framing', async () => {
    if (!state.connectB) throw new Error('no connect link for mcp-client-2 (case c)');
    // Another origin of the same site: the browser sends the session cookie along, so what would
    // render is the real consent page.
    framerHtml = `<!doctype html><title>framer</title><iframe id="victim" width="800" height="600" src="${state.connectB.url.replaceAll('&', '&amp;').replaceAll('"', '&quot;')}"></iframe>`;
    const framerUrl = await framerOrigin();
    const [answer] = await Promise.all([
      alice.waitForResponse((r) => r.url() === state.connectB.url && r.frame() !== alice.mainFrame()),
      alice.goto(framerUrl),
    ]);
    const headers = answer.headers();
    const { content, how, url: frameUrl } = await framedContent(alice);
    report(answer.status() === 200 && headers['x-frame-options'] === 'DENY' && (headers['content-security-policy'] ?? '').includes("frame-ancestors 'none'"),
      'e', "the framed consent page (200, the session cookie sent) says X-Frame-Options: DENY and CSP frame-ancestors 'none'",
      `${answer.status()}, X-Frame-Options: ${headers['x-frame-options']}`);
    report(!content.includes('name="csrf"') && !content.includes('client-id') && !frameUrl.startsWith(GATEWAY_WEB),
      'e', 'the frame shows nothing of the consent page', how);
  });

  await step('c', 'approve mcp-client-2', async () => {
    if (!state.connectB) throw new Error('no connect link for mcp-client-2 (case c)');
    await openLink(alice, state.connectB.url, 'alice');
    const from = alice.navs.length;
    const answer = await submitConsent(alice, 'approve');
    await finishAtThirdParty(alice, 'alice');
    const retry = await call(GATEWAY_MCP, tokenB, TOOL, accept(state.connectB));
    report(answer.status() === 303 && await connectedPage(alice) && resultText(retry) === 'UPSTREAM-USER: alice', 'c',
      'once alice approves mcp-client-2 on the consent page, its retry answers UPSTREAM-USER: alice', `${navTrail(alice, from)}; ${shown(retry)}`);
    const a = await call(GATEWAY_MCP, tokenA, TOOL);
    report(resultText(a) === 'UPSTREAM-USER: alice', 'c', 'mcp-client still goes through (its approval stands)', shown(a));
  });

  // h. The approval record of mcp-client exists, the browser's consent cookie is mcp-client-2's
  //    (its approval was the last): the page is shown; once mcp-client's cookie is back: skipped.
  await step('h', 'consent cookie per client', async () => {
    revoke('files');
    const reply = await call(GATEWAY_MCP, tokenA, TOOL);
    const connect = connectOf(reply);
    if (!connect) throw new Error(`after revoking, no connect request: ${shown(reply)}`);
    const opened = await openLink(alice, connect.url, 'alice');
    const clientId = await alice.locator('#client-id').innerText().catch(() => '');
    report(await onConsentPage(alice) && clientId.trim() === 'mcp-client', 'h',
      'mcp-client approved before, but the consent cookie is mcp-client-2\'s: the consent page is shown', opened.trail);
    await submitConsent(alice, 'approve');
    await finishAtThirdParty(alice, 'alice');
    const retry = await call(GATEWAY_MCP, tokenA, TOOL, accept(connect));
    revoke('files');
    const again = connectOf(await call(GATEWAY_MCP, tokenA, TOOL));
    if (!again) throw new Error('after the second revocation, no connect request');
    const from = alice.navs.length;
    await alice.goto(again.url);
    await finishAtThirdParty(alice, 'alice');
    const shownConsent = alice.navs.slice(from).some((n) => n.method === 'GET' && /\/connect\//.test(n.url) && n.status === 200);
    const skipped = await connectedPage(alice) && !shownConsent;
    const final = await call(GATEWAY_MCP, tokenA, TOOL, accept(again));
    report(resultText(retry) === 'UPSTREAM-USER: alice' && skipped && resultText(final) === 'UPSTREAM-USER: alice', 'h',
      'control: with the approval record and mcp-client\'s own consent cookie the page is skipped', navTrail(alice, from));
  });

  // g. A replayed state.
  await step('g', 'replayed state', async () => {
    if (!state.callbackA) throw new Error('no callback URL from case a');
    const before = await counts();
    const resp = await alice.goto(state.callbackA);
    const after = await counts();
    report(resp.status() === 400 && after.token === before.token, 'g', 'the callback of case a replayed (same code and state): 400, no token request',
      `${resp.status()}`);
  });

  // j. A completed flow's link, again.
  await step('j', 'link reuse', async () => {
    if (!state.linkA) throw new Error('no connect link from case a');
    const before = await counts();
    const resp = await alice.goto(state.linkA);
    const after = await counts();
    report(resp.status() === 400 && !alice.url().startsWith(THIRD) && sameAuthorize(before, after), 'j',
      'the connect link of case a, opened again after completion: refused (400)', `${resp.status()} at ${alice.url().split('?')[0]}`);
  });

  // i. mallory completes the sign-in of alice's link.
  await step('i', 'another person', async () => {
    const reply = await call(GATEWAY_MCP, tokenA, TOOL2);
    const connect = connectOf(reply);
    if (!connect) throw new Error(`files2: no connect request: ${shown(reply)}`);
    const mallory = await newPage(browser);
    const before = await counts();
    const opened = await openLink(mallory, connect.url, 'mallory');
    const text = await mallory.locator('body').innerText().catch(() => '');
    const after = await counts();
    report(opened.status === 403 && /\/signin\/callback/.test(opened.url) && sameAuthorize(before, after), 'i',
      'mallory signs in for alice\'s connect link: 403 at the sign-in callback, the third party not reached', `${opened.trail}; ${text.slice(0, 120)}`);
    const still = await call(GATEWAY_MCP, tokenA, TOOL2);
    const listed = palisade('connections', 'list', '--subject', 'alice', '--config', env.GATEWAY_CONFIG);
    report(isConnectFor(still, GATEWAY_WEB) && !listed.includes('files2'), 'i',
      'nothing was connected: alice\'s files2 call is still input-required, no files2 connection listed', shown(still));
    const upstream2 = await (await fetch(UPSTREAM2.replace(/\/mcp$/, '/calls'))).json();
    report(upstream2.calls.length === 0, 'i', 'the files2 upstream saw no call', JSON.stringify(upstream2));
    state.connect2 = connectOf(still);
    await mallory.context().close();
  });

  // k. Declining the connect request.
  await step('k', 'decline', async () => {
    if (!state.connect2) throw new Error('no files2 connect request (case i)');
    const reply = await call(GATEWAY_MCP, tokenA, TOOL2, { inputResponses: { palisade_connect: { action: 'decline' } }, requestState: state.connect2.requestState });
    report(reply.message?.result?.isError === true && /Not connected/.test(resultText(reply) ?? ''), 'k',
      'declining the connect request: the tool result is isError "Not connected"', shown(reply));
  });

  // l. A 2025-era client on the session wire (2025-11-25): mallory, who has connected nothing.
  await step('l', 'session wire', async () => {
    const tokenM = await mint('mallory', 'mcp-client', GATEWAY_MCP);
    const textOf = (message) => message?.result?.content?.find((c) => c.type === 'text')?.text ?? '';
    // Initialized without elicitation.url (form mode only): a JSON-RPC error, no URL elicitation.
    const plain = await openSession(GATEWAY_MCP, tokenM, { elicitation: {} });
    const refused = await sessionCall(GATEWAY_MCP, tokenM, plain, TOOL);
    const answer = await refused.stream.next();
    refused.abort();
    report(answer?.id === refused.id && !!answer?.error && answer.method === undefined && !answer.result, 'l',
      'a 2025-11-25 session initialized with elicitation: {} (no url): the call answers a JSON-RPC error, not a URL elicitation',
      `HTTP ${refused.status} ${refused.type.split(';')[0]}; ${brief(answer)}`);

    const session = await openSession(GATEWAY_MCP, tokenM, URL_CAPS);
    // Declined (files2): the call's result on the stream is isError "Not connected".
    const declined = await sessionCall(GATEWAY_MCP, tokenM, session, TOOL2);
    const ask2 = await declined.stream.next();
    report(declined.status === 200 && declined.type.startsWith('text/event-stream') && isSessionConnect(ask2, GATEWAY_WEB), 'l',
      'with elicitation.url: the files2 call\'s SSE stream opens with an elicitation/create request, mode url, the connect page, an elicitationId',
      `HTTP ${declined.status} ${declined.type.split(';')[0]}; ${brief(ask2)}`);
    if (ask2?.method === 'elicitation/create') {
      const status = await sessionAnswer(GATEWAY_MCP, tokenM, session, ask2, { action: 'decline' });
      const result = await declined.stream.next();
      report(status === 202 && result?.id === declined.id && result.result?.isError === true && /^Not connected/.test(textOf(result)), 'l',
        'declining it (a JSON-RPC response on the session, 202): the call\'s result on the stream is isError "Not connected"',
        `answer POST ${status}; ${brief(result)}`);
    }
    declined.abort();

    // Accepted (files) after mallory connects in the browser: the call's result on the stream.
    const pending = await sessionCall(GATEWAY_MCP, tokenM, session, TOOL);
    const ask = await pending.stream.next();
    report(isSessionConnect(ask, GATEWAY_WEB) && ask.params.elicitationId !== ask2?.params?.elicitationId, 'l',
      'the files call\'s stream opens with a URL elicitation of the connect page, an elicitationId of its own',
      brief(ask));
    if (!isSessionConnect(ask, GATEWAY_WEB)) {
      pending.abort();
      return;
    }
    const mallory = await newPage(browser);
    const opened = await openLink(mallory, ask.params.url, 'mallory');
    const consent = await onConsentPage(mallory);
    const clientId = await mallory.locator('#client-id').innerText().catch(() => '');
    if (consent) await submitConsent(mallory, 'approve');
    await finishAtThirdParty(mallory, 'mallory');
    const connected = await connectedPage(mallory);
    report(consent && clientId.trim() === 'mcp-client' && connected, 'l',
      'mallory opens the link: sign-in, the consent page (mcp-client), the third party, the success page', navTrail(mallory));
    const status = await sessionAnswer(GATEWAY_MCP, tokenM, session, ask, { action: 'accept' });
    const result = await pending.stream.next();
    pending.abort();
    report(status === 202 && result?.id === pending.id && textOf(result) === 'UPSTREAM-USER: mallory' && !result.result.isError
      && result.result.resultType === undefined, 'l',
    'accepting it (202): the call\'s result on the stream is UPSTREAM-USER: mallory (2025 shape, no resultType)',
    `answer POST ${status}; ${brief(result)}`);
    const listed = palisade('connections', 'list', '--subject', 'mallory', '--config', env.GATEWAY_CONFIG);
    report(/\bupstream=files(\s|$)/m.test(listed) && !/\bupstream=files2\b/.test(listed), 'l', 'palisade connections list: mallory has files (and not the declined files2)',
      listed.trim().replace(/\n/g, ' | ').slice(0, 300));
    await mallory.context().close();
  });

  // g. The short-lived gateway: a fresh state is redeemed (control), an expired one is refused.
  await step('g', 'expired state', async () => {
    const page = await newPage(browser);
    const token = await mint('alice', 'mcp-client', SHORT_MCP);
    // Each flow stops at the third party's login page: only its authorization request's state
    // is wanted.
    const authorizeState = async () => {
      const seen = page.authorizeRequests.length;
      const connect = connectOf(await call(SHORT_MCP, token, TOOL));
      if (!connect || !connect.url.startsWith(`${SHORT_WEB}connect/`)) throw new Error('the short-lived gateway sent no connect request');
      await openLink(page, connect.url, 'alice');
      if (await onConsentPage(page)) await submitConsent(page, 'approve');
      await page.waitForURL((u) => u.href.startsWith(`${THIRD}/`), { waitUntil: 'commit' });
      if (page.authorizeRequests.length <= seen) throw new Error(`no authorization request at the third party: ${navTrail(page)}`);
      return new URL(page.authorizeRequests.at(-1)).searchParams.get('state');
    };
    const callback = (s) => `${SHORT_WEB}oauth/callback?code=not-a-code&state=${encodeURIComponent(s)}&iss=${encodeURIComponent(THIRD)}`;
    const fresh = await authorizeState();
    const control = await page.goto(callback(fresh));
    const stale = await authorizeState();
    await page.waitForTimeout((SHORT_TTL + 1.5) * 1000);
    const expired = await page.goto(callback(stale));
    report(control.status() !== 400 && expired.status() === 400, 'g',
      `a state older than flow_ttl_secs = ${SHORT_TTL}: 400 (a fresh one with a bad code: ${control.status()}, refused by the token endpoint instead)`,
      `expired ${expired.status()}`);
    await page.context().close();
  });

  // ---------------------------------------------------------------------------------------------
  // The pin review page: REVIEW_UPSTREAM's tool is pending until r5 approves it there.
  // ---------------------------------------------------------------------------------------------
  const reviewToken = fs.readFileSync(env.REVIEW_TOKEN_FILE, 'utf8').trim();
  const operator = await newPage(browser);
  const reviewCookie = async () => (await operator.context().cookies(GATEWAY_WEB)).find((c) => c.name === '__Host-palisade_review');
  // Signs in with `token`: the login POST's response (the browser then follows its redirect).
  const signIn = async (token) => {
    await operator.goto(REVIEW);
    await operator.fill('input[name=token]', token);
    const [answer] = await Promise.all([
      operator.waitForResponse((r) => r.url() === `${REVIEW}/login` && r.request().method() === 'POST'),
      operator.click('form[action="/review/login"] button[type=submit]'),
    ]);
    await operator.waitForLoadState();
    return answer;
  };
  // Clicks `verdict` in the pin's form (after `edit` ran on the page): the decide POST's response.
  const decide = async (pinId, verdict, edit = undefined) => {
    const form = `#pin-${pinId} form`;
    await operator.fill(`${form} input[name=reviewer]`, 'rita');
    await operator.fill(`${form} input[name=note]`, 'interop leg k');
    if (edit) await operator.evaluate(edit, form);
    const [answer] = await Promise.all([
      operator.waitForResponse((r) => r.url() === `${REVIEW}/decide` && r.request().method() === 'POST'),
      operator.click(`${form} button[name=verdict][value=${verdict}]`),
    ]);
    await operator.waitForLoadState();
    return answer;
  };
  const pendingPin = () => pinRows(REVIEW_UPSTREAM, 'pending').find((row) => row.state === 'pending')?.id;

  await step('r1', 'wrong review token', async () => {
    const opened = await operator.goto(REVIEW);
    if (opened.status() !== 200 || (await operator.locator('input[name=token]').count()) !== 1) {
      throw new Error(`GET /review: ${opened.status()}, no sign-in form`);
    }
    const wrong = reviewToken.slice(0, -1) + (reviewToken.endsWith('A') ? 'B' : 'A');
    const t0 = Date.now();
    const answer = await signIn(wrong);
    const took = Date.now() - t0;
    const setCookie = (await answer.allHeaders())['set-cookie'];
    const error = await operator.locator('#error').innerText().catch(() => '');
    report(answer.status() === 403 && !setCookie && !(await reviewCookie()) && took >= 900 && error.length > 0, 'r1',
      'a wrong review token: 403 after about a second, no session cookie, the sign-in form again',
      `${answer.status()} in ${took} ms, set-cookie: ${setCookie ?? 'none'}, "${error}"`);
    await operator.goto(REVIEW);
    report((await operator.locator('section.pin').count()) === 0 && (await operator.locator('input[name=token]').count()) === 1, 'r1',
      'after it, /review still shows only the sign-in form');
  });

  await step('r2', 'sign in, the pending pin listed', async () => {
    state.pin3 = pendingPin();
    if (!state.pin3) throw new Error(`no pending pin of ${REVIEW_UPSTREAM}: ${JSON.stringify(pinRows(REVIEW_UPSTREAM))}`);
    const listed = await listTools(GATEWAY_MCP, tokenA);
    const called = await call(GATEWAY_MCP, tokenA, TOOL3);
    report(listed.includes(TOOL) && !listed.includes(TOOL3) && !!called.message?.error && !connectOf(called) && !resultText(called), 'r2',
      `before any approval ${TOOL3} is neither listed (${TOOL} is) nor callable`, `listed ${listed.join(',')}; call: ${shown(called)}`);
    const answer = await signIn(reviewToken);
    const cookie = await reviewCookie();
    report(answer.status() === 303 && operator.url() === REVIEW && lastNav(operator).status === 200
      && !!cookie && cookie.secure && cookie.httpOnly && cookie.sameSite === 'Lax' && cookie.path === '/', 'r2',
    'the review token: 303 to /review with the session cookie __Host-palisade_review (Secure, HttpOnly, SameSite=Lax)',
    `${answer.status()} -> ${operator.url()}; ${cookie ? `secure=${cookie.secure} httpOnly=${cookie.httpOnly} sameSite=${cookie.sameSite}` : 'no cookie'}`);
    const section = operator.locator(`section.pin#pin-${state.pin3}`);
    const stateText = await section.locator('.state').innerText().catch(() => '');
    const definition = await section.locator('pre.definition').innerText().catch(() => '');
    report((await section.count()) === 1 && stateText === 'pending' && definition.includes('"whoami"')
      && (await section.locator('input[name=csrf]').count()) === 1, 'r2',
    `the list shows ${REVIEW_UPSTREAM}'s pin ${state.pin3}: pending, its definition, a form with its csrf token`,
    `${await section.count()} section(s), state "${stateText}"`);
    await operator.screenshot({ path: path.join(OUT_DIR, 'review.png'), fullPage: true }).catch(() => {});
  });

  await step('r3', 'CSRF', async () => {
    if (!state.pin3) throw new Error('no pending pin (case r2)');
    const removed = await decide(state.pin3, 'approve', (form) => document.querySelector(`${form} input[name=csrf]`).remove());
    const removedText = await operator.locator('body').innerText().catch(() => '');
    report(removed.status() === 403 && /CSRF/.test(removedText), 'r3', 'approve without the csrf field: 403',
      `${removed.status()}: ${removedText.slice(0, 100)}`);
    report(pendingPin() === state.pin3, 'r3', '... and the pin is still pending (palisade pins list --state pending)',
      JSON.stringify(pinRows(REVIEW_UPSTREAM)));
    await operator.goto(REVIEW);
    const forged = await decide(state.pin3, 'approve', (form) => {
      const field = document.querySelector(`${form} input[name=csrf]`);
      field.value = (field.value[0] === 'A' ? 'B' : 'A') + field.value.slice(1);
    });
    report(forged.status() === 403 && pendingPin() === state.pin3, 'r3', 'approve with a forged csrf field: 403, still pending',
      `${forged.status()}`);
  });

  await step('r4', 'framing', async () => {
    if (!state.pin3) throw new Error('no pending pin (case r2)');
    framerHtml = `<!doctype html><title>framer</title><iframe id="victim" width="800" height="600" src="${REVIEW}"></iframe>`;
    const framerUrl = await framerOrigin();
    const [answer] = await Promise.all([
      operator.waitForResponse((r) => r.url() === REVIEW && r.frame() !== operator.mainFrame()),
      operator.goto(framerUrl),
    ]);
    const headers = answer.headers();
    const sentCookie = /__Host-palisade_review=/.test((await answer.request().allHeaders()).cookie ?? '');
    const { content, how, url: frameUrl } = await framedContent(operator);
    report(answer.status() === 200 && headers['x-frame-options'] === 'DENY' && (headers['content-security-policy'] ?? '').includes("frame-ancestors 'none'"),
      'r4', "the framed review page says X-Frame-Options: DENY and CSP frame-ancestors 'none'",
      `${answer.status()}, session cookie sent: ${sentCookie}, X-Frame-Options: ${headers['x-frame-options']}`);
    report(!content.includes(state.pin3) && !content.includes('Pin review') && !content.includes('name="csrf"') && !frameUrl.startsWith(GATEWAY_WEB),
      'r4', 'the frame shows nothing of the review page', how);
  });

  await step('r5', 'approve on the page', async () => {
    if (!state.pin3) throw new Error('no pending pin (case r2)');
    const before = await listTools(GATEWAY_MCP, tokenA);
    report(!before.includes(TOOL3), 'r5', `${TOOL3} is still not listed after r3's refused attempts`, before.join(','));
    await operator.goto(REVIEW);
    const from = operator.navs.length;
    const answer = await decide(state.pin3, 'approve');
    const gone = (await operator.locator(`#pin-${state.pin3}`).count()) === 0;
    report(answer.status() === 303 && operator.url() === REVIEW && lastNav(operator).status === 200 && gone, 'r5',
      'approve with the reviewer\'s name: 303 back to /review, the pin no longer listed', navTrail(operator, from));
    const t0 = Date.now();
    let listed = [];
    while (Date.now() - t0 < 15_000) {
      listed = await listTools(GATEWAY_MCP, tokenA);
      if (listed.includes(TOOL3)) break;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    report(listed.includes(TOOL3), 'r5', `the running gateway lists ${TOOL3} within the decision poll`,
      `after ${Date.now() - t0} ms: ${listed.join(',')}`);
    // Callable: the call reaches the upstream's credential (alice connects REVIEW_UPSTREAM), then answers.
    const first = await call(GATEWAY_MCP, tokenA, TOOL3);
    const connect = connectOf(first);
    if (!connect) throw new Error(`${TOOL3}: no connect request: ${shown(first)}`);
    await openLink(alice, connect.url, 'alice');
    if (await onConsentPage(alice)) await submitConsent(alice, 'approve');
    await finishAtThirdParty(alice, 'alice');
    const retry = await call(GATEWAY_MCP, tokenA, TOOL3, accept(connect));
    report(resultText(retry) === 'UPSTREAM-USER: alice', 'r5', `${TOOL3} is callable: after alice connects it answers UPSTREAM-USER: alice`, shown(retry));
  });

  await step('r6', 'audit', async () => {
    if (!state.pin3) throw new Error('no pending pin (case r2)');
    const row = pinRows(REVIEW_UPSTREAM).find((r) => r.id === state.pin3);
    report(row?.state === 'approved', 'r6', `palisade pins list: ${state.pin3} approved`, JSON.stringify(row));
    const query = spawnSync('python3', ['-c', `import sqlite3, sys, json
db = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)
print(json.dumps(db.execute("select operation, decision, detail from audit_log where stage = 'pins' and (operation like 'pins/approved:%' or operation like 'pins/rejected:%')").fetchall()))`, env.STORE_DB], { encoding: 'utf8', timeout: 10_000 });
    const records = query.status === 0 ? JSON.parse(query.stdout) : [];
    const mine = records.filter(([operation]) => operation === `pins/approved:${state.pin3}`);
    report(mine.length === 1 && mine[0][1] === 'allow' && / reviewer=rita /.test(mine[0][2]) && / via=review-page$/.test(mine[0][2])
      && !records.some(([operation]) => operation === `pins/rejected:${state.pin3}`), 'r6',
    'the audit log: one pins/approved record of the pin, reviewer=rita via=review-page (and no other decision on it)',
    query.status === 0 ? JSON.stringify(mine) : `python3: ${query.stderr.trim().slice(0, 200)}`);
    const verify = spawnSync(env.PALISADE_BIN, ['audit', 'verify', '--config', env.GATEWAY_CONFIG], { encoding: 'utf8', timeout: 20_000 });
    report(verify.status === 0, 'r6', 'palisade audit verify: the chain is intact', (verify.stdout + verify.stderr).trim().split('\n').at(-1));
    await operator.context().close();
  });
} catch (error) {
  report(false, '-', 'flow', String(error?.stack ?? error));
} finally {
  await browser?.close().catch(() => {});
  framer?.close();
  clearTimeout(watchdog);
}
process.exit(failures === 0 ? 0 : 1);
