//! The message record: lcm's own layout of one stored message, read by slicing.
//!
//! ```text
//! offset  size  field
//!      0     1  layout version (RECORD_VERSION)
//!      1     8  session id            u64 LE
//!      9     8  sequence number       u64 LE
//!     17     8  created at (ms)       i64 LE
//!     25     4  token count           u32 LE
//!     29     1  role                  Role::code
//!     30     1  source format         SourceFormat code
//!     31     1  flags                 bit 0: the host gave an original (kept in `originals`)
//!     32     4  searchable text length u32 LE
//!     36     n  the searchable text, UTF-8 (lcm_core::message::write_search_text)
//!   36+n     …  the source key and the part descriptors (bincode, see RecordTail)
//! ```
//!
//! The header has fixed offsets, so a scan reads a message's scope (session, role, time) and
//! its searchable text without decoding anything, and the text is one contiguous slice: the
//! index tokenises it, regex grep runs on it (as bytes, then checked), snippets are cut from
//! it. Each part is a descriptor that points into that text for its searchable fields (a text
//! part is a span of it, a tool call a span for its name and one for its arguments) and holds
//! its other fields itself, so every text is stored once and an owned [`Message`] is rebuilt
//! by slicing. The original payload a host gave lives in the `originals` table, not here.
//!
//! Every reader of a message record goes through [`RecordView`]; every writer through
//! [`encode`]. Records of the previous layout (bincode of the whole message, store schema 5
//! and older) are rewritten by `record_migration` when such a store is opened
//! writable.

use std::ops::Range;

use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{FieldSpans, Message, Part, Role, SourceFormat, write_search_text};
use lcm_core::time::Timestamp;

use crate::error::{Result, StoreError};

/// The layout version this build writes and reads (the record's first byte). Version 1 was the
/// bincode encoding of the whole message (rewritten by `record_migration`).
pub const RECORD_VERSION: u8 = 2;

const SESSION: usize = 1;
const SEQ: usize = 9;
const CREATED_AT: usize = 17;
const TOKENS: usize = 25;
const ROLE: usize = 29;
const SOURCE: usize = 30;
const FLAGS: usize = 31;
const TEXT_LEN: usize = 32;
/// Bytes before the searchable text.
pub const HEADER_LEN: usize = 36;

const HAS_ORIGINAL: u8 = 1;

/// The codes of [`SourceFormat`] in a record (never reordered: stored).
const SOURCES: [SourceFormat; 3] = [
    SourceFormat::Lcm,
    SourceFormat::ClaudeCode,
    SourceFormat::OpenAiChat,
];

fn source_code(source: SourceFormat) -> u8 {
    match source {
        SourceFormat::Lcm => 0,
        SourceFormat::ClaudeCode => 1,
        SourceFormat::OpenAiChat => 2,
    }
}

/// A byte range of a record's searchable text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
struct TextSpan {
    start: u64,
    len: u64,
}

impl From<Range<usize>> for TextSpan {
    fn from(r: Range<usize>) -> Self {
        TextSpan {
            start: r.start as u64,
            len: (r.end - r.start) as u64,
        }
    }
}

/// A [`Part`] whose searchable fields are spans of the record's text. Variants in the order of
/// `Part`'s (the tests compare every variant).
#[derive(Debug, Clone, bincode::Encode, bincode::BorrowDecode)]
enum PartDescriptor<'a> {
    Text {
        text: TextSpan,
    },
    Reasoning {
        text: TextSpan,
    },
    ToolCall {
        id: &'a str,
        name: TextSpan,
        arguments: TextSpan,
    },
    ToolResult {
        call_id: &'a str,
        content: TextSpan,
        is_error: bool,
    },
    File {
        path: TextSpan,
        mime_type: Option<&'a str>,
    },
    Binary {
        media_type: &'a str,
        byte_len: u64,
    },
    Opaque {
        kind: &'a str,
        json: TextSpan,
    },
}

/// What follows the searchable text.
#[derive(Debug, bincode::Encode, bincode::BorrowDecode)]
struct RecordTail<'a> {
    /// First, so that [`RecordView::source_key`] reads it without the descriptors.
    source_key: Option<&'a str>,
    parts: Vec<PartDescriptor<'a>>,
}

