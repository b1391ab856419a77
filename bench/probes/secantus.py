"""What the probes share: a SecantusDB server of their own, and dates."""
import contextlib
import datetime
import os
import socket
import subprocess
import tempfile

import pymongo


def dt(ms):
    """A BSON date from ms since the epoch."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@contextlib.contextmanager
def server():
    """A pymongo client of a fresh secantusd-rs (path in
    $PALLETD_SECANTUSD, else the cache scripts/test installs to) on a
    free port, stopped at the end."""
    binary = os.environ.get("PALLETD_SECANTUSD") or os.path.expanduser(
        "~/.cache/palletd-test/secantus/bin/secantusd-rs")
    port, data = free_port(), tempfile.mkdtemp()
    proc = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", str(port), "--storage-path", data,
         "--cache-size", "256M", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                                  serverSelectionTimeoutMS=10_000)
    finally:
        proc.terminate()
        proc.wait()
