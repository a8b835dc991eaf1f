"""A bounded TCP throughput probe between two emulated hosts (one stream, like iperf -P 1).

``python -m dlcomm.tools.emulation.tcp_probe recv PORT MAX_BYTES TIMEOUT_S`` listens on the
emulated subnet and prints one JSON line (bytes received, seconds from first to last byte);
``... send ADDRESS PORT BYTES TIMEOUT_S`` streams BYTES of zeros. Both stop at their byte
bound or their time bound, whichever comes first, and only ever bind or connect to
198.18.0.0/15 addresses, so the probe cannot touch a real network.
"""
from __future__ import annotations

import ipaddress
import json
import socket
import sys
import time

EMULATED_RANGE = ipaddress.ip_network("198.18.0.0/15")
CHUNK_BYTES = 1 << 20


def _check_address(address: str) -> None:
    if ipaddress.ip_address(address) not in EMULATED_RANGE:
        raise ValueError(f"{address} is outside {EMULATED_RANGE}: the probe only runs emulated")


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def receive(bind_address: str, port: int, max_bytes: int, timeout_s: float) -> dict:
    """Accept one connection on ``bind_address:port``; count bytes until EOF, bound or timeout."""
    _check_address(bind_address)
    _positive("max_bytes", max_bytes)
    _positive("timeout_s", timeout_s)
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((bind_address, port))
        server.listen(1)
        print(json.dumps({"listening": port}), flush=True)
        server.settimeout(timeout_s)
        conn, _ = server.accept()
        with conn:
            received = 0
            first = last = None
            buffer = bytearray(CHUNK_BYTES)
            while received < max_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                conn.settimeout(remaining)
                try:
                    n = conn.recv_into(buffer)
                except TimeoutError:
                    break
                if n == 0:
                    break
                last = time.perf_counter()
                if first is None:
                    first = last
                received += n
    seconds = (last - first) if first is not None and last is not None else 0.0
    return {"bytes": received, "seconds": seconds,
            "bits_per_s": received * 8 / seconds if seconds > 0 else 0.0}


def send(address: str, port: int, total_bytes: int, timeout_s: float) -> dict:
    """Connect to ``address:port`` and send ``total_bytes`` zeros, stopping at ``timeout_s``."""
    _check_address(address)
    _positive("total_bytes", total_bytes)
    _positive("timeout_s", timeout_s)
    deadline = time.monotonic() + timeout_s
    payload = bytes(CHUNK_BYTES)
    sent = 0
    with socket.create_connection((address, port), timeout=timeout_s) as conn:
        while sent < total_bytes and time.monotonic() < deadline:
            view = memoryview(payload)[: min(CHUNK_BYTES, total_bytes - sent)]
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                conn.sendall(view)
            except TimeoutError:
                break
            sent += len(view)
    return {"bytes_sent": sent}


def main(argv: list[str] | None = None) -> int:
    """``recv BIND PORT MAX_BYTES TIMEOUT`` or ``send ADDR PORT BYTES TIMEOUT``."""
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: emulate_tcp_probe recv BIND_ADDRESS PORT MAX_BYTES TIMEOUT_S | "
             "send ADDRESS PORT BYTES TIMEOUT_S")
    if len(args) != 5 or args[0] not in ("recv", "send"):
        print(usage, file=sys.stderr)
        return 2
    mode, address, port, amount, timeout = args
    if mode == "recv":
        result = receive(address, int(port), int(amount), float(timeout))
    else:
        result = send(address, int(port), int(amount), float(timeout))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
