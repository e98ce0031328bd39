//! Wall-clock instants (ms since the epoch) as people and documents read them, in UTC.

/// `ms` since the epoch as RFC 3339 UTC with milliseconds (`2026-11-30T06:59:01.123Z`), as
/// receipts and ledgers write it.
///
/// ```
/// assert_eq!(agentbox_core::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
/// ```
pub fn rfc3339(ms: i64) -> String {
    format!("{}.{:03}Z", utc(ms, "%Y-%m-%dT%H:%M:%S"), ms.rem_euclid(1000))
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS` in UTC, as a listing shows it.
///
/// ```
/// assert_eq!(agentbox_core::utc_seconds(1_796_013_600_123), "2026-11-30 04:40:00");
/// ```
pub fn utc_seconds(ms: i64) -> String {
    utc(ms, "%Y-%m-%d %H:%M:%S")
}

/// `t` as milliseconds since the epoch (negative before it), for the functions above.
///
/// ```
/// let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1500);
/// assert_eq!(agentbox_core::epoch_ms(t), 1500);
/// ```
pub fn epoch_ms(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// An HTTP date (`Last-Modified`) of `ms` since the epoch: `Sun, 06 Nov 1994 08:49:37 GMT`.
///
/// ```
/// assert_eq!(agentbox_core::http_date(784_111_777_000), "Sun, 06 Nov 1994 08:49:37 GMT");
/// ```
pub fn http_date(ms: i64) -> String {
    utc(ms, "%a, %d %b %Y %H:%M:%S GMT")
}

/// `ms` since the epoch in UTC, to the second, as `format` (jiff's strftime) writes it; an
/// instant past jiff's range (years -9999 to 9999) is written as the range's end.
fn utc(ms: i64, format: &str) -> String {
    let t = jiff::Timestamp::from_second(ms.div_euclid(1000)).unwrap_or(if ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    t.strftime(format).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(1_796_013_600_123), "2026-11-30T04:40:00.123Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::utc_seconds(-1), "1969-12-31 23:59:59");
    }
}
