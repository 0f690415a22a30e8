//! Bearer tokens: which token is in force, who a request is, and what it may touch.
//!
//! - On a loopback address with no token configured, the API is open (only this machine can
//!   reach it).
//! - Bound to anything else, a token is required: the configured one (`server.token`, or
//!   `LCM_SERVER_TOKEN`), else the one kept in `<data-dir>/server-token`, else a new random one
//!   (32 bytes from the OS, hex) written there with mode 0600 and reported once.
//! - Tenant tokens (`[server.tenants]`: token -> session key prefix) see only their sessions.
//!   Configuring tenants also turns authentication on (with an admin token as above).
//!
//! Tokens are compared in constant time.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use lcm_core::config::{MIN_SERVER_TOKEN_LEN, ServerConfig};
use lcm_core::message::SessionInfo;

use crate::error::ApiError;

/// Who a request is, once its token is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin token (or no authentication configured): every route, every session.
    Admin,
    /// A tenant token: only the sessions whose key starts with `prefix`.
    Tenant {
        /// The session key prefix of the tenant.
        prefix: Arc<str>,
    },
    /// An unauthenticated request to a public route (`/healthz`).
    Public,
}

impl Principal {
    /// Refuses anyone but the admin.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            _ => Err(ApiError::forbidden(
                "this route needs the server's admin token (server.token); a tenant token only reaches its own sessions",
            )),
        }
    }

    /// Whether this principal may see the session with key `key`.
    pub fn may_see(&self, key: &str) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Tenant { prefix } => key.starts_with(&**prefix),
            Principal::Public => false,
        }
    }

    /// A session the principal may not see is reported as absent (no existence oracle).
    pub fn check_session(&self, info: &SessionInfo) -> Result<(), ApiError> {
        if self.may_see(&info.key) {
            Ok(())
        } else {
            Err(ApiError::not_found(format!(
                "no session {} in the store",
                info.id
            )))
        }
    }

    /// Refuses to create a session with key `key` outside the tenant's prefix.
    pub fn check_new_key(&self, key: &str) -> Result<(), ApiError> {
        match self {
            Principal::Tenant { prefix } if !key.starts_with(&**prefix) => {
                Err(ApiError::forbidden(format!(
                    "this token may only use sessions whose key starts with `{prefix}`"
                )))
            }
            Principal::Public => Err(ApiError::forbidden("authentication required")),
            _ => Ok(()),
        }
    }

    /// Whether this is a tenant (scoped) principal.
    pub fn is_tenant(&self) -> bool {
        matches!(self, Principal::Tenant { .. })
    }
}

/// The tokens in force.
#[derive(Clone, Default)]
pub(crate) struct Auth {
    admin: Option<String>,
    tenants: Vec<(String, Arc<str>)>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("admin", &self.admin.as_ref().map(|_| "<redacted>"))
            .field("tenants", &self.tenants.len())
            .finish()
    }
}

impl Auth {
    pub(crate) fn new(admin: Option<String>, config: &ServerConfig) -> Auth {
        Auth {
            admin,
            tenants: config
                .tenants
                .iter()
                .map(|(token, prefix)| (token.clone(), Arc::from(prefix.as_str())))
                .collect(),
        }
    }

    /// Whether requests must carry a token.
    pub(crate) fn enabled(&self) -> bool {
        self.admin.is_some() || !self.tenants.is_empty()
    }

    /// Who the request with `headers` is (401 without a valid token when tokens are in force).
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        if !self.enabled() {
            return Ok(Principal::Admin);
        }
        let unauthorized =
            |message: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(
                "this server requires a bearer token: send `Authorization: Bearer <token>`",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?;
        // Compare with every token (no early exit), so timing says nothing about which matched.
        let mut found = None;
        if let Some(admin) = &self.admin
            && constant_time_eq(admin.as_bytes(), token.as_bytes())
        {
            found = Some(Principal::Admin);
        }
        for (tenant, prefix) in &self.tenants {
            if constant_time_eq(tenant.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(Principal::Tenant {
                    prefix: Arc::clone(prefix),
                });
            }
        }
        found.ok_or_else(|| unauthorized("the bearer token is not valid for this server"))
    }
}

/// Equality of two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The admin token in force and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// No token: the API is open (loopback only, no tenants).
    None,
    /// `server.token` or `LCM_SERVER_TOKEN`.
    Configured,
    /// Read from the token file a previous start generated.
    File(PathBuf),
    /// Generated now (and written to the file, when there is one): tell the operator once.
    Generated(Option<PathBuf>),
}

