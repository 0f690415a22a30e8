//! A 1 GiB tool output on one transcript line: the import passes over it in small reads, so the
//! process's peak memory grows by about the line limit (64 MiB by default), not by the gigabyte,
//! and nothing is stored. It runs in a process of its own (this test binary again, with this
//! test alone), so that no other test of the binary moves the peak.

use crate::common;

use std::process::Command;

use lcm::store::import::{ImportError, ImportOptions, import_file};

/// Set in the child process, which runs the test itself.
const CHILD_ENV: &str = "LCM_IMPORT_HUGE_LINE_CHILD";
const TEST_NAME: &str = "a_one_gigabyte_line_is_passed_over_in_bounded_memory";

/// Peak resident memory of this process so far (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn a_one_gigabyte_line_is_passed_over_in_bounded_memory() {
    if std::env::var_os(CHILD_ENV).is_none() {
        // The parent: run the test alone in a child process and pass its verdict on.
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &common::test_name(module_path!(), TEST_NAME)])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        eprint!("{stderr}");
        assert!(
            out.status.success(),
            "the child failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains(" 1 passed;"),
            "the child ran no test:\n{stdout}"
        );
        return;
    }
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
