"""A server written with the Python SDK (`mcp` 2.3.0, `MCPServer`, the 2.x name of FastMCP),
served over stdio: the gateway runs it as a confined local upstream (crates/palisade/tests/it/
gateway_stdio_servers.rs).

Usage: python3 tiny_py_stdio_server.py   (with the SDK importable, e.g. through PYTHONPATH)

Its tools:
  add {a, b}   -> "PY-STDIO: a + b = <sum>"
  identity {}  -> "uid=<uid> gid=<gid> host=<hostname>" (what the process runs as)
Nothing is printed on stdout but MCP messages (the SDK's stdio transport owns it).
"""

import os
import socket

from mcp.server import MCPServer

server = MCPServer("palisade-py-stdio-server")


@server.tool()
def add(a: int, b: int) -> str:
    """Adds two integers; the answer is marked as coming from the Python stdio server."""
    return f"PY-STDIO: {a} + {b} = {a + b}"


@server.tool()
def identity() -> str:
    """The uid, gid and host name this process runs with."""
    return f"uid={os.getuid()} gid={os.getgid()} host={socket.gethostname()}"


if __name__ == "__main__":
    server.run(transport="stdio")
