//! `[routes.auth]`: how a route verifies who its callers are.
//!
//! The config reads and checks what it can without cryptography (files
//! exist and parse as JSON or PEM, the key file's lines); the gateway
//! builds the verifiers (`gateway/src/auth.rs`) and refuses at start a key
//! it cannot use.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::read::{duration, key_segment, one_of, string, Bad, Problem, Reader};
use crate::schema::{config_path, Env};

/// Whether a caller must be identified on the route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthMode {
    /// An unidentified caller, or one whose credential fails, gets 401.
    #[default]
    Required,
    /// A caller without a credential passes unidentified; one whose
    /// credential fails still gets 401 (a bad credential is never ignored).
    Optional,
}

/// `[routes.auth]`, present when the route authenticates its callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthPolicy {
    pub mode: AuthMode,
    /// Bearer JWTs, verified.
    pub jwt: Option<JwtAuth>,
    /// API keys, checked against their SHA-256 hashes.
    pub api_keys: Option<ApiKeys>,
    /// The header the gateway sets to the verified identity on what it
    /// forwards, and removes from what callers send. Lower-cased; default
    /// [`DEFAULT_IDENTITY_HEADER`].
    pub identity_header: String,
    /// The tenants each identity (`jwt:<sub>`, `key:<name>`) may name:
    /// tenant names, `"*"` (any tenant, or none) or `""` (no tenant).
    /// `None`: no such table (tenants are the caller's word).
    pub tenants: Option<BTreeMap<String, Vec<String>>>,
}

/// Where a JWT's verification keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwtKeys {
    /// A JWKS document (`{"keys": [...]}`), re-read every `refresh`; while
    /// reads fail, the last keys are kept until `max_stale` after the last
    /// good read, then none (every JWT refused).
    JwksFile {
        path: PathBuf,
        refresh: Duration,
        max_stale: Duration,
    },
    /// A JWKS document fetched over HTTPS (HTTP to a loopback host), every
    /// `refresh`, kept as `JwksFile`'s for at most `max_stale`.
    JwksUrl {
        url: String,
        refresh: Duration,
        max_stale: Duration,
    },
    /// One PEM public key (RSA, EC P-256 or Ed25519).
    PublicKey { path: PathBuf, pem: Vec<u8> },
}

/// Bearer JWTs: signed by one of `keys` (RS256, ES256 or EdDSA), with this
/// issuer and audience, within `exp` and `nbf` give or take `leeway`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtAuth {
    pub keys: JwtKeys,
    pub issuer: String,
    pub audience: String,
    pub leeway: Duration,
}

/// API keys: the header a caller sends its key in, and the SHA-256 of each
/// key (lowercase hex) with the name it identifies. `Debug` shows names only.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKeys {
    pub path: PathBuf,
    /// Lower-cased header name. Default `x-api-key`.
    pub header: String,
    /// SHA-256 (64 lowercase hex digits) → name.
    pub keys: BTreeMap<String, String>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeys")
            .field("path", &self.path)
            .field("header", &self.header)
            .field("names", &self.keys.values().collect::<Vec<_>>())
            .finish()
    }
}

/// Default `leeway` on `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// Default JWKS `refresh`.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
/// Default `jwks_max_stale`: how long the last good JWKS keys stay valid
/// while refreshes fail.
pub const DEFAULT_MAX_STALE: Duration = Duration::from_secs(3600);
/// Default `identity_header`.
pub const DEFAULT_IDENTITY_HEADER: &str = "a2a-gateway-caller";

