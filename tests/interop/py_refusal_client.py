"""Interop driver: what the Python `mcp` 2.3.0 client shows its caller when a Palisade server
refuses a tool call (a kill switch's -32030, a policy refusal).

Usage: INTEROP_TOKEN=... python py_refusal_client.py URL TOOL [ARGS_JSON]

Connects twice, on both wires: pinned to 2026-07-28 (`mode="2026-07-28"`) and in `legacy` mode
(the 2025-era initialize handshake and its session), each with the bearer token in INTEROP_TOKEN.
Calls TOOL with ARGS_JSON once on each and prints one JSON line per wire saying what the caller
got:
  {"wire": "2026-07-28", "negotiated": "...", "outcome": "result", "isError": false}
  {"wire": "...", "negotiated": "...", "outcome": "error", "class": "MCPError", "code": -32030,
   "message": "...", "status": null}
where `class` is the raised exception's class (`MCPError` for a JSON-RPC error the client read;
an `httpx2` error for an HTTP failure, whose `status` is the HTTP status). Exits 0 when every
connection succeeded (the outcome is for the caller to judge), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TIMEOUT_S = 20


def leaf(e: BaseException) -> BaseException:
    """The first leaf of a task-group exception group (the exception itself otherwise)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


async def call_once(url: str, wire: str, token: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S)
    transport = streamable_http_client(url, http_client=http)
    mode = "legacy" if wire == "legacy" else wire
    try:
        async with Client(transport, mode=mode, read_timeout_seconds=TIMEOUT_S) as client:
            negotiated = client.protocol_version
            try:
                with anyio.fail_after(TIMEOUT_S):
                    result = await client.call_tool(tool, arguments)
                return {"wire": wire, "negotiated": negotiated, "outcome": "result", "isError": result.is_error}
            except Exception as raised:  # what the caller sees, whatever it is
                e = leaf(raised)
                response = getattr(e, "response", None)
                return {
                    "wire": wire,
                    "negotiated": negotiated,
                    "outcome": "error",
                    "class": type(e).__name__,
                    "code": e.code if isinstance(e, MCPError) else None,
                    "message": e.message if isinstance(e, MCPError) else str(e),
                    "status": getattr(response, "status_code", None),
                }
    finally:
        await http.aclose()


async def run(url: str, tool: str, arguments: dict[str, Any], token: str) -> int:
    failed = False
    for wire in ("2026-07-28", "legacy"):
        try:
            line = await call_once(url, wire, token, tool, arguments)
        except Exception as e:
            failed = True
            line = {"wire": wire, "outcome": "connect failed", "message": f"{type(leaf(e)).__name__}: {leaf(e)}"}
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def main() -> int:
    token = os.environ.get("INTEROP_TOKEN", "")
    if len(sys.argv) not in (3, 4) or not token:
        print("usage: INTEROP_TOKEN=... py_refusal_client.py URL TOOL [ARGS_JSON]", file=sys.stderr)
        return 2
    arguments = json.loads(sys.argv[3]) if len(sys.argv) == 4 else {}
    return anyio.run(run, sys.argv[1], sys.argv[2], arguments, token)


if __name__ == "__main__":
    sys.exit(main())