const BINCODE: bincode::config::Configuration = bincode::config::standard();

/// The fields of a message record, borrowed, for [`encode`].
#[derive(Debug, Clone, Copy)]
pub struct RecordFields<'a> {
    pub session: SessionId,
    pub seq: u64,
    pub role: Role,
    pub created_at: Timestamp,
    pub token_count: u32,
    pub source: SourceFormat,
    pub has_original: bool,
    pub parts: &'a [Part],
    pub source_key: Option<&'a str>,
}

/// Writes the record of `fields` into `out` (cleared first). Fails only for a message whose
/// searchable text passes 4 GiB, which no store can hold.
pub fn encode(fields: &RecordFields<'_>, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    out.reserve(HEADER_LEN + fields.parts.iter().map(encoded_len_hint).sum::<usize>());
    out.push(RECORD_VERSION);
    out.extend_from_slice(&fields.session.0.to_le_bytes());
    out.extend_from_slice(&fields.seq.to_le_bytes());
    out.extend_from_slice(&fields.created_at.0.to_le_bytes());
    out.extend_from_slice(&fields.token_count.to_le_bytes());
    out.push(fields.role.code() as u8);
    out.push(source_code(fields.source));
    out.push(if fields.has_original { HAS_ORIGINAL } else { 0 });
    out.extend_from_slice(&[0; 4]);
    // Each part's descriptor as its fields land; spans are relative to the text, which starts
    // at HEADER_LEN.
    let span = |r: Range<usize>| TextSpan::from(r.start - HEADER_LEN..r.end - HEADER_LEN);
    let mut parts = Vec::with_capacity(fields.parts.len());
    let mut next = fields.parts.iter();
    write_search_text(fields.parts, out, |placed| {
        if let Some(part) = next.next() {
            parts.push(descriptor(part, placed, span));
        }
    });
    let text_len = out.len() - HEADER_LEN;
    let Ok(text_len_u32) = u32::try_from(text_len) else {
        return Err(StoreError::InvalidMessage(format!(
            "a message's text of {text_len} bytes is larger than a record holds (4 GiB)"
        )));
    };
    out[TEXT_LEN..HEADER_LEN].copy_from_slice(&text_len_u32.to_le_bytes());
    let tail = RecordTail {
        source_key: fields.source_key,
        parts,
    };
    // Encoding into a Vec cannot fail (no I/O, no size limit).
    if let Err(e) = bincode::encode_into_std_write(&tail, out, BINCODE) {
        unreachable!("encoding a record into memory failed: {e}");
    }
    Ok(())
}

/// Sets the sequence number of an encoded record (an append encodes its records before its
/// transaction assigns their numbers).
pub(crate) fn set_seq(record: &mut [u8], seq: u64) {
    record[SEQ..SEQ + 8].copy_from_slice(&seq.to_le_bytes());
}

/// About the bytes a part takes in a record (its strings, plus a few bytes of lengths and
/// tags): for reserving a record's room, and for the store's cheap first look at whether a
/// part may pass the large-file threshold.
pub(crate) fn encoded_len_hint(part: &Part) -> usize {
    8 + match part {
        Part::Text { text } | Part::Reasoning { text } => text.len(),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => id.len() + name.len() + arguments.len() + 8,
        Part::ToolResult {
            call_id, content, ..
        } => call_id.len() + content.len() + 4,
        Part::File { path, mime_type } => {
            path.len() + mime_type.as_ref().map_or(0, String::len) + 4
        }
        Part::Binary { media_type, .. } => media_type.len() + 10,
        Part::Opaque { kind, json } => kind.len() + json.len() + 4,
    }
}

