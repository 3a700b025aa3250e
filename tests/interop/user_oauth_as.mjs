// The two authorization servers of the per-user upstream OAuth leg (scripts/interop leg k):
// node-oidc-provider 9.13.3 (pinned in package.json), one process per role.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node user_oauth_as.mjs PORT idp|third
//
// Issuer http://127.0.0.1:PORT. Logins go through oidc-provider's development interactions
// (any login name, any password: the login name becomes `sub`). Each role's cookies have names
// of their own (both servers share the host 127.0.0.1, and cookies do not keep ports apart).
//
// idp — the gateway's identity provider and the issuer of the callers' access tokens:
//   palisade-connect / $CONNECT_SECRET (default palisade-connect-secret): the gateway's sign-in
//     client (authorization code, client_secret_basic, scope openid, PKCE when sent); redirect
//     URIs from $CONNECT_REDIRECT (comma-separated). It is first-party: no consent prompt.
//   mcp-client / mcp-client-secret, mcp-client-2 / mcp-client-2-secret: the MCP clients. They mint
//     the callers' tokens with the grant urn:palisade:interop:user-token (client_secret_basic;
//     parameters `subject` = alice|mallory, `resource` = the gateway's MCP URL, `scope`): an RFC
//     9068 JWT (`typ: at+jwt`, RS256) with sub = subject, client_id = the client, aud = resource.
//   (A fixture's shortcut for "the person signed in at their MCP client".)
//
// third — the upstream's own authorization server:
//   Dynamic Client Registration open (POST /reg), PKCE S256 required of every client, RFC 8707
//   resource indicators required (only the resources in $UPSTREAM_RESOURCES, comma-separated; a
//   request without `resource` is refused) with access tokens as JWTs whose `aud` is the resource,
//   RFC 9207 `iss` on every authorization response, refresh tokens issued to every client allowed
//   the grant and rotated on every use, scope files:read. Access tokens live $THIRD_AT_TTL seconds
//   (default 600). Client ID Metadata Documents are not offered (the gateway registers).
//   GET /counts: {"authorize": N, "token": M, "grants": {grant_type: n}} — requests that reached
//   the authorization endpoint (GET /auth, not the interaction resumes) and the token endpoint.
//
// Both: with $TOKENS_FILE, every token either server hands out (access, refresh and ID tokens) is
// appended to it, one a line, so that a test can check that none of them reaches a log.
// Prints "READY <issuer>" once listening.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const port = Number(process.argv[2]);
const role = process.argv[3];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!nodeModules || !Number.isInteger(port) || port <= 0 || !['idp', 'third'].includes(role)) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node user_oauth_as.mjs PORT idp|third');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { default: Provider, errors } = await import(pathToFileURL(require.resolve('oidc-provider')).href);

const tokensFile = process.env.TOKENS_FILE;
function remember(body) {
  if (!tokensFile || !body || typeof body !== 'object') return;
  const values = ['access_token', 'refresh_token', 'id_token'].map((k) => body[k]).filter((v) => typeof v === 'string' && v);
  if (values.length) fs.appendFileSync(tokensFile, `${values.join('\n')}\n`);
}

const jwtServer = (resource, scope, ttl) => ({
  scope,
  audience: resource,
  accessTokenFormat: 'jwt',
  accessTokenTTL: ttl,
  jwt: { sign: { alg: 'RS256' } },
});

const cookieNames = (prefix) => ({
  session: `${prefix}_session`,
  interaction: `${prefix}_interaction`,
  resume: `${prefix}_interaction_resume`,
});
// Fixed cookie keys: the fixture's own (oidc-provider warns about its defaults otherwise).
const cookieKeys = [`palisade-interop-${role}-cookie-key-${port}`];

let provider;
const counts = { authorize: 0, token: 0, grants: {} };

