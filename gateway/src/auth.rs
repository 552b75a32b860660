//! `[routes.auth]`: who a caller is, verified.
//!
//! A bearer JWT (`Authorization: Bearer …`) is verified with the
//! `jsonwebtoken` crate: signature by one of the route's keys (RS256, ES256
//! or EdDSA only; `none` and HMAC are refused), `iss` and `aud` as
//! configured, `exp` required and `nbf` checked with the route's leeway.
//! An API key (in `api_key_header`) is hashed with SHA-256 and looked up in
//! the route's key file, compared in constant time.
//!
//! The verified identity is what budgets, logs and metrics name the caller
//! by: `jwt:<sub>` or `key:<name>`, so that the two kinds never collide.
//! Keys from a JWKS file or URL are reloaded every `jwks_refresh` on a
//! thread of their own (never on the request path); a key set that cannot
//! be read keeps the last good one and says so in the log.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// A verified caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `jwt:<sub>` or `key:<name>`: what the store, `/budgets`, logs and
    /// budget caps (`[routes.budget.callers."jwt:alice"]`) name it by.
    pub shown: String,
}

/// Why a caller was not identified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No credential (on a `required` route).
    Missing,
    /// A credential was sent and not accepted; `why` is for the log only
    /// (the caller is not told why).
    Rejected { why: String },
}

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Identified(Identity),
    /// No credential, on an `optional` route.
    Anonymous,
    Refused(Failure),
}

/// One verification key with the algorithm it verifies.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// A route's verifier.
pub struct Authenticator {
    route: String,
    mode: config::AuthMode,
    jwt: Option<Jwt>,
    api_keys: Option<config::ApiKeys>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("route", &self.route)
            .field("mode", &self.mode)
            .field("jwt", &self.jwt.is_some())
            .field("api_keys", &self.api_keys.is_some())
            .finish()
    }
}

struct Jwt {
    /// Empty when the keys could not be read: every token is refused.
    keys: Arc<ArcSwap<Vec<Key>>>,
    issuer: String,
    audience: String,
    leeway: Duration,
}

/// The algorithms a route accepts; the key's type must match.
const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

impl Authenticator {
    /// Builds the route's verifier: reads its keys now (an unusable key
    /// file stops start-up or a reload, with why) and, for a JWKS file or
    /// URL, starts the thread that reloads them.
    pub fn new(route: &str, policy: &config::AuthPolicy) -> Result<Arc<Authenticator>, String> {
        let jwt = match &policy.jwt {
            None => None,
            Some(cfg) => {
                let keys = match &cfg.keys {
                    config::JwtKeys::PublicKey { path, pem } => pem_key(pem)
                        .map(|k| vec![k])
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                    config::JwtKeys::JwksFile { path, .. } => {
                        let text = config::read_jwks(path)?;
                        jwks_keys(&text).map_err(|e| format!("{}: {e}", path.display()))?
                    }
                    // Fetched by its thread; until then no token verifies.
                    config::JwtKeys::JwksUrl { url, .. } => match fetch_jwks(url) {
                        Ok(keys) => keys,
                        Err(e) => {
                            tracing::warn!(route, url = %url, error = %e, "cannot fetch the JWKS yet; JWTs are refused until it is fetched");
                            Vec::new()
                        }
                    },
                };
                Some(Jwt {
                    keys: Arc::new(ArcSwap::from_pointee(keys)),
                    issuer: cfg.issuer.clone(),
                    audience: cfg.audience.clone(),
                    leeway: cfg.leeway,
                })
            }
        };
        let auth = Arc::new(Authenticator {
            route: route.to_owned(),
            mode: policy.mode,
            jwt,
            api_keys: policy.api_keys.clone(),
        });
        if let (Some(jwt), Some(cfg)) = (&auth.jwt, &policy.jwt) {
            refresh_in_background(route, &cfg.keys, Arc::downgrade(&jwt.keys));
        }
        Ok(auth)
    }

