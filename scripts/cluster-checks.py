#!/usr/bin/env python3
"""scripts/cluster-checks.py — the checks of scripts/cluster that need more than one request
in flight or a stream held open (Python standard library only; scripts/cluster runs them).

  task-across HOST TOKEN PORT1 PORT2 PORT3
      demo: `orders_export` created as a task through instance 1, a `subscriptions/listen`
      stream for it held open on instance 3, its input answered (`tasks/update`) through
      instance 2; the stream on instance 3 must hear the task reach `completed`.
  session-across HOST PORT1 PORT2 PORT3
      conformance fixture: one 2025-11-25 session initialized on instance 1, used on 2 and 3
      (tools/list, logging/setLevel), an elicitation sent by instance 3 on its POST stream and
      answered by a POST to instance 1 (the answer relay), deleted through instance 2 and then
      refused (404) by instance 3.
  load HOST TOKEN LB_PORT WORKERS CALLS KILL_PID KILL_AFTER
      demo: WORKERS threads, each with its own basket, each sending CALLS basket_add_item
      through the balancer; after KILL_AFTER acknowledged calls in all, SIGKILL to KILL_PID.
      Afterwards every basket is read through the balancer: it must hold at least every
      acknowledged item and at most every attempted one. Prints one JSON summary line.

Every request names HOST in its Host header (the balancer's, which `http.allowed_hosts`
admits), so a request sent straight to an instance's port is the one the balancer would have
forwarded. Each check prints `ok - …` / `FAIL - …` lines and exits 1 if any failed.
"""

import http.client
import json
import os
import signal
import sys
import threading
import time

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
TASKS_CAPS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
FAILED = []


def ok(text):
    print(f"ok - {text}", flush=True)


def fail(text):
    FAILED.append(text)
    print(f"FAIL - {text}", flush=True)


class Host:
    """Requests to 127.0.0.1:PORT with the deployment's Host header."""

    def __init__(self, host, token=None):
        self.host = host
        self.token = token

    def headers(self, extra):
        headers = {
            "Host": self.host,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Connection": "close",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra)
        return headers

    def open(self, port, body, extra, method="POST", timeout=20):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, "/mcp", body=data, headers=self.headers(extra))
        return connection, connection.getresponse()

    def send(self, port, body, extra, method="POST"):
        """(status, headers, [messages]) of a whole answer (JSON or SSE)."""
        connection, response = self.open(port, body, extra, method)
        try:
            raw = response.read().decode()
        finally:
            connection.close()
        return response.status, response.headers, parse(response.headers.get("content-type", ""), raw)


def parse(content_type, raw):
    if content_type.startswith("text/event-stream"):
        return [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:") and line[5:].strip()]
    return [json.loads(raw)] if raw.strip() else []


class SseReader:
    """Frames of an open SSE response, one at a time."""

    def __init__(self, connection, response):
        self.connection = connection
        self.response = response

    def next(self):
        data = []
        while True:
            line = self.response.readline()
            if not line:
                return None
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                return json.loads("".join(data))

    def close(self):
        self.connection.close()


def modern(method, params, caps=None, rid=1):
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": caps or {},
    }
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    name = params.get("name") or params.get("taskId")
    if name:
        headers["Mcp-Name"] = name
    return body, headers


def final(messages):
    found = [m for m in messages if "result" in m or "error" in m]
    return found[-1] if found else {}