/// Why the token could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token from the environment is too weak.
    #[error(
        "LCM_SERVER_TOKEN must be at least {MIN_SERVER_TOKEN_LEN} visible ASCII characters (no spaces)"
    )]
    WeakEnvToken,
    /// The token file is unreadable, unwritable or holds a bad token.
    #[error("server token file {path}: {detail}")]
    File { path: PathBuf, detail: String },
    /// No randomness from the operating system.
    #[error("cannot generate a server token: {0}")]
    Random(String),
}

/// Settles the admin token: the environment's (`env_token`), else the configuration's; when
/// neither is set and the server needs one (bound beyond loopback, or tenants configured), the
/// one in `token_file`, else a new one (written to `token_file` when given).
pub(crate) fn resolve_admin_token(
    config: &ServerConfig,
    bind: SocketAddr,
    env_token: Option<&str>,
    token_file: Option<&Path>,
) -> Result<(Option<String>, TokenSource), TokenError> {
    if let Some(token) = env_token.map(str::trim).filter(|t| !t.is_empty()) {
        if token.len() < MIN_SERVER_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::WeakEnvToken);
        }
        return Ok((Some(token.to_owned()), TokenSource::Configured));
    }
    if let Some(token) = &config.token {
        return Ok((Some(token.clone()), TokenSource::Configured));
    }
    let needed = !bind.ip().is_loopback() || !config.tenants.is_empty();
    if !needed {
        return Ok((None, TokenSource::None));
    }
    let Some(path) = token_file else {
        return Ok((Some(generate()?), TokenSource::Generated(None)));
    };
    let file_error = |detail: String| TokenError::File {
        path: path.to_path_buf(),
        detail,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim();
            if token.len() < MIN_SERVER_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(file_error(format!(
                    "holds no usable token (at least {MIN_SERVER_TOKEN_LEN} visible characters); delete it to have a new one generated"
                )));
            }
            Ok((
                Some(token.to_owned()),
                TokenSource::File(path.to_path_buf()),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = generate()?;
            write_token_file(path, &token).map_err(|e| file_error(e.to_string()))?;
            Ok((
                Some(token),
                TokenSource::Generated(Some(path.to_path_buf())),
            ))
        }
        Err(e) => Err(file_error(e.to_string())),
    }
}

/// 32 random bytes from the operating system, as 64 hex digits: a new secret token.
pub fn generate() -> Result<String, TokenError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes a new token file readable by its owner only (refusing to replace an existing file).
fn write_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(token.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_without_token_is_open_and_elsewhere_a_token_is_generated_once() {
        let config = ServerConfig::default();
        let (token, source) =
            resolve_admin_token(&config, addr("127.0.0.1:0"), None, None).unwrap();
        assert_eq!((token, source), (None, TokenSource::None));

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("server-token");
        let (first, source) =
            resolve_admin_token(&config, addr("0.0.0.0:0"), None, Some(&file)).unwrap();
        let first = first.unwrap();
        assert_eq!(first.len(), 64);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(source, TokenSource::Generated(Some(file.clone())));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // The next start reuses it and does not report it again.
        let (second, source) =
            resolve_admin_token(&config, addr("0.0.0.0:0"), None, Some(&file)).unwrap();
        assert_eq!(second.as_deref(), Some(first.as_str()));
        assert_eq!(source, TokenSource::File(file));
    }

    #[test]
    fn the_environment_overrides_the_configuration() {
        let config = ServerConfig {
            token: Some("configured-token-0123".into()),
            ..ServerConfig::default()
        };
        let (token, _) = resolve_admin_token(
            &config,
            addr("0.0.0.0:0"),
            Some("environment-token-0123"),
            None,
        )
        .unwrap();
        assert_eq!(token.as_deref(), Some("environment-token-0123"));
        assert!(resolve_admin_token(&config, addr("0.0.0.0:0"), Some("short"), None).is_err());
    }

    #[test]
    fn tokens_are_checked() {
        let config = ServerConfig {
            tenants: [("tenant-token-0123456789".to_owned(), "a/".to_owned())].into(),
            ..ServerConfig::default()
        };
        let auth = Auth::new(Some("admin-token-0123456789".into()), &config);
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, value.parse().unwrap());
            h
        };
        assert_eq!(
            auth.authenticate(&headers("Bearer admin-token-0123456789"))
                .unwrap(),
            Principal::Admin
        );
        assert_eq!(
            auth.authenticate(&headers("bearer tenant-token-0123456789"))
                .unwrap(),
            Principal::Tenant {
                prefix: "a/".into()
            }
        );
        for bad in ["Bearer nope", "Basic abc", "admin-token-0123456789"] {
            let err = auth.authenticate(&headers(bad)).unwrap_err();
            assert_eq!(err.status, StatusCode::UNAUTHORIZED, "{bad}");
        }
        assert!(auth.authenticate(&HeaderMap::new()).is_err());
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(constant_time_eq(b"abc", b"abc"));
    }
}
