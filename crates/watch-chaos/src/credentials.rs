//! How the proxy authenticates to kube-apiserver: the client certificate of
//! the kubeconfig (carried by the TLS connector), or a bearer token, given
//! inline or as a file. In a pod the file is the projected ServiceAccount
//! token, which the kubelet rotates, so the file is read again once it is a
//! minute old (client-go's cached file token source does the same).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::HeaderValue;
use secrecy::ExposeSecret;

/// How long a token read from a file is used before the file is read again.
pub const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(60);

/// Why the proxy cannot authenticate upstream.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "the upstream kubeconfig authenticates with {0}, which watch-chaos does not support \
         (use a client certificate, `token` or `tokenFile`)"
    )]
    Unsupported(&'static str),
    #[error("reading the token file {path}: {source}")]
    ReadToken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the token in {0} is empty or not a valid header value")]
    BadToken(String),
}

/// The bearer token the proxy adds to every upstream request that carries
/// none of its own.
#[derive(Debug)]
pub enum Credentials {
    /// Only the client certificate (or nothing).
    None,
    /// A token given in the kubeconfig.
    Token(HeaderValue),
    /// A token read from a file, cached for [`TOKEN_FILE_REFRESH`].
    TokenFile {
        path: PathBuf,
        cached: Mutex<Option<(Instant, HeaderValue)>>,
    },
}

impl Credentials {
    /// The credentials of a kube client configuration (a kubeconfig or the
    /// in-cluster configuration).
    pub fn from_config(config: &kube::Config) -> Result<Self, CredentialsError> {
        let auth = &config.auth_info;
        if auth.exec.is_some() {
            return Err(CredentialsError::Unsupported("an exec plugin"));
        }
        if auth.auth_provider.is_some() {
            return Err(CredentialsError::Unsupported("an auth provider"));
        }
        if auth.username.is_some() || auth.password.is_some() {
            return Err(CredentialsError::Unsupported("a username and password"));
        }
        if let Some(token) = &auth.token {
            return bearer(token.expose_secret())
                .map(Self::Token)
                .ok_or_else(|| CredentialsError::BadToken("the kubeconfig".to_string()));
        }
        if let Some(path) = &auth.token_file {
            let credentials = Self::TokenFile {
                path: PathBuf::from(path),
                cached: Mutex::new(None),
            };
            // A missing or unreadable file fails at start, not on the first request.
            credentials.header(Instant::now())?;
            return Ok(credentials);
        }
        Ok(Self::None)
    }

    /// The `Authorization` value for a request sent at `now`, if any.
    pub fn header(&self, now: Instant) -> Result<Option<HeaderValue>, CredentialsError> {
        match self {
            Self::None => Ok(None),
            Self::Token(value) => Ok(Some(value.clone())),
            Self::TokenFile { path, cached } => {
                let mut cached = cached
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if let Some((read_at, value)) = cached.as_ref()
                    && now.saturating_duration_since(*read_at) < TOKEN_FILE_REFRESH
                {
                    return Ok(Some(value.clone()));
                }
                let token = std::fs::read_to_string(path).map_err(|source| {
                    CredentialsError::ReadToken {
                        path: path.clone(),
                        source,
                    }
                })?;
                let value = bearer(token.trim())
                    .ok_or_else(|| CredentialsError::BadToken(path.display().to_string()))?;
                *cached = Some((now, value.clone()));
                Ok(Some(value))
            }
        }
    }
}

fn bearer(token: &str) -> Option<HeaderValue> {
    if token.is_empty() {
        return None;
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(auth: kube::config::AuthInfo) -> kube::Config {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().expect("a valid URI"));
        config.auth_info = auth;
        config
    }

    #[test]
    fn a_token_file_is_read_again_once_a_minute_old() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").expect("writing the token");
        let credentials = Credentials::from_config(&config_with(kube::config::AuthInfo {
            token_file: Some(path.display().to_string()),
            ..Default::default()
        }))
        .expect("credentials");
        let start = Instant::now();
        let value = |at| credentials.header(at).expect("a header").expect("a token");
        assert_eq!(value(start), "Bearer first");

        // The kubelet rotates the projected token: the new one is used once
        // the cached one is a minute old, not before.
        std::fs::write(&path, "second").expect("rotating the token");
        assert_eq!(value(start + Duration::from_secs(59)), "Bearer first");
        assert_eq!(value(start + TOKEN_FILE_REFRESH), "Bearer second");
    }

    #[test]
    fn a_missing_token_file_fails_at_start_with_its_path() {
        let err = Credentials::from_config(&config_with(kube::config::AuthInfo {
            token_file: Some("/nonexistent/token".to_string()),
            ..Default::default()
        }))
        .expect_err("no such file");
        assert!(err.to_string().contains("/nonexistent/token"), "{err}");
    }

    #[test]
    fn unsupported_authentication_is_named() {
        let err = Credentials::from_config(&config_with(kube::config::AuthInfo {
            username: Some("admin".to_string()),
            ..Default::default()
        }))
        .expect_err("basic auth is refused");
        assert!(err.to_string().contains("username and password"), "{err}");
    }

    #[test]
    fn an_inline_token_and_no_token() {
        let token = Credentials::from_config(&config_with(kube::config::AuthInfo {
            token: Some("abc".to_string().into()),
            ..Default::default()
        }))
        .expect("credentials");
        let header = token.header(Instant::now()).expect("no error");
        assert_eq!(header.expect("a token"), "Bearer abc");
        let none = Credentials::from_config(&config_with(kube::config::AuthInfo::default()))
            .expect("credentials");
        assert!(none.header(Instant::now()).expect("no error").is_none());
    }
}
