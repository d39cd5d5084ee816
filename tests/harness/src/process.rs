//! Child processes of the control plane: each logs to its own file, dies with
//! the test process (PR_SET_PDEATHSIG) and is killed when its handle drops.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

/// How many log lines a failure message or a panicking drop shows.
pub const LOG_TAIL_LINES: usize = 30;

/// A running program of the control plane. Dropping it kills the program
/// (SIGKILL) and, while the thread is panicking, prints the tail of its log.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, stdout and stderr appended to `log_path`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log_path: &Path) -> Result<Self> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        writeln!(
            log,
            "=== eg-harness: starting {} {}",
            program.display(),
            args.join(" ")
        )
        .with_context(|| format!("writing {}", log_path.display()))?;
        let stderr = log
            .try_clone()
            .with_context(|| format!("duplicating {}", log_path.display()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            // Log times in UTC whatever the machine's zone, so that a tool can
            // line a log line up with its own clock.
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let child = spawn_dying_with_us(command)
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    /// The program's name as given to `spawn`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The file its stdout and stderr go to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// Fails, with the tail of the log, if the program has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        let name = self.name.clone();
        let Some(child) = self.child.as_mut() else {
            return Err(anyhow!("{name} was stopped"));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(anyhow!(
                "{name} exited ({status}); last lines of {}:\n{}",
                self.log_path.display(),
                self.log_tail(LOG_TAIL_LINES)
            )),
            Err(err) => Err(anyhow!(err).context(format!("checking on {name}"))),
        }
    }

    /// Polls `ready` every `every` until it answers `Ok`, failing as soon as
    /// the program exits, or after `timeout` with `ready`'s last error and the
    /// tail of the log: how every program a test starts is waited for.
    pub async fn wait_until<F, Fut>(
        &mut self,
        timeout: Duration,
        every: Duration,
        mut ready: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.ensure_running()?;
            let last = match ready().await {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "{} not ready after {timeout:?} (last: {last:#}); last lines of {}:\n{}",
                    self.name,
                    self.log_path.display(),
                    self.log_tail(LOG_TAIL_LINES)
                ));
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Stops the program: SIGTERM, then SIGKILL if it has not exited after
    /// 15 seconds. Does nothing if it already stopped.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if child.try_wait()?.is_none() {
            let pid = libc::pid_t::try_from(child.id()).context("pid out of range")?;
            // SAFETY: kill(2) on our own child's pid; it is not reaped yet, so
            // the pid cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            for _ in 0..150 {
                if child.try_wait()?.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.kill();
        Ok(())
    }

    /// Kills the program (SIGKILL) and reaps it, at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- eg-harness: {} log {} (last {LOG_TAIL_LINES} lines):\n{}",
                self.name,
                self.log_path.display(),
                self.log_tail(LOG_TAIL_LINES)
            );
        }
    }
}

/// The last `lines` lines of a log file (reads at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct TCP ports on 127.0.0.1 that were free a moment ago (all
/// bound at once, so none repeats).
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding 127.0.0.1:0 to pick a port")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` so that the kernel kills the child (SIGKILL) when we die.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not
/// the process. Test threads and runtime worker threads come and go, so every
/// child is forked from one thread that lives as long as the process.
fn spawn_dying_with_us(mut command: Command) -> std::io::Result<Child> {
    static SPAWNER: Mutex<Option<mpsc::Sender<SpawnRequest>>> = Mutex::new(None);
    let parent = libc::pid_t::try_from(std::process::id()).map_err(std::io::Error::other)?;
    // SAFETY: between fork and exec the closure calls only prctl(2), getppid(2)
    // and reads a copied integer, all async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The test process may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("parent exited before exec"));
            }
            Ok(())
        });
    }
    let sender = {
        let mut spawner = SPAWNER
            .lock()
            .map_err(|_| std::io::Error::other("spawner lock poisoned"))?;
        match &*spawner {
            Some(sender) => sender.clone(),
            None => {
                let (tx, rx) = mpsc::channel::<SpawnRequest>();
                std::thread::Builder::new()
                    .name("eg-harness-spawner".into())
                    .spawn(move || {
                        for (mut command, reply) in rx {
                            let _ = reply.send(command.spawn());
                        }
                    })?;
                *spawner = Some(tx.clone());
                tx
            }
        }
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}
