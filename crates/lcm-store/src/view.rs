//! Borrowed views of stored message records, for the paths that look at every message.
//!
//! A scan (regex grep without a usable literal, the unindexed tail) reads each message only to
//! test it, and most messages fail the test. Decoding them into an owned [`Message`] would copy
//! every text into its own `String` just to drop it again. A [`MessageRecordView`] decodes the
//! *same bytes* as [`MessageRecord`] (bincode writes a `String` and a `&str` identically) with
//! every text borrowed from the stored value, so testing a message allocates nothing.
//!
//! The view mirrors the record field by field and [`PartView`] mirrors
//! [`lcm_core::message::Part`] variant by variant, in the same order: bincode writes a variant
//! as its index. The tests below decode every variant both ways and compare.
//!
//! [`Message`]: lcm_core::message::Message
//! [`MessageRecord`]: crate::store::MessageRecord

use bincode::de::{BorrowDecode, BorrowDecoder, Decode};
use bincode::error::DecodeError;
use lcm_core::message::{Role, SourceFormat};
use lcm_core::time::Timestamp;

/// A [`MessageRecord`](crate::store::MessageRecord) decoded in place: same fields, same order,
/// texts borrowed from the stored bytes.
///
/// Every field is decoded, even those no scan reads yet, because the view must read exactly the
/// bytes the record wrote.
#[derive(Debug, Clone, bincode::BorrowDecode)]
#[allow(dead_code)]
pub(crate) struct MessageRecordView<'a> {
    pub session: u64,
    pub seq: u64,
    pub role: Role,
    pub created_at: Timestamp,
    pub token_count: u32,
    pub source: SourceFormat,
    pub parts: PartsView<'a>,
    pub source_key: Option<&'a str>,
    pub has_original: bool,
}

impl<'a> MessageRecordView<'a> {
    /// The message's searchable text, byte for byte [`lcm_core::message::search_text`] of its
    /// parts. Borrowed from the record when one part has text and needs no joining; otherwise
    /// joined into `scratch` (cleared first), so a scan reusing one buffer allocates nothing once
    /// the buffer has grown.
    pub fn search_text_in<'s>(&'s self, scratch: &'s mut String) -> &'s str {
        if let Some(text) = self.parts.single_text() {
            return text;
        }
        scratch.clear();
        let mut first = true;
        for piece in self.parts.iter().filter_map(PartView::searchable) {
            if !first {
                scratch.push('\n');
            }
            first = false;
            piece.push_to(scratch);
        }
        scratch
    }
}

/// A [`lcm_core::message::Part`] with its texts borrowed. Variants and fields in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::BorrowDecode)]
pub(crate) enum PartView<'a> {
    Text {
        text: &'a str,
    },
    Reasoning {
        text: &'a str,
    },
    ToolCall {
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    ToolResult {
        call_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    File {
        path: &'a str,
        mime_type: Option<&'a str>,
    },
    Binary {
        media_type: &'a str,
        byte_len: u64,
    },
    Opaque {
        kind: &'a str,
        json: &'a str,
    },
}

/// What a part contributes to the searchable text (see `Part::searchable_text`).
#[derive(Debug, Clone, Copy)]
enum Piece<'a> {
    Str(&'a str),
    /// A tool call reads as `"{name} {arguments}"`.
    Call {
        name: &'a str,
        arguments: &'a str,
    },
}

impl<'a> Piece<'a> {
    fn push_to(self, out: &mut String) {
        match self {
            Piece::Str(text) => out.push_str(text),
            Piece::Call { name, arguments } => {
                out.push_str(name);
                out.push(' ');
                out.push_str(arguments);
            }
        }
    }
}

impl<'a> PartView<'a> {
    /// Mirrors `Part::searchable_text`: the same parts have text, and the same text.
    fn searchable(&self) -> Option<Piece<'a>> {
        match *self {
            PartView::Text { text } | PartView::Reasoning { text } => Some(Piece::Str(text)),
            PartView::ToolCall {
                name, arguments, ..
            } => Some(Piece::Call { name, arguments }),
            PartView::ToolResult { content, .. } => Some(Piece::Str(content)),
            PartView::File { path, .. } => Some(Piece::Str(path)),
            PartView::Binary { .. } => None,
            PartView::Opaque { json, .. } => Some(Piece::Str(json)),
        }
    }
}

