//! RBAC parity (issue 22 §2): the chart's ClusterRole, rule by rule, against
//! upstream's bootstrap ClusterRoles of the two controllers it replaces, read
//! from a running kube-apiserver (`system:controller:endpoint-controller`,
//! `system:controller:endpointslice-controller`). Every difference is in
//! [`JUSTIFIED`] and explained in docs/rbac.md; any other difference, either
//! way, fails the test.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};

use super::*;

/// One permission: (API group, resource, verb).
type Grant = (String, String, String);

/// The differences docs/rbac.md justifies, as `+group/resource:verb` (the chart
/// grants it, upstream's role does not) or `-group/resource:verb` (upstream's
/// role grants it, the chart does not). Rules for the controller's own
/// infrastructure (the Lease Role, the metrics delegation) are not in the
/// controllers' ClusterRole and are listed in docs/rbac.md separately.
/// None today: the chart's rules are upstream's.
const JUSTIFIED: &[&str] = &[];

fn expand(rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for rule in rules {
        assert!(
            rule.resource_names.as_ref().is_none_or(Vec::is_empty),
            "a rule limited to names: {rule:?}"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    grants.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    grants
}

fn grant_text((group, resource, verb): &Grant) -> String {
    format!("{group}/{resource}:{verb}")
}

/// The chart's controller ClusterRole (the first ClusterRole rendered) with
/// `sets`, as grants.
fn chart_grants(sets: &[&str]) -> Result<BTreeSet<Grant>> {
    let docs = documents(&template(sets)?)?;
    let role: ClusterRole = serde_yaml::from_value(find(&docs, "ClusterRole")?.clone())?;
    Ok(expand(role.rules.as_deref().unwrap_or_default()))
}

async fn upstream_grants(client: &kube::Client, names: &[&str]) -> Result<BTreeSet<Grant>> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut grants = BTreeSet::new();
    for name in names {
        let role = roles
            .get(&format!("system:controller:{name}"))
            .await
            .with_context(|| format!("reading upstream's {name} role"))?;
        grants.extend(expand(role.rules.as_deref().unwrap_or_default()));
    }
    Ok(grants)
}

/// The differences between the chart's grants and upstream's, as
/// `+grant`/`-grant`.
fn differences(chart: &BTreeSet<Grant>, upstream: &BTreeSet<Grant>) -> BTreeSet<String> {
    let extra = chart
        .difference(upstream)
        .map(|g| format!("+{}", grant_text(g)));
    let missing = upstream
        .difference(chart)
        .map(|g| format!("-{}", grant_text(g)));
    extra.chain(missing).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_matches_upstreams_bootstrap_roles_rule_by_rule() -> Result<()> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client();
    let justified: BTreeSet<String> = JUSTIFIED.iter().map(|s| s.to_string()).collect();
    let rbac_doc = std::fs::read_to_string(root().join("docs/rbac.md"))?;
    for difference in &justified {
        assert!(
            rbac_doc.contains(&format!("`{difference}`")),
            "docs/rbac.md does not justify `{difference}`"
        );
    }
    // Both controllers, and each alone: the chart's rules follow the list.
    for (controllers, upstream_roles) in [
        (
            "controllers={endpoints,endpointslices}",
            &["endpoint-controller", "endpointslice-controller"][..],
        ),
        ("controllers={endpoints}", &["endpoint-controller"][..]),
        (
            "controllers={endpointslices}",
            &["endpointslice-controller"][..],
        ),
    ] {
        let upstream = upstream_grants(&client, upstream_roles).await?;
        assert!(
            upstream.len() > 5,
            "upstream's roles read as almost empty: {upstream:?}"
        );
        let chart = chart_grants(&["scope=all", controllers])?;
        let found = differences(&chart, &upstream);
        eprintln!(
            "{controllers}: upstream's {upstream_roles:?} grant {:?}; differences: {found:?}",
            upstream.iter().map(grant_text).collect::<Vec<_>>()
        );
        let unexplained: Vec<&String> = found.difference(&justified).collect();
        assert!(
            unexplained.is_empty(),
            "{controllers}: differences from upstream's {upstream_roles:?} that docs/rbac.md does not justify: {unexplained:?} (chart: {:?})",
            chart.iter().map(grant_text).collect::<Vec<_>>()
        );
        // A justification must stay true: each listed difference is one the
        // chart has (with both controllers on, they all apply).
        if upstream_roles.len() == 2 {
            let stale: Vec<&String> = justified.difference(&found).collect();
            assert!(
                stale.is_empty(),
                "JUSTIFIED lists differences that no longer exist: {stale:?}"
            );
        }
    }
    Ok(())
}

/// The comparison can fail: a rule added to the chart's role, or one taken
/// from upstream's, is a difference nothing justifies.
#[test]
fn a_new_difference_is_caught() {
    let grant = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
    let upstream: BTreeSet<Grant> = [grant("", "pods", "get"), grant("", "events", "create")]
        .into_iter()
        .collect();
    let mut chart = upstream.clone();
    chart.insert(grant("", "secrets", "get"));
    chart.remove(&grant("", "events", "create"));
    assert_eq!(
        differences(&chart, &upstream),
        ["+/secrets:get".to_string(), "-/events:create".to_string()]
            .into_iter()
            .collect()
    );
}
