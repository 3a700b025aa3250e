"""Interop driver: the Python `mcp` 2.3.0 client against a Palisade gateway.

Usage: python py_gateway_client.py URL MODE CHECK...
  MODE   2026-07-28 (a pin), auto or legacy: the client's `mode`
  CHECK  NAME ARGS_JSON EXPECTED_TEXT   NAME is listed, and tools/call NAME ARGS_JSON answers a
                                        first text block equal to EXPECTED_TEXT
         --absent NAME                  NAME is not listed, and calling it is refused

Prints one line per check ("ok - py: ..." or "FAIL - py: ...") and exits non-zero if any failed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
from mcp import Client

CHECK_TIMEOUT_S = 20

failures = 0


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


def parse(args: list[str]) -> tuple[list[tuple[str, dict[str, Any], str]], list[str]]:
    calls, absent = [], []
    i = 0
    while i < len(args):
        if args[i] == "--absent" and i + 1 < len(args):
            absent.append(args[i + 1])
            i += 2
        elif i + 2 < len(args):
            arguments = json.loads(args[i + 1])
            if not isinstance(arguments, dict):
                sys.exit(f"py_gateway_client: {args[i]}: ARGS_JSON is not a JSON object")
            calls.append((args[i], arguments, args[i + 2]))
            i += 3
        else:
            sys.exit(f"py_gateway_client: incomplete check at {args[i:]!r}\n{__doc__}")
    return calls, absent


async def run(url: str, calls: list[tuple[str, dict[str, Any], str]], absent: list[str]) -> None:
    expected_version = "2025-11-25" if MODE == "legacy" else "2026-07-28"
    # One bound for the whole session (connect, every check, close); each check has its own too.
    with anyio.fail_after(CHECK_TIMEOUT_S * (3 + len(calls) + len(absent))):
        async with Client(url, mode=MODE, read_timeout_seconds=CHECK_TIMEOUT_S) as client:
            await checks(client, expected_version, calls, absent)


async def checks(
    client: Client, expected_version: str, calls: list[tuple[str, dict[str, Any], str]], absent: list[str]
) -> None:
    report(client.protocol_version == expected_version, "connect", f"negotiated {client.protocol_version}")
    try:
        listed: list[str] = []
        cursor = None
        with anyio.fail_after(CHECK_TIMEOUT_S):
            while True:
                page = await client.list_tools(cursor=cursor)
                listed += [t.name for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
        missing = [name for name, _, _ in calls if name not in listed]
        shown = [name for name in absent if name in listed]
        ok = not missing and not shown and bool(listed)
        detail = f"{len(listed)} tools: {', '.join(sorted(listed))}"
        if missing:
            detail = f"{', '.join(missing)} not listed in {listed}"
        elif shown:
            detail = f"{', '.join(shown)} listed but must not be, in {listed}"
        report(ok, "tools/list", detail)
    except Exception as e:
        report(False, "tools/list", describe(e))
    for name, arguments, expected in calls:
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                result = await client.call_tool(name, arguments)
            got = [b.text for b in result.content if isinstance(getattr(b, "text", None), str)]
            ok = not result.is_error and got[:1] == [expected]
            report(ok, f"tools/call {name}", repr(got[0]) if ok else f"isError={result.is_error} text={got!r}, expected {expected!r}")
        except Exception as e:
            report(False, f"tools/call {name}", describe(e))
    for name in absent:
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                result = await client.call_tool(name, {})
            report(bool(result.is_error), f"tools/call {name} (not approved) refused", f"isError={result.is_error}")
        except TimeoutError:
            report(False, f"tools/call {name} (not approved) refused", f"no answer in {CHECK_TIMEOUT_S}s")
        except Exception as e:
            report(True, f"tools/call {name} (not approved) refused", describe(e)[:160])


def main() -> None:
    global MODE
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    url, MODE = sys.argv[1], sys.argv[2]
    calls, absent = parse(sys.argv[3:])
    try:
        anyio.run(run, url, calls, absent)
    except Exception as e:
        report(False, "client", describe(e))
    print(f"py client ({MODE}): {'FAILED' if failures else 'passed'} ({failures} failed check(s))", flush=True)
    sys.exit(1 if failures else 0)


MODE = ""
if __name__ == "__main__":
    main()
