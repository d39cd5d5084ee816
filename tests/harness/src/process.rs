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

/// `N` distinct TCP ports on 127.0.0.1 that were free a moment ago.
///
/// Between picking a port and the program binding it, the port must stay
/// free. A port the kernel hands out for `bind(0)` lies in the ephemeral
/// range, where any outgoing connection (kube-apiserver to etcd, a client
/// to kube-apiserver) may take it in that moment: etcd then fails with
/// "address already in use". So ports come from below the ephemeral range,
/// which only explicit binds use, walked by one counter per process (no
/// port repeats within a run) from a start that differs between processes.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let range = outside_ephemeral(&std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default());
    let span = u32::from(range.end.saturating_sub(range.start));
    if span == 0 {
        return Err(anyhow!(
            "no port on 127.0.0.1 lies outside the ephemeral range"
        ));
    }
    let mut next = NEXT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut offset = next.unwrap_or_else(|| std::process::id().wrapping_mul(7919) % span);
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let mut tried = 0;
        let listener = loop {
            if tried == span {
                return Err(anyhow!("no free port on 127.0.0.1 in {range:?}"));
            }
            let candidate = range.start + u16::try_from(offset % span)?;
            offset = (offset + 1) % span;
            tried += 1;
            if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, candidate)) {
                break listener;
            }
        };
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    *next = Some(offset);
    Ok(ports)
}

const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// Ports no outgoing connection takes, given the contents of
/// `ip_local_port_range`: the 10,000 below its start when there is room,
/// else those above its end (Linux's default start is 32768). Kept below
/// 30000 too, where the default NodePort range begins.
fn outside_ephemeral(ip_local_port_range: &str) -> std::ops::Range<u16> {
    const SPAN: u16 = 10_000;
    const NODE_PORTS_START: u16 = 30_000;
    let mut bounds = ip_local_port_range
        .split_whitespace()
        .map(|bound| bound.parse::<u16>().ok());
    let (low, high) = match (bounds.next().flatten(), bounds.next().flatten()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32768, 60999),
    };
    let top = low.min(NODE_PORTS_START);
    if top >= 1024 + SPAN {
        top - SPAN..top
    } else {
        high.saturating_add(1).max(1024)..u16::MAX
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_lie_below_the_ephemeral_range_when_there_is_room() {
        assert_eq!(outside_ephemeral("32768\t60999\n"), 20000..30000);
        assert_eq!(outside_ephemeral("15000 60999"), 5000..15000);
        assert_eq!(outside_ephemeral("5000 65000"), 65001..u16::MAX);
        assert_eq!(outside_ephemeral(""), 20000..30000);
        assert_eq!(outside_ephemeral("1024 65535").len(), 0);
    }

    #[test]
    fn picked_ports_are_distinct_and_outside_the_ephemeral_range() {
        let range =
            outside_ephemeral(&std::fs::read_to_string(EPHEMERAL_RANGE).unwrap_or_default());
        let first = free_ports::<3>().unwrap();
        let second = free_ports::<3>().unwrap();
        let all: std::collections::BTreeSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 6, "{first:?} {second:?}");
        assert!(
            all.iter().all(|port| range.contains(port)),
            "{all:?} outside {range:?}"
        );
    }
}
