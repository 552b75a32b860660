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
//! be read keeps the last good one and says so in the log, for at most
//! `jwks_max_stale` after the last good read ([`Staleness`]): then no JWT
//! is accepted until a read succeeds again (fail closed).
//!
//! A request names one identity: two `Authorization` headers, two API key
//! headers, or an API key beside an `Authorization` on a route that
//! verifies JWTs are refused.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// A verified caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `jwt:<sub>` or `key:<name>`: what the store, `/budgets`, logs and
    /// budget caps (`[routes.budget.callers."jwt:alice"]`) name it by.
    pub shown: String,
    /// Which credential the gateway verified (the other header, if any,
    /// was not).
    pub via: Via,
}

/// The credential an [`Identity`] was verified by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A bearer JWT in `Authorization`.
    Jwt,
    /// An API key in the route's `api_key_header`.
    ApiKey,
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
#[derive(Clone)]
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
    keys: Arc<ArcSwap<KeySet>>,
    issuer: String,
    audience: String,
    leeway: Duration,
}

/// A route's JWT keys, as read last.
#[derive(Default)]
struct KeySet {
    keys: Arc<Vec<Key>>,
    /// When these keys stop being accepted: set once a read failed
    /// (`jwks_max_stale` after the last good read); `None` while reads
    /// succeed, and for a PEM key.
    expires: Option<Instant>,
}

impl KeySet {
    fn fresh(keys: Vec<Key>) -> Arc<KeySet> {
        Arc::new(KeySet {
            keys: Arc::new(keys),
            expires: None,
        })
    }

    /// The keys that verify a token at `now`: none once they expired.
    fn usable(&self, now: Instant) -> &[Key] {
        match self.expires {
            Some(e) if now >= e => &[],
            _ => &self.keys,
        }
    }
}

/// The algorithms a route accepts; the key's type must match.
const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

impl Authenticator {
    /// Builds the route's verifier: reads its keys now (an unusable key
    /// file stops start-up or a reload, with why) and, for a JWKS file or
    /// URL, starts the thread that reloads them.
    pub fn new(route: &str, policy: &config::AuthPolicy) -> Result<Arc<Authenticator>, String> {
        let read_at = Instant::now();
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
                    keys: Arc::new(ArcSwap::new(KeySet::fresh(keys))),
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
            // Keys fetched from a URL that did not answer were never read.
            let read = !jwt.keys.load().keys.is_empty();
            refresh_in_background(
                route,
                &cfg.keys,
                Arc::downgrade(&jwt.keys),
                read.then_some(read_at),
            );
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
                keys: Arc::new(ArcSwap::from_pointee(KeySet::default())),
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

    /// The caller of a request with these headers. A request must name
    /// one identity: two `Authorization` headers, two of the API key
    /// header, or an API key beside an `Authorization` on a route that
    /// verifies JWTs (which identity would it be?) are refused.
    pub fn check(&self, headers: &http::HeaderMap) -> Verdict {
        let rejected = |why: String| Verdict::Refused(Failure::Rejected { why });
        let authorization = headers.get_all(http::header::AUTHORIZATION);
        let mut authorizations = authorization.iter();
        let bearer = authorizations.next();
        if authorizations.next().is_some() {
            return rejected("more than one Authorization header".into());
        }
        if let Some(keys) = &self.api_keys {
            let mut values = headers.get_all(keys.header.as_str()).iter();
            if let Some(v) = values.next() {
                if values.next().is_some() {
                    return rejected(format!("more than one {} header", keys.header));
                }
                let Some(name) = api_key(keys, v.as_bytes()) else {
                    return rejected(format!("the {} value is not a known API key", keys.header));
                };
                if bearer.is_some() && self.jwt.is_some() {
                    return rejected(format!(
                        "two credentials: an API key ({}) and an Authorization header",
                        keys.header
                    ));
                }
                return Verdict::Identified(Identity {
                    shown: format!("key:{name}"),
                    via: Via::ApiKey,
                });
            }
        }
        if let (Some(jwt), Some(v)) = (&self.jwt, bearer) {
            let token = v.to_str().ok().and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
                    .map(str::trim)
            });
            return match token {
                None => rejected("Authorization is not `Bearer <JWT>`".into()),
                Some(t) => match jwt.verify(t) {
                    Ok(sub) => Verdict::Identified(Identity {
                        shown: format!("jwt:{sub}"),
                        via: Via::Jwt,
                    }),
                    Err(why) => rejected(why),
                },
            };
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
    let hex = crate::digest::sha256_hex(value);
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
        self.verify_at(token, Instant::now())
    }

