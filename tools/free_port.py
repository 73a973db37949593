#!/usr/bin/env python3
"""Prints a loopback TCP port that is free now, for MASTER_PORT (tools/torchrun.sh, the Python
tests that start torch ranks themselves).

The port is taken at random below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 by default) and checked with a bind: the kernel never hands such a port to an
outgoing connection or to a bind to port 0, so nothing else on the machine (the gloo
connections of another job running at the same time, as ctest -j2 runs them) takes it in the
second between this check and rank 0's store binding it. A port from bind(0), as before, is an
ephemeral one and could be. Falls back to bind(0) where the ephemeral range starts too low to
leave room below it.
"""
import random
import socket


def free_port():
    lo, hi = 20000, 32767
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = min(hi, int(f.read().split()[0]) - 1)
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200 if hi > lo else 0):
        port = random.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    print(free_port())
