//! # lcm-regex
//!
//! What lcm's grep knows about a regex before it reads anything, computed from the pattern
//! alone:
//! - [`trigram`]: the trigram query a match implies (which trigrams every match contains), for
//!   narrowing a search to the messages an index says can match;
//! - [`required`]: literals every match must contain, searched for before the regex runs;
//! - [`start_classes`]: the bytes a match can start with, for a regex without a literal, and
//!   [`start_classes::StartSearch`], the search for a match's earliest end that uses both.
//!
//! Architecture invariant: pure functions of a pattern (and of the bytes searched). No
//! storage, no index, no I/O; the only dependencies are `regex-syntax` and `regex-automata`.

pub mod required;
pub mod start_classes;
pub mod trigram;