/// An identity name: 1 to 128 visible ASCII characters (a JWT `sub` or a
/// key file's name), so that it can be a log field and a store key part.
pub fn is_identity_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Reads `[routes.auth]` (`None` when the route has no such table).
pub(crate) fn auth_policy(r: &mut Reader<'_>, env: Env<'_>) -> Option<AuthPolicy> {
    if !r.has("auth") {
        return None;
    }
    let mut a = r.section("auth");
    let mode = a.or(
        "mode",
        AuthMode::Required,
        one_of(&[
            ("required", AuthMode::Required),
            ("optional", AuthMode::Optional),
        ]),
    );
    let refresh = a.or("jwks_refresh", DEFAULT_REFRESH, |item| {
        let d = duration(item)?;
        if d < Duration::from_secs(1) {
            return Err("must be at least 1s".to_string());
        }
        Ok(d)
    });
    let max_stale = a.or("jwks_max_stale", DEFAULT_MAX_STALE.max(refresh), |item| {
        let d = duration(item)?;
        if d < refresh {
            return Err(format!(
                "must be at least jwks_refresh ({refresh:?}): the keys would go stale before they are read again"
            ));
        }
        Ok(d)
    });
    let jwks_file = a.opt("jwks_file", |item| {
        let path = config_path(string(item)?, env)?;
        read_jwks(&path)?;
        Ok::<_, String>(JwtKeys::JwksFile {
            path,
            refresh,
            max_stale,
        })
    });
    let jwks_url = a.opt("jwks_url", |item| {
        let url = string(item)?;
        jwks_url_ok(url)?;
        Ok::<_, String>(JwtKeys::JwksUrl {
            url: url.to_owned(),
            refresh,
            max_stale,
        })
    });
    let public_key = a.opt("jwt_public_key", |item| {
        let path = config_path(string(item)?, env)?;
        let pem =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN PUBLIC KEY-----") {
            return Err(format!(
                "{} holds no PEM public key (-----BEGIN PUBLIC KEY-----)",
                path.display()
            ));
        }
        Ok::<_, String>(JwtKeys::PublicKey { path, pem })
    });
    let given: Vec<&str> = ["jwks_file", "jwks_url", "jwt_public_key"]
        .into_iter()
        .filter(|k| a.has(k))
        .collect();
    if given.len() > 1 {
        let at = a.pos(given[1]);
        a.report_at(
            at,
            given[1],
            format!(
                "give one of jwks_file, jwks_url and jwt_public_key, not {}",
                given.join(" and ")
            ),
        );
    }
    let has_jwt = !given.is_empty();
    let issuer = a.opt("issuer", non_empty);
    let audience = a.opt("audience", non_empty);
    let leeway = a.or("leeway", DEFAULT_LEEWAY, |item| {
        let d = duration(item)?;
        if d > Duration::from_secs(300) {
            return Err("at most 5m".to_string());
        }
        Ok(d)
    });
    if has_jwt {
        for key in ["issuer", "audience"] {
            if !a.has(key) {
                a.table_error(format!(
                    "JWTs need {key} (the `{}` claim every token must carry)",
                    if key == "issuer" { "iss" } else { "aud" }
                ));
            }
        }
    } else {
        for key in [
            "issuer",
            "audience",
            "leeway",
            "jwks_refresh",
            "jwks_max_stale",
        ] {
            if a.has(key) {
                let at = a.pos(key);
                a.report_at(
                    at,
                    key,
                    "applies to JWTs: give jwks_file, jwks_url or jwt_public_key",
                );
            }
        }
    }
    let header = a.or("api_key_header", "x-api-key".to_owned(), |item| {
        let h = string(item)?;
        let name = http_header_name(h)?;
        if name == "authorization" {
            return Err("authorization carries JWTs; give API keys their own header".to_string());
        }
        Ok(name)
    });
    let keys = a.opt("api_keys_file", |item| {
        let path = config_path(string(item)?, env)?;
        let keys = read_api_keys(&path)?;
        Ok::<_, String>((path, keys))
    });
    if a.has("api_key_header") && !a.has("api_keys_file") {
        let at = a.pos("api_key_header");
        a.report_at(at, "api_key_header", "applies with api_keys_file");
    }
    if has_jwt && a.has("jwks_max_stale") && a.has("jwt_public_key") {
        let at = a.pos("jwks_max_stale");
        a.report_at(
            at,
            "jwks_max_stale",
            "applies to jwks_file and jwks_url (a PEM key is read once, it never goes stale)",
        );
    }
    let identity_header = a.or(
        "identity_header",
        DEFAULT_IDENTITY_HEADER.to_owned(),
        |item| identity_header(string(item)?, &header),
    );
    let kinds = Kinds {
        jwt: has_jwt,
        api_keys_file: a.has("api_keys_file"),
        key_names: keys
            .as_ref()
            .map(|(_, k)| k.values().map(String::as_str).collect()),
    };
    let tenants = a.opt("tenants", |item| tenant_table(item, &kinds));
    if !has_jwt && !a.has("api_keys_file") {
        a.table_error(
            "names no credential: give jwks_file, jwks_url or jwt_public_key (JWTs), api_keys_file (API keys), or both",
        );
    }
    a.finish();
    let jwt = match (jwks_file.or(jwks_url).or(public_key), issuer, audience) {
        (Some(keys), Some(issuer), Some(audience)) => Some(JwtAuth {
            keys,
            issuer,
            audience,
            leeway,
        }),
        _ => None,
    };
    let api_keys = keys.map(|(path, keys)| ApiKeys { path, header, keys });
    Some(AuthPolicy {
        mode,
        jwt,
        api_keys,
        identity_header,
        tenants,
    })
}

