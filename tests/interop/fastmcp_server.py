"""Interop target: a server written with FastMCP (PyPI `fastmcp`, pinned in requirements.txt),
started as its quick start documents, `mcp.run(transport="http")`, on 127.0.0.1 for leg j of
scripts/interop (`palisade verify` against third-party servers).

Usage: .tools/py/bin/python fastmcp_server.py PORT

It serves Streamable HTTP at /mcp (FastMCP's default path) with one tool, one resource and one
prompt, as the quick start's examples do:
  add {a, b} -> "FASTMCP: a + b = <sum>"
  resource fastmcp://greeting, prompt summarize {text}
"""

import sys

from fastmcp import FastMCP

mcp = FastMCP("palisade-interop-fastmcp")


@mcp.tool
def add(a: int, b: int) -> str:
    """Adds two integers; the answer is marked as coming from the FastMCP server."""
    return f"FASTMCP: {a} + {b} = {a + b}"


@mcp.resource("fastmcp://greeting")
def greeting() -> str:
    """A fixed greeting."""
    return "Hello from FastMCP"


@mcp.prompt
def summarize(text: str) -> str:
    """Asks for a one-line summary of a text."""
    return f"Summarize in one line: {text}"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: fastmcp_server.py PORT")
    mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]))
