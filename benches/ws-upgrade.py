#!/usr/bin/env python3
"""Many WebSocket upgrades through a proxy, each checked to stay open after its 101.

    cargo bench -p a2a-gateway --bench proxy -- --serve     # prints the WebSocket addresses
    python3 benches/ws-upgrade.py HOST PORT [N [AT_ONCE [WAIT_MS]]]

Opens N upgrades (default 3000), AT_ONCE at a time (default 16), to
ws://HOST:PORT/ws; on each, waits WAIT_MS (default 20) for the proxy to close
the socket before anything was sent, then sends one `quick` SendMessage
(JSON-RPC) and reads until its answer. Prints how many upgrades got their
answer and how the others ended. Standard library only.

Written for pingora-proxy 0.9.1's race (vendor/pingora-proxy/PATCHED.md):
before the fix, 0.4 to 0.9% of the upgrades through bare pingora and through
the gateway were closed right after their 101; none after it, and none
direct to the worker.
"""
import asyncio
import base64
import json
import os
import sys

host, port = sys.argv[1], int(sys.argv[2])
n_upgrades = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
at_once = int(sys.argv[4]) if len(sys.argv) > 4 else 16
wait_s = (int(sys.argv[5]) if len(sys.argv) > 5 else 20) / 1000


def frame(opcode, payload):
    """A masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def read_frame(r):
    h = await r.readexactly(2)
    n = h[1] & 0x7F
    if n == 126:
        n = int.from_bytes(await r.readexactly(2), "big")
    elif n == 127:
        n = int.from_bytes(await r.readexactly(8), "big")
    return h[0] & 0x0F, await r.readexactly(n)


async def upgrade(i):
    """None when the round trip worked, else how the socket ended."""
    r, w = await asyncio.open_connection(host, port)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        w.write(
            f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nA2A-Version: 1.0\r\n\r\n".encode()
        )
        head = await r.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            return f"no 101: {head[:60]!r}"
        try:
            if await asyncio.wait_for(r.read(1), wait_s) == b"":
                return "closed after its 101, before anything was sent"
            return "unexpected bytes before the first request"
        except asyncio.TimeoutError:
            pass
        body = {"jsonrpc": "2.0", "id": i, "method": "SendMessage",
                "params": {"message": {"messageId": f"u{i}", "role": "ROLE_USER",
                                       "parts": [{"text": "quick"}]}}}
        w.write(frame(1, json.dumps(body).encode()))
        while True:
            try:
                opcode, data = await read_frame(r)
            except asyncio.IncompleteReadError:
                return "closed after the first request was sent"
            if opcode == 1 and json.loads(data).get("id") == i:
                break
        w.write(frame(8, b"\x03\xe8"))
        return None
    finally:
        w.close()


async def main():
    gate = asyncio.Semaphore(at_once)
    outcomes = {}

    async def one(i):
        async with gate:
            try:
                why = await upgrade(i)
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                why = f"{type(e).__name__}: {e}"
            outcomes[why] = outcomes.get(why, 0) + 1

    await asyncio.gather(*(one(i) for i in range(n_upgrades)))
    ok = outcomes.pop(None, 0)
    print(f"ws://{host}:{port}/ws: {ok} of {n_upgrades} upgrades answered")
    for why, count in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {count}: {why}")
    sys.exit(1 if outcomes else 0)


asyncio.run(main())
