//! Following transcripts as they are written: `lcm import --follow`, and `[watch]` in the daemon.
//!
//! After the first import of the paths, a file-system watcher (the `notify` crate: inotify on
//! Linux, FSEvents on macOS) reports writes under them. Each changed transcript is imported on
//! from where the last read stopped ([`import_file_from`]): complete lines only, so a line the
//! writer has not finished is read once it is whole. A new file is imported from its start. A
//! file that shrank or whose beginning changed (rewritten in place, or replaced) is reported and
//! read again from the start: messages stored already are recognised by their source keys and
//! skipped, so nothing is ever stored twice. What is imported is indexed at once, so it is
//! searchable within a fraction of a second of the write (figures in docs/PERFORMANCE.md).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use lcm_core::config::Config;
use lcm_search::DataDir;
use lcm_store::import::{FilePosition, ImportOptions, import_file_from};
use notify::{RecursiveMode, Watcher};

use crate::App;
use crate::commands::catch_up_index;
use crate::import_commands::{
    ImportArgs, Listing, is_glob, is_transcript_name, list, print_import_report,
};
use crate::interrupt::Interrupt;
use crate::output::{Output, outln};

/// How long the follower waits for more events after one arrives, so a burst of writes is
/// imported in one round.
const SETTLE: Duration = Duration::from_millis(30);
/// How often the follower looks at its interrupt while nothing happens.
const TICK: Duration = Duration::from_millis(100);
/// Bytes at the start of a file remembered (as a hash) to notice that it was rewritten.
const HEAD_BYTES: u64 = 4096;

/// A path given to follow.
#[derive(Debug, Clone)]
pub(crate) enum Root {
    /// A folder: every transcript under it (hidden entries skipped).
    Folder { shown: PathBuf, resolved: PathBuf },
    /// One file.
    File { shown: PathBuf, resolved: PathBuf },
    /// A glob: the files it matches, now or later, under the folder before its first wildcard.
    Glob {
        given: PathBuf,
        pattern: glob::Pattern,
        base: PathBuf,
    },
}

impl Root {
    /// The root of the path given as `given` (already resolved to `resolved`).
    pub(crate) fn new(app: &App, given: &Path) -> Result<Root> {
        let resolved = app.cwd.join(given);
        if std::fs::symlink_metadata(&resolved).is_err() && is_glob(given) {
            let wild = |c: &std::path::Component<'_>| is_glob(Path::new(c.as_os_str()));
            // The watcher reports canonical paths: the pattern is made of the canonical folder
            // before the first wildcard and the rest as given.
            let base = canonical(
                &resolved
                    .components()
                    .take_while(|c| !wild(c))
                    .collect::<PathBuf>(),
            );
            let rest: PathBuf = resolved.components().skip_while(|c| !wild(c)).collect();
            let text = base.join(rest).to_string_lossy().into_owned();
            let pattern = glob::Pattern::new(&text)
                .with_context(|| format!("{} is not a valid glob", given.display()))?;
            return Ok(Root::Glob {
                given: given.to_path_buf(),
                pattern,
                base,
            });
        }
        let metadata = std::fs::metadata(&resolved)
            .with_context(|| format!("cannot follow {}", given.display()))?;
        Ok(if metadata.is_dir() {
            Root::Folder {
                shown: given.to_path_buf(),
                resolved: std::fs::canonicalize(&resolved).unwrap_or(resolved),
            }
        } else {
            Root::File {
                shown: given.to_path_buf(),
                resolved: canonical(&resolved),
            }
        })
    }

    /// The path as given.
    fn given(&self) -> &Path {
        match self {
            Root::Folder { shown, .. } | Root::File { shown, .. } => shown,
            Root::Glob { given, .. } => given,
        }
    }

    /// What the watcher watches for this root.
    fn watched(&self) -> (&Path, RecursiveMode) {
        match self {
            Root::Folder { resolved, .. } => (resolved, RecursiveMode::Recursive),
            Root::File { resolved, .. } => (
                resolved.parent().unwrap_or(Path::new("/")),
                RecursiveMode::NonRecursive,
            ),
            Root::Glob { base, .. } => (base, RecursiveMode::Recursive),
        }
    }

