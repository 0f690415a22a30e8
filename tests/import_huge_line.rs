//! A 1 GiB tool output on one transcript line: the import passes over it in small reads, so the
//! process's peak memory grows by about the line limit (64 MiB by default), not by the gigabyte,
//! and nothing is stored. Its own test binary, so that no other test moves the peak.

mod common;

use lcm::store::import::{ImportError, ImportOptions, import_file};

/// Peak resident memory of this process so far (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn a_one_gigabyte_line_is_passed_over_in_bounded_memory() {
    let Some(before) = peak_rss() else {
        eprintln!("skipped: no /proc/self/status on this system to measure memory with");
        return;
    };
    let (tmp, data) = common::temp_data_dir();
    let path = tmp.path().join("huge.jsonl");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(br#"{"session":"imp","role":"user","content":"before"}"#)
            .unwrap();
        file.write_all(b"\n{\"session\":\"imp\",\"role\":\"tool\",\"content\":\"")
            .unwrap();
        // The rest of the gigabyte: a sparse tail of zero bytes (no newline), cheap to make.
        file.set_len(1 << 30).unwrap();
    }
    let options = ImportOptions::default();
    assert_eq!(options.max_line_bytes, 64 << 20);
    let report = import_file(&data.store, &path, &options, |_, _| {}).unwrap();
    assert_eq!((report.imported, report.error_count), (1, 1), "{report:?}");
    assert!(report.errors[0].contains("longer than import.max_line_bytes"));
    let grown = peak_rss().unwrap().saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "peak memory grew by {} MiB reading a 1 GiB line",
        grown >> 20
    );
    // Strict mode refuses the file and stores nothing more.
    let strict = ImportOptions {
        strict: true,
        ..ImportOptions::default()
    };
    let messages = data.store.stats().unwrap().messages;
    let err = import_file(&data.store, &path, &strict, |_, _| {}).unwrap_err();
    assert!(
        matches!(err, ImportError::LineTooLong { line: 2, .. }),
        "{err}"
    );
    assert_eq!(data.store.stats().unwrap().messages, messages);
}
