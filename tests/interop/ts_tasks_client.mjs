// Interop driver: the TypeScript tasks requester `@modelcontextprotocol/ext-tasks` 0.2.2 on top of
// `@modelcontextprotocol/client` 2.4.0, driving durable tasks on a Palisade server end to end.
//
// Usage: INTEROP_NODE_MODULES=.tools/npm/node_modules node ts_tasks_client.mjs http://127.0.0.1:PORT/mcp
//
// Against the conformance fixture surface (`palisade serve --app conformance`), pinned to
// protocol revision 2026-07-28, it checks:
//   - slow_compute {seconds: 1} runs as a task and settles `completed` with the tool's text;
//   - confirm_delete waits in `input_required` for the elicitation `confirm`; the library hands
//     it to our input handler and answers it with tasks/update; the task completes;
//   - failing_job (task-only) settles `completed` with an isError tool result;
//   - slow_compute {seconds: 60} is cancelled (tasks/cancel) and tasks/get then says `cancelled`.
// Prints one line per check ("ok - ..." or "FAIL - ...") and exits non-zero if any check failed.
//
// How the library talks to a 2026-07-28 server (verified against the installed 0.2.2 sources):
// - createTaskSessionFromClient(client, ...) reads the tasks extension from the SDK client's
//   negotiated server capabilities (`extensions["io.modelcontextprotocol/tasks"]: {}`) and then
//   requires two adapters, `rawDispatch` and `v2RequestFraming`. The SDK client cannot carry
//   task traffic itself: its 2026-07-28 result decoder rejects `resultType: "task"` (the answer
//   to a task-creating tools/call) as an unsupported result type. So the library sends
//   tools/call and tasks/* through `rawDispatch`, a host-owned function that must deliver a
//   framed request and return the JSON-RPC response; every other request (tools/list, ...)
//   still goes through the SDK client.
// - `v2RequestFraming` gives the `_meta` the library stamps on those requests: protocol
//   version, clientInfo and clientCapabilities (it adds the tasks extension itself).
// - rawDispatch below is that host-owned sender: one Streamable HTTP POST per request with the
//   2026-07-28 routing headers (MCP-Protocol-Version, Mcp-Method, Mcp-Name = params.name for
//   tools/call, params.taskId for tasks/*), answered as JSON or as an SSE stream.
//
// Both packages are installed by scripts/test under .tools/npm, not beside this file. ext-tasks
// is ESM only and imports the client's ESM build, so both are imported from their ESM entry
// points (read from each package's `exports`): a client from the CJS build would be a different
// class graph from the one the library checks errors against.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const PROTOCOL = '2026-07-28';
const CHECK_TIMEOUT_MS = 30_000;
const REQUEST_TIMEOUT_MS = 15_000;
const CLIENT_INFO = { name: 'palisade-interop-ts-tasks', version: '0.0.0' };

const url = process.argv[2];
const nodeModules = process.env.INTEROP_NODE_MODULES;
if (!url || !nodeModules) {
  console.error('usage: INTEROP_NODE_MODULES=DIR node ts_tasks_client.mjs URL');
  process.exit(2);
}

// The ESM entry of `pkg` for export `subpath`, from the package's own `exports` map.
async function importEsm(pkg, subpath = '.') {
  const root = path.join(path.resolve(nodeModules), ...pkg.split('/'));
  const manifest = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'));
  let target = manifest.exports?.[subpath];
  while (target && typeof target === 'object') target = target.import ?? target.default;
  if (typeof target !== 'string') throw new Error(`${pkg}: no ESM export for ${subpath}`);
  return import(pathToFileURL(path.join(root, target)).href);
}
const { Client, StreamableHTTPClientTransport } = await importEsm('@modelcontextprotocol/client');
const { createTaskSessionFromClient, resultFromTaskOutcome, DispatchError } = await importEsm(
  '@modelcontextprotocol/ext-tasks',
  './client',
);

