#!/usr/bin/env python3
"""What Mosquitto does with a shared-group member's unacknowledged
messages when that member's connection drops: kept in its session and
resent to it (DUP, same packet id) when it returns, or redispatched to
another member of the group (a new packet id there)?

Starts its own Mosquitto (persistence off, max_inflight_messages 20),
connects two members A and B of $share/g/probe/t (QoS 1, clean session
off, manual acknowledgements), publishes 20 QoS 1 messages, A never
acknowledges its share, then A's socket is closed without DISCONNECT.
Prints what B receives in the next 3 s, then what A receives when it
reconnects (session kept), and, in a second round, what B receives when
A comes back with a clean session (its session, and its in-flight
messages, discarded).

Measured with Mosquitto 2.0.11 (2026-12-03): B received nothing of A's
share in either round; A, back with its session kept, got all its
unacknowledged messages again with DUP and their packet ids; back with a
clean session, it got none, and neither did B (the broker dropped them).
So a message whose PUBACK was lost stays with its member: palletd's
redelivery windows are per session.

Needs paho-mqtt (pip install paho-mqtt). Usage:
bench/probes/shared_redispatch.py
"""
import os
import socket
import subprocess
import tempfile
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Member:
    def __init__(self, port, cid, clean=False, ack=True):
        self.got = []
        self.ack = ack
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean, manual_ack=True)
        self.c.on_message = self.on_message
        self.c.connect("127.0.0.1", port, keepalive=60)
        self.c.loop_start()

    def on_message(self, client, userdata, msg):
        self.got.append((msg.payload.decode(), msg.mid, bool(msg.dup)))
        if self.ack:
            client.ack(msg.mid, msg.qos)

    def subscribe(self):
        self.c.subscribe("$share/g/probe/t", qos=1)

    def drop(self):
        # The socket closes without a DISCONNECT: a dying connection.
        self.c.loop_stop()
        self.c.socket().close()


def round_(port, tag, a_returns_clean):
    a = Member(port, f"A{tag}", ack=False)
    b = Member(port, f"B{tag}")
    a.subscribe(); b.subscribe()
    time.sleep(0.5)
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub{tag}")
    pub.connect("127.0.0.1", port); pub.loop_start()
    for i in range(20):
        pub.publish("probe/t", f"{tag}{i}", qos=1).wait_for_publish()
    time.sleep(1)
    print(f"round {tag}: A received (not acknowledged): {[g[0] for g in a.got]}")
    print(f"round {tag}: B received: {[g[0] for g in b.got]}")
    held = [g[0] for g in a.got]
    a.drop()
    b.got.clear()
    time.sleep(3)
    print(f"round {tag}: B received after A's socket dropped (3 s): {[g[0] for g in b.got]}")
    a2 = Member(port, f"A{tag}", clean=a_returns_clean)
    time.sleep(2)
    print(f"round {tag}: A back (clean session {a_returns_clean}) received: {a2.got}")
    print(f"round {tag}: B received meanwhile: {[g[0] for g in b.got]}")
    back = {g[0] for g in a2.got} | {g[0] for g in b.got}
    print(f"round {tag}: of A's {len(held)} unacknowledged, delivered again: {len([h for h in held if h in back])}")
    for m in (a2, b):
        m.c.loop_stop(); m.c.disconnect()
    pub.loop_stop(); pub.disconnect()


def main():
    port = free_port()
    d = tempfile.mkdtemp()
    conf = os.path.join(d, "m.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages 20\n")
    broker = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        print(subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout.splitlines()[0])
        round_(port, "k", False)
        round_(port, "c", True)
    finally:
        broker.terminate(); broker.wait()


main()