    /// A verifier whose keys could not be read (a route built while its key
    /// file is broken): every credential is refused, and the log says why
    /// once. [`check_keys`] refuses such a config at start and on reload
    /// first, so this is the fallback of a file broken in between.
    fn refusing(route: &str, policy: &config::AuthPolicy, why: &str) -> Arc<Authenticator> {
        tracing::error!(route, error = %why, "the route's caller keys cannot be read: every caller is refused");
        Arc::new(Authenticator {
            route: route.to_owned(),
            mode: config::AuthMode::Required,
            jwt: policy.jwt.as_ref().map(|cfg| Jwt {
                keys: Arc::new(ArcSwap::from_pointee(Vec::new())),
                issuer: cfg.issuer.clone(),
                audience: cfg.audience.clone(),
                leeway: cfg.leeway,
            }),
            api_keys: policy.api_keys.clone().map(|mut k| {
                k.keys.clear();
                k
            }),
        })
    }

    /// [`Authenticator::new`], or one that refuses everyone when the keys
    /// cannot be read.
    pub fn build(route: &str, policy: &config::AuthPolicy) -> Arc<Authenticator> {
        Authenticator::new(route, policy).unwrap_or_else(|why| Self::refusing(route, policy, &why))
    }

    /// The caller of a request with these headers.
    pub fn check(&self, headers: &http::HeaderMap) -> Verdict {
        if let Some(keys) = &self.api_keys {
            if let Some(v) = headers.get(keys.header.as_str()) {
                return match api_key(keys, v.as_bytes()) {
                    Some(name) => Verdict::Identified(Identity {
                        shown: format!("key:{name}"),
                    }),
                    None => Verdict::Refused(Failure::Rejected {
                        why: format!("the {} value is not a known API key", keys.header),
                    }),
                };
            }
        }
        if let Some(jwt) = &self.jwt {
            if let Some(v) = headers.get(http::header::AUTHORIZATION) {
                let token = v.to_str().ok().and_then(|v| {
                    v.strip_prefix("Bearer ")
                        .or_else(|| v.strip_prefix("bearer "))
                        .map(str::trim)
                });
                return match token {
                    None => Verdict::Refused(Failure::Rejected {
                        why: "Authorization is not `Bearer <JWT>`".into(),
                    }),
                    Some(t) => match jwt.verify(t) {
                        Ok(sub) => Verdict::Identified(Identity {
                            shown: format!("jwt:{sub}"),
                        }),
                        Err(why) => Verdict::Refused(Failure::Rejected { why }),
                    },
                };
            }
        }
        match self.mode {
            config::AuthMode::Required => Verdict::Refused(Failure::Missing),
            config::AuthMode::Optional => Verdict::Anonymous,
        }
    }

    /// `WWW-Authenticate` for a 401 (RFC 6750 §3).
    pub fn challenge(&self, failure: &Failure) -> String {
        let scheme = if self.jwt.is_some() {
            "Bearer"
        } else {
            "ApiKey"
        };
        match failure {
            Failure::Missing => format!("{scheme} realm=\"a2a-gateway\""),
            Failure::Rejected { .. } => {
                format!("{scheme} realm=\"a2a-gateway\", error=\"invalid_token\"")
            }
        }
    }

    /// What a caller is told it must send.
    pub fn what_to_send(&self) -> String {
        match (&self.jwt, &self.api_keys) {
            (Some(_), Some(k)) => format!("Authorization: Bearer <JWT> or {} <API key>", k.header),
            (Some(_), None) => "Authorization: Bearer <JWT>".into(),
            (None, Some(k)) => format!("{} <API key>", k.header),
            (None, None) => "a credential".into(),
        }
    }
}