    /// How reports show `path` if it is a transcript of this root.
    fn shown(&self, app: &App, path: &Path) -> Option<PathBuf> {
        match self {
            Root::Folder { shown, resolved } => {
                let relative = path.strip_prefix(resolved).ok()?;
                let hidden = relative
                    .components()
                    .any(|c| c.as_os_str().to_string_lossy().starts_with('.'));
                (!hidden && is_transcript_name(path)).then(|| shown.join(relative))
            }
            Root::File { shown, resolved } => (path == resolved).then(|| shown.clone()),
            Root::Glob { given, pattern, .. } => pattern.matches_path(path).then(|| {
                if given.is_relative() {
                    path.strip_prefix(&app.cwd).unwrap_or(path).to_path_buf()
                } else {
                    path.to_path_buf()
                }
            }),
        }
    }
}

/// A file being followed.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub at: FilePosition,
    /// Hash of the file's first bytes (up to [`HEAD_BYTES`], never past `at`).
    head: u64,
}

impl Tracked {
    /// A file read up to `at`.
    pub(crate) fn new(path: &Path, at: FilePosition) -> Tracked {
        Tracked {
            at,
            head: head_hash(path, at.offset.min(HEAD_BYTES)).unwrap_or(0),
        }
    }
}

/// The key a followed file goes by: its canonical path (as the watcher reports it), or the
/// path itself once it is gone.
pub(crate) fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Hash of the first `len` bytes of `path`.
fn head_hash(path: &Path, len: u64) -> std::io::Result<u64> {
    let mut bytes = Vec::with_capacity(len as usize);
    std::fs::File::open(path)?
        .take(len)
        .read_to_end(&mut bytes)?;
    if (bytes.len() as u64) < len {
        // Shorter than before: not the file that was read.
        return Ok(u64::MAX);
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(&bytes);
    Ok(hasher.finish())
}

/// Follows `roots` until the app's interrupt (Ctrl-C, the CLI's cancel, the daemon stopping),
/// importing into `data`. `files` are the transcripts already imported and how far.
pub(crate) fn follow(
    app: &App,
    data: &DataDir,
    options: &ImportOptions,
    roots: &[Root],
    mut files: HashMap<PathBuf, Tracked>,
) -> Result<()> {
    let interrupt = app.interrupt()?;
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })
    .context("cannot watch the file system")?;
    for root in roots {
        let (path, mode) = root.watched();
        watcher
            .watch(path, mode)
            .with_context(|| format!("cannot watch {}", path.display()))?;
    }
    if !app.quiet {
        app.out.note(&format!(
            "following {} path(s) for new transcripts and lines; Ctrl-C stops",
            roots.len()
        ))?;
    }
    while !interrupt.requested() {
        let first = match rx.recv_timeout(TICK) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the file-system watcher stopped"),
        };
        // A burst of writes (a writer appending several lines) is one round.
        let mut events = vec![first];
        std::thread::sleep(SETTLE);
        events.extend(rx.try_iter());
        let mut changed = BTreeSet::new();
        let mut rescan = false;
        for event in events {
            match event {
                Ok(event) => {
                    rescan |= event.need_rescan();
                    changed.extend(event.paths);
                }
                Err(error) => {
                    tracing::warn!(%error, "file-system watcher");
                    rescan = true;
                }
            }
        }
        if rescan {
            changed.extend(files.keys().cloned());
            changed.extend(roots.iter().flat_map(|r| transcripts_under(app, r.given())));
        }
        // A folder made (or moved in) with files already in it: its files are new.
        let folders: Vec<PathBuf> = changed.iter().filter(|p| p.is_dir()).cloned().collect();
        for folder in folders {
            changed.extend(transcripts_under(app, &folder));
        }
        let mut round = Round::default();
        for path in changed {
            let path = canonical(&path);
            let Some(shown) = roots.iter().find_map(|r| r.shown(app, &path)) else {
                continue;
            };
            import_changed(data, options, &mut files, &path, shown, &mut round);
        }
        // Said once searchable: stored, and in the index.
        if round.imported > 0 {
            catch_up_index(app, data)?;
        }
        for line in round.said {
            match line {
                Said::Report(report) => print_import_report(app, &report)?,
                Said::Line(text) => outln!(app, "{text}")?,
            }
        }
    }
    if !app.quiet {
        app.out.note("stopped following")?;
    }
    Ok(())
}

