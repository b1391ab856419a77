#!/usr/bin/env python3
"""Which in-flight limit Mosquitto applies to a subscriber that does not
acknowledge: its own `max_inflight_messages` or an MQTT 5 client's Receive
Maximum.

Starts its own Mosquitto (max_inflight_messages WINDOW, default 20;
max_queued_messages 10,000), then for each subscriber kind (MQTT 3.1.1;
MQTT 5 with a Receive Maximum of RECEIVE_MAX, default 1,000) subscribes at
QoS 1 with manual acknowledgements, publishes 2,000 QoS 1 messages and
counts how many the broker delivered before waiting for a PUBACK that
never comes. That count is the window the broker gives the subscriber.

Needs paho-mqtt (pip install paho-mqtt). Usage:
bench/probes/mosquitto_window.py [WINDOW] [RECEIVE_MAX]
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WINDOW = int(sys.argv[1]) if len(sys.argv) > 1 else 20
RECEIVE_MAX = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
MESSAGES = 2000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def delivered(port, protocol):
    """Messages a never-acknowledging subscriber of `protocol` receives."""
    got = []
    sub = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"probe-{protocol}",
        protocol=protocol,
        manual_ack=True,
    )
    sub.on_message = lambda c, u, m: got.append(m.mid)
    props = None
    if protocol == mqtt.MQTTv5:
        props = Properties(PacketTypes.CONNECT)
        props.ReceiveMaximum = RECEIVE_MAX
    sub.connect("127.0.0.1", port, properties=props)
    sub.subscribe("probe/#", qos=1)
    sub.loop_start()
    time.sleep(0.5)
    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{protocol}")
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    for i in range(MESSAGES):
        pub.publish(f"probe/{i % 10}", str(i), qos=1)
    time.sleep(3)
    n = len(got)
    for c in (pub, sub):
        c.loop_stop()
        c.disconnect()
    return n


def main():
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write(
                f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                f"max_inflight_messages {WINDOW}\nmax_queued_messages 10000\n"
            )
        broker = subprocess.Popen(["mosquitto", "-c", conf], stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            v3 = delivered(port, mqtt.MQTTv311)
            v5 = delivered(port, mqtt.MQTTv5)
        finally:
            broker.terminate()
            broker.wait()
    version = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"{version}; max_inflight_messages {WINDOW}; {MESSAGES} QoS 1 messages, none acknowledged")
    print(f"MQTT 3.1.1 subscriber: {v3} delivered before the broker waited")
    print(f"MQTT 5 subscriber, Receive Maximum {RECEIVE_MAX}: {v5} delivered before the broker waited")


if __name__ == "__main__":
    main()
