//! Delegation references (`[delegation]`): what names a request to the
//! worker, so that the sends its agent makes while serving it can be
//! linked to its task.
//!
//! A reference is a keyed hash (HMAC-SHA256, ring) of the request's route,
//! tenant and what it names: the message of a send that starts a task, or
//! the task a send continues. So the gateway needs to store nothing to give
//! one, and can recompute every reference of a task from the task alone
//! (its id, and the messages in its history) when the task ends. It travels
//! as the `a2agw` member of the `tracestate` the worker receives, with the
//! depth of its task in its tree and a tag (a second HMAC) that proves the
//! gateway wrote both: an instrumented agent propagates it unchanged on the
//! calls it makes while serving the request, and a send that comes back
//! through the gateway carrying it becomes a child of that task
//! ([`policies::delegation::link`]).
//!
//! The key is the store's ([`crate::store::TaskStore::link_key`]): shared
//! by every replica on one Redis, made per process on the memory store.

use policies::delegation::{Wire, REF_BYTES};
use ring::hmac;

/// Bytes of a fresh key.
const KEY_BYTES: usize = 32;

/// A fresh random key.
pub fn random_key() -> Vec<u8> {
    use ring::rand::SecureRandom as _;
    let mut k = vec![0u8; KEY_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut k)
        .expect("the system's random source");
    k
}

/// A fresh `traceparent` (version 00, not sampled), for a request that
/// came without one: a worker discards a `tracestate` that has no valid
/// `traceparent` beside it. Its ids come from a per-thread generator
/// seeded once from the system's random source (W3C asks for random ids,
/// not secret ones; a system call per request would cost more than the
/// rest of this).
pub fn new_traceparent() -> String {
    let mut ids = [0u8; 24];
    for chunk in ids.chunks_mut(8) {
        chunk.copy_from_slice(&next_random().to_le_bytes());
    }
    // All-zero ids are invalid; one bit set keeps them random enough.
    ids[0] |= 1;
    ids[16] |= 1;
    let mut s = String::with_capacity(55);
    s.push_str("00-");
    policies::delegation::hex_into(&mut s, &ids[..16]);
    s.push('-');
    policies::delegation::hex_into(&mut s, &ids[16..]);
    s.push_str("-00");
    s
}

/// The next number of this thread's SplitMix64 generator.
fn next_random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            use ring::rand::SecureRandom as _;
            let mut seed = [0u8; 8];
            ring::rand::SystemRandom::new()
                .fill(&mut seed)
                .expect("the system's random source");
            u64::from_le_bytes(seed)
        });
    }
    STATE.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// What a request names, which its reference is made of.
#[derive(Clone, Copy, Debug)]
pub enum Names<'a> {
    /// A send that starts a task: its message's id.
    Message(&'a str),
    /// A send that continues a task.
    Task(&'a str),
}

/// Mints and checks references with the store's key.
pub struct Linker {
    key: hmac::Key,
    /// `[delegation] max_depth`.
    pub max_depth: u8,
    /// `[delegation] link`.
    pub on: bool,
}

impl std::fmt::Debug for Linker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linker")
            .field("max_depth", &self.max_depth)
            .field("on", &self.on)
            .finish_non_exhaustive()
    }
}

impl Linker {
    pub fn new(key: &[u8], cfg: &config::Delegation) -> Self {
        Linker {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            max_depth: cfg.max_depth,
            on: cfg.link,
        }
    }

    /// The reference of a request on `route`, naming `tenant` (none: `""`).
    pub fn reference(&self, route: &str, tenant: &str, names: Names<'_>) -> [u8; REF_BYTES] {
        let (kind, id) = match names {
            Names::Message(m) => (b"m", m),
            Names::Task(t) => (b"t", t),
        };
        let mut ctx = hmac::Context::with_key(&self.key);
        // Each part length-prefixed: no two inputs read alike.
        for part in [route.as_bytes(), tenant.as_bytes(), kind, id.as_bytes()] {
            ctx.update(&(part.len() as u32).to_be_bytes());
            ctx.update(part);
        }
        let mut r = [0u8; REF_BYTES];
        r.copy_from_slice(&ctx.sign().as_ref()[..REF_BYTES]);
        r
    }

