"""A real A2A v1.0 worker agent on the official Python SDK (`a2a-sdk` 1.3.0).

The integration tests start it (tests/harness/python_worker.rs) to check the
gateway against an unmodified peer. It is a Starlette app assembled from the
SDK's own pieces:

- `DefaultRequestHandler` (= `DefaultRequestHandlerV2`) over an
  `InMemoryTaskStore`, driving `TestAgentExecutor` below;
- `create_jsonrpc_routes(handler, '/')`: JSON-RPC at `POST /`;
- `create_rest_routes(handler)`: the HTTP+JSON routes (`/message:stream`,
  `/tasks/{id}`, `/tasks/{id}:cancel`, ...) and the same under `/{tenant}/`;
- `create_agent_card_routes(card)`: `GET /.well-known/agent-card.json`.

Two test-only extras: `GET /_test/stats` and an ASGI middleware that records
every `A2A-Extensions` request header. With `--record-requests` it also
records the HTTP version, method, path and `Content-Type` of every request
(`requests_seen`), and the executor every new task's budget grant (its
message's `metadata["a2a-rust.com/budget"]` as JSON, numbers as floats:
`budgets_seen`); both lists stay empty without the flag.

`--server hypercorn` serves the same app with Hypercorn instead of uvicorn:
HTTP/1.1 and HTTP/2 on the one plaintext port, HTTP/2 told by its
connection preface (h2c with prior knowledge, as a gRPC client or a proxy
speaking HTTP/2 to an `http://` upstream connects; also `Upgrade: h2c`).
Neither the server nor the SDK's routes check `Content-Type`: a POST to
`/message:send` or `/` typed `application/grpc` is read as JSON and run.

With `--grpc-port PORT` the same handler (same executor, task store and
stats) is also served over the A2A gRPC binding (`lf.a2a.v1.A2AService`,
plaintext HTTP/2) on that port, by the SDK's `GrpcHandler`, and the card
lists a `GRPC` interface `http://HOST:PORT`. Its context builder records the
`a2a-extensions` metadata of every call into the same `extensions_seen`.
The tenant of a gRPC call is the request's `tenant` field, as over HTTP.
The SDK checks no `a2a-version` metadata on gRPC. `/_test/stats` stays on
HTTP. The gRPC server starts before `READY` and stops (0.5 s grace) when
the HTTP server shuts down, before the handler is closed.

What the agent does is chosen by the first text part of the user message:

- `work:<ms>`  WORKING, then a WORKING update every 100 ms until <ms> elapsed,
               then an artifact and COMPLETED. Cancel ends it CANCELED at once.
- `quick`      WORKING then COMPLETED (no artifact).
- `ask`        WORKING then INPUT_REQUIRED (the stream closes; a follow-up
               message with the task id runs again by the same rules).
- `ask:<bytes>` like `ask`, its question padded to <bytes> characters (an
               event larger than a gateway's `limits.max_sse_event`).
- `spend:<ms>:<meter>=<n>`  like work:<ms>, but the k-th status update carries
               metadata {"a2a-rust.com/budget": {"spent": {"<meter>": k*n}}}.
- `late:<ms>:<text>`  waits <ms> before the task's first event, then does
               <text>: a worker whose stream names the task late.
- `spawn:<ms>@<url>@<text>`  delegates: once WORKING, sends <text> to the
               agent at <url> (a JSON-RPC endpoint) as a non-blocking
               `SendMessage` it never follows (a background child), then
               works as `work:<ms>`. The child's message id and task id are
               listed in the stats' `children`. With `--otel` the send
               carries the W3C trace context of the request being served
               (OpenTelemetry's own httpx instrumentation), as any
               instrumented agent's calls do; without, none.
- `await:<ms>@<url>@<text>`  delegates and waits: once WORKING, streams
               <text> to the agent at <url> (`SendStreamingMessage`) and
               reads the child's stream to its end (the child's task id is
               listed in `children` from its first event), then works as
               `work:<ms>`. A cancel of this task stops the executor, which
               closes the child's stream.
- `spawnbare:<ms>@<url>@<text>`  the same, the send carrying only the
               `traceparent` of the request being served (no `tracestate`,
               no `baggage`): an agent that propagates trace ids only.
- anything else: like `quick`.

With `--otel` the app is served inside OpenTelemetry's ASGI middleware and
the agent's own HTTP client is instrumented (SDK tracer provider, no
exporter; the default propagators, W3C trace context and baggage): the
trace context a request arrives with is the one its executor's calls carry.

Usage: python python_agent.py --port N [--host 127.0.0.1] [--tenant-scoped]
       [--declare-extension URI ...] [--grpc-port M]
       [--server uvicorn|hypercorn] [--record-requests] [--otel]
Prints `READY` on stdout once the sockets listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import socket
import sys
import uuid

from dataclasses import dataclass, field

import grpc
import httpx
import uvicorn

from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import (
    DefaultGrpcServerCallContextBuilder,
    DefaultRequestHandler,
    GrpcHandler,
)
from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.utils.errors import UnsupportedOperationError
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
    a2a_pb2_grpc,
)


BUDGET_KEY = 'a2a-rust.com/budget'
TICK_SECONDS = 0.1

log = logging.getLogger('python_agent')


@dataclass
class Stats:
    """What `/_test/stats` reports."""

    tasks_started: int = 0  # execute() calls that created a new task
    task_ids: list[str] = field(default_factory=list)  # theirs, in order
    turns: int = 0  # every execute() call (continuations included)
    cancels: int = 0  # executor cancel() calls
    extensions_seen: list[str] = field(default_factory=list)
    # With --record-requests: {http_version, method, path, content_type}
    # of every HTTP request but `/_test/stats`, in arrival order
    # (content_type null when absent) ...
    requests_seen: list[dict] = field(default_factory=list)
    # ... and the budget grant of every new task's message that had one.
    budgets_seen: list[dict] = field(default_factory=list)
    # The children `spawn:` started: {url, message_id, task_id, error}.
    children: list[dict] = field(default_factory=list)
    record: bool = False

    def to_json(self) -> dict:
        return {
            'tasks_started': self.tasks_started,
            'task_ids': list(self.task_ids),
            'turns': self.turns,
            'cancels': self.cancels,
            'extensions_seen': list(self.extensions_seen),
            'requests_seen': list(self.requests_seen),
            'budgets_seen': list(self.budgets_seen),
            'children': [dict(c) for c in self.children],
        }


class _Guard:
    """Serialises the work loop's writes with cancel().

    cancel() sets `cancelled` and writes CANCELED under the lock; the work loop
    checks the flag under the same lock before each write, so no event of the
    loop can land after the terminal CANCELED.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.cancelled = False


