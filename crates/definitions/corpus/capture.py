"""Captures the definitions a real MCP server lists, for the clean half of the corpus.

Usage: python3 capture.py SOURCE_LABEL OUT.json -- COMMAND ARGS...

Starts COMMAND as a stdio MCP server (the 2025-11-25 wire), lists its tools, prompts, resources
and resource templates (every page), and writes them as corpus entries
`{"source", "kind", "definition"}` to OUT.json. Standard library only.
"""

import json
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    label, out, command = sys.argv[1], sys.argv[2], sys.argv[4:]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    next_id = 0

    def request(method, params):
        nonlocal next_id
        next_id += 1
        server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}) + "\n")
        server.stdin.flush()
        while True:
            line = server.stdout.readline()
            if not line:
                raise SystemExit(f"{label}: the server closed its output")
            message = json.loads(line)
            if message.get("id") == next_id and "method" not in message:
                if "error" in message:
                    return None
                return message["result"]

    request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "corpus-capture", "version": "1"}})
    server.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    server.stdin.flush()
    entries = []
    for method, key, kind in [
        ("tools/list", "tools", "tool"),
        ("prompts/list", "prompts", "prompt"),
        ("resources/list", "resources", "resource"),
        ("resources/templates/list", "resourceTemplates", "resource_template"),
    ]:
        cursor = None
        for _ in range(50):
            result = request(method, {"cursor": cursor} if cursor else {})
            if result is None:
                break
            for definition in result.get(key, []):
                entries.append({"source": label, "kind": kind, "definition": definition})
            cursor = result.get("nextCursor")
            if not cursor:
                break
    server.terminate()
    with open(out, "w", encoding="utf-8") as file:
        json.dump(entries, file, indent=1, ensure_ascii=False)
        file.write("\n")
    print(f"{label}: {len(entries)} definitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
