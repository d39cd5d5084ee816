//! The controller's client asks for gzipped answers, and kube-apiserver
//! sends them: a LIST of pods larger than kube-apiserver's threshold for
//! compression (128 KiB) is read through the client endpoints-guard builds
//! (`startup::client`), and kube-apiserver's own count of the bytes it sent
//! (`apiserver_response_sizes`) must be a fraction of the answer's decoded
//! length. With `--disable-compression` the same list must cost its whole
//! length, so the flag, and the measurement, are shown to do something.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use eg_bench::plane::apiserver_metrics;
use eg_harness::{ControlPlane, ControlPlaneOptions, PodBuilder};
use eg_workload::metrics::sample_sum;
use endpoints_guard::config::Config;
use endpoints_guard::startup;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

const NS: &str = "gzip";
const PODS: usize = 80;
/// What kube-apiserver counts of a pod LIST's answers: the bytes it wrote,
/// after compression.
const LIST_PODS_BYTES: &str =
    "apiserver_response_sizes_sum{resource=\"pods\",verb=\"LIST\",scope=\"namespace\"}";

async fn list_bytes_sent(cp: &ControlPlane) -> Result<f64> {
    let text = apiserver_metrics(&cp.client()).await?;
    Ok(sample_sum(&text, LIST_PODS_BYTES).unwrap_or(0.0))
}

/// The decoded length of one JSON LIST of the namespace's pods read through
/// the controller's client built with `flags`, and the bytes kube-apiserver
/// counted for it.
async fn one_list(cp: &ControlPlane, flags: &[&str]) -> Result<(usize, f64)> {
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let mut argv = vec!["endpoints-guard", "--kubeconfig", kubeconfig.as_str()];
    argv.extend_from_slice(flags);
    let client = startup::client(&Config::try_parse_from(argv)?).await?;
    let before = list_bytes_sent(cp).await?;
    let request = http::Request::get(format!("/api/v1/namespaces/{NS}/pods")).body(Vec::new())?;
    let decoded = client.request_text(request).await?.len();
    // kube-apiserver counts a request after its handler returns, which may be
    // a moment after the client has read the last byte.
    for _ in 0..50 {
        let sent = list_bytes_sent(cp).await? - before;
        if sent > 0.0 {
            return Ok((decoded, sent));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("kube-apiserver counted no bytes for the LIST of {NS}'s pods within 5 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_lists_come_gzipped_unless_disabled() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.create_namespace(NS).await?;
    let pods = Api::<Pod>::namespaced(cp.client(), NS);
    // Annotations make each pod about 4 KiB, the list about 320 KiB: above the
    // threshold, as a page of the resync's or the audit's lists is.
    let note = "endpoints-guard reads this list gzipped. ".repeat(64);
    for i in 0..PODS {
        let pod = PodBuilder::new(NS, &format!("p{i}"))
            .annotation("example.com/note", &note)
            .build();
        pods.create(&PostParams::default(), &pod).await?;
    }

    let (decoded, sent) = one_list(&cp, &[]).await?;
    eprintln!("compression: a {decoded}-byte list sent in {sent} bytes with gzip");
    ensure!(
        decoded > 128 * 1024,
        "the list is {decoded} bytes, under kube-apiserver's threshold for gzip"
    );
    ensure!(
        sent < decoded as f64 / 4.0,
        "gzip asked for: kube-apiserver sent {sent} bytes for a {decoded}-byte list"
    );

    let (decoded, sent) = one_list(&cp, &["--disable-compression"]).await?;
    eprintln!("compression: a {decoded}-byte list sent in {sent} bytes without");
    ensure!(
        sent >= decoded as f64 * 0.9,
        "--disable-compression: kube-apiserver sent {sent} bytes for a {decoded}-byte list"
    );
    Ok(())
}
