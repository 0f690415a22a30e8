//! The on-disk encoding of records, chosen in this one place.
//!
//! Every value is one byte of record schema version followed by the record in bincode 2's
//! standard configuration (varint integers, little endian). The version byte lets a later lcm
//! migrate old records or refuse records from a newer one with a clear error. (bincode is marked
//! unmaintained by an advisory; the format is simple and frozen, and this module is the only place
//! that would change if it were replaced.)

use bincode::config::{Configuration, standard};

use crate::error::{Result, StoreError};

/// The record schema this build writes and the newest it reads.
pub const SCHEMA_VERSION: u8 = 1;

const CONFIG: Configuration = standard();

/// Encodes a record with the current schema version.
pub fn encode<T: bincode::Encode>(record: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(SCHEMA_VERSION);
    write_fields(record, &mut out);
    out
}

/// Appends `value` in bincode to `out`.
fn write_fields<T: bincode::Encode>(value: &T, out: &mut Vec<u8>) {
    // Encoding into a Vec cannot fail for our derived types (no I/O, no size limit).
    if let Err(e) = bincode::encode_into_std_write(value, out, CONFIG) {
        unreachable!("encoding a record into memory failed: {e}");
    }
}

/// Encodes the fields of a record that come after `head` (its first fields), without the version
/// byte: the expensive part of a record, which can be encoded before the head is known (a message's
/// parts before its sequence number is assigned inside the write transaction). `size_hint` is
/// the expected length, to allocate once.
pub fn encode_tail<T: bincode::Encode>(fields: &T, size_hint: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size_hint);
    write_fields(fields, &mut out);
    out
}

/// Writes into `out` (cleared first) the start of a record whose remaining fields were encoded
/// by [`encode_tail`]: the version byte and `head`. The record is these bytes followed by the
/// tail, byte for byte what [`encode`] writes for the whole record, since bincode writes a
/// struct's fields one after another with nothing between them.
pub fn encode_head<H: bincode::Encode>(head: &H, out: &mut Vec<u8>) {
    out.clear();
    out.push(SCHEMA_VERSION);
    write_fields(head, out);
}

/// Decodes a record written by [`encode`].
pub fn decode<T: bincode::Decode<()>>(table: &'static str, bytes: &[u8]) -> Result<T> {
    let body = body(table, bytes)?;
    let decoded = bincode::decode_from_slice(body, CONFIG);
    finish(table, body, decoded)
}

/// Decodes a record written by [`encode`] into a type that borrows from `bytes` (a view with
/// `&str` where the record has `String`: bincode writes both the same way). Same checks and
/// errors as [`decode`].
#[inline]
pub fn decode_borrowed<'a, T: bincode::BorrowDecode<'a, ()>>(
    table: &'static str,
    bytes: &'a [u8],
) -> Result<T> {
    let body = body(table, bytes)?;
    let decoded = bincode::borrow_decode_from_slice(body, CONFIG);
    finish(table, body, decoded)
}

/// The record after its version byte, if this build can read that version.
#[inline]
fn body<'a>(table: &'static str, bytes: &'a [u8]) -> Result<&'a [u8]> {
    let Some((&version, body)) = bytes.split_first() else {
        return Err(StoreError::Corrupt {
            table,
            detail: "empty record".into(),
        });
    };
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: u32::from(version),
            supported: u32::from(SCHEMA_VERSION),
        });
    }
    Ok(body)
}

/// The decoded record, if decoding worked and used the whole body.
#[inline]
fn finish<T>(
    table: &'static str,
    body: &[u8],
    decoded: std::result::Result<(T, usize), bincode::error::DecodeError>,
) -> Result<T> {
    let (record, used) = decoded.map_err(|e| StoreError::Corrupt {
        table,
        detail: e.to_string(),
    })?;
    if used != body.len() {
        return Err(StoreError::Corrupt {
            table,
            detail: format!("{} trailing bytes", body.len() - used),
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::message::{Part, Role};

    #[derive(Debug, PartialEq, bincode::Encode, bincode::Decode)]
    struct Sample {
        role: Role,
        parts: Vec<Part>,
        n: u64,
    }

    #[test]
    fn round_trips_and_rejects_newer_or_broken_records() {
        let sample = Sample {
            role: Role::Tool,
            parts: vec![Part::Text {
                text: "héllo".into(),
            }],
            n: 7,
        };
        let bytes = encode(&sample);
        assert_eq!(bytes[0], SCHEMA_VERSION);
        assert_eq!(decode::<Sample>("t", &bytes).unwrap(), sample);

        let mut newer = bytes.clone();
        newer[0] = SCHEMA_VERSION + 1;
        assert!(matches!(
            decode::<Sample>("t", &newer),
            Err(StoreError::NewerSchema { .. })
        ));
        assert!(matches!(
            decode::<Sample>("t", &bytes[..bytes.len() - 2]),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            decode::<Sample>("t", &[]),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
