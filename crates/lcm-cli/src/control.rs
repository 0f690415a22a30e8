//! The control socket: how the CLI runs a command inside a daemon that holds the data directory.
//!
//! redb lets one process open a store file, so while `lcm serve` or `lcm mcp` runs, a second
//! `lcm grep` on the same data directory cannot open it. Instead the daemon listens on a unix
//! socket and advertises it in the data directory:
//!
//! ```text
//! <data_dir>/daemon.json   pid, program, version, socket path, a fresh secret token (mode 0600)
//! <data_dir>/lcm.sock      the socket (mode 0600)
//! ```
//!
//! The CLI reads the advert, connects, sends its arguments, working directory and the token,
//! and the daemon runs the very same command code on its open store and index
//! ([`crate::dispatch`]), sending back what the command writes (stdout bytes, notes for
//! stderr, progress bars to draw) and how it ended. Output is therefore byte for byte what the
//! command prints without a daemon. Ctrl-C in the CLI cancels the command in the daemon (it
//! stops as it would here: after the unit of work in hand).
//!
//! Frames in both directions: one kind byte, a big-endian `u32` length, the payload.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use lcm_core::config::Config;
use lcm_search::DataDir;
use serde::{Deserialize, Serialize};

use crate::interrupt::{INTERRUPTED_EXIT_CODE, Interrupt, Interrupted};
use crate::output::{BarStyle, BarUpdate, Output};
use crate::{App, Cli, Placement};

/// The advert's file name inside the data directory.
pub const ADVERT_FILE: &str = "daemon.json";
/// The socket's file name inside the data directory (when the path fits a socket address).
pub const SOCKET_FILE: &str = "lcm.sock";

/// Longest socket path the platform takes (`sun_path` is 108 bytes on Linux, 104 on macOS).
const MAX_SOCKET_PATH: usize = 100;
/// Largest frame accepted (a page of output is far smaller).
const MAX_FRAME: u32 = 64 * 1024 * 1024;
/// How long the daemon waits for a connected CLI's request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping daemon gives the commands it runs for CLIs to end.
const STOP_GRACE: Duration = Duration::from_secs(10);

// Frame kinds. CLI to daemon:
const REQUEST: u8 = b'R';
const CANCEL: u8 = b'C';
// Daemon to CLI:
const STDOUT: u8 = b'O';
const STDERR: u8 = b'E';
const PROGRESS: u8 = b'P';
const EXIT: u8 = b'X';

/// What a running daemon says about itself in `<data_dir>/daemon.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Advert {
    pub pid: u32,
    /// `lcm serve` or `lcm mcp`.
    pub program: String,
    /// The daemon's lcm version; a CLI of another version is refused.
    pub version: String,
    pub socket: PathBuf,
    /// The secret a CLI presents (the file is readable by its owner only).
    pub token: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    token: String,
    version: String,
    /// The CLI's arguments after the program name.
    args: Vec<String>,
    /// Where relative paths in `args` start.
    cwd: PathBuf,
    /// `lcm import -`: the CLI's standard input, copied into a file in the data directory.
    stdin_file: Option<PathBuf>,
    /// The data directory as the CLI names it (what `lcm stats` prints).
    data_dir: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct Exit {
    code: u8,
    /// The error report (`error: ` is added by the CLI).
    error: Option<String>,
}

fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// The next frame, or `None` at the end of the stream.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// The daemon's end of one CLI connection: what the command writes goes through it.
pub(crate) struct Link {
    stream: Mutex<UnixStream>,
}

impl Link {
    fn send(&self, kind: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut stream = self
            .stream
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        write_frame(&mut *stream, kind, payload)
    }

    pub(crate) fn stdout(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.send(STDOUT, bytes)
    }

    pub(crate) fn stderr(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.send(STDERR, bytes)
    }

    pub(crate) fn progress(&self, update: &BarUpdate) -> std::io::Result<()> {
        self.send(PROGRESS, &serde_json::to_vec(update)?)
    }

