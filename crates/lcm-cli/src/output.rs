//! Printing: JSON for scripts, aligned text for people, progress bars on stderr.

use std::time::Duration;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A byte-count progress bar (hidden when quiet or when stderr is not a terminal).
pub fn bytes_bar(quiet: bool, message: &str, total: u64) -> ProgressBar {
    bar(
        quiet,
        message,
        total,
        "{msg:>12} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
}

/// A count progress bar (hidden when quiet or when stderr is not a terminal).
pub fn count_bar(quiet: bool, message: &str, total: u64) -> ProgressBar {
    bar(
        quiet,
        message,
        total,
        "{msg:>12} [{bar:32}] {human_pos}/{human_len} {per_sec} eta {eta}",
    )
}

/// A spinner on stderr while a step without progress of its own runs (hidden when quiet).
pub fn spinner(quiet: bool, message: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        bar.set_style(style);
    }
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn bar(quiet: bool, message: &str, total: u64, template: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_owned());
    bar
}

/// `12345` -> `12,345`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_separators() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000), "1,000");
        assert_eq!(super::thousands(1234567), "1,234,567");
    }
}
