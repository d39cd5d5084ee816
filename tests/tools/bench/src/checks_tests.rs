use super::{CHECKED, CheckDone, CpuStep, MEAN_PERIOD_S, attribute, parse_checks, resource_name};

/// 2026-11-29 23:00:00 UTC.
const T0: f64 = 1_795_993_200.0;

#[test]
fn finished_checks_are_read_from_both_releases_logs() {
    let log = r#"=== eg-harness: starting kube-apiserver --v=1
I1129 23:01:02.250000   4242 checker.go:103] "Cache consistency check passed" group="" resource="pods" resourceVersion="812" digest="1f"
I1129 23:01:05.000000   4242 checker.go:84] "Cache consistency check start" group="" resource="nodes"
E1129 23:01:07.500000   4242 checker.go:107] "Cache consistency check failed" group="discovery.k8s.io" resource="endpointslices" resourceVersion="9" etcdDigest="a" cacheDigest="b"
E1129 23:01:08.000000   4242 checker.go:95] "Cache consistency check error" err="cache is not ready" group="" resource="services"
I1129 23:01:09.000000   4242 delegator.go:342] "Cache consistency check passed" group="" resource="endpoints" resourceVersion="812" digest="2e"
"#;
    let checks = parse_checks(log, T0 + 60.0);
    assert_eq!(
        checks,
        vec![
            CheckDone {
                at_s: T0 + 62.25,
                resource: "core/pods".into(),
                erred: false,
            },
            CheckDone {
                at_s: T0 + 67.5,
                resource: "discovery.k8s.io/endpointslices".into(),
                erred: false,
            },
            CheckDone {
                at_s: T0 + 68.0,
                resource: "core/services".into(),
                erred: true,
            },
            CheckDone {
                at_s: T0 + 69.0,
                resource: "core/endpoints".into(),
                erred: false,
            },
        ],
        "a check that only started has not ended"
    );
}

#[test]
fn a_line_just_before_midnight_is_placed_on_the_day_before() {
    let log = r#"I1129 23:59:59.500000   1 checker.go:103] "Cache consistency check passed" group="" resource="pods""#;
    // 30 minutes after that midnight.
    let near = T0 + 3_600.0 + 1_800.0;
    assert_eq!(parse_checks(log, near)[0].at_s, T0 + 3_599.5);
}

/// `n` steps of 0.2 s from `T0`, kube-apiserver idling at 0.1 CPU-s a
/// second with a little noise, etcd at 0.05.
fn idle_steps(n: usize) -> Vec<CpuStep> {
    (1..=n)
        .map(|i| CpuStep {
            at_s: T0 + 0.2 * i as f64,
            dt_s: 0.2,
            apiserver_s: 0.02 + if i % 3 == 0 { 0.002 } else { 0.0 },
            etcd_s: 0.01,
        })
        .collect()
}

fn check(at_s: f64, resource: &str) -> CheckDone {
    CheckDone {
        at_s,
        resource: resource_name("", resource),
        erred: false,
    }
}

#[test]
fn a_check_costs_its_busy_steps_above_the_idle_rate() {
    let mut steps = idle_steps(1_000);
    // Steps 500..=504 (ending at T0 + 100.2 .. 101.0): 0.1 CPU-s more each in
    // kube-apiserver and 0.05 in etcd, the check logged in the last of them.
    for step in &mut steps[500..=504] {
        step.apiserver_s += 0.1;
        step.etcd_s += 0.05;
    }
    let cost = attribute(&steps, &[check(T0 + 100.9, "pods")], 200.0);
    let pods = cost.resources["core/pods"];
    assert_eq!(pods.checks, 1);
    assert!(
        (pods.apiserver_cpu_s - 0.5).abs() < 0.01,
        "{pods:?}: five busy steps of 0.1 CPU-s above idle"
    );
    assert!((pods.etcd_cpu_s - 0.25).abs() < 0.01, "{pods:?}");
    assert!((cost.idle_cpu_s_per_s - 0.15).abs() < 0.011, "{cost:?}");
    assert_eq!(
        cost.cpu_s_per_min, None,
        "the other checked resources had no check in the window"
    );
}

#[test]
fn a_check_without_busy_steps_costs_about_nothing() {
    let steps = idle_steps(1_000);
    let cost = attribute(&steps, &[check(T0 + 100.9, "services")], 200.0);
    let services = cost.resources["core/services"];
    assert_eq!(services.checks, 1);
    assert!(services.cpu_s_per_check().abs() < 0.005, "{services:?}");
}

#[test]
fn checks_in_one_step_share_it_and_a_minute_spreads_each_over_the_period() {
    let mut steps = idle_steps(3_000);
    let mut checks = Vec::new();
    for (i, (group, resource)) in CHECKED.iter().enumerate() {
        // One busy step each, 100 s apart: 0.3 CPU-s above idle.
        let step = 200 + 500 * i;
        steps[step].apiserver_s += 0.3;
        checks.push(CheckDone {
            at_s: steps[step].at_s - 0.1,
            resource: resource_name(group, resource),
            // An error still counts, and costs what it spent.
            erred: *resource == "nodes",
        });
    }
    // A second resource checked within the same busy step as the pods.
    steps[200].apiserver_s += 0.3;
    checks.push(check(steps[200].at_s - 0.05, "configmaps"));
    let cost = attribute(&steps, &checks, 600.0);
    let pods = cost.resources["core/pods"];
    assert!(
        (pods.apiserver_cpu_s - 0.3).abs() < 0.01,
        "{pods:?}: half the step"
    );
    assert_eq!((pods.errors, cost.resources["core/nodes"].errors), (0, 1));
    assert!((cost.resources["core/configmaps"].apiserver_cpu_s - 0.3).abs() < 0.01);
    let per_min = cost
        .cpu_s_per_min
        .expect("every checked resource had a check");
    let expected = 5.0 * 0.3 * 60.0 / MEAN_PERIOD_S;
    assert!(
        (per_min - expected).abs() < 0.01,
        "{per_min} against {expected}"
    );
}

#[test]
fn a_busy_stretch_before_an_earlier_check_is_not_claimed_twice() {
    let mut steps = idle_steps(1_000);
    for step in &mut steps[300..=310] {
        step.apiserver_s += 0.1;
    }
    // The nodes check is logged in step 305, the pods check in 310: the pods
    // check claims 306..=310 only.
    let checks = [
        check(steps[305].at_s - 0.1, "nodes"),
        check(steps[310].at_s - 0.1, "pods"),
    ];
    let cost = attribute(&steps, &checks, 200.0);
    assert!((cost.resources["core/pods"].apiserver_cpu_s - 0.5).abs() < 0.01);
    assert!((cost.resources["core/nodes"].apiserver_cpu_s - 0.6).abs() < 0.01);
}
