//! Wall-clock instants (ms since the epoch) as people and documents read them, in UTC.

/// `ms` since the epoch as RFC 3339 UTC with milliseconds (`2026-11-30T06:59:01.123Z`), as
/// receipts and ledgers write it.
///
/// ```
/// assert_eq!(agentbox_core::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
/// ```
pub fn rfc3339(ms: i64) -> String {
    let (y, m, d, rest) = civil(ms);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        (rest / 60) % 60,
        rest % 60,
        ms.rem_euclid(1000)
    )
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS` in UTC, as a listing shows it.
///
/// ```
/// assert_eq!(agentbox_core::utc_seconds(1_796_013_600_123), "2026-11-30 04:40:00");
/// ```
pub fn utc_seconds(ms: i64) -> String {
    let (y, m, d, rest) = civil(ms);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        (rest / 60) % 60,
        rest % 60
    )
}

/// Year, month, day and the second of that day: Howard Hinnant's days-to-civil, the
/// proleptic Gregorian date of a day number.
fn civil(ms: i64) -> (i64, i64, i64, i64) {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rest)
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