let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - ts-tasks: ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
function assert(cond, message) {
  if (!cond) throw new Error(message);
}
function withTimeout(promise, name, ms = CHECK_TIMEOUT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${name}: no answer in ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
async function check(name, body) {
  try {
    report(true, name, await withTimeout(body(), name));
  } catch (e) {
    const cause = e?.cause ? ` (cause: ${e.cause?.message ?? e.cause})` : '';
    report(false, name, `${e?.name ?? 'Error'}: ${e?.message ?? String(e)}${cause}`);
  }
}
const texts = blocks => (blocks ?? []).filter(b => typeof b?.text === 'string').map(b => b.text);
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// rawDispatch: the host-owned request path for task traffic
// ---------------------------------------------------------------------------
let rawId = 0;
const NAME_PARAM = { 'tools/call': 'name', 'prompts/get': 'name', 'resources/read': 'uri', 'tasks/get': 'taskId', 'tasks/update': 'taskId', 'tasks/cancel': 'taskId' };
const rawLog = [];                  // method -> outcome, for the report

function headerValue(value, what) {
  // Every value this driver sends is printable ASCII; anything else would need the
  // Mcp-Param encoding, which is out of scope here.
  if (typeof value !== 'string' || !/^[\x20-\x7e]*$/.test(value)) {
    throw new DispatchError(`${what} is not printable ASCII: ${JSON.stringify(value)}`);
  }
  return value;
}

// The JSON-RPC response with `id` from a JSON body or an SSE stream (read until it arrives).
async function readResponse(res, id) {
  const type = res.headers.get('content-type') ?? '';
  if (!type.startsWith('text/event-stream')) return JSON.parse(await res.text());
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of res.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) !== -1) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
      const data = event.split(/\r?\n/).filter(l => l.startsWith('data:')).map(l => l.slice(5).replace(/^ /, '')).join('\n');
      if (!data) continue;
      const message = JSON.parse(data);
      if (message?.id === id && ('result' in message || 'error' in message)) {
        await res.body.cancel().catch(() => {});
        return message;
      }
    }
  }
  throw new DispatchError(`SSE stream ended without the response to ${id}`, true);
}

async function rawDispatch(request, options = {}) {
  const id = `ext-tasks-${++rawId}`;
  const { method, params = {} } = request;
  const headers = {
    'Content-Type': 'application/json',
    Accept: 'application/json, text/event-stream',
    'MCP-Protocol-Version': headerValue(params?._meta?.['io.modelcontextprotocol/protocolVersion'], 'protocolVersion'),
    'Mcp-Method': headerValue(method, 'method'),
    ...(options.context?.headers ?? {}),
  };
  if (NAME_PARAM[method] && typeof params[NAME_PARAM[method]] === 'string') {
    headers['Mcp-Name'] = headerValue(params[NAME_PARAM[method]], `params.${NAME_PARAM[method]}`);
  }
  const timeout = AbortSignal.timeout(options.context?.requestTimeoutMs ?? REQUEST_TIMEOUT_MS);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  let res;
  try {
    res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id, method, params }), signal });
  } catch (e) {
    if (options.signal?.aborted) throw e;
    throw new DispatchError(`${method}: POST failed: ${e?.message ?? e}`, true, { cause: e });
  }
  let message;
  try {
    message = await readResponse(res, id);
  } catch (e) {
    if (e instanceof DispatchError || options.signal?.aborted) throw e;
    throw new DispatchError(`${method}: HTTP ${res.status} without a JSON-RPC response: ${e?.message ?? e}`, false, { cause: e });
  }
  if (message?.error) {
    rawLog.push(`${method} -> error ${message.error.code}`);
    return { kind: 'error', error: message.error };
  }
  if (!message || typeof message.result !== 'object') {
    throw new DispatchError(`${method}: HTTP ${res.status}, no result or error in ${JSON.stringify(message).slice(0, 200)}`);
  }
  rawLog.push(`${method} -> ${message.result.resultType ?? 'result'}${message.result.status ? `/${message.result.status}` : ''}`);
  return { kind: 'result', result: message.result };
}