/// Parts decoded without allocating for up to this many (most messages have one or two; more
/// take one allocation). Kept small: the view is moved a few times per decoded message, and a
/// larger inline array measured slower.
const INLINE_PARTS: usize = 2;

/// Filler for unused inline slots (never exposed).
const NO_PART: PartView<'static> = PartView::Binary {
    media_type: "",
    byte_len: 0,
};

/// The parts of a [`MessageRecordView`]: decoded from a bincode `Vec<Part>`, kept inline when
/// there are few of them.
#[derive(Debug, Clone)]
pub(crate) enum PartsView<'a> {
    Inline {
        parts: [PartView<'a>; INLINE_PARTS],
        len: usize,
    },
    Spilled(Vec<PartView<'a>>),
}

impl<'a> std::ops::Deref for PartsView<'a> {
    type Target = [PartView<'a>];

    fn deref(&self) -> &[PartView<'a>] {
        match self {
            PartsView::Inline { parts, len } => &parts[..*len],
            PartsView::Spilled(parts) => parts,
        }
    }
}

impl<'a> PartsView<'a> {
    /// The searchable text when it can be borrowed as is: no part has text (`""`), or exactly
    /// one has and it is not a tool call (which reads as two fields joined).
    fn single_text(&self) -> Option<&'a str> {
        let mut pieces = self.iter().filter_map(PartView::searchable);
        match (pieces.next(), pieces.next()) {
            (None, _) => Some(""),
            (Some(Piece::Str(text)), None) => Some(text),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a, Context> BorrowDecode<'de, Context> for PartsView<'a> {
    /// Reads what `Vec<Part>`'s encoding wrote: a varint length, then each part.
    #[inline]
    fn borrow_decode<D: BorrowDecoder<'de, Context = Context>>(
        decoder: &mut D,
    ) -> Result<Self, DecodeError> {
        let len = u64::decode(decoder)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::OutsideUsizeRange(len))?;
        decoder.claim_container_read::<PartView<'a>>(len)?;
        let next = |decoder: &mut D| {
            // As bincode's own containers do: each element claims its own bytes as it decodes.
            decoder.unclaim_bytes_read(std::mem::size_of::<PartView<'a>>());
            <PartView<'a> as BorrowDecode<'de, Context>>::borrow_decode(decoder)
        };
        if len <= INLINE_PARTS {
            let mut parts = [NO_PART; INLINE_PARTS];
            for slot in &mut parts[..len] {
                *slot = next(decoder)?;
            }
            return Ok(PartsView::Inline { parts, len });
        }
        // A corrupt length fails on the missing bytes; do not reserve for it up front.
        let mut parts = Vec::with_capacity(len.min(64));
        for _ in 0..len {
            parts.push(next(decoder)?);
        }
        Ok(PartsView::Spilled(parts))
    }
}

/// The scope fields of a stored message record and its searchable text as bytes, read by hand
/// from the record's bytes: what a scan needs to reject a message, at a fraction of the cost of
/// a [`MessageRecordView`]. The texts are not checked as UTF-8 and nothing after the parts is
/// read, so a record accepted here is not known to be well formed: a scan decodes a message that
/// matches again through the checked view before reporting it, and a record this reader cannot
/// read (`None`) goes through the checked view too, which reports what is wrong with it.
///
/// The record's wire format is bincode 2's standard configuration: unsigned integers and enum
/// variant indices as varints (one byte up to 250, else a marker byte 251, 252 or 253 and 2, 4 or
/// 8 little-endian bytes), signed integers zigzag-encoded first, `Option` and `bool` as one byte,
/// strings as a varint length and their bytes. The tests compare it with the derived decoder on
/// every part variant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScanRecord<'a> {
    pub session: u64,
    pub role: Role,
    pub created_at: Timestamp,
    /// The record from the parts' count on.
    parts: &'a [u8],
}

/// A cursor over a record's bytes; every read is `None` past the end.
struct WireReader<'a> {
    rest: &'a [u8],
}

impl<'a> WireReader<'a> {
    #[inline]
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(b)
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (bytes, rest) = self.rest.split_first_chunk::<N>()?;
        self.rest = rest;
        Some(*bytes)
    }

    #[inline]
    fn varint(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0..=250 => Some(u64::from(b)),
            251 => Some(u64::from(u16::from_le_bytes(self.fixed()?))),
            252 => Some(u64::from(u32::from_le_bytes(self.fixed()?))),
            253 => Some(u64::from_le_bytes(self.fixed()?)),
            _ => None,
        }
    }

    #[inline]
    fn zigzag(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    #[inline]
    fn text(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let (text, rest) = self.rest.split_at_checked(len)?;
        self.rest = rest;
        Some(text)
    }
}