/// Whether every route's JWT keys can be used (a PEM key or JWKS file
/// that parses but holds no usable key passes the config check): one
/// message per route that cannot. A JWKS URL is not fetched here.
pub fn check_keys(routes: &[config::Route]) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    for r in routes {
        let Some(jwt) = r.auth.as_ref().and_then(|a| a.jwt.as_ref()) else {
            continue;
        };
        let read = match &jwt.keys {
            config::JwtKeys::PublicKey { path, pem } => pem_key(pem)
                .map(drop)
                .map_err(|e| format!("{}: {e}", path.display())),
            config::JwtKeys::JwksFile { path, .. } => config::read_jwks(path)
                .and_then(|t| jwks_keys(&t).map_err(|e| format!("{}: {e}", path.display())))
                .map(drop),
            config::JwtKeys::JwksUrl { .. } => Ok(()),
        };
        if let Err(e) = read {
            errors.push(format!("routes {:?}: auth: {e}", r.name));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// The name of the API key `value`, if it is one of `keys`. Every hash is
/// compared, in constant time, so the time taken does not say how close a
/// guess came.
fn api_key(keys: &config::ApiKeys, value: &[u8]) -> Option<String> {
    let hex = crate::budget::sha256_hex(value);
    let mut found = None;
    for (hash, name) in &keys.keys {
        if ct_eq(hash.as_bytes(), hex.as_bytes()) {
            found = Some(name.clone());
        }
    }
    found
}

/// Equal, compared in time that depends only on the lengths (a length is
/// no secret): every byte is looked at whatever differs. For credentials.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    a.len() == b.len() && diff == 0
}

#[derive(serde::Deserialize)]
struct Claims {
    sub: Option<String>,
}

impl Jwt {
    /// The token's `sub`, or why it is refused.
    fn verify(&self, token: &str) -> Result<String, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!(
                "alg {:?} is not accepted (RS256, ES256, EdDSA)",
                header.alg
            ));
        }
        let keys = self.keys.load();
        let candidates: Vec<&Key> = keys
            .iter()
            .filter(|k| k.alg == header.alg)
            .filter(|k| match (&header.kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "no {:?} key{} to verify it",
                header.alg,
                header
                    .kid
                    .as_deref()
                    .map(|k| format!(" with kid {k:?}"))
                    .unwrap_or_default()
            ));
        }
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.validate_nbf = true;
        v.leeway = self.leeway.as_secs();
        let mut last = String::new();
        for k in candidates {
            match jsonwebtoken::decode::<Claims>(token, &k.key, &v) {
                Ok(data) => {
                    let sub = data.claims.sub.unwrap_or_default();
                    if !config::is_identity_name(&sub) {
                        return Err(
                            "its sub is empty, over 128 characters or not visible ASCII".into()
                        );
                    }
                    return Ok(sub);
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}

/// A `DecodingKey` constructor from PEM.
type ParsePem = fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>;
/// How a refresh thread reads its keys.
type LoadKeys = Box<dyn Fn() -> Result<Vec<Key>, String> + Send>;

/// A PEM public key: RSA (RS256), EC P-256 (ES256) or Ed25519 (EdDSA).
fn pem_key(pem: &[u8]) -> Result<Key, String> {
    let tries: [(Algorithm, ParsePem); 3] = [
        (Algorithm::RS256, DecodingKey::from_rsa_pem),
        (Algorithm::ES256, DecodingKey::from_ec_pem),
        (Algorithm::EdDSA, DecodingKey::from_ed_pem),
    ];
    for (alg, parse) in tries {
        if let Ok(key) = parse(pem) {
            return Ok(Key {
                kid: None,
                alg,
                key,
            });
        }
    }
    Err("not an RSA, EC P-256 or Ed25519 public key".into())
}

/// The usable keys of a JWKS document: RSA, EC P-256 and Ed25519 keys meant
/// for signatures; others (HMAC, `use: enc`, other curves) are skipped. At
/// least one must be left.
fn jwks_keys(text: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWK set: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        if let Some(k) = jwk_key(jwk) {
            keys.push(k);
        }
    }
    if keys.is_empty() {
        return Err("no RSA, EC P-256 or Ed25519 signing key in the JWK set".into());
    }
    Ok(keys)
}

fn jwk_key(jwk: &Jwk) -> Option<Key> {
    use jsonwebtoken::jwk::PublicKeyUse;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

/// How long a JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a JWKS document read.
const MAX_JWKS: u64 = 1 << 20;

fn fetch_jwks(url: &str) -> Result<Vec<Key>, String> {
    use std::io::Read as _;
    let resp = ureq::AgentBuilder::new()
        .timeout(FETCH_TIMEOUT)
        .build()
        .get(url)
        .call()
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    resp.into_reader()
        .take(MAX_JWKS)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    jwks_keys(&text)
}

/// Reloads a JWKS file or URL every `refresh` on a thread of its own, until
/// the route is gone (`keys` dropped: a reload replaced it).
fn refresh_in_background(route: &str, source: &config::JwtKeys, keys: Weak<ArcSwap<Vec<Key>>>) {
    let (refresh, load): (Duration, LoadKeys) = match source {
        config::JwtKeys::PublicKey { .. } => return,
        config::JwtKeys::JwksFile { path, refresh } => {
            let path = path.clone();
            (
                *refresh,
                Box::new(move || {
                    let text = config::read_jwks(&path)?;
                    jwks_keys(&text)
                }),
            )
        }
        config::JwtKeys::JwksUrl { url, refresh } => {
            let url = url.clone();
            (*refresh, Box::new(move || fetch_jwks(&url)))
        }
    };
    let route = route.to_owned();
    let spawned = std::thread::Builder::new()
        .name("jwks-refresh".into())
        .spawn(move || {
            let mut failing = false;
            loop {
                // Wake often enough to notice the route is gone.
                let mut slept = Duration::ZERO;
                while slept < refresh {
                    let step = Duration::from_secs(1).min(refresh - slept);
                    std::thread::sleep(step);
                    slept += step;
                    if keys.strong_count() == 0 {
                        return;
                    }
                }
                let Some(slot) = keys.upgrade() else { return };
                match load() {
                    Ok(k) => {
                        if failing {
                            tracing::info!(route = %route, "JWT keys read again");
                        }
                        failing = false;
                        slot.store(Arc::new(k));
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(route = %route, error = %e, "cannot reload the JWT keys; keeping the last ones");
                        }
                        failing = true;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the JWKS refresh thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn keys() -> config::ApiKeys {
        // sha256("test") and sha256("other")
        config::ApiKeys {
            path: "k".into(),
            header: "x-api-key".into(),
            keys: BTreeMap::from([
                (
                    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
                    "billing".into(),
                ),
                (
                    "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa".into(),
                    "ops".into(),
                ),
            ]),
        }
    }

    #[test]
    fn api_keys_by_hash() {
        let k = keys();
        for (value, want) in [
            ("test", Some("billing")),
            ("other", Some("ops")),
            ("tes", None),
            ("", None),
        ] {
            assert_eq!(api_key(&k, value.as_bytes()).as_deref(), want, "{value}");
        }
    }

    fn auth(mode: config::AuthMode) -> Authenticator {
        Authenticator {
            route: "r".into(),
            mode,
            jwt: None,
            api_keys: Some(keys()),
        }
    }

    #[test]
    fn verdicts() {
        let mut h = http::HeaderMap::new();
        assert_eq!(
            auth(config::AuthMode::Required).check(&h),
            Verdict::Refused(Failure::Missing)
        );
        assert_eq!(
            auth(config::AuthMode::Optional).check(&h),
            Verdict::Anonymous
        );
        h.insert("x-api-key", "test".parse().unwrap());
        assert_eq!(
            auth(config::AuthMode::Optional).check(&h),
            Verdict::Identified(Identity {
                shown: "key:billing".into()
            })
        );
        h.insert("x-api-key", "nope".parse().unwrap());
        // A bad credential is refused on an optional route too.
        assert!(matches!(
            auth(config::AuthMode::Optional).check(&h),
            Verdict::Refused(Failure::Rejected { .. })
        ));
    }

    #[test]
    fn jwks_with_only_unusable_keys_is_refused() {
        let hmac = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
        assert!(jwks_keys(hmac).is_err());
        let ed = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"a","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
        let k = jwks_keys(ed).unwrap();
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].alg, Algorithm::EdDSA);
        assert_eq!(k[0].kid.as_deref(), Some("a"));
    }
}
