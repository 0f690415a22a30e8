//! Timestamps: milliseconds since the Unix epoch, UTC, rendered as RFC 3339.

use std::fmt;

/// A point in time with millisecond precision (what transcripts carry).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, bincode::Encode, bincode::Decode,
)]
pub struct Timestamp(pub i64);

/// Why a string is not a timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{input}` is not a timestamp: expected RFC 3339 (2026-02-10T21:11:56.846Z) or a date (2026-02-10)"
)]
pub struct TimestampError {
    pub input: String,
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        Timestamp(chrono::Utc::now().timestamp_millis())
    }

    /// Milliseconds since the epoch.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// Parses RFC 3339 (`2026-02-10T21:11:56.846Z`, any offset) or a bare date (`2026-02-10`,
    /// midnight UTC), or `@{ms}ms`, the form [`Display`](fmt::Display) writes for times RFC 3339
    /// cannot (before year 0 or after year 9999), so that every written time reads back.
    pub fn parse(input: &str) -> Result<Self, TimestampError> {
        let trimmed = input.trim();
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(trimmed) {
            return Ok(Timestamp(t.timestamp_millis()));
        }
        if let Some(millis) = trimmed
            .strip_prefix('@')
            .and_then(|rest| rest.strip_suffix("ms"))
            .and_then(|millis| millis.parse().ok())
        {
            return Ok(Timestamp(millis));
        }
        if let Ok(d) = chrono::NaiveDate::parse_from_str(trimmed, "%Y-%m-%d")
            && let Some(t) = d.and_hms_opt(0, 0, 0)
        {
            return Ok(Timestamp(t.and_utc().timestamp_millis()));
        }
        Err(TimestampError {
            input: input.to_owned(),
        })
    }
}

/// RFC 3339 (`2026-02-10T21:11:56.846Z`) for years 0 to 9999; `@{ms}ms` outside them, where
/// RFC 3339 has no form (chrono would write `+10000-01-01...`, which no RFC 3339 parser reads).
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match chrono::DateTime::from_timestamp_millis(self.0) {
            Some(t) if (0..=9999).contains(&chrono::Datelike::year(&t)) => {
                write!(f, "{}", t.format("%Y-%m-%dT%H:%M:%S%.3fZ"))
            }
            _ => write!(f, "@{}ms", self.0),
        }
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_transcript_timestamps_and_renders_them_back() {
        let t = Timestamp::parse("2026-02-10T21:11:56.846Z").unwrap();
        assert_eq!(t.to_string(), "2026-02-10T21:11:56.846Z");
        let offset = Timestamp::parse("2026-02-10T22:11:56.846+01:00").unwrap();
        assert_eq!(t, offset);
        let day = Timestamp::parse("2026-02-10").unwrap();
        assert!(day < t);
    }

    #[test]
    fn every_time_written_reads_back() {
        // Found by fuzzing (lcm_line): a message dated after year 9999 was exported as
        // `+10000-01-01T00:00:00.000Z`, which the importer refused.
        for millis in [
            0,
            -1,
            253_402_300_799_999,
            253_402_300_800_000,
            -62_167_219_200_001,
            8_210_266_876_799_999,
            i64::MAX,
            i64::MIN,
        ] {
            let t = Timestamp(millis);
            assert_eq!(Timestamp::parse(&t.to_string()), Ok(t), "{millis}: {t}");
        }
        assert_eq!(
            Timestamp(253_402_300_800_000).to_string(),
            "@253402300800000ms"
        );
        assert_eq!(
            Timestamp(253_402_300_799_999).to_string(),
            "9999-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn rejects_garbage() {
        let err = Timestamp::parse("yesterday").unwrap_err();
        assert!(err.to_string().contains("RFC 3339"));
    }
}
