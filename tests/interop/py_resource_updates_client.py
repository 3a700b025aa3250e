"""Interop driver: the Python `mcp` 2.3.0 client waits for a resource update through a Palisade
gateway, on both wires.

Usage: INTEROP_TOKEN=... python py_resource_updates_client.py URL URI TRIGGER_TOOL

Connects twice with the bearer token in INTEROP_TOKEN: pinned to 2026-07-28, where it opens
`Client.listen(resource_subscriptions=[URI])`, and in `legacy` mode (the 2025-era session), where
it calls `resources/subscribe` for URI and reads its session's notifications. On each it then
calls TRIGGER_TOOL (which makes the resource change) every half second until the update of URI
arrives, and prints one JSON line per wire:
  {"wire": "2026-07-28", "honored": [...], "updated": "URI"}
  {"wire": "legacy", "negotiated": "2025-11-25", "updated": "URI"}
`updated` is null when no update came within the timeout; an error is printed as
{"wire": ..., "error": "..."}. Exits 0 when every wire printed its line.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated

TIMEOUT_S = 30


async def trigger_until(client: Client, tool: str, done: anyio.Event) -> None:
    """Calls `tool` every half second until `done`."""
    while not done.is_set():
        await client.call_tool(tool, {})
        with anyio.move_on_after(0.5):
            await done.wait()


async def modern(url: str, token: str, uri: str, tool: str) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S)
    try:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                honored = list(subscription.honored.resource_subscriptions or [])
                updated = None
                done = anyio.Event()
                with anyio.move_on_after(TIMEOUT_S):
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(trigger_until, client, tool, done)
                        async for event in subscription:
                            if isinstance(event, ResourceUpdated):
                                updated = event.uri
                                break
                        done.set()
                return {"wire": "2026-07-28", "honored": honored, "updated": updated}
    finally:
        await http.aclose()


async def legacy(url: str, token: str, uri: str, tool: str) -> dict[str, Any]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S)
    updates: list[str] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)
            arrived.set()

    try:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", message_handler=on_message) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource(uri)
            with anyio.move_on_after(TIMEOUT_S):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(trigger_until, client, tool, arrived)
                    await arrived.wait()
            return {"wire": "legacy", "negotiated": client.protocol_version, "updated": updates[0] if updates else None}
    finally:
        await http.aclose()


async def run(url: str, uri: str, tool: str, token: str) -> int:
    failed = False
    for wire in (modern, legacy):
        try:
            line = await wire(url, token, uri, tool)
        except Exception as e:  # reported, the other wire still runs
            failed = True
            while isinstance(e, BaseExceptionGroup) and e.exceptions:
                e = e.exceptions[0]
            line = {"wire": wire.__name__, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def main() -> int:
    token = os.environ.get("INTEROP_TOKEN", "")
    if len(sys.argv) != 4 or not token:
        print("usage: INTEROP_TOKEN=... py_resource_updates_client.py URL URI TRIGGER_TOOL", file=sys.stderr)
        return 2
    return anyio.run(run, sys.argv[1], sys.argv[2], sys.argv[3], token)


if __name__ == "__main__":
    sys.exit(main())
