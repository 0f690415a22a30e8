//! The file tables (`files`, `file_hashes`, `message_files`, `file_messages`):
//!
//! - [`ViolationKind::FileRecords`]: the file tables disagree with each other or with the
//!   messages: a reference to a file record that does not exist, a record whose content
//!   message does not exist, a message reference without its reverse entry (or the other way),
//!   a hash pointing nowhere. No repair (the records are written with their messages; restore
//!   from a backup);
//! - [`ViolationKind::CounterBehind`] for `next_file` (repair: [`Repair::RaiseCounter`]);
//! - [`ViolationKind::UndecodableRecord`] for file records and message references.
//!
//! A store of schema 3 has no file tables: nothing to check.
//!
//! [`Repair::RaiseCounter`]: super::Repair::RaiseCounter

use lcm_core::files::{FileInfo, MessageFiles};
use redb::ReadableTable;

use super::counters::check_counter;
use super::shared::{Facts, Findings, Tables, last_key};
use super::{Counter, ViolationKind};
use crate::codec;
use crate::error::Result;
use crate::message_rows;

/// The file tables against each other and the messages.
pub(super) fn check(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    let Some(ft) = &t.files else {
        return Ok(());
    };
    let bad = |f: &mut Findings, subject: String, detail: String| {
        f.push(ViolationKind::FileRecords, subject, detail, None);
    };
    check_counter(t, f, last_key(&ft.files)?, Counter::NextFile, "file")?;
    for entry in ft.files.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let Some(info): Option<FileInfo> =
            f.decode(codec::decode("files", bytes.value()), format!("file_{id}"))?
        else {
            continue;
        };
        if info.id.0 != id {
            bad(
                f,
                format!("file_{id}"),
                format!("its record says it is {}", info.id),
            );
        }
        if let Some(message) = info.content_message
            && message_rows::get(&t.messages, message.0)?.is_none()
        {
            bad(
                f,
                format!("file_{id}"),
                format!("its content is said to be in {message}, which does not exist"),
            );
        }
    }
    for entry in ft.hashes.iter()? {
        let (_, id) = entry?;
        let id = id.value();
        if ft.files.get(id)?.is_none() {
            bad(
                f,
                format!("file_{id}"),
                "a content hash points at this missing record".into(),
            );
        }
    }
    for entry in ft.message_files.iter()? {
        let (message, bytes) = entry?;
        let message = message.value();
        let Some(refs): Option<MessageFiles> = f.decode(
            codec::decode("message_files", bytes.value()),
            format!("msg_{message}"),
        )?
        else {
            continue;
        };
        if message_rows::get(&t.messages, message)?.is_none() {
            bad(
                f,
                format!("msg_{message}"),
                "has file references but no message record".into(),
            );
        }
        for r in &refs.refs {
            if ft.files.get(r.file.0)?.is_none() {
                bad(
                    f,
                    format!("msg_{message}"),
                    format!("references missing {}", r.file),
                );
            }
            if ft.file_messages.get((r.file.0, message))?.is_none() {
                bad(
                    f,
                    format!("msg_{message}"),
                    format!("references {} without the reverse entry", r.file),
                );
            }
        }
    }
    for entry in ft.file_messages.iter()? {
        let (key, _) = entry?;
        let (file, message) = key.value();
        let listed = match ft.message_files.get(message)? {
            Some(bytes) => codec::decode::<MessageFiles>("message_files", bytes.value())
                .is_ok_and(|refs| refs.refs.iter().any(|r| r.file.0 == file)),
            None => false,
        };
        if !listed {
            bad(
                f,
                format!("file_{file}"),
                format!("lists msg_{message} as referencing it, which it does not"),
            );
        }
    }
    Ok(())
}
