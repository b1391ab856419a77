#!/usr/bin/env python3
"""What one statement of each shape palletd could send costs SecantusDB.

Starts its own secantusd-rs (path in $PALLETD_SECANTUSD, else the cache
scripts/test installs to) on a free port, then writes 9,000 one-sample
buckets (3 sensors x 3,000 hourly windows) in commands of 1,000, fresh
collection per shape, three rounds, and prints statements per second:

- probe: the bench's yardstick (one field, sensorId/startTs in the filter)
- routed: palletd's upsert through mongos (three fields, first/last, an
  LSN pair; sensorId and startTs as equalities in the filter)
- direct: the same upsert off a cluster (_id, closed and the caps only;
  sensorId and startTs in $setOnInsert), what palletd sends
- insert: the same bucket as a whole document in an `insert` command
- rollup key: the upsert a flush records per (rollup, sensor, interval)

Needs pymongo (pip install pymongo). Usage: bench/probes/statement_shapes.py
"""
import time

from secantus import dt, server

N, H, FIELDS = 9000, 3_600_000, ["temp", "hum", "pres"]


def bucket(i):
    sensor, start = f"p{i % 3}", (i // 3) * H
    vals = {f: 1.5 + k for k, f in enumerate(FIELDS)}
    return sensor, start, dt(start), vals


def upsert(i, shard_key):
    sensor, start, ts, vals = bucket(i)
    q = {"_id": f"{sensor}|{start}|0"}
    on_insert = {}
    (q if shard_key else on_insert).update({"sensorId": sensor, "startTs": ts})
    on_insert["endTs"] = dt(start + H)
    q.update({"closed": False, "count": {"$lte": 199}, "size": {"$lte": 262000}})
    u = {
        "$push": {"samples": {"$each": [{"ts": ts, **vals}]}, "lsns.s0000abcd": {"$each": [i, i]}},
        "$inc": {"count": 1, "size": 300, **{f"sum.{f}": v for f, v in vals.items()},
                 **{f"n.{f}": 1 for f in FIELDS}},
        "$min": {"minTs": ts, **{f"min.{f}": v for f, v in vals.items()},
                 **{f"first.{f}": {"t": ts, "v": v} for f, v in vals.items()}},
        "$max": {"maxTs": ts, **{f"max.{f}": v for f, v in vals.items()},
                 **{f"last.{f}": {"t": ts, "v": v} for f, v in vals.items()}},
        "$setOnInsert": on_insert,
    }
    return {"q": q, "u": u, "upsert": True}


def document(i):
    sensor, start, ts, vals = bucket(i)
    edge = {f: {"t": ts, "v": v} for f, v in vals.items()}
    return {"_id": f"{sensor}|{start}|0", "sensorId": sensor, "startTs": ts,
            "endTs": dt(start + H), "closed": False, "count": 1, "size": 300,
            "minTs": ts, "maxTs": ts, "samples": [{"ts": ts, **vals}],
            "lsns": {"s0000abcd": [i, i]}, "sum": dict(vals), "n": {f: 1 for f in FIELDS},
            "min": dict(vals), "max": dict(vals), "first": edge, "last": dict(edge)}


def probe(i):
    sensor, start, ts, _ = bucket(i)
    return {"q": {"_id": f"{sensor}|{start}|0", "sensorId": sensor, "startTs": ts,
                  "closed": False, "count": {"$lte": 199}, "size": {"$lte": 262000}},
            "u": {"$push": {"samples": {"$each": [{"ts": ts, "temp": 1.5}]}},
                  "$inc": {"count": 1, "size": 40, "sum.temp": 1.5, "n.temp": 1},
                  "$min": {"min.temp": 1.5}, "$max": {"max.temp": 1.5},
                  "$setOnInsert": {"endTs": ts}},
            "upsert": True}


def key(i):
    sensor, start, ts, _ = bucket(i)
    return {"q": {"_id": f"1h|{start}|{sensor}"},
            "u": {"$set": {"due": dt(start + H), "r": "1h", "s": sensor, "t": ts},
                  "$inc": {"v": 1}},
            "upsert": True}


SHAPES = {
    "probe": ("update", "updates", probe, True),
    "routed": ("update", "updates", lambda i: upsert(i, True), True),
    "direct": ("update", "updates", lambda i: upsert(i, False), True),
    "insert": ("insert", "documents", document, False),
    "rollup key": ("update", "updates", key, False),
}


def rate(db, name, shape, rnd):
    command, field, make, ordered = SHAPES[shape]
    coll = f"{name}{rnd}"
    db[coll].drop()
    if shape == "rollup key":
        db[coll].create_index([("due", 1)])
    else:
        db[coll].create_index([("sensorId", 1), ("startTs", 1)])
        db[coll].create_index([("closed", 1), ("endTs", 1)])
    started = time.time()
    for k in range(0, N, 1000):
        db.command({command: coll, field: [make(i) for i in range(k, k + 1000)],
                    "ordered": ordered})
    return N / (time.time() - started)


def main():
    with server() as client:
        db = client.probe
        print("| round | " + " | ".join(SHAPES) + " |")
        print("|---:|" + "---:|" * len(SHAPES))
        for rnd in range(3):
            rates = [rate(db, shape.replace(" ", "_"), shape, rnd) for shape in SHAPES]
            print(f"| {rnd + 1} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |", flush=True)


if __name__ == "__main__":
    main()