    /// Over everything a value carries (`depth_byte`: depth and
    /// `metered`, as [`Wire::depth_byte`]).
    fn tag(
        &self,
        reference: &[u8; REF_BYTES],
        depth_byte: u8,
        deadline_ms: Option<u64>,
    ) -> [u8; REF_BYTES] {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"tag");
        ctx.update(reference);
        ctx.update(&[depth_byte]);
        if let Some(d) = deadline_ms {
            ctx.update(&d.to_be_bytes());
        }
        let mut t = [0u8; REF_BYTES];
        t.copy_from_slice(&ctx.sign().as_ref()[..REF_BYTES]);
        t
    }

    /// The `tracestate` member value of a request with `reference`, whose
    /// task is `depth` deep, whose budget ends at `deadline_ms` (Unix ms),
    /// if it has one, and whose budget's meters the store keeps for its
    /// children (`metered`).
    pub fn wire(
        &self,
        reference: [u8; REF_BYTES],
        depth: u8,
        deadline_ms: Option<u64>,
        metered: bool,
    ) -> String {
        let mut w = Wire {
            reference,
            depth,
            deadline_ms,
            metered,
            tag: [0; REF_BYTES],
        };
        w.tag = self.tag(&reference, w.depth_byte(), deadline_ms);
        w.encode()
    }

    /// A member value the gateway wrote (with this key), read; anything
    /// else (another value, an altered depth, another deployment's) `None`.
    pub fn verify(&self, value: &str) -> Option<Wire> {
        let w = Wire::decode(value)?;
        // Compared in constant time, as a tag should be.
        let want = self.tag(&w.reference, w.depth_byte(), w.deadline_ms);
        let diff = want
            .iter()
            .zip(&w.tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        (diff == 0).then_some(w)
    }

    /// Every reference the requests feeding a task were given (hex): the
    /// one of the sends continuing it, and those of the messages that
    /// started it (`messages`: its history's, or the one send seen).
    pub fn task_refs(
        &self,
        route: &str,
        tenant: &str,
        task_id: &str,
        messages: &[String],
    ) -> Vec<String> {
        std::iter::once(self.reference(route, tenant, Names::Task(task_id)))
            .chain(
                messages
                    .iter()
                    .map(|m| self.reference(route, tenant, Names::Message(m))),
            )
            .map(|r| hex(&r))
            .collect()
    }
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 * b.len());
    policies::delegation::hex_into(&mut s, b);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linker(key: &[u8]) -> Linker {
        Linker::new(key, &config::Delegation::default())
    }

    #[test]
    fn references_differ_by_every_part() {
        let l = linker(b"k");
        let base = l.reference("r", "t", Names::Message("m"));
        assert_eq!(base, l.reference("r", "t", Names::Message("m")));
        for other in [
            l.reference("r2", "t", Names::Message("m")),
            l.reference("r", "", Names::Message("m")),
            l.reference("r", "t", Names::Message("m2")),
            l.reference("r", "t", Names::Task("m")),
            // Parts do not run into each other.
            l.reference("rt", "", Names::Message("m")),
            linker(b"other").reference("r", "t", Names::Message("m")),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_wire_value_is_checked() {
        let l = linker(b"k");
        let r = l.reference("r", "", Names::Message("m"));
        let v = l.wire(r, 2, None, false);
        let w = l.verify(&v).expect("its own value");
        assert_eq!((w.reference, w.depth, w.deadline_ms), (r, 2, None));
        // Another depth with the same tag: refused.
        let mut forged = Wire::decode(&v).unwrap();
        forged.depth = 0;
        assert!(l.verify(&forged.encode()).is_none());
        // `metered` claimed with the same tag: refused.
        let mut forged = Wire::decode(&v).unwrap();
        forged.metered = true;
        assert!(l.verify(&forged.encode()).is_none());
        assert!(l.verify(&l.wire(r, 2, None, true)).unwrap().metered);
        // A deadline, and another one or none with its tag: refused.
        let v = l.wire(r, 2, Some(1_700_000_000_000), false);
        assert_eq!(l.verify(&v).unwrap().deadline_ms, Some(1_700_000_000_000));
        let mut forged = Wire::decode(&v).unwrap();
        forged.deadline_ms = Some(1_800_000_000_000);
        assert!(l.verify(&forged.encode()).is_none());
        forged.deadline_ms = None;
        assert!(l.verify(&forged.encode()).is_none());
        // Another key's value: refused.
        assert!(linker(b"other").verify(&v).is_none());
        assert!(l.verify("not a value").is_none());
    }

    #[test]
    fn task_refs_hold_the_sends() {
        let l = linker(b"k");
        let refs = l.task_refs("r", "t", "task", &["m1".into(), "m2".into()]);
        assert_eq!(refs.len(), 3);
        assert_eq!(refs[0], hex(&l.reference("r", "t", Names::Task("task"))));
        assert_eq!(refs[2], hex(&l.reference("r", "t", Names::Message("m2"))));
    }

    #[test]
    fn traceparents_are_valid_and_fresh() {
        let a = new_traceparent();
        assert!(policies::delegation::traceparent_valid(&a), "{a}");
        assert_ne!(a, new_traceparent());
    }
}
