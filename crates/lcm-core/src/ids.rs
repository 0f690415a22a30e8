//! Typed, human-readable identifiers.
//!
//! Every id is a prefix naming its kind followed by a decimal number: `msg_1042`, `ses_3`,
//! `sum_17`, `file_2`, `job_5`. Numbers are allocated by the store in append order, so ids are
//! stable for the life of a database, sort in creation order, and are short enough for a model to
//! copy. Parsing is strict: a wrong prefix, an empty or non-decimal number, or a value that does
//! not fit in 64 bits is an [`IdError`] that says exactly what was wrong.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("`{input}` is not an lcm id: expected one of msg_N, ses_N, sum_N, file_N, job_N")]
    UnknownPrefix { input: String },
    #[error("`{input}` is not a {kind} id: expected `{prefix}` followed by a decimal number")]
    WrongKind {
        input: String,
        kind: &'static str,
        prefix: &'static str,
    },
    #[error(
        "`{input}` has no valid number after `{prefix}` (expected decimal digits, at most 2^64-1)"
    )]
    BadNumber { input: String, prefix: &'static str },
}

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash,
            bincode::Encode, bincode::Decode,
        )]
        pub struct $name(pub u64);

        impl $name {
            /// The prefix of this kind of id, including the underscore.
            pub const PREFIX: &'static str = $prefix;
            /// The number behind the id.
            pub fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(input: &str) -> Result<Self, IdError> {
                let Some(rest) = input.strip_prefix($prefix) else {
                    return Err(if known_prefix(input).is_some() {
                        IdError::WrongKind { input: input.to_owned(), kind: $kind, prefix: $prefix }
                    } else {
                        IdError::UnknownPrefix { input: input.to_owned() }
                    });
                };
                parse_number(rest).map($name).ok_or_else(|| IdError::BadNumber {
                    input: input.to_owned(),
                    prefix: $prefix,
                })
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

typed_id!(
    /// A stored message: `msg_N`, unique across the whole store.
    MessageId, "msg_", "message"
);
typed_id!(
    /// A session (one conversation): `ses_N`.
    SessionId, "ses_", "session"
);
typed_id!(
    /// A summary node of the DAG: `sum_N`.
    SummaryId, "sum_", "summary"
);
typed_id!(
    /// A large file kept outside the context: `file_N`.
    FileId, "file_", "file"
);
typed_id!(
    /// An operator job (llm_map / agentic_map): `job_N`.
    JobId, "job_", "job"
);

const PREFIXES: [&str; 5] = ["msg_", "ses_", "sum_", "file_", "job_"];

fn known_prefix(input: &str) -> Option<&'static str> {
    PREFIXES.into_iter().find(|p| input.starts_with(p))
}

/// Decimal digits only (no sign, no whitespace), fitting in u64.
fn parse_number(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Any lcm id, for commands that accept "an id" (`lcm show <id>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnyId {
    Message(MessageId),
    Session(SessionId),
    Summary(SummaryId),
    File(FileId),
    Job(JobId),
}

impl FromStr for AnyId {
    type Err = IdError;
    fn from_str(input: &str) -> Result<Self, IdError> {
        let input = input.trim();
        let bad = |prefix| IdError::BadNumber {
            input: input.to_owned(),
            prefix,
        };
        let Some(prefix) = known_prefix(input) else {
            return Err(IdError::UnknownPrefix {
                input: input.to_owned(),
            });
        };
        let n = parse_number(&input[prefix.len()..]).ok_or_else(|| bad(prefix))?;
        Ok(match prefix {
            "msg_" => AnyId::Message(MessageId(n)),
            "ses_" => AnyId::Session(SessionId(n)),
            "sum_" => AnyId::Summary(SummaryId(n)),
            "file_" => AnyId::File(FileId(n)),
            _ => AnyId::Job(JobId(n)),
        })
    }
}

impl fmt::Display for AnyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyId::Message(id) => id.fmt(f),
            AnyId::Session(id) => id.fmt(f),
            AnyId::Summary(id) => id.fmt(f),
            AnyId::File(id) => id.fmt(f),
            AnyId::Job(id) => id.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_render_and_parse_back() {
        assert_eq!(MessageId(42).to_string(), "msg_42");
        assert_eq!("msg_42".parse::<MessageId>(), Ok(MessageId(42)));
        assert_eq!("file_7".parse::<AnyId>(), Ok(AnyId::File(FileId(7))));
        assert_eq!(
            "sum_18446744073709551615".parse::<SummaryId>(),
            Ok(SummaryId(u64::MAX))
        );
    }

    #[test]
    fn garbage_is_rejected_with_a_clear_error() {
        let err = "hello".parse::<MessageId>().unwrap_err();
        assert!(matches!(err, IdError::UnknownPrefix { .. }), "{err}");
        assert!(err.to_string().contains("not an lcm id"));

        let err = "sum_3".parse::<MessageId>().unwrap_err();
        assert!(
            matches!(
                err,
                IdError::WrongKind {
                    kind: "message",
                    ..
                }
            ),
            "{err}"
        );

        for bad in [
            "msg_",
            "msg_-1",
            "msg_+1",
            "msg_1a",
            "msg_ 1",
            "msg_18446744073709551616",
        ] {
            let err = bad.parse::<MessageId>().unwrap_err();
            assert!(matches!(err, IdError::BadNumber { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn serde_uses_the_text_form() {
        let json = serde_json::to_string(&MessageId(9)).unwrap();
        assert_eq!(json, "\"msg_9\"");
        let back: MessageId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, MessageId(9));
        assert!(serde_json::from_str::<MessageId>("\"ses_9\"").is_err());
    }

    proptest! {
        #[test]
        fn any_number_round_trips(n in any::<u64>()) {
            prop_assert_eq!(MessageId(n).to_string().parse::<MessageId>(), Ok(MessageId(n)));
            prop_assert_eq!(SessionId(n).to_string().parse::<AnyId>(), Ok(AnyId::Session(SessionId(n))));
        }

        #[test]
        fn parsing_never_panics(s in ".{0,40}") {
            let _ = s.parse::<AnyId>();
            let _ = s.parse::<MessageId>();
        }
    }
}
