# The reference implementations' reading of payloads, for
# tests/suite/reference.rs: PyPI's cbor2, msgpack and line-protocol-parser
# (installed by scripts/install-test-services into
# ~/.cache/palletd-test/pyref). Reads one JSON request a line on stdin,
# {"format": "cbor" | "msgpack" | "line_protocol", "hex": ...} or
# {"format": "line_protocol", "text": ...}, and writes one JSON answer a
# line: {"error": why} when the reference refuses the payload, else
# {"leaves": [...]} (CBOR, MessagePack: every leaf of the decoded value
# under its dotted path) or {"lines": [...]} (each line's measurement,
# tags, fields and time, or its error).
import datetime
import decimal
import json
import math
import sys

import cbor2
import line_protocol_parser
import msgpack

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def leaf(path, kind, value=None):
    out = {"path": path, "kind": kind}
    if value is not None:
        out["value"] = value
    return out


def number(path, x):
    if isinstance(x, float) and not math.isfinite(x):
        return leaf(path, "other", repr(x))
    return leaf(path, "num", float(x))


def leaves(path, v, out):
    """Every leaf of a decoded value: num, str, bool, date (milliseconds),
    null, or other (a value with no kind palletd stores: bytes, an
    extension, a tag nobody reads, undefined, a simple value, a
    non-finite number, a map key that is not text)."""
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                out.append(leaf(path, "other", "a map key of type " + type(k).__name__))
                continue
            leaves(path + "." + k if path else k, x, out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            leaves(f"{path}.{i}", x, out)
    elif isinstance(v, cbor2.CBORTag):
        # palletd reads a tag it gives no meaning to as the item it wraps
        # (src/decode/item.rs); cbor2 leaves such a tag to its caller.
        leaves(path, v.value, out)
    elif v is None or v is cbor2.undefined:
        # CBOR's undefined is read as null: no value (item.rs).
        out.append(leaf(path, "null"))
    elif isinstance(v, bool):
        out.append(leaf(path, "bool", v))
    elif isinstance(v, (int, float, decimal.Decimal)):
        out.append(number(path, v))
    elif isinstance(v, str):
        out.append(leaf(path, "str", v))
    elif isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        out.append(leaf(path, "date", (v - EPOCH) // datetime.timedelta(milliseconds=1)))
    elif isinstance(v, msgpack.Timestamp):
        out.append(leaf(path, "date", v.to_unix_nano() // 1_000_000))
    else:
        out.append(leaf(path, "other", type(v).__name__))


def tree(fmt, payload):
    if fmt == "cbor":
        return cbor2.loads(payload)
    return msgpack.unpackb(payload, timestamp=0, strict_map_key=False, raw=False)


def answer(req):
    fmt = req["format"]
    if fmt in ("cbor", "msgpack"):
        try:
            v = tree(fmt, bytes.fromhex(req["hex"]))
        except Exception as e:  # the reference refuses it
            return {"error": f"{type(e).__name__}: {e}"}
        out = []
        leaves("", v, out)
        return {"leaves": out}
    lines = []
    for line in req["text"].split("\n"):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            p = line_protocol_parser.parse_line(line)
        except Exception as e:
            lines.append({"error": f"{type(e).__name__}: {e}"})
            continue
        fields = []
        for k, x in p["fields"].items():
            leaves_of = []
            leaves(k, x, leaves_of)
            fields.extend(leaves_of)
        lines.append(
            {
                "measurement": p["measurement"],
                "tags": p["tags"],
                "fields": fields,
                "time": p.get("time"),
            }
        )
    return {"lines": lines}


for request in sys.stdin:
    sys.stdout.write(json.dumps(answer(json.loads(request))) + "\n")
