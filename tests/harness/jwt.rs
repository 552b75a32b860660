//! Signed JWTs and an identity provider's JWKS endpoint, for routes with
//! `[routes.auth]`: keys the test generates (Ed25519 and P-256 with
//! `rcgen`, RSA with the `openssl` command) and tokens they sign.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// The issuer every token names (a route's `issuer`).
pub const ISS: &str = "https://idp.test";
/// The audience every token names (a route's `audience`).
pub const AUD: &str = "a2a-gateway";

/// A signing key and its public half as a JWK.
pub struct Signer {
    pub alg: Algorithm,
    pub kid: String,
    pub key: EncodingKey,
    pub jwk: Value,
    pub public_pem: String,
}

impl Signer {
    pub fn ed25519(kid: &str) -> Signer {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(kp.public_key_raw());
        Signer {
            alg: Algorithm::EdDSA,
            kid: kid.into(),
            key: EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap(),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "use": "sig", "x": x}),
            public_pem: kp.public_key_pem(),
        }
    }

    pub fn p256(kid: &str) -> Signer {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = kp.public_key_raw();
        assert_eq!(raw.len(), 65, "an uncompressed P-256 point");
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Signer {
            alg: Algorithm::ES256,
            kid: kid.into(),
            key: EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap(),
            jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&raw[1..33]), "y": b64(&raw[33..])}),
            public_pem: kp.public_key_pem(),
        }
    }

    /// A signed token with `claims` over the defaults (iss, aud, an exp an
    /// hour away, sub "alice").
    pub fn token(&self, claims: Value) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut c = json!({"iss": ISS, "aud": AUD, "sub": "alice", "exp": now + 3600, "iat": now});
        for (k, v) in claims.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        let mut h = Header::new(self.alg);
        h.kid = Some(self.kid.clone());
        encode(&h, &c, &self.key).unwrap()
    }
}

impl Signer {
    /// An RSA-2048 key made by the `openssl` command (rcgen makes no RSA
    /// keys), signing RS256.
    pub fn rsa(kid: &str, dir: &std::path::Path) -> Signer {
        let pem = dir.join(format!("{kid}.pem"));
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .expect("run openssl (scripts/deps installs it)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let pem_s = pem.to_str().unwrap();
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            pem_s,
        ]);
        let public_pem = String::from_utf8(run(&["pkey", "-in", pem_s, "-pubout"])).unwrap();
        // "Modulus=C0FFEE..." in hex; the exponent is openssl's default 65537.
        let modulus = String::from_utf8(run(&["rsa", "-in", pem_s, "-noout", "-modulus"])).unwrap();
        let hex = modulus.trim().trim_start_matches("Modulus=");
        let n: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        Signer {
            alg: Algorithm::RS256,
            kid: kid.into(),
            key: EncodingKey::from_rsa_pem(&std::fs::read(&pem).unwrap()).unwrap(),
            jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64(&n), "e": "AQAB"}),
            public_pem,
        }
    }
}

/// Serves `doc` (replaceable) as `application/json` to any GET on a port of
/// its own, counting the fetches: an identity provider's JWKS endpoint.
/// [`JwksServer::stop`] makes it close every connection unanswered (a
/// provider that is down) until [`JwksServer::resume`].
pub struct JwksServer {
    pub url: String,
    pub addr: SocketAddr,
    doc: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    /// When the last document was written to a fetcher.
    last_served: Arc<Mutex<Option<Instant>>>,
    down: Arc<AtomicBool>,
    /// Connections being answered.
    in_flight: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    pub async fn start(doc: String) -> JwksServer {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}/.well-known/jwks.json");
        let doc = Arc::new(Mutex::new(doc));
        let fetches = Arc::new(AtomicUsize::new(0));
        let last_served = Arc::new(Mutex::new(None));
        let down = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (d, f, l, dn, n) = (
            doc.clone(),
            fetches.clone(),
            last_served.clone(),
            down.clone(),
            in_flight.clone(),
        );
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                // Counted before the switch is read: `stop` waits for it.
                n.fetch_add(1, Ordering::SeqCst);
                if dn.load(Ordering::SeqCst) {
                    n.fetch_sub(1, Ordering::SeqCst);
                    drop(s);
                    continue;
                }
                let (d, f, l, n) = (d.clone(), f.clone(), l.clone(), n.clone());
                tokio::spawn(async move {
                    let _done = Decrement(n);
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    f.fetch_add(1, Ordering::SeqCst);
                    let body = d.lock().unwrap().clone();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    *l.lock().unwrap() = Some(Instant::now());
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        JwksServer {
            url,
            addr,
            doc,
            fetches,
            last_served,
            down,
            in_flight,
            task,
        }
    }

    /// Serves `doc` from now on.
    pub fn serve(&self, doc: String) {
        *self.doc.lock().unwrap() = doc;
    }

    /// How many documents were served.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// When the last document was served (just before it was written).
    pub fn last_served(&self) -> Option<Instant> {
        *self.last_served.lock().unwrap()
    }

    /// From now on every connection is closed unanswered. Returns once
    /// the connections being answered are done, with when the last
    /// document was served: no document is served after it.
    pub async fn stop(&self) -> Option<Instant> {
        self.down.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        self.last_served()
    }

    /// Serves documents again.
    pub fn resume(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

/// Decrements its counter when dropped (a connection answered or given up).
struct Decrement(Arc<AtomicUsize>);

impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An `api_keys_file` in a fresh scratch directory: one line per
/// `(key, name)`, the key's SHA-256 and the name (the caller is then
/// `key:<name>`).
pub fn api_keys_file(tag: &str, keys: &[(&str, &str)]) -> std::path::PathBuf {
    let path = super::gateway::scratch_dir(tag).join("keys");
    let lines: String = keys
        .iter()
        .map(|(key, name)| {
            format!(
                "{} {name}\n",
                a2a_gateway::digest::sha256_hex(key.as_bytes())
            )
        })
        .collect();
    std::fs::write(&path, lines).expect("write the API keys file");
    path
}

/// Opens a JSON-RPC stream of `method` (`params`) as the caller of API key
/// `key`; the stream and the task id its first events name.
pub async fn stream_as(
    url: &str,
    key: &str,
    method: &str,
    params: Value,
) -> (super::stream::SseStream, String) {
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params});
    let mut s = super::stream::SseStream::open(url, "/", &[("x-api-key", key)], &body).await;
    assert_eq!(s.status, 200, "{method}");
    for _ in 0..10 {
        let ev = s.next(super::scaled_secs(10)).await.expect("an event");
        if let Some(id) = super::worker::task_id_of(&ev) {
            return (s, id);
        }
    }
    panic!("no event named the task");
}