# ---------------------------------------------------------------------------
def task_across(host, token, p1, p2, p3):
    api = Host(host, token)

    def rpc(port, method, params):
        body, headers = modern(method, params, TASKS_CAPS)
        return final(api.send(port, body, headers)[2])

    created = rpc(p1, "tools/call", {"name": "orders_export", "arguments": {}})
    task = created.get("result", {}).get("taskId")
    if created.get("result", {}).get("resultType") != "task" or not task:
        fail(f"task across instances: orders_export on instance 1 made no task: {created}")
        return
    ok("task across instances: orders_export created as a task through instance 1")
    body, headers = modern("subscriptions/listen", {"notifications": {"taskIds": [task]}}, TASKS_CAPS, rid="listen")
    connection, response = api.open(p3, body, headers, timeout=60)
    stream = SseReader(connection, response)
    heard = []
    done = threading.Event()

    def read():
        while True:
            frame = stream.next()
            if frame is None:
                break
            heard.append(frame)
            if frame.get("method") == "notifications/tasks" and frame["params"].get("status") in ("completed", "failed"):
                break
        done.set()

    ack = stream.next()
    if response.status != 200 or not ack or ack.get("method") != "notifications/subscriptions/acknowledged":
        fail(f"task across instances: the listen stream on instance 3 was not acknowledged: {response.status} {ack}")
        stream.close()
        return
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    status = None
    for _ in range(200):
        status = rpc(p1, "tasks/get", {"taskId": task}).get("result", {}).get("status")
        if status == "input_required":
            break
        time.sleep(0.05)
    if status != "input_required":
        fail(f"task across instances: the task never asked for input (status {status})")
        stream.close()
        return
    answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    update = rpc(p2, "tasks/update", {"taskId": task, "inputResponses": answer})
    if update.get("result", {}).get("resultType") == "complete":
        ok("task across instances: its input answered (tasks/update) through instance 2")
    else:
        fail(f"task across instances: tasks/update through instance 2: {update}")
    if not done.wait(30):
        fail("task across instances: the listen stream on instance 3 heard no end of the task within 30 s")
        stream.close()
        return
    stream.close()
    statuses = [f["params"].get("status") for f in heard if f.get("method") == "notifications/tasks"]
    if statuses and statuses[-1] == "completed":
        ok(f"task across instances: the listen stream on instance 3 heard it: {' -> '.join(statuses)}")
    else:
        fail(f"task across instances: the listen stream on instance 3 heard {statuses}")
    final_state = rpc(p3, "tasks/get", {"taskId": task}).get("result", {})
    if final_state.get("status") == "completed":
        ok("task across instances: tasks/get through instance 3 reports it completed")
    else:
        fail(f"task across instances: tasks/get through instance 3: {final_state}")


# ---------------------------------------------------------------------------
def session_across(host, p1, p2, p3):
    api = Host(host)
    base = {"MCP-Protocol-Version": LEGACY}

    def with_session(session):
        return dict(base, **{"Mcp-Session-Id": session})

    init = {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": LEGACY, "capabilities": {"elicitation": {}},
                   "clientInfo": {"name": "cluster-check", "version": "1"}},
    }
    status, headers, messages = api.send(p1, init, base)
    session = headers.get("mcp-session-id")
    if status != 200 or not session:
        fail(f"2025 session: initialize on instance 1: HTTP {status} {messages}")
        return
    ok("2025 session: initialized through instance 1")
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    status, _, _ = api.send(p2, note, with_session(session))
    listed = final(api.send(p3, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, with_session(session))[2])
    tools = [t["name"] for t in listed.get("result", {}).get("tools", [])]
    level = final(api.send(p2, {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}},
                           with_session(session))[2])
    if status == 202 and "test_elicitation" in tools and level.get("result") == {}:
        ok(f"2025 session: used on instance 2 (initialized, logging/setLevel) and 3 (tools/list: {len(tools)} tools)")
    else:
        fail(f"2025 session: on instances 2 and 3: initialized {status}, tools {len(tools)}, setLevel {level}")
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "test_elicitation", "arguments": {"message": "who?"}}}
    connection, response = api.open(p3, call, with_session(session), timeout=30)
    stream = SseReader(connection, response)
    ask = stream.next() if response.status == 200 else None
    if not ask or ask.get("method") != "elicitation/create":
        fail(f"2025 session: instance 3 sent no elicitation request: HTTP {response.status} {ask}")
        stream.close()
        return
    content = {"username": "cluster", "email": "cluster@example.com"}
    reply = {"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": content}}
    status, _, _ = api.send(p1, reply, with_session(session))
    result = stream.next()
    stream.close()
    text = ((result or {}).get("result", {}).get("content") or [{}])[0].get("text", "")
    if status == 202 and text.startswith("User response: action=accept") and "cluster@example.com" in text:
        ok("2025 session: an elicitation sent by instance 3, answered by a POST to instance 1, reached it")
    else:
        fail(f"2025 session: elicitation via instance 3, answer via instance 1 (HTTP {status}): {result}")
    status, _, _ = api.send(p2, None, with_session(session), method="DELETE")
    after, _, _ = api.send(p3, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, with_session(session))
    if status == 200 and after == 404:
        ok("2025 session: deleted through instance 2, then refused (404) by instance 3")
    else:
        fail(f"2025 session: DELETE through instance 2 gave {status}, then instance 3 answered {after}")


