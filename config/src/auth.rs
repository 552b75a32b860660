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

use crate::read::{duration, one_of, string, Reader};
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
}

/// Where a JWT's verification keys come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwtKeys {
    /// A JWKS document (`{"keys": [...]}`), re-read every `refresh`.
    JwksFile { path: PathBuf, refresh: Duration },
    /// A JWKS document fetched over HTTP(S), every `refresh`.
    JwksUrl { url: String, refresh: Duration },
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
    let jwks_file = a.opt("jwks_file", |item| {
        let path = config_path(string(item)?, env)?;
        read_jwks(&path)?;
        Ok::<_, String>(JwtKeys::JwksFile { path, refresh })
    });
    let jwks_url = a.opt("jwks_url", |item| {
        let url = string(item)?;
        if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() < 10 {
            return Err(format!("{url:?} is not an http(s) URL"));
        }
        Ok(JwtKeys::JwksUrl {
            url: url.to_owned(),
            refresh,
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
        for key in ["issuer", "audience", "leeway", "jwks_refresh"] {
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
    })
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
        std::fs::write(dir.join("keys"), format!("{H} billing\n")).unwrap();
        std::fs::write(
            dir.join("jwks.json"),
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
        )
        .unwrap();
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
            matches!(&jwt.keys, JwtKeys::JwksFile { refresh, .. } if *refresh == DEFAULT_REFRESH)
        );

        let c = parse("jwks_url = \"https://idp.example/jwks\"\nissuer = \"i\"\naudience = \"a\"\njwks_refresh = \"1m\"\n").unwrap();
        let jwt = c.routes[0].auth.as_ref().unwrap().jwt.clone().unwrap();
        assert_eq!(
            jwt.keys,
            JwtKeys::JwksUrl {
                url: "https://idp.example/jwks".into(),
                refresh: Duration::from_secs(60)
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

    #[test]
    fn identity_names() {
        assert!(is_identity_name("alice@example.com"));
        assert!(!is_identity_name(""));
        assert!(!is_identity_name("a b"));
        assert!(!is_identity_name(&"x".repeat(129)));
    }
}
