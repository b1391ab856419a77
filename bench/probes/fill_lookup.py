#!/usr/bin/env python3
"""What the fill lookup costs SecantusDB beside a history, by its two shapes.

Starts its own secantusd-rs (path in $PALLETD_SECANTUSD, else the cache
scripts/test installs to) on a free port. For 2,048 sensors, first with
no history, then with HOURS (default 240) sealed hourly buckets each
stored, plus an open bucket of the current hour for every other sensor,
it times (seconds, three times each):

- by key: `sensorId $in` x `startTs $in` of the current hour on
  `{sensorId, startTs}` (palletd's fill lookup before it went by `_id`,
  and still its resolve lookup)
- by _id: `_id $in` of the first four sequence numbers of each sensor's
  current window (8,192 ids), what palletd sends now

Needs pymongo (pip install pymongo). Usage: bench/probes/fill_lookup.py [HOURS]
"""
import sys
import time

from secantus import dt, server

SENSORS, H = 2048, 3_600_000


def timed(query):
    started = time.time()
    found = len(list(query()))
    return time.time() - started, found


def main():
    hours = int(sys.argv[1]) if len(sys.argv) > 1 else 240
    with server() as client:
        now = int(time.time() * 1000) // H * H
        names = [f"s{i:05}" for i in range(SENSORS)]
        print("| buckets per sensor | by key (s) | by _id (s) | found |")
        print("|---:|---|---|---:|")
        for stored in (0, hours):
            coll = client.probe[f"h{stored}"]
            coll.create_index([("sensorId", 1), ("startTs", 1)])
            coll.create_index([("closed", 1), ("endTs", 1)])
            docs = []
            for h in range(1, stored + 1):
                start = now - h * H
                for name in names:
                    docs.append({"_id": f"{name}|{start}|0", "sensorId": name,
                                 "startTs": dt(start), "endTs": dt(start + H), "closed": True,
                                 "count": 1, "size": 200,
                                 "samples": [{"ts": dt(start), "temp": 1.0}]})
                    if len(docs) == 10_000:
                        coll.insert_many(docs)
                        docs = []
            if docs:
                coll.insert_many(docs)
            coll.insert_many([{"_id": f"{n}|{now}|0", "sensorId": n, "startTs": dt(now),
                               "closed": False, "count": 1, "size": 200} for n in names[::2]])
            fields = {"_id": 1, "sensorId": 1, "startTs": 1, "count": 1, "size": 1, "closed": 1}
            by_key = [timed(lambda: coll.find(
                {"sensorId": {"$in": names}, "startTs": {"$in": [dt(now)]}}, fields))
                for _ in range(3)]
            ids = [f"{n}|{now}|{q}" for n in names for q in range(4)]
            by_id = [timed(lambda: coll.find({"_id": {"$in": ids}}, fields)) for _ in range(3)]
            print(f"| {stored} | " + ", ".join(f"{t:.3f}" for t, _ in by_key) + " | "
                  + ", ".join(f"{t:.3f}" for t, _ in by_id) + f" | {by_id[0][1]} |", flush=True)


if __name__ == "__main__":
    main()
