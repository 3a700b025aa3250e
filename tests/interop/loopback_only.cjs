// Preload (node -r) for servers that take a port but no host, such as
// @modelcontextprotocol/server-everything's Streamable HTTP mode: a listen(port) without a host
// binds 127.0.0.1 instead of every interface, so the interop legs never open a public port.
const net = require('node:net');

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const portOnly = typeof args[0] === 'number' || /^\d+$/.test(String(args[0]));
  if (portOnly && typeof args[1] !== 'string') args.splice(1, 0, '127.0.0.1');
  return listen.apply(this, args);
};