/// Whether a JWKS URL may be fetched: `https://`, or `http://` to a
/// loopback host (an identity provider beside the gateway, a test's).
fn jwks_url_ok(url: &str) -> Result<(), String> {
    let parts = match crate::url::split_url(url) {
        Ok(p) if matches!(p.scheme.as_str(), "http" | "https") => p,
        Ok(_) | Err(crate::url::UrlError::Shape) => {
            return Err(format!("{url:?} is not an http(s) URL"))
        }
        Err(crate::url::UrlError::Invalid(why)) => return Err(format!("{url:?}: {why}")),
    };
    if parts.scheme == "http" && !is_loopback_host(&parts.host) {
        return Err(format!(
            "{url:?}: the keys that verify callers must be fetched over https:// (http:// only from a loopback host: 127.0.0.1, [::1], localhost), or anyone on the path could replace them"
        ));
    }
    Ok(())
}

/// `localhost`, an IPv4 address in 127.0.0.0/8 or `[::1]` (lower-cased,
/// IPv6 in brackets, as [`crate::url::split_url`] gives hosts).
fn is_loopback_host(host: &str) -> bool {
    if host == "localhost" {
        return true;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    }
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}

/// Headers `identity_header` must not be: the ones a proxy manages per
/// connection or per message, and the credentials.
const NOT_IDENTITY_HEADERS: [&str; 14] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "authorization",
    "cookie",
];

/// `identity_header`: a header name, lower-cased, that is no hop-by-hop
/// header, no credential (`authorization`, the route's `api_key_header`)
/// and none that says what the body is.
fn identity_header(h: &str, api_key_header: &str) -> Result<String, String> {
    let name = http::HeaderName::from_bytes(h.as_bytes())
        .map_err(|_| format!("{h:?} is not a header name"))?;
    let name = name.as_str().to_owned();
    if NOT_IDENTITY_HEADERS.contains(&name.as_str()) {
        return Err(format!(
            "{name} cannot carry the identity: it is a hop-by-hop, message or credential header"
        ));
    }
    if name == api_key_header {
        return Err(format!(
            "{name} is the api_key_header: the identity needs a header of its own"
        ));
    }
    Ok(name)
}

/// What identities a route can verify, for `tenants`.
struct Kinds<'a> {
    /// JWTs (`jwt:<sub>`).
    jwt: bool,
    /// API keys (`key:<name>`): the file is named,
    api_keys_file: bool,
    /// and holds these names (`None`: it could not be read).
    key_names: Option<Vec<&'a str>>,
}

impl Kinds<'_> {
    /// Why the route cannot verify `identity` (`jwt:…` or `key:…`).
    fn cannot_verify(&self, identity: &str) -> Option<String> {
        match identity.split_once(':') {
            Some(("jwt", _)) if !self.jwt => Some(
                "names a JWT identity, but the route verifies no JWT (give jwks_file, jwks_url or jwt_public_key)".into(),
            ),
            Some(("key", _)) if !self.api_keys_file => Some(
                "names an API key identity, but the route has no api_keys_file".into(),
            ),
            Some(("key", name)) => match &self.key_names {
                Some(names) if !names.contains(&name) => Some(format!(
                    "names the API key {name:?}, which api_keys_file does not hold"
                )),
                _ => None,
            },
            _ => None,
        }
    }
}