/// The transcripts under `path` (a root as given, or a folder that appeared) now, listed as
/// `lcm import` lists them; what cannot be read is passed over (it is said at its import).
fn transcripts_under(app: &App, path: &Path) -> Vec<PathBuf> {
    list(app, &[path.to_path_buf()], true)
        .map(|listing| listing.files.into_iter().filter_map(|f| f.read).collect())
        .unwrap_or_default()
}

/// What one round of imports stored and has to say.
#[derive(Default)]
struct Round {
    imported: u64,
    said: Vec<Said>,
}

enum Said {
    Report(lcm_store::import::ImportReport),
    Line(String),
}

/// Imports what is new in the changed file at `path`.
fn import_changed(
    data: &DataDir,
    options: &ImportOptions,
    files: &mut HashMap<PathBuf, Tracked>,
    path: &Path,
    shown: PathBuf,
    round: &mut Round,
) {
    let Ok(metadata) = std::fs::metadata(path) else {
        // Deleted: what was imported from it stays stored.
        files.remove(path);
        return;
    };
    if !metadata.is_file() {
        return;
    }
    let size = metadata.len();
    let mut tracked = files
        .remove(path)
        .unwrap_or_else(|| Tracked::new(path, FilePosition::default()));
    if tracked.at.offset > 0 {
        let head_len = tracked.at.offset.min(HEAD_BYTES);
        let shrank = size < tracked.at.offset;
        if shrank || head_hash(path, head_len).unwrap_or(u64::MAX) != tracked.head {
            round.said.push(Said::Line(format!(
                "{}: {} (read up to byte {}, now {} bytes): reading it again from the start; \
                 messages stored already are skipped",
                shown.display(),
                if shrank { "truncated" } else { "rewritten" },
                tracked.at.offset,
                size
            )));
            tracked = Tracked::new(path, FilePosition::default());
        }
    }
    if size == tracked.at.offset {
        files.insert(path.to_path_buf(), tracked);
        return;
    }
    match import_file_from(&data.store, path, options, tracked.at, |_, _| {}) {
        Ok((mut report, at)) => {
            report.path = shown;
            round.imported += report.imported;
            if report.imported > 0 || report.error_count > 0 {
                round.said.push(Said::Report(report));
            }
            files.insert(path.to_path_buf(), Tracked::new(path, at));
        }
        Err(error) => {
            // Said once per change; the file is tried again at its next write.
            round.said.push(Said::Line(format!(
                "{}: not imported: {}",
                shown.display(),
                crate::report(&error.into())
            )));
            files.insert(path.to_path_buf(), tracked);
        }
    }
}

/// The roots of `given` for a listing made with them.
pub(crate) fn roots(app: &App, given: &[PathBuf], listing: &Listing) -> Result<Vec<Root>> {
    if listing.files.iter().any(|f| f.read.is_none()) {
        bail!("standard input (`-`) cannot be followed: give files or folders");
    }
    given.iter().map(|g| Root::new(app, g)).collect()
}

/// The `[watch]` follower of a daemon: a thread importing the configured paths until stopped.
pub struct Watching {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Watching {
    /// Starts following `config.watch.paths` into `data` (`None` when none is configured).
    /// `program` names the daemon in what it reports on stderr.
    pub fn start(
        data: &DataDir,
        config: &Config,
        program: &'static str,
    ) -> Result<Option<Watching>> {
        if config.watch.paths.is_empty() {
            return Ok(None);
        }
        let paths: Vec<PathBuf> = config.watch.paths.iter().map(|p| expand_home(p)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let cwd = std::env::current_dir().context("cannot read the working directory")?;
        let app = App::in_daemon(
            data.clone(),
            config.clone(),
            Output::stderr(),
            Interrupt::from_flag(Arc::clone(&stop)),
            cwd,
        );
        let args = ImportArgs {
            paths,
            format: None,
            session: None,
            strict: false,
            follow: true,
        };
        let thread = std::thread::Builder::new()
            .name("lcm-watch".into())
            .spawn(move || {
                if let Err(error) = crate::import_commands::import(&app, &args) {
                    eprintln!("{program}: [watch] stopped: {}", crate::report(&error));
                }
            })
            .context("cannot start the [watch] thread")?;
        Ok(Some(Watching { stop, thread }))
    }

    /// The flag that stops the follower when raised (from a signal handler's task).
    pub fn stopper(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Stops the follower and waits for it (it ends within a tick, or after the file in hand).
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// `~/x` is `x` in the home directory.
fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), dirs::home_dir()) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}
