"""Interop driver: the Python `mcp` 2.3.0 client answering what an upstream behind a Palisade
gateway asks during a call (server-everything's elicitation, sampling and roots tools).

Usage: INTEROP_TOKEN=... python py_asks_client.py URL MODE PREFIX ROOT
  MODE    2026-07-28 (a pin: the questions come as input_required rounds) or legacy (2025-11-25:
          they come as requests on the call's stream)
  PREFIX  the exposed names' prefix (e.g. `ev_`)
  ROOT    the root the operator granted that upstream: get-roots-list must show it, and never the
          root this client's own callback offers (`-`: get-roots-list is not called)

The client declares sampling, elicitation and roots through its callbacks: sampling answers
"sampled-by-py", elicitation accepts name "Ada from py", roots offers file:///caller-private.
Prints one line per check ("ok - py: ..." or "FAIL - py: ...") and exits non-zero if any failed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

CHECK_TIMEOUT_S = 30

failures = 0
MODE = ""


def report(ok: bool, name: str, detail: str = "") -> None:
    global failures
    if not ok:
        failures += 1
    line = f"{'ok' if ok else 'FAIL'} - py ({MODE}): {name}"
    print(f"{line}: {detail}" if detail else line, flush=True)


def describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    return f"{type(e).__name__}: {e}"


async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        model="interop-model", role="assistant", content=types.TextContent(type="text", text="sampled-by-py")
    )


async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada from py"})


async def roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///caller-private", name="mine")])


async def run(url: str, prefix: str, root: str) -> None:
    checks = [
        ("trigger-elicitation-request", {}, lambda text: "- Name: Ada from py" in text),
        ("trigger-sampling-request", {"prompt": "palisade", "maxTokens": 8}, lambda text: "sampled-by-py" in text),
    ]
    if root != "-":
        checks.append(("get-roots-list", {}, lambda text: root in text and "caller-private" not in text))
    with anyio.fail_after(CHECK_TIMEOUT_S * (2 + len(checks))):
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {os.environ['INTEROP_TOKEN']}"}, timeout=CHECK_TIMEOUT_S
        )
        async with Client(
            streamable_http_client(url, http_client=http),
            mode=MODE,
            read_timeout_seconds=CHECK_TIMEOUT_S,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=roots,
        ) as client:
            report(True, "connect", f"negotiated {client.protocol_version}")
            for tool, arguments, expected in checks:
                name = f"{prefix}{tool}"
                try:
                    with anyio.fail_after(CHECK_TIMEOUT_S):
                        result = await client.call_tool(name, arguments)
                    text = "\n".join(b.text for b in result.content if isinstance(getattr(b, "text", None), str))
                    report(not result.is_error and expected(text), f"tools/call {name}", repr(text[:300]))
                except Exception as e:
                    report(False, f"tools/call {name}", describe(e))


def main() -> None:
    global MODE
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    url, MODE, prefix, root = sys.argv[1:]
    try:
        anyio.run(run, url, prefix, root)
    except Exception as e:
        report(False, "client", describe(e))
    print(f"py client ({MODE}): {'FAILED' if failures else 'passed'} ({failures} failed check(s))", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