/// `tenants`: identity → the tenants it may name.
fn tenant_table(
    item: &toml_edit::Item,
    kinds: &Kinds<'_>,
) -> Result<BTreeMap<String, Vec<String>>, Bad> {
    let table = item
        .as_table_like()
        .ok_or_else(|| Bad::from(crate::read::expected("a table", item)))?;
    if table.is_empty() {
        return Err(Bad::from(
            "is empty: name the identities and the tenants each may use (\"jwt:alice\" = [\"acme\"]), or remove it to leave tenants unchecked".to_string(),
        ));
    }
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    for (identity, value) in table.iter() {
        let sub = key_segment(identity);
        let at = value.span().map(|s| s.start);
        let mut bad = |at: Option<usize>, sub: String, message: String| {
            problems.push(Problem { at, sub, message });
        };
        let named = match identity.split_once(':') {
            Some(("jwt" | "key", name)) => is_identity_name(name),
            _ => false,
        };
        if !named {
            bad(
                at,
                sub.clone(),
                format!("{identity:?} is not an identity: write \"jwt:<sub>\" or \"key:<name>\" (1 to 128 visible ASCII characters after the colon)"),
            );
            continue;
        }
        if let Some(why) = kinds.cannot_verify(identity) {
            bad(at, sub.clone(), why);
        }
        let Some(array) = value.as_array() else {
            bad(
                at,
                sub.clone(),
                crate::read::expected("an array of tenant names", value),
            );
            continue;
        };
        if array.is_empty() {
            bad(at, sub.clone(), "is empty, which allows nothing at all: give [\"\"] for no tenant, or remove the identity".to_string());
            continue;
        }
        let mut tenants: Vec<String> = Vec::new();
        for (i, v) in array.iter().enumerate() {
            let at = v.span().map(|s| s.start).or(at);
            let sub = format!("{sub}[{i}]");
            let Some(t) = v.as_str() else {
                bad(
                    at,
                    sub,
                    format!(
                        "expected a tenant name, found {}",
                        crate::read::found(&toml_edit::Item::Value(v.clone()))
                    ),
                );
                continue;
            };
            if !(t.is_empty() || is_identity_name(t)) {
                bad(at, sub, format!("{t:?} is not a tenant name: 1 to 128 visible ASCII characters, \"*\" (any tenant) or \"\" (no tenant)"));
            } else if tenants.iter().any(|x| x == t) {
                bad(at, sub, format!("{t:?} is named twice"));
            } else if (t == "*" && !tenants.is_empty()) || tenants.iter().any(|x| x == "*") {
                bad(
                    at,
                    sub,
                    "\"*\" allows every tenant (and none): give it alone".to_string(),
                );
            } else {
                tenants.push(t.to_owned());
            }
        }
        out.insert(identity.to_owned(), tenants);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Bad(problems))
    }
}

fn non_empty(item: &toml_edit::Item) -> Result<String, String> {
    let s = string(item)?;
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

/// A header name, lower-cased.
fn http_header_name(h: &str) -> Result<String, String> {
    let ok = !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !ok {
        return Err(format!("{h:?} is not a header name"));
    }
    Ok(h.to_ascii_lowercase())
}

/// A JWKS file: JSON with a non-empty `keys` array of objects.
pub fn read_jwks(path: &std::path::Path) -> Result<String, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    check_jwks(&text).map_err(|e| format!("{shown}: {e}"))?;
    Ok(text)
}

/// A JWKS document: JSON with a non-empty `keys` array of objects, each
/// with a `kty`.
pub fn check_jwks(text: &str) -> Result<(), String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let keys = doc["keys"]
        .as_array()
        .ok_or("not a JWK set: no \"keys\" array")?;
    if keys.is_empty() {
        return Err("the JWK set holds no key".into());
    }
    if let Some(i) = keys.iter().position(|k| !k["kty"].is_string()) {
        return Err(format!("key {} has no \"kty\"", i + 1));
    }
    Ok(())
}

/// An API key file: one key per line, `<sha256 hex> <name>`; blank lines
/// and lines starting with `#` skipped. No hash or name twice.
pub fn read_api_keys(path: &std::path::Path) -> Result<BTreeMap<String, String>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    parse_api_keys(&text).map_err(|e| format!("{shown}: {e}"))
}

