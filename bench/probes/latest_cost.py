#!/usr/bin/env python3
"""What a latest-value statement costs SecantusDB, by its form.

Starts its own secantusd-rs (see secantus.py). For SENSORS (default 2,000)
sensors whose `<collection>_latest` document exists, it times commands of
1,000 statements, each sensor once per round, newer samples each round:

- pipeline: palletd's statement (a pipeline `$set` of `ts`, `sample` and
  `updatedAt`, each a `$cond` on the sample being newer), with and
  without the `{ts: 1}` index;
- filter: `{_id, ts: {$lt: new}}` with a plain `$set` and no upsert (the
  sensor's document exists; a missing one would need the insert apart);
- and, for scale, palletd's bucket upsert of 50 samples into a bucket of
  100 (push_cost.py's shape).

Needs pymongo. Usage: bench/probes/latest_cost.py [SENSORS]
"""
import sys
import time

from pymongo import UpdateOne

from secantus import dt, server

ROUNDS = 3


def sample(ms, i):
    return {"ts": dt(ms), "temp": 20.0 + i / 10, "hum": 40.0 + i / 20, "pres": 1000.0 + i / 30}


def pipeline(sensor, ms, i):
    ts = dt(ms)
    newer = {"$gt": [ts, {"$ifNull": ["$ts", None]}]}
    pick = lambda new, old: {"$cond": [newer, new, old]}
    return UpdateOne({"_id": sensor}, [{"$set": {
        "ts": pick(ts, "$ts"),
        "sample": pick({"$literal": sample(ms, i)}, "$sample"),
        "updatedAt": pick("$$NOW", "$updatedAt")}}], upsert=True)


def filtered(sensor, ms, i):
    return UpdateOne({"_id": sensor, "ts": {"$lt": dt(ms)}},
                     {"$set": {"ts": dt(ms), "sample": sample(ms, i)},
                      "$currentDate": {"updatedAt": True}})


def timed(coll, make, sensors, base):
    took = 0.0
    for r in range(ROUNDS):
        ops = [make(f"s{s:05}", base + (r + 1) * 10_000 + s, r) for s in range(sensors)]
        started = time.time()
        for i in range(0, len(ops), 1000):
            coll.bulk_write(ops[i:i + 1000], ordered=False)
        took += time.time() - started
    return took / (ROUNDS * sensors)


def main():
    sensors = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    base = int(time.time() * 1000)
    with server() as client:
        print("| statement | ms per statement |")
        print("|---|---:|")
        for name, make, index in (("pipeline, ts index", pipeline, True),
                                  ("pipeline, no index", pipeline, False),
                                  ("filter on ts, $set, ts index", filtered, True)):
            coll = client.probe[name.split(",")[0] + str(index)]
            if index:
                coll.create_index("ts")
            coll.insert_many([{"_id": f"s{s:05}", "ts": dt(base), "sample": sample(base, 0),
                               "updatedAt": dt(base)} for s in range(sensors)])
            print(f"| {name} | {timed(coll, make, sensors, base) * 1000:.3f} |")
        # The bucket statement it rides along with: 50 samples into 100.
        coll = client.probe.buckets
        start = base // 3_600_000 * 3_600_000
        coll.insert_many([{"_id": f"s{s:05}", "closed": False, "count": 100, "size": 6000,
                           "samples": [sample(start + j, j) for j in range(100)]}
                          for s in range(sensors)])
        ops = [UpdateOne({"_id": f"s{s:05}", "closed": False, "count": {"$lte": 150}},
                         {"$push": {"samples": {"$each": [sample(start + 100 + j, j)
                                                          for j in range(50)]}},
                          "$inc": {"count": 50, "size": 3000, "sum.temp": 1.0, "n.temp": 50},
                          "$min": {"min.temp": 20.0}, "$max": {"max.temp": 21.0}},
                         upsert=True) for s in range(sensors)]
        started = time.time()
        for i in range(0, len(ops), 1000):
            coll.bulk_write(ops[i:i + 1000], ordered=False)
        took = (time.time() - started) / sensors
        print(f"| bucket upsert, 50 samples into 100 | {took * 1000:.3f} |")


if __name__ == "__main__":
    main()
