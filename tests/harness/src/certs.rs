//! Certificates and keys for kube-apiserver, made with rcgen: one CA that
//! signs both the serving certificate (IP 127.0.0.1, DNS localhost) and the
//! admin client certificate (O=system:masters), plus the ECDSA P-256 key pair
//! that signs ServiceAccount tokens. For a real node it also signs the
//! kubelet's serving certificate and kube-apiserver's client certificate
//! toward the kubelet (exec, container logs, port-forward).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The `kubernetes` Service's ClusterIP: the first address of
/// [`crate::SERVICE_CLUSTER_IP_RANGE`].
pub const KUBERNETES_SERVICE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));

/// Common name of the admin client certificate.
pub const ADMIN_USER: &str = "eg-admin";

/// Common name of kube-apiserver's client certificate toward kubelets.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
/// kube-controller-manager's user, as kubeadm makes it.
pub const KUBE_CONTROLLER_MANAGER_USER: &str = "system:kube-controller-manager";

/// The files of the control plane's PKI, all in one folder.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// `ca.crt`: trusted for serving and for client certificates.
    pub ca_cert: PathBuf,
    /// `apiserver.crt` / `apiserver.key`: kube-apiserver's serving pair.
    pub serving_cert: PathBuf,
    /// See `serving_cert`.
    pub serving_key: PathBuf,
    /// `admin.crt` / `admin.key`: CN=eg-admin, O=system:masters.
    pub admin_cert: PathBuf,
    /// See `admin_cert`.
    pub admin_key: PathBuf,
    /// `sa.pub`: verifies ServiceAccount tokens.
    pub sa_public_key: PathBuf,
    /// `sa.key`: signs ServiceAccount tokens.
    pub sa_private_key: PathBuf,
    /// `kubelet-client.crt` / `kubelet-client.key`: kube-apiserver's client
    /// pair toward kubelets (`--kubelet-client-certificate`), CN
    /// kube-apiserver-kubelet-client, O=system:masters, so a kubelet with
    /// webhook authorization lets it exec and read logs.
    pub kubelet_client_cert: PathBuf,
    /// See `kubelet_client_cert`.
    pub kubelet_client_key: PathBuf,
    /// `kubelet.crt` / `kubelet.key`: a kubelet's serving pair on the same
    /// address as kube-apiserver (the real node), which kube-apiserver
    /// verifies against `ca.crt` (`--kubelet-certificate-authority`).
    pub kubelet_serving_cert: PathBuf,
    /// See `kubelet_serving_cert`.
    pub kubelet_serving_key: PathBuf,
    /// `kube-controller-manager.crt` / `.key`: CN
    /// system:kube-controller-manager, as kubeadm gives it: the identity
    /// API Priority and Fairness serves from `workload-high`, and RBAC's
    /// bootstrap roles allow to act for its controllers' ServiceAccounts.
    pub kube_controller_manager_cert: PathBuf,
    /// See `kube_controller_manager_cert`.
    pub kube_controller_manager_key: PathBuf,
}

impl Pki {
    /// Generates every key and certificate and writes them into `dir`, for
    /// a kube-apiserver on 127.0.0.1.
    pub fn generate(dir: &Path) -> Result<Self> {
        Self::generate_for(dir, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// As [`Pki::generate`], for a kube-apiserver that also listens on
    /// `address`. The serving certificate always names the `kubernetes`
    /// Service too (10.96.0.1 and its DNS names), as pods reach it there.
    pub fn generate_for(dir: &Path, address: IpAddr) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;

        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("eg-test-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .context("self-signing the CA")?;
        let ca = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().context("generating the serving key")?;
        let mut serving = CertificateParams::default();
        serving.distinguished_name = name("kube-apiserver", None);
        serving.subject_alt_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(KUBERNETES_SERVICE_IP),
            SanType::DnsName("localhost".try_into().context("DNS name localhost")?),
        ];
        if !address.is_loopback() {
            serving.subject_alt_names.push(SanType::IpAddress(address));
        }
        for dns in [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            let dns = dns.try_into().with_context(|| format!("DNS name {dns}"))?;
            serving.subject_alt_names.push(SanType::DnsName(dns));
        }
        serving.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving.use_authority_key_identifier_extension = true;
        let serving_cert = serving
            .signed_by(&serving_key, &ca)
            .context("signing the serving certificate")?;

        let client = |cn: &str, org: Option<&str>| -> Result<(String, String)> {
            let key = KeyPair::generate().with_context(|| format!("generating the key of {cn}"))?;
            let mut params = CertificateParams::default();
            params.distinguished_name = name(cn, org);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            params.use_authority_key_identifier_extension = true;
            let cert = params
                .signed_by(&key, &ca)
                .with_context(|| format!("signing the client certificate of {cn}"))?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let admin = client(ADMIN_USER, Some("system:masters"))?;
        let kubelet_client = client(KUBELET_CLIENT_USER, Some("system:masters"))?;
        let kcm = client(KUBE_CONTROLLER_MANAGER_USER, None)?;

        let kubelet_serving_key =
            KeyPair::generate().context("generating the kubelet serving key")?;
        let mut kubelet_serving = CertificateParams::default();
        kubelet_serving.distinguished_name = name("kubelet", None);
        kubelet_serving.subject_alt_names = vec![SanType::IpAddress(address)];
        kubelet_serving.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        kubelet_serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        kubelet_serving.use_authority_key_identifier_extension = true;
        let kubelet_serving_cert = kubelet_serving
            .signed_by(&kubelet_serving_key, &ca)
            .context("signing the kubelet serving certificate")?;

        // ECDSA P-256 (rcgen's default algorithm): kube-apiserver accepts it
        // for --service-account-signing-key-file and signs tokens with ES256.
        let sa_key = KeyPair::generate().context("generating the ServiceAccount key")?;

        let pki = Self {
            ca_pem: ca_cert.pem(),
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_public_key: dir.join("sa.pub"),
            sa_private_key: dir.join("sa.key"),
            kubelet_client_cert: dir.join("kubelet-client.crt"),
            kubelet_client_key: dir.join("kubelet-client.key"),
            kubelet_serving_cert: dir.join("kubelet.crt"),
            kubelet_serving_key: dir.join("kubelet.key"),
            kube_controller_manager_cert: dir.join("kube-controller-manager.crt"),
            kube_controller_manager_key: dir.join("kube-controller-manager.key"),
        };
        write(&pki.ca_cert, &pki.ca_pem)?;
        write(&pki.serving_cert, &serving_cert.pem())?;
        write(&pki.serving_key, &serving_key.serialize_pem())?;
        write(&pki.admin_cert, &admin.0)?;
        write(&pki.admin_key, &admin.1)?;
        write(&pki.kube_controller_manager_cert, &kcm.0)?;
        write(&pki.kube_controller_manager_key, &kcm.1)?;
        write(&pki.sa_public_key, &sa_key.public_key_pem())?;
        write(&pki.sa_private_key, &sa_key.serialize_pem())?;
        write(&pki.kubelet_client_cert, &kubelet_client.0)?;
        write(&pki.kubelet_client_key, &kubelet_client.1)?;
        write(&pki.kubelet_serving_cert, &kubelet_serving_cert.pem())?;
        write(
            &pki.kubelet_serving_key,
            &kubelet_serving_key.serialize_pem(),
        )?;
        Ok(pki)
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}