fn descriptor<'p>(
    part: &'p Part,
    placed: FieldSpans,
    span: impl Fn(Range<usize>) -> TextSpan,
) -> PartDescriptor<'p> {
    let one = |placed: &FieldSpans| match placed {
        FieldSpans::One(r) => span(r.clone()),
        _ => unreachable!("write_search_text places a one-field part as one span"),
    };
    match part {
        Part::Text { .. } => PartDescriptor::Text { text: one(&placed) },
        Part::Reasoning { .. } => PartDescriptor::Reasoning { text: one(&placed) },
        Part::ToolCall { id, .. } => {
            let FieldSpans::Call { name, arguments } = placed else {
                unreachable!("write_search_text places a tool call as two spans")
            };
            PartDescriptor::ToolCall {
                id,
                name: span(name),
                arguments: span(arguments),
            }
        }
        Part::ToolResult {
            call_id, is_error, ..
        } => PartDescriptor::ToolResult {
            call_id,
            content: one(&placed),
            is_error: *is_error,
        },
        Part::File { mime_type, .. } => PartDescriptor::File {
            path: one(&placed),
            mime_type: mime_type.as_deref(),
        },
        Part::Binary {
            media_type,
            byte_len,
        } => PartDescriptor::Binary {
            media_type,
            byte_len: *byte_len,
        },
        Part::Opaque { kind, .. } => PartDescriptor::Opaque {
            kind,
            json: one(&placed),
        },
    }
}

/// A stored message record, read in place. [`Self::read`] checks the header and the text's
/// bounds only; the text's UTF-8 ([`Self::text`]) and the descriptors ([`Self::parts`]) are
/// checked when read, so a scan that rejects a message on its bytes pays for neither.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    text_end: usize,
}

/// The error for a record that cannot be read.
fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt {
        table: "messages",
        detail,
    }
}

impl<'a> RecordView<'a> {
    /// Reads the header of a stored record.
    #[inline]
    pub fn read(bytes: &'a [u8]) -> Result<RecordView<'a>> {
        match Self::read_fast(bytes) {
            Some(view) => Ok(view),
            None => Err(Self::why_unreadable(bytes)),
        }
    }

    /// [`Self::read`] without saying why a record cannot be read (a scan's hot path).
    #[inline]
    pub fn read_fast(bytes: &'a [u8]) -> Option<RecordView<'a>> {
        let header = bytes.get(..HEADER_LEN)?;
        if header[0] != RECORD_VERSION
            || usize::from(header[ROLE]) >= Role::ALL.len()
            || usize::from(header[SOURCE]) >= SOURCES.len()
        {
            return None;
        }
        let text_len = u32::from_le_bytes(header[TEXT_LEN..HEADER_LEN].try_into().ok()?) as usize;
        let text_end = HEADER_LEN.checked_add(text_len)?;
        (text_end <= bytes.len()).then_some(RecordView { bytes, text_end })
    }

    #[cold]
    fn why_unreadable(bytes: &[u8]) -> StoreError {
        match bytes.first() {
            None => corrupt("an empty message record".into()),
            Some(&1) => corrupt(
                "a message record of the layout before schema 6: the store was not migrated \
                 (open it writable once, e.g. with `lcm doctor --repair`)"
                    .into(),
            ),
            Some(&v) if v > RECORD_VERSION => StoreError::NewerSchema {
                found: u32::from(v),
                supported: u32::from(RECORD_VERSION),
            },
            Some(_) if bytes.len() < HEADER_LEN => corrupt(format!(
                "a message record of {} bytes is shorter than its header",
                bytes.len()
            )),
            Some(_) => corrupt(format!(
                "a message record with role code {}, source code {} and a text past its end",
                bytes[ROLE], bytes[SOURCE]
            )),
        }
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.bytes[at..at + 8]);
        u64::from_le_bytes(b)
    }

    #[inline]
    pub fn session(&self) -> SessionId {
        SessionId(self.u64_at(SESSION))
    }

    #[inline]
    pub fn seq(&self) -> u64 {
        self.u64_at(SEQ)
    }

    #[inline]
    pub fn created_at(&self) -> Timestamp {
        Timestamp(self.u64_at(CREATED_AT) as i64)
    }

    #[inline]
    pub fn token_count(&self) -> u32 {
        let mut b = [0; 4];
        b.copy_from_slice(&self.bytes[TOKENS..TOKENS + 4]);
        u32::from_le_bytes(b)
    }

    #[inline]
    pub fn role(&self) -> Role {
        // Checked by `read`.
        Role::ALL[usize::from(self.bytes[ROLE])]
    }

    #[inline]
    pub fn source(&self) -> SourceFormat {
        SOURCES[usize::from(self.bytes[SOURCE])]
    }

    /// Whether the host gave an original payload (kept in `originals`); without one, the
    /// original is rendered from the parts.
    pub fn has_original(&self) -> bool {
        self.bytes[FLAGS] & HAS_ORIGINAL != 0
    }

    /// The searchable text's bytes, not checked as UTF-8.
    #[inline]
    pub fn text_bytes(&self) -> &'a [u8] {
        &self.bytes[HEADER_LEN..self.text_end]
    }