// ---------------------------------------------------------------------------
// The flows
// ---------------------------------------------------------------------------
async function run() {
  const client = new Client(CLIENT_INFO, { capabilities: {}, versionNegotiation: { mode: { pin: PROTOCOL } } });
  try {
    await withTimeout(client.connect(new StreamableHTTPClientTransport(new URL(url))), 'connect');
  } catch (e) {
    report(false, 'connect (pinned)', e?.message ?? String(e));
    return;
  }
  const negotiated = client.getNegotiatedProtocolVersion();
  const tasksCapability = client.getServerCapabilities()?.extensions?.['io.modelcontextprotocol/tasks'];
  report(
    negotiated === PROTOCOL && tasksCapability !== undefined,
    'connect (pinned), server declares the tasks extension',
    `negotiated ${negotiated}, tasks extension ${JSON.stringify(tasksCapability)}`,
  );

  // Input requests reach the application here; confirm_delete asks for `confirm`.
  const inputSeen = [];
  const onInputRequest = async (request, context) => {
    inputSeen.push({ kind: request.kind, inputId: context.inputId, delivery: context.delivery, taskId: context.taskId });
    if (request.kind === 'elicitation') return { action: 'accept', content: { confirm: true } };
    throw new Error(`unexpected ${request.kind} input request`);
  };

  let session;
  try {
    session = createTaskSessionFromClient(client, {
      endpointId: `palisade-interop:${url}`,
      rawDispatch,
      v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo: CLIENT_INFO, clientCapabilities: {} },
      onInputRequest,
      onError: e => console.log(`  (ext-tasks reported: ${e?.message ?? e})`),
    });
  } catch (e) {
    report(false, 'createTaskSessionFromClient', e?.message ?? String(e));
    await client.close().catch(() => {});
    return;
  }
  const caps = session.capabilities;
  report(caps.execution && caps.cancellation && caps.inputResponses, 'task session', `capabilities ${JSON.stringify(caps)}`);

  // Calls `name` through the library, insists on a task, settles it; returns what was seen.
  async function settleTask(name, args) {
    const execution = await session.callTool(name, args, { requestTimeoutMs: REQUEST_TIMEOUT_MS });
    assert(execution.kind === 'task', `${name} was not run as a task (execution kind ${execution.kind})`);
    const statuses = [];
    const { outcome, lastTask } = await execution.settle({
      onEvent: event => {
        const status = event.type === 'task' ? event.task.status : `outcome:${event.outcome.status}`;
        if (statuses.at(-1) !== status) statuses.push(status);
      },
    });
    return { taskId: execution.handle.taskId, outcome, lastTask, statuses };
  }

  await check('slow_compute {seconds: 1} as a task -> completed', async () => {
    const { taskId, outcome, statuses } = await settleTask('slow_compute', { seconds: 1 });
    assert(outcome.status === 'completed', `outcome ${outcome.status}: ${outcome.error?.message ?? ''} (statuses ${statuses})`);
    const result = resultFromTaskOutcome(outcome);
    assert(!result.isError, `isError=true: ${JSON.stringify(result.content)}`);
    const got = texts(result.content);
    assert(got.length === 1 && got[0] === 'Computed result after 1 s', `text content ${JSON.stringify(got)}`);
    return `task ${taskId.slice(0, 8)}…, statuses ${statuses.join(' -> ')}, ${JSON.stringify(got[0])}`;
  });

  await check('confirm_delete: input_required answered through tasks/update -> completed', async () => {
    const before = inputSeen.length;
    const { taskId, outcome, statuses } = await settleTask('confirm_delete', { filename: 'report.txt' });
    const asked = inputSeen.slice(before);
    assert(asked.length === 1, `the input handler ran ${asked.length} times: ${JSON.stringify(asked)}`);
    const [input] = asked;
    assert(
      input.kind === 'elicitation' && input.inputId === 'confirm' && input.delivery === 'task-update' && input.taskId === taskId,
      `unexpected input request ${JSON.stringify(input)}`,
    );
    assert(outcome.status === 'completed', `outcome ${outcome.status}: ${outcome.error?.message ?? ''} (statuses ${statuses})`);
    const got = texts(resultFromTaskOutcome(outcome).content);
    assert(got[0] === 'Deleted report.txt', `text content ${JSON.stringify(got)}`);
    assert(rawLog.some(l => l.startsWith('tasks/update ->')), 'no tasks/update was sent');
    return `statuses ${statuses.join(' -> ')}, input ${input.inputId} via ${input.delivery}, ${JSON.stringify(got[0])}`;
  });

  await check('failing_job (task only) -> completed with isError', async () => {
    const { outcome, statuses } = await settleTask('failing_job', {});
    assert(outcome.status === 'completed', `outcome ${outcome.status} (statuses ${statuses})`);
    const result = resultFromTaskOutcome(outcome);
    assert(result.isError === true, `isError=${result.isError}: ${JSON.stringify(result.content)}`);
    return `statuses ${statuses.join(' -> ')}, ${JSON.stringify(texts(result.content)[0])}`;
  });

  await check('slow_compute {seconds: 60} cancelled -> cancelled', async () => {
    const execution = await session.callTool('slow_compute', { seconds: 60 }, { requestTimeoutMs: REQUEST_TIMEOUT_MS });
    assert(execution.kind === 'task', `not run as a task (execution kind ${execution.kind})`);
    const { taskId } = execution.handle;
    const controller = session.task(taskId);
    const first = await controller.snapshot();
    assert(first.status === 'working', `a fresh 60 s task is ${first.status}`);
    // The library ends its local execution on the server's acknowledgement (cancellation is
    // cooperative); the server's own view comes from tasks/get.
    await execution.cancel();
    const local = await execution.result();
    assert(local.status === 'cancelled', `local outcome ${local.status}`);
    const deadline = Date.now() + 20_000;
    let view = await controller.snapshot();
    while (view.status !== 'cancelled' && Date.now() < deadline) {
      assert(view.status === 'working', `after tasks/cancel the task is ${view.status}`);
      await sleep(Math.max(50, Math.min(500, view.suggestedPollIntervalMs ?? 100)));
      view = await controller.snapshot();
    }
    assert(view.status === 'cancelled', `tasks/get still says ${view.status} 20 s after tasks/cancel`);
    return `task ${taskId.slice(0, 8)}… working -> cancelled`;
  });

  try {
    await withTimeout(session.close(), 'session close');
    await withTimeout(client.close(), 'close');
    report(true, 'close', `raw task requests: ${rawLog.length}`);
  } catch (e) {
    report(false, 'close', e?.message ?? String(e));
  }
}

await run();
console.log(`ts tasks client: ${failures ? 'FAILED' : 'passed'} (${failures} failed check(s))`);
process.exit(failures ? 1 : 0);
