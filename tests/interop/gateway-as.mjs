// The authorization server the gateway's credential tests run against: node-oidc-provider 9.13.3
// (pinned in package.json) with client credentials and an RFC 8693 token-exchange grant.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node gateway-as.mjs PORT [SUBJECT_AUDIENCE]
//
// Issuer http://127.0.0.1:PORT, JWKS at /jwks, token endpoint /token. Every token that names an
// RFC 8707 `resource` is an RFC 9068 JWT (`typ: at+jwt`, RS256) whose `aud` is that resource and
// whose `scope` is what was asked for (within the client's allowed scopes).
//
// Clients:
//   gateway / gateway-secret            client_secret_basic; client_credentials and token exchange
//   gateway-post / gateway-post-secret  client_secret_post; client_credentials
//   caller / caller-secret              client_credentials only: mints the callers' tokens
// Scopes: files:read files:write files:admin (the gateway clients may not ask for files:admin).
//
// Token exchange (grant urn:ietf:params:oauth:grant-type:token-exchange): the subject_token must
// be an access token of this issuer (signature checked with this server's own key), of type
// urn:ietf:params:oauth:token-type:access_token, whose `aud` is SUBJECT_AUDIENCE (default
// http://gateway.test/mcp, the gateway's own resource). The issued token has the subject's `sub`,
// `act: { sub: <exchanging client> }` (RFC 8693 §4.1), `aud` = the requested `resource`.
// Prints "READY <issuer>" once listening. With EXIT_WITH_STDIN=1 it exits when its standard input
// closes (a test that started it cannot leave it running).
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const port = Number(process.argv[2]);
const subjectAudience = process.argv[3] || 'http://gateway.test/mcp';
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!nodeModules || !Number.isInteger(port) || port <= 0) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node gateway-as.mjs PORT [SUBJECT_AUDIENCE]');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
// oidc-provider and jose are ESM-only and live outside this folder: import them by file URL.
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const { default: Provider, errors } = await load('oidc-provider');
const { jwtVerify, createLocalJWKSet } = await load('jose');

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token';
const SCOPES = ['files:read', 'files:write', 'files:admin'];

// One signing key made at start: the server verifies subject tokens with it too.
const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingJwk = { ...privateKey.export({ format: 'jwk' }), kid: 'gateway-as-1', alg: 'RS256', use: 'sig' };
const { d, p, q, dp, dq, qi, ...publicJwk } = signingJwk;
const ownKeys = createLocalJWKSet({ keys: [publicJwk] });

const client = (id, secret, grants, method = 'client_secret_basic') => ({
  client_id: id,
  client_secret: secret,
  grant_types: grants,
  token_endpoint_auth_method: method,
  redirect_uris: [],
  response_types: [],
  scope: 'files:read files:write',
});

const resourceServer = (resource) => ({
  scope: SCOPES.join(' '),
  audience: resource,
  accessTokenFormat: 'jwt',
  accessTokenTTL: 600,
  jwt: { sign: { alg: 'RS256' } },
});

const exchangedSubject = new WeakMap();

const provider = new Provider(issuer, {
  jwks: { keys: [signingJwk] },
  clients: [
    client('gateway', 'gateway-secret', ['client_credentials', TOKEN_EXCHANGE]),
    client('gateway-post', 'gateway-post-secret', ['client_credentials'], 'client_secret_post'),
    { ...client('caller', 'caller-secret', ['client_credentials']), scope: SCOPES.join(' ') },
  ],
  scopes: SCOPES,
  // Carries the exchanged subject from the grant handler into the token (the customizer below).
  extraTokenClaims: (_ctx, token) => (exchangedSubject.has(token) ? { exchanged_subject: exchangedSubject.get(token) } : undefined),
  features: {
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => resourceServer(resource),
    },
  },
  formats: {
    customizers: {
      // An exchanged token speaks for the subject, with the exchanging client as the actor.
      jwt: (_ctx, token, jwt) => {
        if (token.extra?.exchanged_subject) {
          jwt.payload.sub = token.extra.exchanged_subject;
          jwt.payload.act = { sub: token.clientId };
          delete jwt.payload.exchanged_subject;
        }
      },
    },
  },
});

provider.registerGrantType(
  TOKEN_EXCHANGE,
  async (ctx) => {
    const { client: exchanger, params } = ctx.oidc;
    if (params.subject_token_type !== ACCESS_TOKEN_TYPE) {
      throw new errors.InvalidRequest('subject_token_type must be an access token');
    }
    if (params.requested_token_type && params.requested_token_type !== ACCESS_TOKEN_TYPE) {
      throw new errors.InvalidRequest('only access tokens are issued');
    }
    if (!params.resource) {
      throw new errors.InvalidTarget('resource is required');
    }
    let subject;
    try {
      ({ payload: subject } = await jwtVerify(params.subject_token, ownKeys, {
        issuer,
        audience: subjectAudience,
        typ: 'at+jwt',
        algorithms: ['RS256'],
      }));
    } catch {
      throw new errors.InvalidGrant('subject_token is not a valid access token of this issuer');
    }
    const allowed = new Set(exchanger.scope.split(' '));
    const asked = (params.scope || '').split(' ').filter(Boolean);
    if (asked.some((scope) => !allowed.has(scope))) {
      throw new errors.InvalidScope('requested scope is not allowed', asked.find((s) => !allowed.has(s)));
    }
    const token = new provider.ClientCredentials({ client: exchanger, scope: asked.join(' ') || undefined });
    token.resourceServer = new provider.ResourceServer(params.resource, resourceServer(params.resource));
    exchangedSubject.set(token, subject.sub);
    const value = await token.save();
    ctx.body = {
      access_token: value,
      issued_token_type: ACCESS_TOKEN_TYPE,
      token_type: 'Bearer',
      expires_in: token.expiration,
      scope: token.scope,
    };
  },
  ['subject_token', 'subject_token_type', 'requested_token_type', 'resource', 'scope', 'audience'],
);

if (process.env.EXIT_WITH_STDIN === '1') {
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}
provider.listen(port, '127.0.0.1', () => console.log('READY', issuer));
