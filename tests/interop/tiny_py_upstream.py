"""Interop upstream: a server written with the Python SDK (`mcp` 2.3.0, `MCPServer`), served over
Streamable HTTP on 127.0.0.1 for the gateway leg of scripts/interop.

Usage: .tools/py/bin/python tiny_py_upstream.py PORT

It speaks 2026-07-28 and the 2025-era handshake on one endpoint, /mcp. Its one tool:
  add {a, b} -> "PY-UPSTREAM: a + b = <sum>"
The SDK's server prints its own start-up lines; the gateway leg waits for the port to answer.
"""

import sys

from mcp.server import MCPServer

server = MCPServer("palisade-interop-py-upstream")


@server.tool()
def add(a: int, b: int) -> str:
    """Adds two integers; the answer is marked as coming from the Python upstream."""
    return f"PY-UPSTREAM: {a} + {b} = {a + b}"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: tiny_py_upstream.py PORT")
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