/// [`read_api_keys`]'s format, from its text.
pub fn parse_api_keys(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut keys = BTreeMap::new();
    let mut names = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let mut parts = line.split_whitespace();
        let (Some(hash), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {n}: expected `<sha256 of the key, 64 hex digits> <name>`"
            ));
        };
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "line {n}: the key's SHA-256 must be 64 hex digits (`printf %s KEY | sha256sum`), never the key itself"
            ));
        }
        if !is_identity_name(name) {
            return Err(format!(
                "line {n}: a name is 1 to 128 visible ASCII characters"
            ));
        }
        let hash = hash.to_ascii_lowercase();
        if let Some(first) = names.insert(name.to_owned(), n) {
            return Err(format!(
                "line {n}: the name {name:?} is on line {first} too"
            ));
        }
        if keys.insert(hash, name.to_owned()).is_some() {
            return Err(format!("line {n}: the same key hash is on an earlier line"));
        }
    }
    if keys.is_empty() {
        return Err("holds no key".into());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn api_key_files() {
        let ok = parse_api_keys(&format!("# keys\n\n{H} billing\n")).unwrap();
        assert_eq!(ok.get(H).map(String::as_str), Some("billing"));
        let upper = parse_api_keys(&format!("{} b", H.to_uppercase())).unwrap();
        assert!(upper.contains_key(H));
        for (text, err) in [
            ("".to_string(), "holds no key"),
            ("# only\n".to_string(), "holds no key"),
            (
                "abc name".to_string(),
                "line 1: the key's SHA-256 must be 64 hex digits",
            ),
            (H.to_string(), "line 1: expected"),
            (format!("{H} a b"), "line 1: expected"),
            (format!("{H} a\n{H} b"), "line 2: the same key hash"),
            (
                format!("{H} a\n{} a", H.replace('9', "8")),
                "line 2: the name \"a\" is on line 1 too",
            ),
        ] {
            let got = parse_api_keys(&text).unwrap_err();
            assert!(got.starts_with(err), "{text:?}: {got}");
        }
    }

    #[test]
    fn jwks_documents() {
        assert!(check_jwks(r#"{"keys":[{"kty":"RSA","n":"x","e":"AQAB"}]}"#).is_ok());
        for (text, err) in [
            ("nope", "not JSON"),
            ("{}", "not a JWK set"),
            (r#"{"keys":[]}"#, "the JWK set holds no key"),
            (r#"{"keys":[{"n":"x"}]}"#, "key 1 has no \"kty\""),
        ] {
            let got = check_jwks(text).unwrap_err();
            assert!(got.starts_with(err), "{text}: {got}");
        }
    }

    /// A directory with a key file and a JWKS file, one per test (tests run
    /// at once).
    fn dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("a2agw-config-auth-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Written whole (to a file of this thread's, then renamed): tests
        // that share the directory read it while another writes it.
        let write = |name: &str, text: &str| {
            let tmp = dir.join(format!("{name}.{:?}", std::thread::current().id()));
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, dir.join(name)).unwrap();
        };
        write("keys", &format!("{H} billing\n"));
        write(
            "jwks.json",
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
        );
        write(
            "pub.pem",
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n-----END PUBLIC KEY-----\n",
        );
        dir
    }

    fn parse(auth: &str) -> Result<crate::Config, Vec<String>> {
        let src = format!("[[routes]]\nname = \"a\"\nworker = \"http://w\"\n[routes.auth]\n{auth}");
        crate::parse_at(&src, Some(&dir("tables")), &|_| None)
            .map_err(|e| e.errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn auth_tables() {
        let c = parse("api_keys_file = \"keys\"\n").unwrap();
        let a = c.routes[0].auth.as_ref().unwrap();
        assert_eq!(a.mode, AuthMode::Required);
        assert!(a.jwt.is_none());
        let keys = a.api_keys.as_ref().unwrap();
        assert_eq!(keys.header, "x-api-key");
        assert_eq!(keys.keys.get(H).map(String::as_str), Some("billing"));
        assert!(!format!("{a:?}").contains(H), "Debug shows names only");

        let c = parse(
            "mode = \"optional\"\njwks_file = \"jwks.json\"\nissuer = \"https://idp\"\naudience = \"gw\"\nleeway = \"5s\"\n",
        )
        .unwrap();
        let a = c.routes[0].auth.as_ref().unwrap();
        assert_eq!(a.mode, AuthMode::Optional);
        let jwt = a.jwt.as_ref().unwrap();
        assert_eq!(
            (jwt.issuer.as_str(), jwt.audience.as_str()),
            ("https://idp", "gw")
        );
        assert_eq!(jwt.leeway, Duration::from_secs(5));
        assert!(
            matches!(&jwt.keys, JwtKeys::JwksFile { refresh, max_stale, .. }
                if *refresh == DEFAULT_REFRESH && *max_stale == DEFAULT_MAX_STALE)
        );
        assert_eq!(a.identity_header, DEFAULT_IDENTITY_HEADER);
        assert_eq!(a.tenants, None);

        let c = parse("jwks_url = \"https://idp.example/jwks\"\nissuer = \"i\"\naudience = \"a\"\njwks_refresh = \"1m\"\n").unwrap();
        let jwt = c.routes[0].auth.as_ref().unwrap().jwt.clone().unwrap();
        assert_eq!(
            jwt.keys,
            JwtKeys::JwksUrl {
                url: "https://idp.example/jwks".into(),
                refresh: Duration::from_secs(60),
                max_stale: DEFAULT_MAX_STALE,
            }
        );

        // Every error at once.
        for (auth, want) in [
            ("", &["4:1: routes[0].auth: names no credential"][..]),
            (
                "jwks_file = \"jwks.json\"\n",
                &[
                    "4:1: routes[0].auth: JWTs need issuer",
                    "4:1: routes[0].auth: JWTs need audience",
                ],
            ),
            (
                "jwks_file = \"jwks.json\"\njwks_url = \"https://x/jwks\"\nissuer = \"i\"\naudience = \"a\"\n",
                &["6:12: routes[0].auth.jwks_url: give one of jwks_file, jwks_url and jwt_public_key, not jwks_file and jwks_url"],
            ),
            (
                "api_keys_file = \"keys\"\nissuer = \"i\"\nmode = \"maybe\"\n",
                &[
                    "7:8: routes[0].auth.mode: expected one of \"required\", \"optional\"",
                    "6:10: routes[0].auth.issuer: applies to JWTs",
                ],
            ),
            (
                "api_keys_file = \"missing\"\n",
                &["5:17: routes[0].auth.api_keys_file: cannot read"],
            ),
            (
                "api_keys_file = \"keys\"\napi_key_header = \"Authorization\"\n",
                &["6:18: routes[0].auth.api_key_header: authorization carries JWTs"],
            ),
            (
                "jwks_url = \"ftp://x\"\nissuer = \"i\"\naudience = \"a\"\n",
                &["5:12: routes[0].auth.jwks_url: \"ftp://x\" is not an http(s) URL"],
            ),
        ] {
            let got = parse(auth).unwrap_err();
            assert_eq!(got.len(), want.len(), "{auth}: {got:#?}");
            for w in want {
                assert!(got.iter().any(|g| g.starts_with(w)), "{auth}: {w} not in {got:#?}");
            }
        }
    }

    #[test]
    fn auth_names_the_budget_caller() {
        let src = |budget: &str| {
            format!("[[routes]]\nname = \"a\"\nworker = \"http://w\"\n[routes.auth]\napi_keys_file = \"keys\"\n[routes.budget]\n{budget}")
        };
        let c = crate::parse_at(
            &src("[routes.budget.callers.\"key:billing\"]\nmax_deadline = \"1m\"\n"),
            Some(&dir("budget")),
            &|_| None,
        )
        .unwrap();
        assert!(c.routes[0].budget.callers.contains_key("key:billing"));
        let e = crate::parse_at(
            &src("caller_header = \"x-k\"\n"),
            Some(&dir("budget")),
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("remove caller_header"), "{e}");
    }

    /// Errors of one `[routes.auth]` body, which must all start with one of
    /// `want` (and be as many).
    fn refused(auth: &str, want: &[&str]) {
        let got = parse(auth).unwrap_err();
        assert_eq!(got.len(), want.len(), "{auth}: {got:#?}");
        for w in want {
            assert!(
                got.iter().any(|g| g.starts_with(w)),
                "{auth}: {w} not in {got:#?}"
            );
        }
    }

    const JWT: &str = "jwks_file = \"jwks.json\"\nissuer = \"i\"\naudience = \"a\"\n";

    /// `jwks_max_stale`: default 1h (or `jwks_refresh` when longer), at
    /// least `jwks_refresh`, only for keys that are read again.
    #[test]
    fn jwks_max_stale() {
        let stale = |auth: &str| match parse(auth).unwrap().routes[0]
            .auth
            .clone()
            .unwrap()
            .jwt
            .unwrap()
            .keys
        {
            JwtKeys::JwksFile { max_stale, .. } | JwtKeys::JwksUrl { max_stale, .. } => max_stale,
            JwtKeys::PublicKey { .. } => panic!("{auth}: a PEM key"),
        };
        assert_eq!(stale(JWT), Duration::from_secs(3600));
        assert_eq!(
            stale(&format!(
                "{JWT}jwks_max_stale = \"90s\"\njwks_refresh = \"1m\"\n"
            )),
            Duration::from_secs(90)
        );
        assert_eq!(
            stale(&format!(
                "{JWT}jwks_max_stale = \"1s\"\njwks_refresh = \"1s\"\n"
            )),
            Duration::from_secs(1)
        );
        assert_eq!(
            stale(&format!("{JWT}jwks_refresh = \"2h\"\n")),
            Duration::from_secs(7200),
            "never below jwks_refresh"
        );
        refused(
            &format!("{JWT}jwks_refresh = \"10m\"\njwks_max_stale = \"5m\"\n"),
            &["9:18: routes[0].auth.jwks_max_stale: must be at least jwks_refresh (600s)"],
        );
        refused(
            "api_keys_file = \"keys\"\njwks_max_stale = \"1h\"\n",
            &["6:18: routes[0].auth.jwks_max_stale: applies to JWTs"],
        );
        refused(
            "jwt_public_key = \"pub.pem\"\nissuer = \"i\"\naudience = \"a\"\njwks_max_stale = \"1h\"\n",
            &["8:18: routes[0].auth.jwks_max_stale: applies to jwks_file and jwks_url"],
        );
    }

    /// `jwks_url`: https, or http to a loopback host only.
    #[test]
    fn jwks_urls_must_be_https_unless_loopback() {
        let url = |u: &str| format!("jwks_url = \"{u}\"\nissuer = \"i\"\naudience = \"a\"\n");
        for ok in [
            "https://idp.example/jwks",
            "HTTPS://idp.example:8443/.well-known/jwks.json",
            "http://127.0.0.1:8080/jwks",
            "http://127.10.0.3/jwks",
            "http://[::1]:9000/jwks",
            "http://localhost/jwks",
            "http://LocalHost:80/jwks",
        ] {
            assert!(parse(&url(ok)).is_ok(), "{ok}: {:?}", parse(&url(ok)));
        }
        for (bad, why) in [
            ("http://idp.example/jwks", "must be fetched over https://"),
            ("http://10.0.0.5/jwks", "must be fetched over https://"),
            ("http://128.0.0.1/jwks", "must be fetched over https://"),
            ("http://[::2]/jwks", "must be fetched over https://"),
            (
                "http://localhost.evil.example/jwks",
                "must be fetched over https://",
            ),
            (
                "http://127.0.0.1.nip.io/jwks",
                "must be fetched over https://",
            ),
            (
                "http://127.0.0.1@idp.example/jwks",
                "must be fetched over https://",
            ),
            ("ftp://idp.example/jwks", "is not an http(s) URL"),
            ("idp.example/jwks", "is not an http(s) URL"),
            ("https://idp example/jwks", "character ' ' is not allowed"),
        ] {
            let got = parse(&url(bad)).unwrap_err();
            assert_eq!(got.len(), 1, "{bad}: {got:#?}");
            assert!(
                got[0].starts_with("5:12: routes[0].auth.jwks_url: ") && got[0].contains(why),
                "{bad}: {got:#?}"
            );
        }
    }

    /// `identity_header`: a header of its own, lower-cased.
    #[test]
    fn identity_headers() {
        let header = |h: &str| {
            parse(&format!(
                "api_keys_file = \"keys\"\napi_key_header = \"x-key\"\nidentity_header = \"{h}\"\n"
            ))
        };
        let c = header("X-Verified-Caller").unwrap();
        assert_eq!(
            c.routes[0].auth.as_ref().unwrap().identity_header,
            "x-verified-caller"
        );
        for (bad, why) in [
            ("Authorization", "authorization cannot carry the identity"),
            ("host", "host cannot carry the identity"),
            ("Connection", "connection cannot carry the identity"),
            (
                "transfer-encoding",
                "transfer-encoding cannot carry the identity",
            ),
            ("te", "te cannot carry the identity"),
            ("upgrade", "upgrade cannot carry the identity"),
            ("content-type", "content-type cannot carry the identity"),
            ("content-length", "content-length cannot carry the identity"),
            ("X-Key", "x-key is the api_key_header"),
            ("bad header", "\"bad header\" is not a header name"),
            ("", "\"\" is not a header name"),
        ] {
            let got = header(bad).unwrap_err();
            assert_eq!(got.len(), 1, "{bad}: {got:#?}");
            assert!(
                got[0].starts_with("7:19: routes[0].auth.identity_header: ")
                    && got[0].contains(why),
                "{bad}: {got:#?}"
            );
        }
        // The default API key header is refused as well.
        let got = parse("api_keys_file = \"keys\"\nidentity_header = \"x-api-key\"\n").unwrap_err();
        assert!(
            got[0].contains("x-api-key is the api_key_header"),
            "{got:#?}"
        );
    }

    /// `tenants`: identities of the route's kinds, each with the tenants
    /// it may name; every error at once, named by identity.
    #[test]
    fn tenant_tables() {
        let both = format!("{JWT}api_keys_file = \"keys\"\n");
        let c = parse(&format!(
            "{both}[routes.auth.tenants]\n\"jwt:alice\" = [\"acme\", \"\"]\n\"key:billing\" = [\"*\"]\n\"jwt:bob@example.com\" = [\"\"]\n"
        ))
        .unwrap();
        let t = c.routes[0].auth.clone().unwrap().tenants.unwrap();
        assert_eq!(
            t,
            BTreeMap::from([
                ("jwt:alice".into(), vec!["acme".into(), String::new()]),
                ("jwt:bob@example.com".into(), vec![String::new()]),
                ("key:billing".into(), vec!["*".into()]),
            ])
        );
        // Inline too.
        let c = parse(&format!(
            "{both}tenants = {{ \"key:billing\" = [\"a\"] }}\n"
        ))
        .unwrap();
        assert!(c.routes[0].auth.as_ref().unwrap().tenants.is_some());

        refused(
            &format!("{both}tenants = {{}}\n"),
            &["9:11: routes[0].auth.tenants: is empty: name the identities"],
        );
        refused(
            &format!("{both}tenants = [\"acme\"]\n"),
            &["9:11: routes[0].auth.tenants: expected a table, found an array"],
        );
        let long = "t".repeat(129);
        refused(
            &format!(
                "{both}[routes.auth.tenants]\n\
                 alice = [\"a\"]\n\
                 \"jwt:\" = [\"a\"]\n\
                 \"jwt:a b\" = [\"a\"]\n\
                 \"jwt:carol\" = \"acme\"\n\
                 \"jwt:dave\" = []\n\
                 \"jwt:erin\" = [\"a\", \"a\", 3, \"x y\", \"{long}\"]\n\
                 \"jwt:frank\" = [\"*\", \"a\"]\n\
                 \"jwt:gina\" = [\"a\", \"*\"]\n\
                 \"key:nobody\" = [\"a\"]\n"
            ),
            &[
                "10:9: routes[0].auth.tenants.alice: \"alice\" is not an identity",
                "11:10: routes[0].auth.tenants.\"jwt:\": \"jwt:\" is not an identity",
                "12:13: routes[0].auth.tenants.\"jwt:a b\": \"jwt:a b\" is not an identity",
                "13:15: routes[0].auth.tenants.\"jwt:carol\": expected an array of tenant names, found \"acme\"",
                "14:14: routes[0].auth.tenants.\"jwt:dave\": is empty, which allows nothing",
                "15:20: routes[0].auth.tenants.\"jwt:erin\"[1]: \"a\" is named twice",
                "15:25: routes[0].auth.tenants.\"jwt:erin\"[2]: expected a tenant name, found integer 3",
                "15:28: routes[0].auth.tenants.\"jwt:erin\"[3]: \"x y\" is not a tenant name",
                "15:35: routes[0].auth.tenants.\"jwt:erin\"[4]: \"ttt",
                "16:21: routes[0].auth.tenants.\"jwt:frank\"[1]: \"*\" allows every tenant (and none): give it alone",
                "17:20: routes[0].auth.tenants.\"jwt:gina\"[1]: \"*\" allows every tenant",
                "18:16: routes[0].auth.tenants.\"key:nobody\": names the API key \"nobody\", which api_keys_file does not hold",
            ],
        );
        // Identities of a kind the route does not verify.
        refused(
            "api_keys_file = \"keys\"\n[routes.auth.tenants]\n\"jwt:alice\" = [\"a\"]\n",
            &["7:15: routes[0].auth.tenants.\"jwt:alice\": names a JWT identity, but the route verifies no JWT"],
        );
        refused(
            &format!("{JWT}[routes.auth.tenants]\n\"key:billing\" = [\"a\"]\n"),
            &["9:17: routes[0].auth.tenants.\"key:billing\": names an API key identity, but the route has no api_keys_file"],
        );
    }

    #[test]
    fn identity_names() {
        assert!(is_identity_name("alice@example.com"));
        assert!(!is_identity_name(""));
        assert!(!is_identity_name("a b"));
        assert!(!is_identity_name(&"x".repeat(129)));
    }
}
