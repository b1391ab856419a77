#!/usr/bin/env python3
"""What reading one sensor through the flat view costs SecantusDB, against
the same readings from its buckets.

Starts its own secantusd-rs (path in $PALLETD_SECANTUSD, else the cache
scripts/test installs to) on a free port. Stores SENSORS (default 1,000)
sensors x 24 hourly buckets of 200 samples (three fields) with palletd's
index, makes palletd's view `<collection>_flat` (its pipeline as
`src/store/buckets.rs` builds it), then times, three times each (seconds):

- view, sensor: `find({sensorId})` on the view, sorted by ts
- view, sensor + hour: the same with `ts` within one hour
- buckets, sensor + hour: `{sensorId, startTs}` on the buckets, unwound in
  the aggregation the README shows (what `palletd query` reads)

Needs pymongo (pip install pymongo). Usage: bench/probes/flat_view.py [SENSORS]
"""
import sys
import time

from secantus import dt, server

H = 3_600_000
PIPELINE = [
    {"$unwind": "$samples"},
    {"$replaceWith": {"$mergeObjects": [{"sensorId": "$sensorId"}, "$samples"]}},
]


def timed(run):
    best = None
    for _ in range(3):
        started = time.time()
        n = len(list(run()))
        took = time.time() - started
        best = took if best is None else min(best, took)
    return best, n


def main():
    sensors = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with server() as client:
        db = client.probe
        coll = db.readings
        coll.create_index([("sensorId", 1), ("startTs", 1)])
        t0 = int(time.time() * 1000) // H * H - 24 * H
        for s in range(sensors):
            docs = []
            for h in range(24):
                start = t0 + h * H
                samples = [{"ts": dt(start + i * 18_000), "temp": 20.0 + i / 10,
                            "hum": 40.0, "pres": 1000.0} for i in range(200)]
                docs.append({"_id": f"s{s:05}|{start}|0", "sensorId": f"s{s:05}",
                             "startTs": dt(start), "endTs": dt(start + H),
                             "count": 200, "closed": True, "samples": samples})
            coll.insert_many(docs)
        db.command({"create": "readings_flat", "viewOn": "readings", "pipeline": PIPELINE})
        sensor, hour = f"s{sensors // 2:05}", t0 + 12 * H
        view = db.readings_flat
        rows = [
            ("view, sensor (4,800 readings)",
             lambda: view.find({"sensorId": sensor}).sort("ts", 1)),
            ("view, sensor + hour (200)",
             lambda: view.find({"sensorId": sensor,
                                "ts": {"$gte": dt(hour), "$lt": dt(hour + H)}}).sort("ts", 1)),
            ("buckets, sensor + hour (200)",
             lambda: coll.aggregate([
                 {"$match": {"sensorId": sensor, "startTs": {"$gte": dt(hour), "$lt": dt(hour + H)}}},
                 *PIPELINE, {"$sort": {"ts": 1}}])),
        ]
        print(f"{sensors} sensors x 24 buckets of 200 samples")
        print("| read | seconds (best of 3) | readings |")
        print("|---|---:|---:|")
        for name, run in rows:
            took, n = timed(run)
            print(f"| {name} | {took:.3f} | {n} |")


if __name__ == "__main__":
    main()