class _Cancelled(Exception):
    pass


def _first_text(context: RequestContext) -> str:
    message = context.message
    if message is None:
        return ''
    for part in message.parts:
        if part.HasField('text'):
            return part.text
    return ''


def _parse(text: str) -> tuple[str, float, str | None, float]:
    """Returns (kind, seconds, meter, n)."""
    text = text.strip()
    if text.startswith('work:'):
        try:
            return 'work', max(0, int(text[5:])) / 1000, None, 0
        except ValueError:
            return 'quick', 0, None, 0
    if text.startswith('spend:'):
        try:
            ms, charge = text[6:].split(':', 1)
            meter, n = charge.split('=', 1)
            return 'work', max(0, int(ms)) / 1000, meter, float(n)
        except ValueError:
            return 'quick', 0, None, 0
    if text == 'ask':
        return 'ask', 0, None, 0
    if text.startswith('ask:'):
        try:
            return 'ask', 0, None, max(0, int(text[4:]))
        except ValueError:
            return 'quick', 0, None, 0
    return 'quick', 0, None, 0


def _budget_grant(context: RequestContext):
    """The message's budget grant as JSON, or None."""
    message = context.message
    if message is None or not message.HasField('metadata'):
        return None
    metadata = MessageToDict(message.metadata)
    return metadata.get(BUDGET_KEY)


def _number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _child_send(method: str, text: str) -> tuple[str, dict]:
    """A JSON-RPC send of `text` to a child agent: its message id, its body."""
    message_id = f'child-{uuid.uuid4()}'
    return message_id, {
        'jsonrpc': '2.0',
        'id': message_id,
        'method': method,
        'params': {
            'message': {
                'messageId': message_id,
                'role': 'ROLE_USER',
                'parts': [{'text': text}],
            }
        },
    }


