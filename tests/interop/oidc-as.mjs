// A real OAuth authorization server for scripts/interop: node-oidc-provider 9.13.3 (INTEROP §8.6).
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node oidc-as.mjs [PORT]   (default 9401)
//
// Issuer http://127.0.0.1:PORT, JWKS at /jwks, token endpoint /token. With resource indicators
// (RFC 8707) every client_credentials token that names a `resource` is an RFC 9068 JWT
// (`typ: at+jwt`, RS256) whose `aud` is that resource. Clients (client_secret_basic):
//   ci-client / ci-secret                 plain tokens
//   ci-tenant-client / ci-tenant-secret   tokens also carry `tenant: "acme"`
// Scopes: shop:read, shop:other. Prints "READY <issuer>" once listening.
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const port = Number(process.argv[2] || 9401);
const issuer = `http://127.0.0.1:${port}`;
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node oidc-as.mjs [PORT]');
  process.exit(2);
}
// oidc-provider is ESM-only and lives under .tools/, so import it by file URL.
const require = createRequire(path.join(path.resolve(nodeModules), '..', 'resolve-from-here.js'));
const { default: Provider } = await import(pathToFileURL(require.resolve('oidc-provider')).href);

const SCOPES = ['shop:read', 'shop:other'];
const TENANT_OF = { 'ci-tenant-client': 'acme' };
const client = (id, secret) => ({
  client_id: id, client_secret: secret, grant_types: ['client_credentials'], redirect_uris: [], response_types: [],
});

const provider = new Provider(issuer, {
  clients: [client('ci-client', 'ci-secret'), client('ci-tenant-client', 'ci-tenant-secret')],
  scopes: SCOPES,
  extraTokenClaims: (_ctx, token) => (TENANT_OF[token.clientId] ? { tenant: TENANT_OF[token.clientId] } : undefined),
  features: {
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => ({
        scope: SCOPES.join(' '),
        audience: resource,
        accessTokenFormat: 'jwt',
        accessTokenTTL: 600,
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
});
provider.listen(port, '127.0.0.1', () => console.log('READY', issuer));
