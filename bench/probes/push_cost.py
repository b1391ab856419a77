#!/usr/bin/env python3
"""What one of palletd's upserts costs SecantusDB by how full its bucket is.

Starts its own secantusd-rs (path in $PALLETD_SECANTUSD, else the cache
scripts/test installs to) on a free port. For SENSORS (default 2,000)
buckets already holding N samples (three fields, about 60 bytes each), it
times commands of 1,000 upserts of palletd's shape (filter by `_id`,
`closed` and the caps; `$push` of K = 5 samples, `$inc`, `$min`, `$max`,
an LSN pair), each bucket once, and prints statements per second by N.

Needs pymongo (pip install pymongo). Usage: bench/probes/push_cost.py [SENSORS]
"""
import sys
import time

from pymongo import UpdateOne

from secantus import dt, server

K = 5


def samples(start_ms, n):
    return [{"ts": dt(start_ms + i * 2000), "temp": 20.0 + i / 10, "hum": 40.0 + i / 20,
             "pres": 1000.0 + i / 30} for i in range(n)]


def statement(sensor, start_ms, n, lsn):
    new = samples(start_ms + n * 2000, K)
    return UpdateOne(
        {"_id": f"{sensor}|{start_ms}|0", "closed": False, "count": {"$lte": 200 - K},
         "size": {"$lte": 262144 - 300}},
        {"$push": {"samples": {"$each": new}, "lsns.s00000001": [lsn, lsn + K - 1]},
         "$inc": {"count": K, "size": K * 60, "sum.temp": 100.0, "sum.hum": 200.0,
                  "sum.pres": 5000.0, "n.temp": K, "n.hum": K, "n.pres": K},
         "$min": {"min.temp": 20.0, "min.hum": 40.0, "min.pres": 1000.0, "minTs": new[0]["ts"]},
         "$max": {"max.temp": 21.0, "max.hum": 41.0, "max.pres": 1001.0, "maxTs": new[-1]["ts"]},
         "$setOnInsert": {"sensorId": sensor, "startTs": dt(start_ms),
                          "endTs": dt(start_ms + 3_600_000)}},
        upsert=True)


def main():
    sensors = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with server() as client:
        print("| samples in the bucket | statements/s | ms per statement |")
        print("|---:|---:|---:|")
        for n in (195, 150, 100, 50, 0):
            coll = client.probe[f"n{n}"]
            start = int(time.time() * 1000) // 3_600_000 * 3_600_000
            if n:
                coll.insert_many([
                    {"_id": f"s{s:05}|{start}|0", "sensorId": f"s{s:05}", "startTs": dt(start),
                     "endTs": dt(start + 3_600_000), "closed": False, "count": n,
                     "size": n * 60, "samples": samples(start, n),
                     "lsns": {"s00000001": [[i, i] for i in range(0, n, K)]}}
                    for s in range(sensors)])
            ops = [statement(f"s{s:05}", start, n, 10_000 + s) for s in range(sensors)]
            started = time.time()
            for i in range(0, len(ops), 1000):
                coll.bulk_write(ops[i:i + 1000], ordered=True)
            took = time.time() - started
            print(f"| {n} | {sensors / took:,.0f} | {took * 1000 / sensors:.2f} |")
        # The same new buckets as plain inserts of the document the upsert
        # would make.
        coll = client.probe.insert
        start = int(time.time() * 1000) // 3_600_000 * 3_600_000
        docs = [{"_id": f"s{s:05}|{start}|0", "sensorId": f"s{s:05}", "startTs": dt(start),
                 "endTs": dt(start + 3_600_000), "closed": False, "count": K,
                 "size": K * 60, "samples": samples(start, K),
                 "lsns": {"s00000001": [[1, K]]}, "sum": {"temp": 100.0}, "n": {"temp": K},
                 "min": {"temp": 20.0}, "max": {"temp": 21.0}} for s in range(sensors)]
        started = time.time()
        for i in range(0, len(docs), 1000):
            coll.insert_many(docs[i:i + 1000], ordered=True)
        took = time.time() - started
        print(f"| 0, as an insert | {sensors / took:,.0f} | {took * 1000 / sensors:.2f} |")


if __name__ == "__main__":
    main()