# ---------------------------------------------------------------------------
def load(host, token, lb_port, workers, calls, kill_pid, kill_after):
    api = Host(host, token)
    lock = threading.Lock()
    acked_total = [0]
    killed = [False]

    def tool(name, arguments, rid):
        body, headers = modern("tools/call", {"name": name, "arguments": arguments}, None, rid)
        try:
            status, _, messages = api.send(lb_port, body, headers)
        except (OSError, ValueError, http.client.HTTPException):
            # The connection broke, or the balancer answered for a dead instance (not JSON).
            return None
        answer = final(messages)
        result = answer.get("result")
        if status != 200 or not result or result.get("isError"):
            return None
        return result.get("structuredContent", {})

    baskets = []
    for w in range(workers):
        for _ in range(20):
            made = tool("basket_create", {}, f"create-{w}")
            if made and made.get("basket"):
                baskets.append(made["basket"])
                break
    if len(baskets) != workers:
        fail(f"load: only {len(baskets)}/{workers} baskets could be created")
        return None
    stats = [{"acked": 0, "attempted": 0} for _ in range(workers)]

    def worker(w):
        for n in range(calls):
            stats[w]["attempted"] += 1
            added = tool("basket_add_item", {"basket": baskets[w], "sku": "TEA-001", "quantity": 1}, f"w{w}-{n}")
            if added is None:
                continue
            stats[w]["acked"] += 1
            with lock:
                acked_total[0] += 1
                if not killed[0] and acked_total[0] >= kill_after:
                    os.kill(kill_pid, signal.SIGKILL)
                    killed[0] = True

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not killed[0]:
        os.kill(kill_pid, signal.SIGKILL)
        fail(f"load: fewer than {kill_after} calls were acknowledged before the kill")
    # Read back every basket (a read landing on the dead instance before it is marked DOWN is
    # refused by the balancer, not answered: retry it).
    held = []
    for w, basket in enumerate(baskets):
        items = None
        for _ in range(50):
            view = tool("basket_view", {"basket": basket}, f"view-{w}")
            if view is not None:
                items = view.get("items", [])
                break
            time.sleep(0.2)
        held.append(None if items is None else sum(i["quantity"] for i in items))
    acked = sum(s["acked"] for s in stats)
    attempted = sum(s["attempted"] for s in stats)
    lost = [w for w in range(workers) if held[w] is None or held[w] < stats[w]["acked"]]
    invented = [w for w in range(workers) if held[w] is not None and held[w] > stats[w]["attempted"]]
    if not lost and not invented:
        ok(f"load: kill -9 under load ({workers} concurrent clients): {acked}/{attempted} calls acknowledged, "
           f"every acknowledged item is in its basket ({sum(h for h in held)} held)")
    else:
        fail(f"load: baskets {lost} lost acknowledged items, {invented} hold more than was sent: "
             f"held {held}, stats {stats}")
    print(json.dumps({"acked": acked, "attempted": attempted, "held": held}), flush=True)
    return acked


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    command, args = argv[1], argv[2:]
    if command == "task-across" and len(args) == 5:
        task_across(args[0], args[1], *map(int, args[2:]))
    elif command == "session-across" and len(args) == 4:
        session_across(args[0], *map(int, args[1:]))
    elif command == "load" and len(args) == 7:
        load(args[0], args[1], *map(int, args[2:]))
    else:
        print(f"scripts/cluster-checks.py: bad arguments: {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