if (role === 'idp') {
  const USER_TOKEN = 'urn:palisade:interop:user-token';
  const PEOPLE = new Set(['alice', 'mallory']);
  const connectRedirects = (process.env.CONNECT_REDIRECT || '').split(',').map((s) => s.trim()).filter(Boolean);
  if (!connectRedirects.length) {
    console.error('user_oauth_as idp: CONNECT_REDIRECT (the gateway sign-in callback URL) is required');
    process.exit(2);
  }
  const mcpClient = (id) => ({
    client_id: id,
    client_secret: `${id}-secret`,
    grant_types: [USER_TOKEN],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_basic',
  });
  const subjectOf = new WeakMap();
  provider = new Provider(issuer, {
    clients: [
      {
        client_id: 'palisade-connect',
        client_secret: process.env.CONNECT_SECRET || 'palisade-connect-secret',
        grant_types: ['authorization_code'],
        response_types: ['code'],
        redirect_uris: connectRedirects,
        token_endpoint_auth_method: 'client_secret_basic',
        scope: 'openid',
      },
      mcpClient('mcp-client'),
      mcpClient('mcp-client-2'),
    ],
    cookies: { names: cookieNames('idp'), keys: cookieKeys },
    scopes: ['openid'],
    claims: { openid: ['sub'] },
    // The gateway's sign-in client is first-party: its openid grant needs no consent prompt.
    loadExistingGrant: async (ctx) => {
      const existing = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      if (existing) return ctx.oidc.provider.Grant.find(existing);
      if (ctx.oidc.client.clientId !== 'palisade-connect') return undefined;
      const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
      grant.addOIDCScope('openid');
      await grant.save();
      return grant;
    },
    extraTokenClaims: (_ctx, token) => (subjectOf.has(token) ? { interop_subject: subjectOf.get(token) } : undefined),
    features: {
      devInteractions: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource) => jwtServer(resource, 'mcp:tools', 600),
      },
    },
    formats: {
      customizers: {
        jwt: (_ctx, token, jwt) => {
          if (token.extra?.interop_subject) {
            jwt.payload.sub = token.extra.interop_subject;
            delete jwt.payload.interop_subject;
          }
        },
      },
    },
  });
  provider.registerGrantType(
    USER_TOKEN,
    async (ctx) => {
      const { client, params } = ctx.oidc;
      if (!PEOPLE.has(params.subject)) throw new errors.InvalidRequest('subject must be alice or mallory');
      if (!params.resource) throw new errors.InvalidTarget('resource is required');
      const token = new provider.ClientCredentials({ client, scope: params.scope || undefined });
      token.resourceServer = new provider.ResourceServer(params.resource, jwtServer(params.resource, 'mcp:tools', 600));
      subjectOf.set(token, params.subject);
      const value = await token.save();
      ctx.body = { access_token: value, token_type: 'Bearer', expires_in: token.expiration, scope: token.scope };
    },
    ['subject', 'resource', 'scope'],
  );
} else {
  const resources = new Set((process.env.UPSTREAM_RESOURCES || '').split(',').map((s) => s.trim()).filter(Boolean));
  if (!resources.size) {
    console.error('user_oauth_as third: UPSTREAM_RESOURCES (the upstream MCP URLs) is required');
    process.exit(2);
  }
  const ttl = Number(process.env.THIRD_AT_TTL || 600);
  const MISSING = 'urn:palisade:interop:no-resource';
  provider = new Provider(issuer, {
    clients: [],
    cookies: { names: cookieNames('third'), keys: cookieKeys },
    scopes: ['openid', 'offline_access'],
    pkce: { required: () => true },
    rotateRefreshToken: true,
    issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    features: {
      devInteractions: { enabled: true },
      registration: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // No resource named: a resource no server has, refused below (RFC 8707 is required).
        defaultResource: () => MISSING,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource) => {
          if (!resources.has(resource)) throw new errors.InvalidTarget(`unknown resource (or none named): ${resource}`);
          return jwtServer(resource, 'files:read', ttl);
        },
      },
    },
  });
}

provider.use(async (ctx, next) => {
  if (role === 'third' && ctx.method === 'GET' && ctx.path === '/counts') {
    ctx.type = 'application/json';
    ctx.body = JSON.stringify(counts);
    return;
  }
  if (ctx.path === '/auth' && ctx.method === 'GET') counts.authorize += 1;
  if (ctx.path === '/token' && ctx.method === 'POST') counts.token += 1;
  await next();
  if (ctx.path === '/token' && ctx.method === 'POST') {
    const grant = ctx.oidc?.params?.grant_type ?? 'unknown';
    if (ctx.status === 200) counts.grants[grant] = (counts.grants[grant] ?? 0) + 1;
    remember(ctx.body);
  }
});
provider.on('server_error', (_ctx, error) => console.error(`user_oauth_as ${role}: server_error: ${error?.stack ?? error}`));
provider.on('grant.error', (_ctx, error) => console.error(`user_oauth_as ${role}: grant.error: ${error?.message} ${error?.error_description ?? ''}`));
provider.on('authorization.error', (_ctx, error) => console.error(`user_oauth_as ${role}: authorization.error: ${error?.message} ${error?.error_description ?? ''}`));
provider.on('registration_create.error', (_ctx, error) => console.error(`user_oauth_as ${role}: registration.error: ${error?.message} ${error?.error_description ?? ''}`));

const server = provider.listen(port, '127.0.0.1', () => console.log('READY', issuer));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => { server.close(); process.exit(0); });