    /// Where the searchable text lies in the record's bytes.
    pub fn text_range(&self) -> Range<usize> {
        HEADER_LEN..self.text_end
    }

    /// The searchable text ([`lcm_core::message::search_text`] of the parts).
    #[inline]
    pub fn text(&self) -> Result<&'a str> {
        std::str::from_utf8(self.text_bytes())
            .map_err(|e| corrupt(format!("a message's text is not UTF-8: {e}")))
    }

    fn tail(&self) -> Result<RecordTail<'a>> {
        let bytes = &self.bytes[self.text_end..];
        let (tail, used): (RecordTail<'a>, usize) =
            bincode::borrow_decode_from_slice(bytes, BINCODE)
                .map_err(|e| corrupt(format!("a message's part descriptors: {e}")))?;
        if used != bytes.len() {
            return Err(corrupt(format!(
                "{} trailing bytes after a message's part descriptors",
                bytes.len() - used
            )));
        }
        Ok(tail)
    }

    /// The key the host gave the message (a transcript line's uuid), if any. Reads only the
    /// key, not the part descriptors after it.
    pub fn source_key(&self) -> Result<Option<&'a str>> {
        let bytes = &self.bytes[self.text_end..];
        bincode::borrow_decode_from_slice(bytes, BINCODE)
            .map(|(key, _)| key)
            .map_err(|e| corrupt(format!("a message's source key: {e}")))
    }

    /// The message's parts, rebuilt from their descriptors and the text.
    pub fn parts(&self) -> Result<Vec<Part>> {
        let text = self.text()?;
        let slice = |s: TextSpan| -> Result<String> {
            usize::try_from(s.start)
                .ok()
                .zip(usize::try_from(s.start.saturating_add(s.len)).ok())
                .and_then(|(from, to)| text.get(from..to))
                .map(str::to_owned)
                .ok_or_else(|| {
                    corrupt(format!(
                        "a part's span {}+{} outside its {}-byte text",
                        s.start,
                        s.len,
                        text.len()
                    ))
                })
        };
        self.tail()?
            .parts
            .into_iter()
            .map(|d| {
                Ok(match d {
                    PartDescriptor::Text { text } => Part::Text { text: slice(text)? },
                    PartDescriptor::Reasoning { text } => Part::Reasoning { text: slice(text)? },
                    PartDescriptor::ToolCall {
                        id,
                        name,
                        arguments,
                    } => Part::ToolCall {
                        id: id.to_owned(),
                        name: slice(name)?,
                        arguments: slice(arguments)?,
                    },
                    PartDescriptor::ToolResult {
                        call_id,
                        content,
                        is_error,
                    } => Part::ToolResult {
                        call_id: call_id.to_owned(),
                        content: slice(content)?,
                        is_error,
                    },
                    PartDescriptor::File { path, mime_type } => Part::File {
                        path: slice(path)?,
                        mime_type: mime_type.map(str::to_owned),
                    },
                    PartDescriptor::Binary {
                        media_type,
                        byte_len,
                    } => Part::Binary {
                        media_type: media_type.to_owned(),
                        byte_len,
                    },
                    PartDescriptor::Opaque { kind, json } => Part::Opaque {
                        kind: kind.to_owned(),
                        json: slice(json)?,
                    },
                })
            })
            .collect()
    }

    /// The whole message, with its id.
    pub fn to_message(&self, id: MessageId) -> Result<Message> {
        Ok(Message {
            id,
            session: self.session(),
            seq: self.seq(),
            role: self.role(),
            created_at: self.created_at(),
            token_count: self.token_count(),
            parts: self.parts()?,
            source: self.source(),
        })
    }

    /// Checks what [`Self::read`] leaves to later reads: the text is UTF-8, the descriptors
    /// decode, and their spans lay out the text exactly as
    /// [`write_search_text`] does (in order, joined by
    /// the separators, covering all of it), so that [`Self::parts`] cannot fail and the text
    /// is the searchable text of the parts. Allocates only the list of descriptors.
    pub fn validate(&self) -> Result<()> {
        let text = self.text()?;
        let bytes = text.as_bytes();
        let mut at = 0usize;
        let mut any = false;
        let mut field = |span: TextSpan, separator: Option<u8>| -> Result<()> {
            if let Some(sep) = separator {
                if bytes.get(at) != Some(&sep) {
                    return Err(corrupt(format!(
                        "a message's text lacks a separator at byte {at}"
                    )));
                }
                at += 1;
            }
            let end = usize::try_from(span.start.saturating_add(span.len)).unwrap_or(usize::MAX);
            if span.start != at as u64 || end > bytes.len() || !text.is_char_boundary(end) {
                return Err(corrupt(format!(
                    "a part's span {}+{} does not follow byte {at} of its {}-byte text",
                    span.start,
                    span.len,
                    bytes.len()
                )));
            }
            at = end;
            Ok(())
        };
        let part_separator = lcm_core::message::PART_SEPARATOR.as_bytes()[0];
        let call_separator = lcm_core::message::CALL_SEPARATOR.as_bytes()[0];
        for part in self.tail()?.parts {
            let first = if any { Some(part_separator) } else { None };
            match part {
                PartDescriptor::Text { text: span }
                | PartDescriptor::Reasoning { text: span }
                | PartDescriptor::ToolResult { content: span, .. }
                | PartDescriptor::File { path: span, .. }
                | PartDescriptor::Opaque { json: span, .. } => field(span, first)?,
                PartDescriptor::ToolCall {
                    name, arguments, ..
                } => {
                    field(name, first)?;
                    field(arguments, Some(call_separator))?;
                }
                PartDescriptor::Binary { .. } => continue,
            }
            any = true;
        }
        if at != bytes.len() {
            return Err(corrupt(format!(
                "a message's text has {} bytes its parts do not account for",
                bytes.len() - at
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use lcm_core::message::search_text;

    use super::*;

    /// One part of every variant (the match fails to compile when `Part` gains one, so that it
    /// gets a sample here and a descriptor).
    pub(crate) fn every_part() -> Vec<Part> {
        let parts = vec![
            Part::Text {
                text: "héllo wörld".into(),
            },
            Part::Reasoning {
                text: "thinking…".into(),
            },
            Part::ToolCall {
                id: "call_1".into(),
                name: "Bash".into(),
                arguments: r#"{"command":"cargo test"}"#.into(),
            },
            Part::ToolResult {
                call_id: "call_1".into(),
                content: "ok: 3 passed\nline two".into(),
                is_error: true,
            },
            Part::File {
                path: "src/main.rs".into(),
                mime_type: Some("text/x-rust".into()),
            },
            Part::Binary {
                media_type: "image/png".into(),
                byte_len: 1 << 40,
            },
            Part::Opaque {
                kind: "citation".into(),
                json: r#"{"a":1}"#.into(),
            },
        ];
        for p in &parts {
            match p {
                Part::Text { .. }
                | Part::Reasoning { .. }
                | Part::ToolCall { .. }
                | Part::ToolResult { .. }
                | Part::File { .. }
                | Part::Binary { .. }
                | Part::Opaque { .. } => {}
            }
        }
        parts
    }

    fn fields(parts: &[Part]) -> RecordFields<'_> {
        RecordFields {
            session: SessionId(7),
            seq: 0,
            role: Role::Tool,
            created_at: Timestamp(-1_700_000_000_123),
            token_count: 70_000,
            source: SourceFormat::ClaudeCode,
            has_original: true,
            parts,
            source_key: Some("uuid-1"),
        }
    }

    #[test]
    fn every_field_and_part_round_trips_and_the_text_is_the_search_text() {
        let parts = every_part();
        // Every subset shape that matters: none, one of each, all, a binary alone.
        let mut cases: Vec<Vec<Part>> = vec![vec![]];
        cases.extend(parts.iter().map(|p| vec![p.clone()]));
        cases.push(parts.clone());
        cases.push(parts.iter().rev().cloned().collect());
        for case in cases {
            let mut out = Vec::new();
            encode(&fields(&case), &mut out).unwrap();
            set_seq(&mut out, u64::MAX - 3);
            let view = RecordView::read(&out).unwrap();
            assert_eq!(view.session(), SessionId(7));
            assert_eq!(view.seq(), u64::MAX - 3);
            assert_eq!(view.role(), Role::Tool);
            assert_eq!(view.created_at(), Timestamp(-1_700_000_000_123));
            assert_eq!(view.token_count(), 70_000);
            assert_eq!(view.source(), SourceFormat::ClaudeCode);
            assert!(view.has_original());
            assert_eq!(view.source_key().unwrap(), Some("uuid-1"));
            assert_eq!(view.parts().unwrap(), case);
            assert_eq!(view.text().unwrap(), search_text(&case));
            assert_eq!(&out[view.text_range()], view.text_bytes());
            view.validate().unwrap();
            let m = view.to_message(MessageId(9)).unwrap();
            assert_eq!((m.id, m.seq, m.parts), (MessageId(9), u64::MAX - 3, case));
        }
    }

    #[test]
    fn every_role_and_source_round_trips() {
        for role in Role::ALL {
            for source in SOURCES {
                let f = RecordFields {
                    role,
                    source,
                    has_original: false,
                    source_key: None,
                    ..fields(&[])
                };
                let mut out = Vec::new();
                encode(&f, &mut out).unwrap();
                let view = RecordView::read(&out).unwrap();
                assert_eq!((view.role(), view.source()), (role, source));
                assert!(!view.has_original());
                assert_eq!(view.source_key().unwrap(), None);
                assert_eq!(view.text().unwrap(), "");
            }
        }
    }

    #[test]
    fn damaged_records_are_errors_not_panics() {
        let parts = every_part();
        let mut good = Vec::new();
        encode(&fields(&parts), &mut good).unwrap();

        assert!(RecordView::read(&[]).is_err());
        let mut old = good.clone();
        old[0] = 1;
        let err = RecordView::read(&old).unwrap_err().to_string();
        assert!(err.contains("not migrated"), "{err}");
        let mut newer = good.clone();
        newer[0] = RECORD_VERSION + 1;
        assert!(matches!(
            RecordView::read(&newer),
            Err(StoreError::NewerSchema { .. })
        ));
        let mut bad_role = good.clone();
        bad_role[ROLE] = 9;
        assert!(RecordView::read(&bad_role).is_err());
        let mut long_text = good.clone();
        long_text[TEXT_LEN..HEADER_LEN].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(RecordView::read(&long_text).is_err());
        // Every truncation fails somewhere (header, text, or descriptors), never panics.
        for len in 0..good.len() {
            let cut = &good[..len];
            let outcome = RecordView::read(cut).and_then(|v| v.validate());
            assert!(
                outcome.is_err(),
                "a record cut at {len} bytes read as whole"
            );
        }
        // A text whose separator was changed no longer lays out its parts.
        let mut moved = good.clone();
        let view = RecordView::read(&moved).unwrap();
        let sep = view.text_range().start + view.text().unwrap().find('\n').unwrap();
        moved[sep] = b'x';
        let view = RecordView::read(&moved).unwrap();
        assert!(view.validate().is_err());
        assert!(
            view.parts().is_ok(),
            "parts alone do not see it: validate does"
        );
        // Text that is not UTF-8.
        let mut bad_utf8 = good.clone();
        bad_utf8[HEADER_LEN] = 0xFF;
        let view = RecordView::read(&bad_utf8).unwrap();
        assert!(view.text().is_err());
        assert!(view.parts().is_err());
    }
}