/// A part's contribution to the searchable text, as bytes (see [`Piece`]).
#[derive(Clone, Copy)]
enum PieceBytes<'a> {
    Str(&'a [u8]),
    Call { name: &'a [u8], arguments: &'a [u8] },
}

impl PieceBytes<'_> {
    fn push_to(self, out: &mut Vec<u8>) {
        match self {
            PieceBytes::Str(text) => out.extend_from_slice(text),
            PieceBytes::Call { name, arguments } => {
                out.extend_from_slice(name);
                out.push(b' ');
                out.extend_from_slice(arguments);
            }
        }
    }
}

impl<'a> ScanRecord<'a> {
    /// Reads the fields before the parts of `bytes`, a stored value (version byte first).
    pub fn read(bytes: &'a [u8]) -> Option<ScanRecord<'a>> {
        let (&version, body) = bytes.split_first()?;
        if version != crate::codec::SCHEMA_VERSION {
            return None;
        }
        let mut r = WireReader { rest: body };
        let session = r.varint()?;
        let _seq = r.varint()?;
        let role = *Role::ALL.get(usize::try_from(r.varint()?).ok()?)?;
        let created_at = Timestamp(r.zigzag()?);
        let _token_count = r.varint()?;
        let _source = r.varint()?;
        Some(ScanRecord {
            session,
            role,
            created_at,
            parts: r.rest,
        })
    }

    /// The searchable text, byte for byte [`MessageRecordView::search_text_in`]: borrowed from
    /// the record when one part has text and needs no joining, else joined into `scratch`
    /// (cleared first). `None` if the parts cannot be read.
    pub fn search_bytes<'s>(&'s self, scratch: &'s mut Vec<u8>) -> Option<&'s [u8]> {
        let mut r = WireReader { rest: self.parts };
        let count = r.varint()?;
        let mut first: Option<PieceBytes<'a>> = None;
        let mut joined = false;
        for _ in 0..count {
            let piece = match r.varint()? {
                0 | 1 => PieceBytes::Str(r.text()?),
                2 => {
                    let _id = r.text()?;
                    let name = r.text()?;
                    let arguments = r.text()?;
                    PieceBytes::Call { name, arguments }
                }
                3 => {
                    let _call_id = r.text()?;
                    let content = r.text()?;
                    let _is_error = r.byte()?;
                    PieceBytes::Str(content)
                }
                4 => {
                    let path = r.text()?;
                    if r.byte()? == 1 {
                        let _mime_type = r.text()?;
                    }
                    PieceBytes::Str(path)
                }
                5 => {
                    let _media_type = r.text()?;
                    let _byte_len = r.varint()?;
                    continue;
                }
                6 => {
                    let _kind = r.text()?;
                    PieceBytes::Str(r.text()?)
                }
                _ => return None,
            };
            match first {
                None => first = Some(piece),
                Some(earlier) => {
                    if !joined {
                        scratch.clear();
                        earlier.push_to(scratch);
                        joined = true;
                    }
                    scratch.push(b'\n');
                    piece.push_to(scratch);
                }
            }
        }
        match first {
            None => Some(b""),
            Some(PieceBytes::Str(text)) if !joined => Some(text),
            Some(call) if !joined => {
                scratch.clear();
                call.push_to(scratch);
                Some(scratch)
            }
            Some(_) => Some(scratch),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use lcm_core::message::{Part, search_text};

    use super::*;
    use crate::codec;
    use crate::error::StoreError;
    use crate::store::MessageRecord;

    /// One part of every variant (the match fails to compile when `Part` gains one, so that it
    /// gets a sample here and a mirror in `PartView`).
    fn every_part() -> Vec<Part> {
        let parts = vec![
            Part::Text {
                text: "plain text é".into(),
            },
            Part::Reasoning {
                text: "thinking\nabout it".into(),
            },
            Part::ToolCall {
                id: "toolu_1".into(),
                name: "Bash".into(),
                arguments: r#"{"command":"ls -la"}"#.into(),
            },
            Part::ToolResult {
                call_id: "toolu_1".into(),
                content: "total 0\n".into(),
                is_error: true,
            },
            Part::File {
                path: "/src/main.rs".into(),
                mime_type: Some("text/x-rust".into()),
            },
            Part::File {
                path: "/README".into(),
                mime_type: None,
            },
            Part::Binary {
                media_type: "image/png".into(),
                byte_len: 123_456,
            },
            Part::Opaque {
                kind: "citation".into(),
                json: r#"{"url":"https://example.com"}"#.into(),
            },
            Part::Text { text: "".into() },
        ];
        let mut seen = [false; 7];
        for part in &parts {
            let variant = match part {
                Part::Text { .. } => 0,
                Part::Reasoning { .. } => 1,
                Part::ToolCall { .. } => 2,
                Part::ToolResult { .. } => 3,
                Part::File { .. } => 4,
                Part::Binary { .. } => 5,
                Part::Opaque { .. } => 6,
            };
            seen[variant] = true;
        }
        assert!(seen.iter().all(|s| *s), "a Part variant has no sample");
        parts
    }

    fn owned(part: &PartView<'_>) -> Part {
        match *part {
            PartView::Text { text } => Part::Text { text: text.into() },
            PartView::Reasoning { text } => Part::Reasoning { text: text.into() },
            PartView::ToolCall {
                id,
                name,
                arguments,
            } => Part::ToolCall {
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            },
            PartView::ToolResult {
                call_id,
                content,
                is_error,
            } => Part::ToolResult {
                call_id: call_id.into(),
                content: content.into(),
                is_error,
            },
            PartView::File { path, mime_type } => Part::File {
                path: path.into(),
                mime_type: mime_type.map(str::to_owned),
            },
            PartView::Binary {
                media_type,
                byte_len,
            } => Part::Binary {
                media_type: media_type.into(),
                byte_len,
            },
            PartView::Opaque { kind, json } => Part::Opaque {
                kind: kind.into(),
                json: json.into(),
            },
        }
    }

    fn record(parts: Vec<Part>, source_key: Option<&str>) -> MessageRecord {
        MessageRecord {
            session: 300,
            seq: 1 << 40,
            role: Role::Tool,
            created_at: Timestamp(-1_767_225_600_123),
            token_count: 70_000,
            source: SourceFormat::OpenAiChat,
            parts,
            source_key: source_key.map(str::to_owned),
            has_original: true,
        }
    }

    /// Every way of combining the samples that matters: none, each alone, pairs, all, and more
    /// than fit inline.
    fn part_lists() -> Vec<Vec<Part>> {
        let every = every_part();
        let mut lists = vec![Vec::new()];
        lists.extend(every.iter().map(|p| vec![p.clone()]));
        for a in &every {
            for b in &every {
                lists.push(vec![a.clone(), b.clone()]);
            }
        }
        lists.push(every.clone());
        lists.push(every.iter().chain(&every).cloned().collect());
        lists.push(every[..INLINE_PARTS].to_vec());
        lists.push(every[..INLINE_PARTS + 1].to_vec());
        lists
    }

    fn assert_same(view: &MessageRecordView<'_>, record: &MessageRecord) {
        assert_eq!(view.session, record.session);
        assert_eq!(view.seq, record.seq);
        assert_eq!(view.role, record.role);
        assert_eq!(view.created_at, record.created_at);
        assert_eq!(view.token_count, record.token_count);
        assert_eq!(view.source, record.source);
        assert_eq!(
            view.parts.iter().map(owned).collect::<Vec<_>>(),
            record.parts
        );
        assert_eq!(view.source_key, record.source_key.as_deref());
        assert_eq!(view.has_original, record.has_original);
    }

    #[test]
    fn the_view_decodes_the_records_bytes_to_the_same_fields() {
        for parts in part_lists() {
            for key in [None, Some("uuid-1234")] {
                let written = record(parts.clone(), key);
                let bytes = codec::encode(&written);
                let decoded: MessageRecord = codec::decode("messages", &bytes).unwrap();
                let view: MessageRecordView<'_> =
                    codec::decode_borrowed("messages", &bytes).unwrap();
                assert_same(&view, &written);
                assert_same(&view, &decoded);
                assert_eq!(
                    matches!(view.parts, PartsView::Inline { .. }),
                    parts.len() <= INLINE_PARTS
                );
            }
        }
    }

    #[test]
    fn the_view_refuses_what_the_owned_decode_refuses() {
        let bytes = codec::encode(&record(every_part(), Some("k")));
        let view = |b: &[u8]| codec::decode_borrowed::<MessageRecordView<'_>>("messages", b).err();
        for cut in 0..bytes.len() {
            assert!(
                matches!(view(&bytes[..cut]), Some(StoreError::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(view(&longer), Some(StoreError::Corrupt { .. })));
        let mut newer = bytes.clone();
        newer[0] = codec::SCHEMA_VERSION + 1;
        assert!(matches!(view(&newer), Some(StoreError::NewerSchema { .. })));
        // Bad UTF-8 inside a text, and an unknown variant.
        let text = record(vec![Part::Text { text: "abc".into() }], None);
        let mut bad = codec::encode(&text);
        let at = bad.windows(3).position(|w| w == b"abc").unwrap();
        bad[at] = 0xff;
        assert!(codec::decode::<MessageRecord>("messages", &bad).is_err());
        assert!(matches!(view(&bad), Some(StoreError::Corrupt { .. })));
        let mut unknown = codec::encode(&text);
        let at = at - 2; // the variant index, before the text's length
        assert_eq!(unknown[at], 0);
        unknown[at] = 7;
        assert!(codec::decode::<MessageRecord>("messages", &unknown).is_err());
        assert!(matches!(view(&unknown), Some(StoreError::Corrupt { .. })));
    }

    #[test]
    fn search_text_is_byte_identical_to_lcm_core_search_text() {
        let mut scratch = String::new();
        for parts in part_lists() {
            let bytes = codec::encode(&record(parts.clone(), None));
            let view: MessageRecordView<'_> = codec::decode_borrowed("messages", &bytes).unwrap();
            let expected = search_text(&parts);
            let (text, at) = {
                let text = view.search_text_in(&mut scratch);
                (text.to_owned(), text.as_ptr())
            };
            assert_eq!(text, expected, "parts: {parts:?}");
            // Borrowed from the record exactly when lcm_core borrows too.
            // (An unallocated buffer holds nothing: its dangling pointer may equal a `""`'s.)
            let borrowed = scratch.capacity() == 0 || !std::ptr::eq(at, scratch.as_ptr());
            assert_eq!(
                borrowed,
                matches!(expected, Cow::Borrowed(_)),
                "parts: {parts:?}"
            );
        }
    }

    /// `text` cut at every byte that can join two of its fields (a newline between parts, a
    /// space in a tool call): more cuts than needed, each piece still a part of one field.
    fn fields(text: &[u8]) -> Vec<&[u8]> {
        text.split(|&b| b == b'\n' || b == b' ').collect()
    }

    #[test]
    fn the_scan_reader_reads_the_fields_and_search_text_of_every_record() {
        let mut scratch = Vec::new();
        let mut joined = String::new();
        for parts in part_lists() {
            for key in [None, Some("uuid-1234")] {
                // Values that take every varint width, and a negative time.
                for (session, seq, created_at) in [
                    (300, 1 << 40, -1_767_225_600_123),
                    (7, 250, 0),
                    (251, 65_535, 1_767_225_600_123),
                    (65_536, u64::from(u32::MAX) + 1, i64::MIN),
                ] {
                    let mut written = record(parts.clone(), key);
                    written.session = session;
                    written.seq = seq;
                    written.created_at = Timestamp(created_at);
                    let bytes = codec::encode(&written);
                    let scan = ScanRecord::read(&bytes).unwrap();
                    assert_eq!(scan.session, written.session);
                    assert_eq!(scan.role, written.role);
                    assert_eq!(scan.created_at, written.created_at);
                    let view: MessageRecordView<'_> =
                        codec::decode_borrowed("messages", &bytes).unwrap();
                    let text = scan.search_bytes(&mut scratch).unwrap();
                    assert_eq!(
                        text,
                        view.search_text_in(&mut joined).as_bytes(),
                        "parts: {parts:?}"
                    );
                    // Cut at its joining bytes, the text is fields that stand in the record's
                    // bytes as they are (what lets a scan search a whole pack at once).
                    for field in fields(text) {
                        assert!(
                            bytes.windows(field.len().max(1)).any(|w| w == field)
                                || field.is_empty(),
                            "field {field:?} of parts {parts:?}"
                        );
                    }
                }
            }
        }
        for role in Role::ALL {
            let mut written = record(every_part(), None);
            written.role = role;
            let bytes = codec::encode(&written);
            assert_eq!(ScanRecord::read(&bytes).unwrap().role, role);
        }
    }

    #[test]
    fn the_scan_reader_gives_up_on_what_it_cannot_read() {
        let bytes = codec::encode(&record(every_part(), Some("k")));
        let mut scratch = Vec::new();
        // Cut anywhere inside the fields or the parts: never a panic, never a text.
        let parts_end = bytes.len() - (1 + 1 + 1 + 1); // `Some`, key length, "k", `has_original`
        for cut in 0..parts_end {
            let text = ScanRecord::read(&bytes[..cut])
                .and_then(|r| r.search_bytes(&mut scratch).map(<[u8]>::to_vec));
            assert_eq!(text, None, "cut at {cut}");
        }
        let mut newer = bytes.clone();
        newer[0] = codec::SCHEMA_VERSION + 1;
        assert!(ScanRecord::read(&newer).is_none());
        let text = record(vec![Part::Text { text: "abc".into() }], None);
        let mut unknown = codec::encode(&text);
        let at = unknown.windows(3).position(|w| w == b"abc").unwrap() - 2;
        unknown[at] = 7;
        let scan = ScanRecord::read(&unknown).unwrap();
        assert!(scan.search_bytes(&mut scratch).is_none());
    }

    #[test]
    fn a_reused_scratch_buffer_never_leaks_into_the_next_text() {
        let long = record(every_part(), None);
        let short = record(
            vec![
                Part::Text { text: "a".into() },
                Part::Binary {
                    media_type: "x".into(),
                    byte_len: 1,
                },
                Part::Text { text: "b".into() },
            ],
            None,
        );
        let mut scratch = String::new();
        for r in [&long, &short, &long] {
            let bytes = codec::encode(r);
            let view: MessageRecordView<'_> = codec::decode_borrowed("messages", &bytes).unwrap();
            assert_eq!(view.search_text_in(&mut scratch), search_text(&r.parts));
        }
    }
}
