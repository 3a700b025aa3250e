// Interop driver: the TypeScript `@modelcontextprotocol/client` 2.4.0 with its OAuth client
// provider against `palisade serve` (the demo, dev issuer with auto_approve), by itself:
// discovery from the 401 challenge → registration (a Client ID Metadata Document when
// CIMD_URL is given, else Dynamic Client Registration) → authorize → token → tools/call; then
// basket_create (needs shop:basket) → 403 insufficient_scope → the SDK's step-up → success.
//
// Usage: INTEROP_NODE_MODULES=DIR node ts_oauth_client.mjs http://127.0.0.1:PORT/mcp [CIMD_URL]
//
// The "browser" is a fetch of the authorization URL without following the redirect: with
// auto_approve the issuer answers 302 to the redirect URI with code, state and iss, which are
// handed to transport.finishAuth like a callback page would. The first authorization grants
// shop:read only (as a person unticking shop:basket on the page would: the resource's 401
// challenge names every scope, so the SDK first asks for all of them); later ones go as sent.
import { createRequire } from 'node:module';
import path from 'node:path';

const url = process.argv[2];
const cimdUrl = process.argv[3];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!url || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node ts_oauth_client.mjs URL [CIMD_URL]');
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { Client, StreamableHTTPClientTransport, UnauthorizedError } = require('@modelcontextprotocol/client');

const REDIRECT = 'http://127.0.0.1:1/callback';
const mode = cimdUrl ? 'cimd' : 'dcr';
let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - ts oauth (${mode}): ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}

class Provider {
  constructor() {
    this.pendingCallback = null;
    this.authorizations = [];
    this._client = undefined;
    this._tokens = undefined;
    this._verifier = undefined;
  }
  get redirectUrl() { return REDIRECT; }
  get clientMetadata() {
    return { client_name: 'palisade-interop-ts', redirect_uris: [REDIRECT], token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'] };
  }
  get clientMetadataUrl() { return cimdUrl; }
  clientInformation() { return this._client; }
  saveClientInformation(info) { this._client = info; }
  tokens() { return this._tokens; }
  saveTokens(tokens) { this._tokens = tokens; }
  saveCodeVerifier(v) { this._verifier = v; }
  codeVerifier() { return this._verifier; }
  async redirectToAuthorization(authorizationUrl) {
    const sent = new URL(authorizationUrl);
    this.authorizations.push(sent);
    const target = new URL(sent);
    if (this.authorizations.length === 1) target.searchParams.set('scope', 'shop:read');
    const response = await fetch(target, { redirect: 'manual' });
    const location = response.headers.get('location');
    if (response.status !== 302 || !location) throw new Error(`authorization answered ${response.status}`);
    this.pendingCallback = new URL(location).searchParams;
  }
}

const provider = new Provider();
// Each UnauthorizedError means "the browser went to the issuer": finish with its callback and retry.
async function withAuth(transport, action) {
  for (let attempt = 0; attempt < 3; attempt += 1) {
    try {
      return await action();
    } catch (error) {
      if (!(error instanceof UnauthorizedError) || !provider.pendingCallback) throw error;
      const callback = provider.pendingCallback;
      provider.pendingCallback = null;
      await transport.finishAuth(callback);
    }
  }
  throw new Error('authorization did not complete');
}

let client;
let transport;
try {
  transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  client = new Client({ name: 'palisade-interop-ts-oauth', version: '1.0.0' },
    { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } });
  try {
    await client.connect(transport);
  } catch (error) {
    if (!(error instanceof UnauthorizedError) || !provider.pendingCallback) throw error;
    await transport.finishAuth(provider.pendingCallback);
    provider.pendingCallback = null;
    transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
    client = new Client({ name: 'palisade-interop-ts-oauth', version: '1.0.0' },
      { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } });
    await client.connect(transport);
  }
  const first = provider.authorizations[0];
  report(!!first, 'authorized through the dev issuer');
  if (first) {
    report(first.searchParams.get('code_challenge_method') === 'S256', 'PKCE S256');
    report(first.searchParams.get('resource') === url, 'resource is the server', first.searchParams.get('resource'));
    const clientId = first.searchParams.get('client_id');
    report(cimdUrl ? clientId === cimdUrl : clientId?.startsWith('dcr-'), 'registration', clientId);
  }
  const product = await withAuth(transport, () => client.callTool({ name: 'product_get', arguments: { sku: 'TEA-001' } }));
  report(product.structuredContent?.sku === 'TEA-001', 'tools/call product_get');
  const before = provider.authorizations.length;
  const basket = await withAuth(transport, () => client.callTool({ name: 'basket_create', arguments: {} }));
  const stepUp = provider.authorizations[before];
  report(!!stepUp && (stepUp.searchParams.get('scope') ?? '').split(' ').includes('shop:basket'), 'step-up asked for shop:basket',
    stepUp?.searchParams.get('scope'));
  report(typeof basket.structuredContent?.basket === 'string' && !basket.isError, 'tools/call basket_create after step-up');
} catch (error) {
  report(false, 'flow', error?.stack ?? String(error));
} finally {
  await client?.close().catch(() => {});
}
process.exit(failures === 0 ? 0 : 1);
