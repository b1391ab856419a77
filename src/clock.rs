//! The wall clock, in the one unit palletd uses for time stamps:
//! milliseconds since the Unix epoch (BSON dates have millisecond
//! precision). Sans-IO parts never read it: they take `now_ms` as an
//! argument, so their tests choose the time.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Microseconds since the Unix epoch (a fresh spool starts its LSNs here).
pub(crate) fn now_us() -> u64 {
    chrono::Utc::now().timestamp_micros().max(0) as u64
}

/// `ms` as RFC 3339 with milliseconds, UTC (`2026-08-20T14:00:03.000Z`).
pub fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms}ms"))
}