class TestAgentExecutor(AgentExecutor):
    """The scripted agent; see the module doc for its behaviour."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self._guards: dict[str, _Guard] = {}
        # The client of `spawn:` (instrumented with --otel), and the one of
        # `spawnbare:` (never instrumented).
        self.http = httpx.AsyncClient(timeout=10)
        self.bare_http = httpx.AsyncClient(timeout=10)

    async def _await_child(self, url: str, text: str) -> None:
        """Streams a child at `url` and reads it to its end (see `await:`)."""
        message_id, body = _child_send('SendStreamingMessage', text)
        entry = {'url': url, 'message_id': message_id, 'task_id': None, 'error': None}
        self.stats.children.append(entry)
        headers = {'A2A-Version': '1.0', 'Accept': 'text/event-stream'}
        async with self.http.stream(
            'POST', url, json=body, headers=headers, timeout=None
        ) as r:
            async for line in r.aiter_lines():
                if entry['task_id'] is None and line.startswith('data:'):
                    result = json.loads(line[5:]).get('result', {})
                    task = result.get('task') or {}
                    update = result.get('statusUpdate') or {}
                    entry['task_id'] = task.get('id') or update.get('taskId')

    async def _spawn(self, url: str, text: str, bare: bool) -> None:
        """Starts a background child at `url` (see `spawn:`)."""
        message_id, body = _child_send('SendMessage', text)
        body['params']['configuration'] = {'returnImmediately': True}
        headers = {'A2A-Version': '1.0'}
        client = self.http
        if bare:
            from opentelemetry import propagate

            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if 'traceparent' in carrier:
                headers['traceparent'] = carrier['traceparent']
            client = self.bare_http
        entry = {'url': url, 'message_id': message_id, 'task_id': None, 'error': None}
        self.stats.children.append(entry)
        try:
            r = await client.post(url, json=body, headers=headers)
            entry['task_id'] = r.json().get('result', {}).get('task', {}).get('id')
            if entry['task_id'] is None:
                entry['error'] = f'HTTP {r.status_code}: {r.text[:200]}'
        except Exception as e:  # recorded for the test to show
            entry['error'] = repr(e)

    async def execute(
        self, context: RequestContext, event_queue: EventQueue
    ) -> None:
        task_id = context.task_id or ''
        context_id = context.context_id or ''
        self.stats.turns += 1
        text = _first_text(context).strip()
        if text.startswith('late:'):
            ms, _, text = text[5:].partition(':')
            try:
                await asyncio.sleep(max(0, int(ms)) / 1000)
            except ValueError:
                pass
        if context.current_task is None:
            self.stats.tasks_started += 1
            self.stats.task_ids.append(context.task_id)
            grant = _budget_grant(context) if self.stats.record else None
            if grant is not None:
                self.stats.budgets_seen.append(grant)
            # A new task: the first event must be the Task itself.
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message] if context.message else [],
                )
            )

        spawn = None
        if text.startswith(('spawn:', 'spawnbare:', 'await:')):
            directive, _, rest = text.partition(':')
            ms, _, rest = rest.partition('@')
            url, _, child_text = rest.partition('@')
            spawn = (url, child_text, directive)
            text = f'work:{ms}'
        guard = self._guards.setdefault(task_id, _Guard())
        updater = TaskUpdater(event_queue, task_id, context_id)
        kind, seconds, meter, n = _parse(text)
        updates = 0

        async def status(state: TaskState, message=None) -> None:
            nonlocal updates
            async with guard.lock:
                if guard.cancelled:
                    raise _Cancelled
                updates += 1
                metadata = None
                if meter is not None:
                    metadata = {
                        BUDGET_KEY: {'spent': {meter: _number(updates * n)}}
                    }
                await updater.update_status(
                    state, message=message, metadata=metadata
                )

        try:
            await status(TaskState.TASK_STATE_WORKING)
            if spawn is not None:
                url, child_text, directive = spawn
                if directive == 'await':
                    await self._await_child(url, child_text)
                else:
                    await self._spawn(url, child_text, directive == 'spawnbare')
            if kind == 'ask':
                question = 'need more input'
                question += '.' * max(0, int(n) - len(question))
                await status(
                    TaskState.TASK_STATE_INPUT_REQUIRED,
                    message=updater.new_agent_message([Part(text=question)]),
                )
                return
            if kind == 'work':
                loop = asyncio.get_running_loop()
                deadline = loop.time() + seconds
                while True:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    await asyncio.sleep(min(TICK_SECONDS, left))
                    if loop.time() < deadline:
                        await status(TaskState.TASK_STATE_WORKING)
                async with guard.lock:
                    if guard.cancelled:
                        raise _Cancelled
                    await updater.add_artifact(
                        [Part(text=f'done: {_first_text(context)}')],
                        name='result',
                    )
            await status(TaskState.TASK_STATE_COMPLETED)
        except _Cancelled:
            log.info('task %s: stopped by cancel', task_id)
        finally:
            if self._guards.get(task_id) is guard:
                self._guards.pop(task_id, None)

    async def cancel(
        self, context: RequestContext, event_queue: EventQueue
    ) -> None:
        task_id = context.task_id or ''
        context_id = context.context_id or ''
        self.stats.cancels += 1
        guard = self._guards.pop(task_id, None) or _Guard()
        async with guard.lock:
            guard.cancelled = True
            await TaskUpdater(event_queue, task_id, context_id).cancel()


class RecordExtensions:
    """Pure ASGI middleware: records each `A2A-Extensions` request header
    (and, with --record-requests, each request's HTTP version, method, path
    and `Content-Type`).

    Pure ASGI (not BaseHTTPMiddleware) so SSE streaming and client-disconnect
    handling are exactly those of the SDK's routes.
    """

    def __init__(self, app, stats: Stats) -> None:
        self.app = app
        self.stats = stats

    async def __call__(self, scope, receive, send) -> None:
        if scope['type'] == 'http' and scope.get('path') != '/_test/stats':
            content_type = None
            for name, value in scope.get('headers', []):
                if name.lower() == b'a2a-extensions':
                    self.stats.extensions_seen.append(value.decode('latin-1'))
                elif name.lower() == b'content-type':
                    content_type = value.decode('latin-1')
            if self.stats.record:
                self.stats.requests_seen.append(
                    {
                        'http_version': scope.get('http_version'),
                        'method': scope.get('method'),
                        'path': scope.get('path'),
                        'content_type': content_type,
                        'traceparent': _header(scope, b'traceparent'),
                        'tracestate': _header(scope, b'tracestate'),
                    }
                )
        await self.app(scope, receive, send)


def _header(scope, name: bytes) -> str | None:
    """A request header's lines joined by ',' (None when absent)."""
    values = [
        v.decode('latin-1')
        for k, v in scope.get('headers', [])
        if k.lower() == name
    ]
    return ','.join(values) if values else None


