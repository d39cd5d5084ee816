//! What happens to one member of a several-member etcd: it leads, it stalls
//! (SIGSTOP), or it is partitioned from its peers by etcd-peer-proxy, which
//! carries the raft traffic between members.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::json;

use crate::binaries;
use crate::etcd_admin::start_proxy;
use crate::loopback::{get, http_json};
use crate::process::{Process, free_port};
use crate::{ControlPlane, etcd};

/// etcd-peer-proxy: one route per member, from the peer port it advertises
/// to the one it listens on.
pub(crate) struct PeerProxy {
    _process: Process,
    control_port: u16,
}

impl PeerProxy {
    /// Starts the routes of every proxied member of `members`; `None` when
    /// none is (a one-member etcd has no peers).
    pub async fn start(
        log_dir: &Path,
        members: &[etcd::Member],
        timeout: Duration,
    ) -> Result<Option<Self>> {
        if !members.iter().any(|m| m.ports.proxied()) {
            return Ok(None);
        }
        let program = binaries::program("etcd-peer-proxy")?;
        let control_port = free_port()?;
        let mut args = vec![format!("--control=127.0.0.1:{control_port}")];
        args.extend(members.iter().map(|m| {
            format!(
                "--route=127.0.0.1:{}=127.0.0.1:{}",
                m.ports.advertised_peer, m.ports.peer
            )
        }));
        let process = start_proxy(
            "etcd-peer-proxy",
            &program,
            &args,
            log_dir,
            control_port,
            timeout,
        )
        .await?;
        Ok(Some(Self {
            _process: process,
            control_port,
        }))
    }
}

impl ControlPlane {
    /// The index of the etcd member that leads, as the first member that
    /// answers says (a paused member does not).
    pub async fn etcd_leader(&self) -> Result<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for index in 0..self.etcd_members.len() {
            match self.etcd_member_status(index).await {
                Ok((id, lead)) => {
                    leader.get_or_insert(lead);
                    ids.push(Some(id));
                }
                Err(_) => ids.push(None),
            }
        }
        let leader = leader.context("no etcd member answered")?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
            .with_context(|| format!("leader {leader} is none of the members {ids:?}"))
    }

    /// Member `index`'s id and the leader id it knows, within 2 s.
    pub async fn etcd_member_status(&self, index: usize) -> Result<(String, String)> {
        let member = self
            .etcd_members
            .get(index)
            .with_context(|| format!("no etcd member {index}"))?;
        tokio::time::timeout(
            Duration::from_secs(2),
            etcd::member_status(member.client_addr()),
        )
        .await
        .with_context(|| format!("etcd member {index} did not answer within 2 s"))?
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) etcd member `index`: a member
    /// that stalls without closing a connection, as a hung disk or a
    /// scheduler freeze makes one.
    pub fn pause_etcd_member(&self, index: usize, paused: bool) -> Result<()> {
        let process = match index {
            0 => self.etcd.as_ref(),
            i => self.etcd_others.get(i - 1).and_then(Option::as_ref),
        };
        let pid = process
            .and_then(Process::pid)
            .with_context(|| format!("etcd member {index} is not running"))?;
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill {signal} {pid}: {status}");
        Ok(())
    }

    /// Whether etcd member `index` knows a leader (a member cut off from a
    /// quorum forgets it within an election timeout or two).
    pub async fn etcd_member_knows_a_leader(&self, index: usize) -> Result<bool> {
        let (_, leader) = self.etcd_member_status(index).await?;
        // The JSON gateway leaves a zero id out.
        Ok(!matches!(leader.as_str(), "0" | "null" | ""))
    }

    fn peer_proxy(&self) -> Result<&PeerProxy> {
        self.etcd_peer_proxy.as_ref().ok_or_else(|| {
            anyhow!("this control plane has one etcd member: there is no peer to cut")
        })
    }

    /// Cuts etcd member `index` off from the others: its clients (kube-apiserver)
    /// still reach it and it answers them, but it hears no leader and no write
    /// until [`ControlPlane::heal_etcd_partition`]. Its open raft streams are
    /// closed.
    pub async fn partition_etcd_member(&self, index: usize) -> Result<()> {
        let (id, _) = self.etcd_member_status(index).await?;
        http_json(
            self.peer_proxy()?.control_port,
            "POST",
            "/isolate",
            Some(json!({"route": index, "member_id": id})),
        )
        .await
        .map(drop)
    }

    /// Lets every member reach every other again.
    pub async fn heal_etcd_partition(&self) -> Result<()> {
        http_json(self.peer_proxy()?.control_port, "DELETE", "/isolate", None)
            .await
            .map(drop)
    }

    /// The index of the etcd member holding the most watches (gauge
    /// `etcd_debugging_mvcc_watcher_total`): the one serving kube-apiserver's
    /// watches of etcd, which feed its watch cache.
    pub async fn etcd_member_serving_watches(&self) -> Result<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (index, member) in self.etcd_members.iter().enumerate() {
            let metrics = get(member.ports.client, "/metrics")
                .await
                .with_context(|| format!("reading etcd member {index}'s metrics"))?;
            let watchers = gauge(&metrics, "etcd_debugging_mvcc_watcher_total")
                .with_context(|| format!("etcd member {index}'s metrics"))?;
            if best.is_none_or(|(_, most)| watchers > most) {
                best = Some((index, watchers));
            }
        }
        best.map(|(index, _)| index).context("no etcd member")
    }
}

/// The value of the unlabelled sample `name` in Prometheus text `metrics`.
fn gauge(metrics: &str, name: &str) -> Result<f64> {
    metrics
        .lines()
        .find_map(|line| {
            let (metric, value) = line.split_once(' ')?;
            (metric == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .with_context(|| format!("no sample {name}"))
}

#[cfg(test)]
mod tests {
    use super::gauge;

    #[test]
    fn reads_an_unlabelled_sample() {
        let text = "# HELP w x\n# TYPE w gauge\nw_total_other 3\nw 7\n";
        assert_eq!(gauge(text, "w").ok(), Some(7.0));
        assert!(gauge(text, "missing").is_err());
    }
}
