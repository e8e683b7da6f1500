#!/usr/bin/env python3
"""A faulty network between `arbor router` and one replica, for the chaos suite
(router_chaos_test.cc): listens on TCP 127.0.0.1 (the port chosen by the system, written to
PORT_FILE) and forwards every connection to the replica's Unix socket, delaying each chunk by
DELAY_MS in both directions and resetting a connection (RST, as a lost link) with probability
RESET_PER_MILLE / 1000 per chunk. Seeded, so a run's faults can be replayed.

    chaos_proxy.py PORT_FILE UNIX_SOCKET DELAY_MS RESET_PER_MILLE SEED

Prints one line per reset to stderr. Runs until killed. Uses only the standard library (the
kernel's netem qdisc needs a module that containers often lack)."""
import asyncio
import random
import socket
import struct
import sys


async def pipe(reader, writer, delay_s, reset_p, rng, peer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if rng.random() < reset_p:
                print("chaos_proxy: reset a connection", file=sys.stderr, flush=True)
                for w in (writer, peer):
                    sock = w.get_extra_info("socket")
                    if sock is not None and sock.family == socket.AF_INET:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                    w.transport.abort()
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    port_file, target, delay_ms, reset_per_mille, seed = sys.argv[1:6]
    delay_s = float(delay_ms) / 1000.0
    reset_p = float(reset_per_mille) / 1000.0
    rng = random.Random(int(seed))

    async def handle(client_reader, client_writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError:
            client_writer.transport.abort()
            return
        await asyncio.gather(
            pipe(client_reader, up_writer, delay_s, reset_p, rng, client_writer),
            pipe(up_reader, client_writer, delay_s, reset_p, rng, up_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    import os
    os.replace(port_file + ".tmp", port_file)
    async with server:
        await server.serve_forever()


asyncio.run(main())
