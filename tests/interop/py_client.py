"""Interop driver: the Python `mcp` 2.3.0 client against a Palisade server.

Usage: python py_client.py http://127.0.0.1:PORT/mcp
       INTEROP_TOKEN=... python py_client.py http://127.0.0.1:PORT/mcp legacy|auto

With `legacy` or `auto`, the client runs tools and resources against the demo application with a
bearer token: `legacy` must negotiate 2025-11-25 over the initialize handshake, `auto` must pick
2026-07-28 from server/discover's supported versions.

Pins protocol revision 2026-07-28 (`Client(url, mode="2026-07-28")`), then
checks discover, tools/list, tools/call, resources/read, prompts/get and
subscriptions/listen against the conformance fixture surface
(`palisade serve --app conformance`). Prints one line per check
("ok - ..." or "FAIL - ...") and exits non-zero if any check failed.

API notes (verified against the installed mcp 2.3.0 source):
- A version pin adopts a synthesized DiscoverResult without any wire traffic,
  and `ClientSession.discover()` returns that cached result, so the explicit
  probe uses `client.session.send_discover(version)`, validates the raw dict
  as `mcp_types.DiscoverResult` and installs it with `client.session.adopt()`.
- `client.listen(...)` is an async context manager; `sub.honored` is the
  acknowledged `SubscriptionFilter`.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types
from mcp import Client

PROTOCOL = "2026-07-28"
SIMPLE_TEXT = "This is a simple text response for testing."
CHECK_TIMEOUT_S = 20

failures = 0


def report(ok: bool, name: str, detail: str = "") -> None:
    global failures
    if not ok:
        failures += 1
    line = f"{'ok' if ok else 'FAIL'} - py: {name}"
    print(f"{line}: {detail}" if detail else line, flush=True)


async def check(name: str, body: Callable[[], Awaitable[str]]) -> None:
    """Run one check: `body` returns a short detail, or raises AssertionError/anything on failure."""
    try:
        with anyio.fail_after(CHECK_TIMEOUT_S):
            detail = await body()
        report(True, name, detail)
    except AssertionError as e:
        report(False, name, str(e))
    except Exception as e:  # any client or transport error is a failed check
        report(False, name, describe(e))


def describe(e: BaseException) -> str:
    """`Type: message` of an exception, unwrapping task-group exception groups to their leaves."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    return f"{type(e).__name__}: {e}"


def texts(blocks: Any) -> list[str]:
    """The `text` of every text block in a content / contents list."""
    return [b.text for b in blocks if isinstance(getattr(b, "text", None), str)]


async def run(url: str) -> None:
    async with Client(url, mode=PROTOCOL, read_timeout_seconds=CHECK_TIMEOUT_S) as client:
        report(
            client.protocol_version == PROTOCOL,
            "connect (mode pinned)",
            f"negotiated {client.protocol_version}",
        )

        async def discover() -> str:
            raw = await client.session.send_discover(PROTOCOL)
            result = mcp_types.DiscoverResult.model_validate(raw)
            assert PROTOCOL in result.supported_versions, f"supportedVersions={result.supported_versions}"
            client.session.adopt(result)  # install the server's real capabilities
            caps = result.capabilities.model_dump(by_alias=True, exclude_none=True)
            return f"supportedVersions={result.supported_versions} capabilities={sorted(caps)}"

        async def list_tools() -> str:
            names = [t.name for t in (await client.list_tools()).tools]
            assert "test_simple_text" in names, f"test_simple_text not listed in {names}"
            return f"{len(names)} tools"

        async def call_tool() -> str:
            result = await client.call_tool("test_simple_text", {})
            assert not result.is_error, f"isError=true: {result.content}"
            got = texts(result.content)
            assert got == [SIMPLE_TEXT], f"text content {got!r}, expected [{SIMPLE_TEXT!r}]"
            return repr(got[0])

        async def read_resource() -> str:
            result = await client.read_resource("test://static-text")
            got = texts(result.contents)
            assert got and got[0], f"no non-empty text in {result.contents}"
            return f"{len(got[0])} chars"

        async def get_prompt() -> str:
            result = await client.get_prompt("test_simple_prompt")
            assert len(result.messages) >= 1, "no messages"
            return f"{len(result.messages)} message(s)"

        async def listen() -> str:
            async with client.listen(tools_list_changed=True) as sub:
                honored = sub.honored.model_dump(by_alias=True, exclude_none=True)
                assert sub.honored.tools_list_changed is True, f"honored filter {honored}"
                return f"honored {honored}"

        await check("server/discover", discover)
        await check("tools/list", list_tools)
        await check("tools/call test_simple_text", call_tool)
        await check("resources/read test://static-text", read_resource)
        await check("prompts/get test_simple_prompt", get_prompt)
        await check("subscriptions/listen toolsListChanged", listen)
    report(True, "close")


async def run_demo(url: str, mode: str, token: str) -> None:
    """`legacy` or `auto` negotiation against the demo application with a bearer token."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    expected = "2025-11-25" if mode == "legacy" else PROTOCOL
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=CHECK_TIMEOUT_S)
    transport = streamable_http_client(url, http_client=http)
    async with Client(transport, mode=mode, read_timeout_seconds=CHECK_TIMEOUT_S) as client:
        report(
            client.protocol_version == expected,
            f"{mode}: connect",
            f"negotiated {client.protocol_version}, expected {expected}",
        )

        async def list_tools() -> str:
            names = [t.name for t in (await client.list_tools()).tools]
            assert "catalog_search" in names, f"catalog_search not listed in {names}"
            return f"{len(names)} tools"

        async def call_tool() -> str:
            result = await client.call_tool("catalog_search", {"query": "tea"})
            assert not result.is_error, f"isError=true: {result.content}"
            return f"{len(result.content)} content item(s)"

        async def read_resource() -> str:
            resources = (await client.list_resources()).resources
            assert resources, "no resources listed"
            uri = str(resources[0].uri)
            result = await client.read_resource(uri)
            assert result.contents, f"no contents for {uri}"
            return f"{len(resources)} resources, read {uri}"

        await check(f"{mode}: tools/list", list_tools)
        await check(f"{mode}: tools/call catalog_search", call_tool)
        await check(f"{mode}: resources/list + read", read_resource)
    await http.aclose()
    report(True, f"{mode}: close")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[2] in ("legacy", "auto"):
        token = os.environ.get("INTEROP_TOKEN", "")
        if not token:
            print("INTEROP_TOKEN is not set", file=sys.stderr)
            return 2
        try:
            anyio.run(run_demo, sys.argv[1], sys.argv[2], token)
        except Exception as e:
            traceback.print_exc()
            report(False, "session", describe(e))
        print(f"py client ({sys.argv[2]}): {'FAILED' if failures else 'passed'} ({failures} failed check(s))")
        return 1 if failures else 0
    if len(sys.argv) != 2:
        print("usage: py_client.py URL [legacy|auto]  (legacy/auto: demo app, token in INTEROP_TOKEN)", file=sys.stderr)
        return 2
    try:
        anyio.run(run, sys.argv[1])
    except Exception as e:  # the session itself died (connect, transport or close): nothing else could run
        traceback.print_exc()
        report(False, "session", describe(e))
    print(f"py client: {'FAILED' if failures else 'passed'} ({failures} failed check(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