    /// [`Jwt::verify`] at `now` (which says whether stale keys expired).
    fn verify_at(&self, token: &str, now: Instant) -> Result<String, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("not a JWT: {e}"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!(
                "alg {:?} is not accepted (RS256, ES256, EdDSA)",
                header.alg
            ));
        }
        let set = self.keys.load();
        let keys = set.usable(now);
        if keys.is_empty() && !set.keys.is_empty() {
            return Err(
                "the JWT keys are stale: no read of them succeeded within jwks_max_stale".into(),
            );
        }
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

/// Whether a route's last good JWKS keys may still be used while reads
/// fail: the refresh thread's state, with the time given (tests give it).
#[derive(Debug)]
struct Staleness {
    max_stale: Duration,
    /// When the last successful read started (`None`: never read).
    last_good: Option<Instant>,
    /// A read failed since the last good one.
    failing: bool,
    /// The keys were dropped for it.
    stale: bool,
}

/// What the refresh thread does after a read or a tick.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    None,
    /// The keys read are used, with no expiry; `was_failing`: reads had
    /// failed (and `was_stale`: the keys had been dropped).
    Fresh {
        was_failing: bool,
        was_stale: bool,
    },
    /// The first failed read since the last good one: the keys are kept
    /// until `until` (`None`: there are none).
    Failing {
        until: Option<Instant>,
    },
    /// `jwks_max_stale` passed since the last good read: the keys are
    /// dropped.
    Stale,
}

impl Staleness {
    fn new(max_stale: Duration, last_good: Option<Instant>) -> Staleness {
        Staleness {
            max_stale,
            last_good,
            failing: false,
            stale: false,
        }
    }

    /// When the keys expire if reads keep failing.
    fn until(&self) -> Option<Instant> {
        self.last_good.map(|t| t + self.max_stale)
    }

    /// A read that started at `started` ended at `now`, `ok` or not.
    fn read(&mut self, ok: bool, started: Instant, now: Instant) -> Change {
        if ok {
            let change = Change::Fresh {
                was_failing: self.failing,
                was_stale: self.stale,
            };
            *self = Staleness::new(self.max_stale, Some(started));
            return change;
        }
        if self.failing {
            return self.tick(now);
        }
        self.failing = true;
        match self.tick(now) {
            Change::Stale => Change::Stale,
            _ => Change::Failing {
                until: self.until(),
            },
        }
    }

    /// Time passed: [`Change::Stale`] once, when reads are failing and
    /// `jwks_max_stale` passed since the last good one.
    fn tick(&mut self, now: Instant) -> Change {
        if self.failing && !self.stale && self.until().is_some_and(|u| now >= u) {
            self.stale = true;
            return Change::Stale;
        }
        Change::None
    }
}