class RecordingGrpcContextBuilder(DefaultGrpcServerCallContextBuilder):
    """The gRPC twin of RecordExtensions: records `a2a-extensions` metadata."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def build(self, context: grpc.aio.ServicerContext) -> ServerCallContext:
        for key, value in context.invocation_metadata() or ():
            if key.lower() == 'a2a-extensions':
                self.stats.extensions_seen.append(
                    value if isinstance(value, str) else value.decode('latin-1')
                )
        return super().build(context)


def _tenant_owner(context: ServerCallContext) -> str:
    """Owner resolver that scopes tasks by tenant (only with --tenant-scoped)."""
    return f'{context.tenant}\x00{context.user.user_name}'


class NoListTasksHandler(DefaultRequestHandler):
    """The SDK's handler without ListTasks: a worker whose task store
    cannot list (the call is answered UnsupportedOperationError)."""

    async def on_list_tasks(self, params, context):
        raise UnsupportedOperationError(message='ListTasks is not served here')


def build_app(
    base_url: str,
    tenant_scoped: bool = False,
    extensions: list[str] | None = None,
    grpc_url: str | None = None,
    list_tasks: bool = True,
    otel: bool = False,
) -> tuple[Starlette, Stats, DefaultRequestHandler, list]:
    """The app, its stats, its handler, and a list of async callables the
    app's lifespan awaits at shutdown before it closes the handler (where
    the caller registers the gRPC server's stop)."""
    stats = Stats()
    interfaces = [
        AgentInterface(
            url=base_url,
            protocol_binding='JSONRPC',
            protocol_version='1.0',
        ),
        AgentInterface(
            url=base_url,
            protocol_binding='HTTP+JSON',
            protocol_version='1.0',
        ),
    ]
    if grpc_url is not None:
        interfaces.append(
            AgentInterface(
                url=grpc_url,
                protocol_binding='GRPC',
                protocol_version='1.0',
            )
        )
    card = AgentCard(
        name='python-test-worker',
        description='Scripted A2A worker on a2a-sdk 1.3.0 for a2a-gateway tests.',
        version='1.0.0',
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(
            streaming=True,
            push_notifications=False,
            extensions=[
                AgentExtension(uri=uri, required=False)
                for uri in (extensions or [])
            ],
        ),
        default_input_modes=['text/plain'],
        default_output_modes=['text/plain'],
        skills=[
            AgentSkill(
                id='scripted',
                name='scripted',
                description='work:<ms>, quick, ask, spend:<ms>:<meter>=<n>',
                tags=['test'],
            )
        ],
    )
    store = (
        InMemoryTaskStore(owner_resolver=_tenant_owner)
        if tenant_scoped
        else InMemoryTaskStore()
    )
    executor = TestAgentExecutor(stats)
    handler = (DefaultRequestHandler if list_tasks else NoListTasksHandler)(
        agent_executor=executor,
        task_store=store,
        agent_card=card,
    )

    async def test_stats(_request: Request) -> JSONResponse:
        return JSONResponse(stats.to_json())

    routes = [
        # Before the REST routes: their `/{tenant}` mount matches any prefix.
        Route('/_test/stats', test_stats, methods=['GET']),
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, rpc_url='/'),
        *create_rest_routes(handler),
    ]

    on_shutdown: list = []

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        yield
        for stop in on_shutdown:
            await stop()
        await handler.aclose()
        await executor.http.aclose()
        await executor.bare_http.aclose()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(RecordExtensions, stats=stats)
    if otel:
        from opentelemetry import trace
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        HTTPXClientInstrumentor.instrument_client(executor.http)
        app = OpenTelemetryMiddleware(app)
    return app, stats, handler, on_shutdown