    fn exit(&self, exit: &Exit) -> std::io::Result<()> {
        self.send(EXIT, &serde_json::to_vec(exit)?)
    }
}

/// Where the socket of the daemon on `data_dir` goes: inside it when the path fits a socket
/// address, else in the runtime or temporary directory under a name derived from the data
/// directory's path.
fn socket_path(data_dir: &Path) -> PathBuf {
    let inside = data_dir.join(SOCKET_FILE);
    if inside.as_os_str().len() <= MAX_SOCKET_PATH {
        return inside;
    }
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    data_dir.hash(&mut hasher);
    let dir = std::env::var_os("XDG_RUNTIME_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    dir.join(format!("lcm-{:016x}.sock", hasher.finish()))
}

/// Writes `bytes` to `path` readable by its owner only, replacing it atomically.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

/// The daemon's side: the socket it listens on and the CLI commands it is running.
pub struct Control {
    advert_path: PathBuf,
    socket_path: PathBuf,
    stopping: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
    running: Arc<Mutex<Vec<Running>>>,
}

/// A CLI command the daemon runs: its interrupt flag and its thread.
struct Running {
    interrupt: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
    /// The connection, to cut if the command outlives the grace period (a CLI that stopped
    /// reading leaves the command blocked in a write).
    stream: Option<UnixStream>,
}

/// What stops a [`Control`] from another task (the daemon's signal handler): commands in hand
/// are interrupted and no new connection is served.
#[derive(Clone)]
pub struct ControlStopper {
    stopping: Arc<AtomicBool>,
    socket_path: PathBuf,
    running: Arc<Mutex<Vec<Running>>>,
}

impl ControlStopper {
    /// Begins the stop without waiting: running commands are asked to stop, the socket stops
    /// taking connections.
    pub fn begin(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        for running in lock(&self.running).iter() {
            running.interrupt.store(true, Ordering::SeqCst);
        }
        // Wakes the acceptor blocked in `accept`, which then sees `stopping`.
        let _ = UnixStream::connect(&self.socket_path);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Control {
    /// Listens for CLIs on the socket of `data`'s directory and advertises it. `data` is the
    /// daemon's open store and index; `config` its configuration, which commands run with.
    /// Call once the daemon holds the store (so no other live daemon owns the files).
    pub fn start(data: DataDir, config: Config, program: &str) -> Result<Control> {
        let socket_path = socket_path(&data.path);
        let advert_path = data.path.join(ADVERT_FILE);
        // Left by a daemon that did not stop cleanly: this process holds the store now.
        let _ = std::fs::remove_file(&socket_path);
        let listener = UnixListener::bind(&socket_path)
            .with_context(|| format!("cannot listen on {}", socket_path.display()))?;
        std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", socket_path.display()))?;
        let token = lcm_server::new_token().context("cannot make the control token")?;
        let advert = Advert {
            pid: std::process::id(),
            program: program.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            socket: socket_path.clone(),
            token: token.clone(),
        };
        write_private(&advert_path, &serde_json::to_vec_pretty(&advert)?)
            .with_context(|| format!("cannot write {}", advert_path.display()))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let running = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let stopping = Arc::clone(&stopping);
            let running = Arc::clone(&running);
            let daemon = Arc::new(Daemon {
                data,
                config,
                token,
            });
            std::thread::Builder::new()
                .name("lcm-control".into())
                .spawn(move || accept(&listener, &daemon, &stopping, &running))
                .context("cannot start the control thread")?
        };
        Ok(Control {
            advert_path,
            socket_path,
            stopping,
            acceptor: Some(acceptor),
            running,
        })
    }

    /// A handle that begins the stop from elsewhere.
    pub fn stopper(&self) -> ControlStopper {
        ControlStopper {
            stopping: Arc::clone(&self.stopping),
            socket_path: self.socket_path.clone(),
            running: Arc::clone(&self.running),
        }
    }

    /// Stops: no new connection, running commands interrupted and waited for (up to a grace
    /// period), the advert and the socket removed.
    pub fn stop(&mut self) {
        self.stopper().begin();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let deadline = Instant::now() + STOP_GRACE;
        let running = std::mem::take(&mut *lock(&self.running));
        for r in running {
            while !r.thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !r.thread.is_finished() {
                tracing::warn!("a CLI command did not stop within the grace period: cut off");
                if let Some(stream) = &r.stream {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                }
                let cut = Instant::now() + Duration::from_secs(1);
                while !r.thread.is_finished() && Instant::now() < cut {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if r.thread.is_finished() {
                let _ = r.thread.join();
            }
        }
        let _ = std::fs::remove_file(&self.advert_path);
        let _ = std::fs::remove_file(&self.socket_path);
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.stop();
        }
    }
}

/// What a daemon (`lcm serve`, `lcm mcp`) runs beside its own service while it holds a data
/// directory: the control socket for the CLI and the `[watch]` follower.
pub struct Holding {
    control: Control,
    watching: Option<crate::follow::Watching>,
}

impl Holding {
    /// Starts both on the data directory `runtime` holds; `program` names the daemon.
    pub fn start(
        app: &App,
        runtime: &lcm_engine::runtime::Runtime,
        program: &'static str,
    ) -> Result<Holding> {
        let held = DataDir::from_parts(
            app.data_dir.clone(),
            Arc::clone(runtime.store()),
            Arc::clone(runtime.index()),
        );
        let watching = crate::follow::Watching::start(&held, &app.config, program)?;
        let control = Control::start(held, app.config.clone(), program)?;
        Ok(Holding { control, watching })
    }

    /// `signal`, then the stop begun: the CLI commands in hand are interrupted and the
    /// follower is told to stop, before the daemon's own service stops.
    pub fn stop_on(
        &self,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let stopper = self.control.stopper();
        let following = self.watching.as_ref().map(crate::follow::Watching::stopper);
        async move {
            signal.await;
            stopper.begin();
            if let Some(flag) = following {
                flag.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Stops both and waits for them (inside the daemon's tokio runtime).
    pub fn stop(self) {
        let Holding {
            mut control,
            watching,
        } = self;
        tokio::task::block_in_place(|| {
            control.stop();
            if let Some(watching) = watching {
                watching.stop();
            }
        });
    }
}

/// What every connection's command runs with.
struct Daemon {
    data: DataDir,
    config: Config,
    token: String,
}

fn accept(
    listener: &UnixListener,
    daemon: &Arc<Daemon>,
    stopping: &AtomicBool,
    running: &Mutex<Vec<Running>>,
) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!(%error, "control socket: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let interrupt = Arc::new(AtomicBool::new(false));
        let kept = stream.try_clone().ok();
        let spawned = {
            let daemon = Arc::clone(daemon);
            let interrupt = Arc::clone(&interrupt);
            std::thread::Builder::new()
                .name("lcm-control-cli".into())
                .spawn(move || serve_connection(stream, &daemon, interrupt))
        };
        let mut running = lock(running);
        running.retain(|r| !r.thread.is_finished());
        match spawned {
            Ok(thread) => running.push(Running {
                interrupt,
                thread,
                stream: kept,
            }),
            Err(error) => tracing::warn!(%error, "control socket: cannot start a thread"),
        }
    }
}

/// Runs one CLI's command and reports how it ended.
fn serve_connection(stream: UnixStream, daemon: &Daemon, interrupt: Arc<AtomicBool>) {
    let link = match stream.try_clone() {
        Ok(writer) => Arc::new(Link {
            stream: Mutex::new(writer),
        }),
        Err(error) => {
            tracing::warn!(%error, "control socket: cannot use a connection");
            return;
        }
    };
    let exit = match run_request(stream, daemon, &link, interrupt) {
        Ok(()) => Exit {
            code: 0,
            error: None,
        },
        Err(error) => Exit {
            code: if error.is::<Interrupted>() {
                INTERRUPTED_EXIT_CODE
            } else {
                1
            },
            error: Some(crate::report(&error)),
        },
    };
    if let Err(error) = link.exit(&exit) {
        tracing::debug!(%error, "control socket: the CLI went away before the end");
    }
}

fn run_request(
    mut stream: UnixStream,
    daemon: &Daemon,
    link: &Arc<Link>,
    interrupt: Arc<AtomicBool>,
) -> Result<()> {
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let request: Request = match read_frame(&mut stream)? {
        Some((REQUEST, payload)) => {
            serde_json::from_slice(&payload).context("a malformed request")?
        }
        _ => bail!("expected a request"),
    };
    if !constant_time_eq(request.token.as_bytes(), daemon.token.as_bytes()) {
        bail!("the control token is wrong (is daemon.json from another daemon?)");
    }
    if request.version != env!("CARGO_PKG_VERSION") {
        bail!(
            "this daemon runs lcm {}, the command is lcm {}: use the daemon's lcm, or stop the \
             daemon first",
            env!("CARGO_PKG_VERSION"),
            request.version
        );
    }
    stream.set_read_timeout(None)?;
    // The CLI cancels with a frame (Ctrl-C) or by going away.
    {
        let interrupt = Arc::clone(&interrupt);
        std::thread::Builder::new()
            .name("lcm-control-cancel".into())
            .spawn(move || {
                while let Ok(Some((kind, _))) = read_frame(&mut stream) {
                    if kind == CANCEL {
                        break;
                    }
                }
                interrupt.store(true, Ordering::SeqCst);
            })?;
    }
    let cli = Cli::try_parse_from(std::iter::once("lcm".to_owned()).chain(request.args))
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    if let Placement::StoreAlone(what) | Placement::Elsewhere(what) = crate::placement(&cli.command)
    {
        bail!("{what} does not run through a daemon");
    }
    let mut app = App::in_daemon(
        daemon.data.clone(),
        daemon.config.clone(),
        Output::remote(Arc::clone(link)),
        Interrupt::from_flag(interrupt),
        request.cwd,
    );
    app.json = cli.json;
    app.quiet = cli.quiet || cli.json;
    app.stdin_file = request.stdin_file;
    app.data_dir = request.data_dir;
    let result = crate::dispatch(&app, &cli.command);
    app.out.flush()?;
    result
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A daemon found holding a data directory, connected.
pub(crate) struct Connected {
    pub advert: Advert,
    stream: UnixStream,
}

/// The daemon serving `data_dir`, if one runs: its advert is there and its socket answers. A
/// stale advert (the daemon was killed) is ignored: the store is then free to open here.
pub(crate) fn find(data_dir: &Path) -> Result<Option<Connected>> {
    let path = data_dir.join(ADVERT_FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let Ok(advert) = serde_json::from_slice::<Advert>(&text) else {
        return Ok(None);
    };
    match UnixStream::connect(&advert.socket) {
        Ok(stream) => Ok(Some(Connected { advert, stream })),
        Err(_) => Ok(None),
    }
}

/// The daemon's answer when a command ended with an error there.
#[derive(Debug)]
pub struct RemoteError {
    pub message: String,
    pub code: u8,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteError {}

/// Runs the command of `args` in the daemon of `connected` and prints what it writes; the
/// command's error comes back as a [`RemoteError`].
pub(crate) fn run_remote(
    connected: Connected,
    data_dir: &Path,
    args: Vec<String>,
    stdin_file: Option<PathBuf>,
) -> Result<()> {
    let Connected { advert, mut stream } = connected;
    let request = Request {
        token: advert.token.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        args,
        cwd: std::env::current_dir().context("cannot read the working directory")?,
        stdin_file,
        data_dir: data_dir.to_path_buf(),
    };
    write_frame(&mut stream, REQUEST, &serde_json::to_vec(&request)?)
        .context("cannot send the command to the daemon")?;
    // Ctrl-C: the daemon stops the command as it would stop here; a second one ends the CLI.
    let interrupt = Interrupt::install()?;
    // Watches for Ctrl-C until the command ends (told at once through the channel, so the
    // CLI never waits for the watcher's next look).
    let (finished, ended_rx) = std::sync::mpsc::channel::<()>();
    let watcher = {
        let mut cancel = stream.try_clone()?;
        std::thread::spawn(move || {
            loop {
                match ended_rx.recv_timeout(Duration::from_millis(20)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if interrupt.requested() {
                    let _ = write_frame(&mut cancel, CANCEL, &[]);
                    return;
                }
            }
        })
    };
    let ended = receive(&mut stream);
    let _ = finished.send(());
    let _ = watcher.join();
    match ended? {
        Exit { error: None, .. } => Ok(()),
        Exit {
            error: Some(message),
            code,
        } => Err(RemoteError { message, code }.into()),
    }
}

/// Prints the daemon's frames until the exit frame.
fn receive(stream: &mut UnixStream) -> Result<Exit> {
    let mut bars: Vec<(u32, indicatif::ProgressBar)> = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let lost = || {
        anyhow::anyhow!("the daemon closed the connection before the command ended (did it stop?)")
    };
    loop {
        let (kind, payload) = read_frame(stream)
            .map_err(|e| lost().context(e.to_string()))?
            .ok_or_else(lost)?;
        match kind {
            STDOUT => stdout.write_all(&payload)?,
            STDERR => {
                stdout.flush()?;
                std::io::stderr().write_all(&payload)?;
            }
            PROGRESS => {
                let update: BarUpdate = serde_json::from_slice(&payload)?;
                draw(&mut bars, update);
            }
            EXIT => {
                for (_, bar) in bars {
                    bar.finish_and_clear();
                }
                stdout.flush()?;
                return Ok(serde_json::from_slice(&payload)?);
            }
            other => bail!("the daemon sent a frame of unknown kind {other}"),
        }
    }
}

/// Mirrors a daemon's progress bar on this terminal.
fn draw(bars: &mut Vec<(u32, indicatif::ProgressBar)>, update: BarUpdate) {
    let index = match bars.iter().position(|(id, _)| *id == update.id) {
        Some(index) => index,
        None => {
            let bar = update.style.local(&update.message, update.length);
            bars.push((update.id, bar));
            bars.len() - 1
        }
    };
    let bar = &bars[index].1;
    if update.done {
        bar.finish_and_clear();
        bars.remove(index);
        return;
    }
    if update.style != BarStyle::Spinner {
        bar.set_length(update.length);
        bar.set_position(update.position);
    }
    bar.set_message(update.message);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut wire = Vec::new();
        write_frame(&mut wire, STDOUT, b"hello").unwrap();
        write_frame(&mut wire, EXIT, b"").unwrap();
        let mut r = wire.as_slice();
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some((STDOUT, b"hello".to_vec()))
        );
        assert_eq!(read_frame(&mut r).unwrap(), Some((EXIT, Vec::new())));
        assert_eq!(read_frame(&mut r).unwrap(), None);

        let mut huge = vec![STDOUT];
        huge.extend_from_slice(&(MAX_FRAME + 1).to_be_bytes());
        let error = read_frame(&mut huge.as_slice()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);

        // A frame cut short is an error, not a short frame.
        let mut cut = Vec::new();
        write_frame(&mut cut, STDOUT, b"hello").unwrap();
        cut.truncate(7);
        assert!(read_frame(&mut cut.as_slice()).is_err());
    }

    #[test]
    fn a_long_data_directory_gets_its_socket_elsewhere() {
        let short = Path::new("/tmp/lcm-data");
        assert_eq!(socket_path(short), short.join(SOCKET_FILE));
        let long = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        let socket = socket_path(&long);
        assert!(socket.as_os_str().len() <= MAX_SOCKET_PATH + 40);
        assert!(!socket.starts_with(&long));
        assert_eq!(
            socket,
            socket_path(&long),
            "the same directory, the same socket"
        );
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
