//! Printing: JSON for scripts, aligned text for people, progress bars on stderr.
//!
//! A command never prints with `println!`: it writes through its [`App`]'s [`Output`], which is
//! the process's stdout and stderr when the command runs here, and the connection to the CLI
//! when it runs inside a daemon for a CLI (`crate::control`). The same code makes the same
//! bytes either way, which is what lets `lcm grep` through a daemon print exactly what it
//! prints without one.

use std::fmt;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::App;
use crate::control::Link;

/// Writes one line of a command's output: `outln!(app, "{} hits", n)?`.
macro_rules! outln {
    ($app:expr) => {
        $app.out.write_fmt(format_args!("\n"))
    };
    ($app:expr, $($arg:tt)*) => {
        $app.out.write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes a command's output without a line end: `out!(app, "{table}")?`.
macro_rules! out {
    ($app:expr, $($arg:tt)*) => {
        $app.out.write_fmt(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};

/// Bytes the daemon gathers before it sends them to the CLI.
const REMOTE_BUFFER: usize = 32 * 1024;
/// How often a progress bar drawn for a CLI is updated over the connection.
const REMOTE_PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Where a command's output goes.
pub struct Output {
    sink: Sink,
}

enum Sink {
    /// This process's stdout and stderr.
    Local,
    /// This process's stderr only (a daemon's own reports; its stdout may be a protocol).
    Stderr,
    /// A CLI's connection to the daemon running the command; stdout is gathered into frames.
    Remote {
        link: Arc<Link>,
        buffer: Mutex<Vec<u8>>,
        next_bar: Mutex<u32>,
    },
}

impl Output {
    /// Output to this process's stdout and stderr.
    pub fn local() -> Output {
        Output { sink: Sink::Local }
    }

    /// Output to this process's stderr: what a daemon reports of its own work.
    pub fn stderr() -> Output {
        Output { sink: Sink::Stderr }
    }

    /// Output over `link` to the CLI that asked a daemon to run the command.
    pub(crate) fn remote(link: Arc<Link>) -> Output {
        Output {
            sink: Sink::Remote {
                link,
                buffer: Mutex::new(Vec::new()),
                next_bar: Mutex::new(0),
            },
        }
    }

    /// Writes formatted text to stdout (see [`outln!`]).
    pub fn write_fmt(&self, args: fmt::Arguments<'_>) -> std::io::Result<()> {
        match args.as_str() {
            Some(text) => self.write_bytes(text.as_bytes()),
            None => self.write_bytes(args.to_string().as_bytes()),
        }
    }

    /// Writes bytes to stdout as they are (`lcm show --original`).
    pub fn write_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        match &self.sink {
            Sink::Local => std::io::stdout().lock().write_all(bytes),
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
            Sink::Remote { link, buffer, .. } => {
                let mut buffer = lock(buffer);
                buffer.extend_from_slice(bytes);
                if buffer.len() >= REMOTE_BUFFER {
                    link.stdout(&buffer)?;
                    buffer.clear();
                }
                Ok(())
            }
        }
    }

    /// A note for the person at the terminal (stderr), not part of the output proper.
    pub fn note(&self, text: &str) -> std::io::Result<()> {
        match &self.sink {
            Sink::Local | Sink::Stderr => writeln!(std::io::stderr().lock(), "{text}"),
            Sink::Remote { .. } => {
                self.flush()?;
                self.remote_link()
                    .map_or(Ok(()), |link| link.stderr(format!("{text}\n").as_bytes()))
            }
        }
    }

    /// Sends what is gathered (through a daemon) or flushes stdout (here).
    pub fn flush(&self) -> std::io::Result<()> {
        match &self.sink {
            Sink::Local => std::io::stdout().lock().flush(),
            Sink::Stderr => std::io::stderr().lock().flush(),
            Sink::Remote { link, buffer, .. } => {
                let mut buffer = lock(buffer);
                if !buffer.is_empty() {
                    link.stdout(&buffer)?;
                    buffer.clear();
                }
                Ok(())
            }
        }
    }

    fn remote_link(&self) -> Option<&Arc<Link>> {
        match &self.sink {
            Sink::Local | Sink::Stderr => None,
            Sink::Remote { link, .. } => Some(link),
        }
    }

    fn bar(&self, quiet: bool, style: BarStyle, message: &str, total: u64) -> Bar {
        if quiet {
            return Bar::Local(ProgressBar::hidden());
        }
        match &self.sink {
            Sink::Local | Sink::Stderr => Bar::Local(style.local(message, total)),
            Sink::Remote { link, next_bar, .. } => {
                let id = {
                    let mut next = lock(next_bar);
                    *next += 1;
                    *next
                };
                let bar = Bar::Remote(Arc::new(RemoteBar {
                    link: Arc::clone(link),
                    state: Mutex::new(RemoteBarState {
                        update: BarUpdate {
                            id,
                            style,
                            message: message.to_owned(),
                            position: 0,
                            length: total,
                            done: false,
                        },
                        sent: None,
                    }),
                }));
                bar.send(true);
                bar
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The kind of a progress bar.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BarStyle {
    Bytes,
    Count,
    Spinner,
}

impl BarStyle {
    /// The bar drawn on this process's stderr (indicatif hides it when stderr is not a
    /// terminal).
    pub(crate) fn local(self, message: &str, total: u64) -> ProgressBar {
        let template = match self {
            BarStyle::Bytes => {
                "{msg:>12} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
            }
            BarStyle::Count => "{msg:>12} [{bar:32}] {human_pos}/{human_len} {per_sec} eta {eta}",
            BarStyle::Spinner => "{spinner} {msg} {elapsed}",
        };
        let bar = if self == BarStyle::Spinner {
            let bar = ProgressBar::new_spinner();
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        } else {
            ProgressBar::new(total)
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(message.to_owned());
        bar
    }
}

/// One state of a progress bar a daemon draws for a CLI (sent over the connection).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BarUpdate {
    pub id: u32,
    pub style: BarStyle,
    pub message: String,
    pub position: u64,
    pub length: u64,
    /// The bar is finished and cleared.
    pub done: bool,
}

/// A progress bar on stderr: drawn here, or by the CLI a daemon runs the command for.
#[derive(Clone)]
pub enum Bar {
    Local(ProgressBar),
    Remote(Arc<RemoteBar>),
}

/// A bar drawn by the CLI at the other end of a connection.
pub struct RemoteBar {
    link: Arc<Link>,
    state: Mutex<RemoteBarState>,
}

struct RemoteBarState {
    update: BarUpdate,
    sent: Option<Instant>,
}

impl Bar {
    pub fn set_length(&self, length: u64) {
        match self {
            Bar::Local(bar) => bar.set_length(length),
            Bar::Remote(bar) => {
                lock(&bar.state).update.length = length;
                self.send(false);
            }
        }
    }

    pub fn set_position(&self, position: u64) {
        match self {
            Bar::Local(bar) => bar.set_position(position),
            Bar::Remote(bar) => {
                lock(&bar.state).update.position = position;
                self.send(false);
            }
        }
    }

    pub fn inc(&self, delta: u64) {
        match self {
            Bar::Local(bar) => bar.inc(delta),
            Bar::Remote(bar) => {
                lock(&bar.state).update.position += delta;
                self.send(false);
            }
        }
    }

    pub fn set_message(&self, message: String) {
        match self {
            Bar::Local(bar) => bar.set_message(message),
            Bar::Remote(bar) => {
                lock(&bar.state).update.message = message;
                self.send(true);
            }
        }
    }

    pub fn finish_and_clear(&self) {
        match self {
            Bar::Local(bar) => bar.finish_and_clear(),
            Bar::Remote(bar) => {
                lock(&bar.state).update.done = true;
                self.send(true);
            }
        }
    }

    /// Sends the bar's state to the CLI: always when `now`, else at most every
    /// [`REMOTE_PROGRESS_EVERY`]. A CLI that went away is noticed by the command's interrupt,
    /// not here.
    fn send(&self, now: bool) {
        let Bar::Remote(bar) = self else { return };
        let mut state = lock(&bar.state);
        if !now
            && state
                .sent
                .is_some_and(|at| at.elapsed() < REMOTE_PROGRESS_EVERY)
        {
            return;
        }
        state.sent = Some(Instant::now());
        let _ = bar.link.progress(&state.update);
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(app: &App, value: &T) -> Result<()> {
    outln!(app, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// A byte-count progress bar (hidden when quiet or when stderr is not a terminal).
pub fn bytes_bar(app: &App, message: &str, total: u64) -> Bar {
    app.out.bar(app.quiet, BarStyle::Bytes, message, total)
}

/// A count progress bar (hidden when quiet or when stderr is not a terminal).
pub fn count_bar(app: &App, message: &str, total: u64) -> Bar {
    app.out.bar(app.quiet, BarStyle::Count, message, total)
}

/// A spinner on stderr while a step without progress of its own runs (hidden when quiet).
pub fn spinner(app: &App, message: &str) -> Bar {
    app.out.bar(app.quiet, BarStyle::Spinner, message, 0)
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