/// Reloads a JWKS file or URL every `refresh` on a thread of its own, until
/// the route is gone (`keys` dropped: a reload replaced it). `read_at`:
/// when the keys in `keys` were read (`None`: not yet). While reads fail,
/// the keys are kept for `max_stale` after the last good one, then
/// dropped.
fn refresh_in_background(
    route: &str,
    source: &config::JwtKeys,
    keys: Weak<ArcSwap<KeySet>>,
    read_at: Option<Instant>,
) {
    let (refresh, max_stale, load): (Duration, Duration, LoadKeys) = match source {
        config::JwtKeys::PublicKey { .. } => return,
        config::JwtKeys::JwksFile {
            path,
            refresh,
            max_stale,
        } => {
            let path = path.clone();
            (
                *refresh,
                *max_stale,
                Box::new(move || {
                    let text = config::read_jwks(&path)?;
                    jwks_keys(&text)
                }),
            )
        }
        config::JwtKeys::JwksUrl {
            url,
            refresh,
            max_stale,
        } => {
            let url = url.clone();
            (*refresh, *max_stale, Box::new(move || fetch_jwks(&url)))
        }
    };
    let route = route.to_owned();
    let stale_gauge = crate::metrics::JWKS_STALE.with_label_values(&[&route]);
    stale_gauge.set(0);
    let mut state = Staleness::new(max_stale, read_at);
    // Carries out a change; `read`: the keys a read gave, or why it failed.
    let apply = move |slot: &ArcSwap<KeySet>,
                      change: Change,
                      read: Option<Result<Vec<Key>, String>>| {
        let error = match read {
            Some(Ok(k)) => {
                slot.store(KeySet::fresh(k));
                None
            }
            Some(Err(e)) => Some(e),
            None => None,
        };
        match change {
            Change::None => {}
            Change::Fresh {
                was_failing,
                was_stale,
            } => {
                if was_stale {
                    stale_gauge.set(0);
                    tracing::warn!(route = %route, "JWT keys read again: JWTs are verified again");
                } else if was_failing {
                    tracing::info!(route = %route, "JWT keys read again");
                }
            }
            Change::Failing { until: None } => {
                tracing::warn!(route = %route, error = %error.unwrap_or_default(), "cannot read the JWT keys; JWTs are refused until they are read");
            }
            Change::Failing { until } => {
                let current = slot.load().keys.clone();
                let left = until.map(|u| u.saturating_duration_since(Instant::now()));
                slot.store(Arc::new(KeySet {
                    keys: current,
                    expires: until,
                }));
                tracing::warn!(
                    route = %route,
                    error = %error.unwrap_or_default(),
                    kept_for_s = left.map(|d| d.as_secs()),
                    "cannot reload the JWT keys; keeping the last ones until jwks_max_stale after the last good read"
                );
            }
            Change::Stale => {
                slot.store(Arc::new(KeySet::default()));
                stale_gauge.set(1);
                tracing::warn!(
                    route = %route,
                    error = ?error,
                    max_stale_s = max_stale.as_secs(),
                    "the JWT keys were not read for jwks_max_stale: every JWT is refused until a read succeeds"
                );
            }
        }
    };
    let spawned = std::thread::Builder::new()
        .name("jwks-refresh".into())
        .spawn(move || loop {
            // Wake often enough to notice the route is gone, and the keys
            // going stale.
            let mut slept = Duration::ZERO;
            while slept < refresh {
                let step = Duration::from_secs(1).min(refresh - slept);
                std::thread::sleep(step);
                slept += step;
                let Some(slot) = keys.upgrade() else { return };
                apply(&slot, state.tick(Instant::now()), None);
            }
            let Some(slot) = keys.upgrade() else { return };
            let started = Instant::now();
            let read = load();
            let change = state.read(read.is_ok(), started, Instant::now());
            apply(&slot, change, Some(read));
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
                shown: "key:billing".into(),
                via: Via::ApiKey,
            })
        );
        h.insert("x-api-key", "nope".parse().unwrap());
        // A bad credential is refused on an optional route too.
        assert!(matches!(
            auth(config::AuthMode::Optional).check(&h),
            Verdict::Refused(Failure::Rejected { .. })
        ));
    }

    /// An Ed25519 key pair made for these tests (`openssl genpkey
    /// -algorithm ed25519`): the private half signs, the public half is a JWK.
    const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEICqfPfz+yCU+STy/thy9Fttyb52q3SYtpG/+g1VrKbGG\n-----END PRIVATE KEY-----\n";
    const ED_PUBLIC_X: &str = "osbNcjwL6N32NGRcodIODaBNpmmYIjfGpwCrracApwc";

    fn jwt_keys() -> Vec<Key> {
        jwks_keys(&format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{ED_PUBLIC_X}"}}]}}"#
        ))
        .unwrap()
    }

    /// A token for `sub`, signed by the test key; `alg: none` unsigned.
    fn token(sub: &str, signed: bool) -> String {
        use base64::Engine as _;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let claims = serde_json::json!({"iss": "i", "aud": "a", "sub": sub, "exp": exp});
        if !signed {
            let b64 = |v: &serde_json::Value| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
            };
            return format!(
                "{}.{}.",
                b64(&serde_json::json!({"alg": "none"})),
                b64(&claims)
            );
        }
        let key = jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap();
        jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::EdDSA), &claims, &key).unwrap()
    }

    /// A route with JWTs (the test key), API keys, or both.
    fn both(jwt: bool, api_keys: bool) -> Authenticator {
        Authenticator {
            route: "r".into(),
            mode: config::AuthMode::Required,
            jwt: jwt.then(|| Jwt {
                keys: Arc::new(ArcSwap::new(KeySet::fresh(jwt_keys()))),
                issuer: "i".into(),
                audience: "a".into(),
                leeway: Duration::from_secs(5),
            }),
            api_keys: api_keys.then(keys),
        }
    }

    /// One identity per request: duplicate headers and an API key beside
    /// an `Authorization` (on a route that verifies JWTs) are refused; a
    /// verified identity says which header proved it.
    #[test]
    fn one_credential_per_request() {
        let good = format!("Bearer {}", token("alice", true));
        let forged = format!("Bearer {}", token("admin", false));
        let key = |who: &str| {
            Verdict::Identified(Identity {
                shown: format!("key:{who}"),
                via: Via::ApiKey,
            })
        };
        let jwt = |who: &str| {
            Verdict::Identified(Identity {
                shown: format!("jwt:{who}"),
                via: Via::Jwt,
            })
        };
        let rejected = |why: &str| Err(why.to_string());
        // (jwt route, api key route, headers, verdict or the start of why)
        type Case<'a> = (bool, bool, Vec<(&'a str, &'a str)>, Result<Verdict, String>);
        let cases: Vec<Case<'_>> = vec![
            (true, true, vec![("authorization", &good)], Ok(jwt("alice"))),
            (true, true, vec![("x-api-key", "test")], Ok(key("billing"))),
            (
                false,
                true,
                vec![("x-api-key", "test"), ("authorization", &forged)],
                Ok(key("billing")),
            ),
            (
                true,
                false,
                vec![("x-api-key", "test"), ("authorization", &good)],
                Ok(jwt("alice")),
            ),
            (true, true, vec![], Ok(Verdict::Refused(Failure::Missing))),
            (
                true,
                true,
                vec![("authorization", &good), ("authorization", &forged)],
                rejected("more than one Authorization header"),
            ),
            (
                true,
                true,
                vec![("authorization", &forged), ("authorization", &good)],
                rejected("more than one Authorization header"),
            ),
            (
                true,
                true,
                vec![("authorization", &good), ("authorization", &good)],
                rejected("more than one Authorization header"),
            ),
            (
                false,
                true,
                vec![
                    ("authorization", "Basic a"),
                    ("authorization", "Basic b"),
                    ("x-api-key", "test"),
                ],
                rejected("more than one Authorization header"),
            ),
            (
                true,
                true,
                vec![("x-api-key", "test"), ("x-api-key", "other")],
                rejected("more than one x-api-key header"),
            ),
            (
                false,
                true,
                vec![("x-api-key", "test"), ("x-api-key", "test")],
                rejected("more than one x-api-key header"),
            ),
            (
                true,
                true,
                vec![("x-api-key", "test"), ("authorization", &good)],
                rejected("two credentials"),
            ),
            (
                true,
                true,
                vec![("x-api-key", "test"), ("authorization", &forged)],
                rejected("two credentials"),
            ),
            (
                true,
                true,
                vec![("x-api-key", "nope"), ("authorization", &good)],
                rejected("the x-api-key value is not a known API key"),
            ),
            (
                true,
                true,
                vec![("authorization", &forged)],
                rejected("not a JWT"),
            ),
        ];
        for (i, (jwt_route, key_route, headers, want)) in cases.into_iter().enumerate() {
            let mut h = http::HeaderMap::new();
            for (k, v) in &headers {
                h.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            let got = both(jwt_route, key_route).check(&h);
            match (&want, &got) {
                (Ok(w), g) => assert_eq!(g, w, "case {i}: {headers:?}"),
                (Err(w), Verdict::Refused(Failure::Rejected { why })) => {
                    assert!(why.starts_with(w.as_str()), "case {i}: {why}")
                }
                (Err(w), g) => panic!("case {i}: want rejected ({w}), got {g:?}"),
            }
        }
    }

    /// Keys kept while reads fail expire `max_stale` after the last good
    /// read (not after the first failure), are dropped once, and come back
    /// with the next good read.
    #[test]
    fn stale_keys_expire_after_max_stale() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut st = Staleness::new(Duration::from_secs(10), Some(t0));
        assert_eq!(st.tick(s(100)), Change::None, "reads never failed");
        assert_eq!(
            st.read(true, s(3), s(4)),
            Change::Fresh {
                was_failing: false,
                was_stale: false
            }
        );
        // The last good read started at 3: kept until 13.
        assert_eq!(
            st.read(false, s(6), s(7)),
            Change::Failing { until: Some(s(13)) }
        );
        assert_eq!(st.read(false, s(9), s(10)), Change::None);
        assert_eq!(st.tick(s(12)), Change::None);
        assert_eq!(st.tick(s(13)), Change::Stale);
        assert_eq!(st.tick(s(14)), Change::None, "dropped once");
        assert_eq!(st.read(false, s(15), s(16)), Change::None);
        assert_eq!(
            st.read(true, s(20), s(21)),
            Change::Fresh {
                was_failing: true,
                was_stale: true
            }
        );
        assert_eq!(st.tick(s(100)), Change::None, "fresh again");
        // A first failure already past the bound drops the keys at once.
        assert_eq!(st.read(false, s(40), s(41)), Change::Stale);
        // Never read (a URL that did not answer at start): nothing expires.
        let mut never = Staleness::new(Duration::from_secs(1), None);
        assert_eq!(
            never.read(false, s(0), s(1)),
            Change::Failing { until: None }
        );
        assert_eq!(never.tick(s(1000)), Change::None);

        // A key set with an expiry verifies until it, and nothing from then.
        let auth = both(true, false);
        let jwt = auth.jwt.as_ref().unwrap();
        let t = token("alice", true);
        jwt.keys.store(Arc::new(KeySet {
            keys: Arc::new(jwt_keys()),
            expires: Some(s(13)),
        }));
        assert_eq!(jwt.verify_at(&t, s(12)).as_deref(), Ok("alice"));
        let why = jwt.verify_at(&t, s(13)).unwrap_err();
        assert!(why.contains("stale"), "{why}");
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
