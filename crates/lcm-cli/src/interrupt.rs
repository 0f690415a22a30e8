//! Ctrl-C (SIGINT) and SIGTERM during a long command that writes (`lcm import`, `lcm reindex`).
//!
//! Killed by the signal's default action, such a command leaves the store unclosed: nothing
//! acknowledged is lost (every commit is durable), but the next open has to recover the file,
//! which reads the whole store (about 0.2 s for 134 MB here; seconds for gigabytes), and the
//! user learns nothing about what was done. With [`Interrupt::install`] the first signal
//! only raises a flag: the command finishes the unit of work in hand (a file, an index commit),
//! closes the store cleanly, says what was done and what was not, and exits with 130 ([`Interrupted`]).
//! A second signal ends the process at once, as the default would.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};

/// The exit code of a command stopped by [`Interrupt`] (128 + SIGINT, as shells report it).
pub const INTERRUPTED_EXIT_CODE: u8 = 130;

/// Whether SIGINT or SIGTERM arrived since [`Interrupt::install`].
#[derive(Debug, Clone)]
pub struct Interrupt {
    requested: Arc<AtomicBool>,
}

impl Interrupt {
    /// Catches SIGINT and SIGTERM from now on: the first one raises the flag, a second one
    /// exits the process with [`INTERRUPTED_EXIT_CODE`] at once.
    pub fn install() -> Result<Interrupt> {
        let requested = Arc::new(AtomicBool::new(false));
        for signal in [SIGINT, SIGTERM] {
            // The order matters: the shutdown hook runs first and exits only if the flag was
            // already raised by an earlier signal; then the flag is raised.
            signal_hook::flag::register_conditional_shutdown(
                signal,
                i32::from(INTERRUPTED_EXIT_CODE),
                Arc::clone(&requested),
            )
            .context("cannot install the signal handler")?;
            signal_hook::flag::register(signal, Arc::clone(&requested))
                .context("cannot install the signal handler")?;
        }
        Ok(Interrupt { requested })
    }

    /// An interrupt raised by whoever holds `flag` (the daemon, for a command it runs for a
    /// CLI: the CLI's Ctrl-C, the CLI going away, or the daemon stopping).
    pub fn from_flag(flag: Arc<AtomicBool>) -> Interrupt {
        Interrupt { requested: flag }
    }

    /// Whether a signal asked the command to stop.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }
}

/// The error a command returns when it stopped early because of [`Interrupt`]; the CLI exits
/// with [`INTERRUPTED_EXIT_CODE`] for it. The message says what was done and what was not.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "interrupted: {}", self.0)
    }
}

impl std::error::Error for Interrupted {}
