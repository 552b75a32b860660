//! Digests the gateway shows or compares: one helper, used by the budget
//! ledger (fingerprints of caller keys) and by `[routes.auth]` (API keys
//! listed by their SHA-256).

/// The SHA-256 of `bytes`, in 64 lowercase hex digits (as `sha256sum`
/// prints it, and `[routes.auth] api_keys_file` lists keys).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = String::with_capacity(64);
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}