async def _start_grpc(
    handler: DefaultRequestHandler, stats: Stats, host: str, port: int
) -> grpc.aio.Server:
    """Serves `handler` over gRPC (plaintext HTTP/2) on host:port."""
    server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(
        GrpcHandler(handler, RecordingGrpcContextBuilder(stats)), server
    )
    try:
        bound = server.add_insecure_port(f'{host}:{port}')
    except RuntimeError as e:
        # grpcio says only "Failed to bind"; the harness retries on these words.
        sys.exit(f'grpc port {port}: address already in use? ({e})')
    if bound == 0:
        sys.exit(f'grpc port {port}: address already in use?')
    await server.start()
    return server


async def _serve(args: argparse.Namespace) -> None:
    base_url = f'http://{args.host}:{args.port}'
    grpc_url = (
        f'http://{args.host}:{args.grpc_port}' if args.grpc_port else None
    )
    app, stats, handler, on_shutdown = build_app(
        base_url,
        args.tenant_scoped,
        args.declare_extension,
        grpc_url,
        list_tasks=not args.no_list_tasks,
        otel=args.otel,
    )
    stats.record = args.record_requests
    if args.grpc_port:
        grpc_server = await _start_grpc(
            handler, stats, args.host, args.grpc_port
        )

        async def stop_grpc() -> None:
            await grpc_server.stop(0.5)

        on_shutdown.append(stop_grpc)
    if args.server == 'hypercorn':
        await _serve_hypercorn(app, args)
        return
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan='on',
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # re-raises a startup failure
            sys.exit('uvicorn stopped before it started')
        await asyncio.sleep(0.02)
    print('READY', flush=True)
    await serving


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; exits with the words the
    harness retries on when the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            sys.exit(f'port {port}: address already in use ({e})')
        raise
    sock.listen(128)
    return sock


async def _serve_hypercorn(app: Starlette, args: argparse.Namespace) -> None:
    """Serves `app` with Hypercorn on a socket bound here (so a taken port
    fails as uvicorn's does, and `READY` means it listens): HTTP/1.1 and h2c
    (prior knowledge or `Upgrade: h2c`) on the one port. Stops on SIGTERM
    or SIGINT (Hypercorn's own handlers), running the app's lifespan end."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    sock = _listen(args.host, args.port)
    config = Config()
    # Hypercorn wraps the descriptor itself; detach so ours never closes it.
    config.bind = [f'fd://{sock.detach()}']
    config.loglevel = args.log_level.upper()
    config.accesslog = None
    print('READY', flush=True)
    await serve(app, config, mode='asgi')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument(
        '--tenant-scoped',
        action='store_true',
        help='key stored tasks by tenant (the SDK default ignores the tenant)',
    )
    parser.add_argument(
        '--declare-extension',
        action='append',
        default=[],
        metavar='URI',
        help='declare this extension (required=false) in the agent card',
    )
    parser.add_argument(
        '--grpc-port',
        type=int,
        default=None,
        metavar='PORT',
        help='also serve the A2A gRPC binding (plaintext) on this port',
    )
    parser.add_argument(
        '--server',
        choices=['uvicorn', 'hypercorn'],
        default='uvicorn',
        help='the ASGI server (hypercorn also speaks h2c on --port)',
    )
    parser.add_argument(
        '--record-requests',
        action='store_true',
        help='record every request and budget grant in /_test/stats',
    )
    parser.add_argument(
        '--no-list-tasks',
        action='store_true',
        help='answer ListTasks UnsupportedOperationError (a store that cannot list)',
    )
    parser.add_argument(
        '--otel',
        action='store_true',
        help='serve inside OpenTelemetry (ASGI middleware, instrumented httpx client)',
    )
    parser.add_argument('--log-level', default='warning')
    args = parser.parse_args()
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format='%(asctime)s %(levelname)s %(name)s: %(message)s',
    )
    asyncio.run(_serve(args))


if __name__ == '__main__':
    main()
