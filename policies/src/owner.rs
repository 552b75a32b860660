//! Who may move a task's gateway state.
//!
//! On a route that verifies its callers (`[routes.auth]`), the identity that
//! started a task owns it: only its owner's requests keep it alive by
//! watching, renew its lease, or trigger a cascade for it. Another caller's
//! request still reaches the worker (the worker decides what that caller may
//! see), but it moves nothing in the gateway. On a route without `auth`
//! there are no owners and every caller moves state, as before.

/// Who is asking, as the route knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asker<'a> {
    /// The route does not authenticate: no ownership.
    Unverified,
    /// The route authenticates and the caller sent no credential (an
    /// `optional` route).
    Anonymous,
    /// A verified identity (`jwt:<sub>`, `key:<name>`).
    Identity(&'a str),
}

impl<'a> Asker<'a> {
    /// The owner a send by this asker records: only a verified identity
    /// owns what it starts.
    pub fn owner(self) -> Option<&'a str> {
        match self {
            Asker::Identity(id) => Some(id),
            Asker::Unverified | Asker::Anonymous => None,
        }
    }
}

/// Whether `asker`'s request may move the gateway state of a task owned by
/// `owner` (`None`: the task has no owner, because it was started on a
/// route without `auth`, anonymously, or out of the gateway's sight).
pub fn moves_state(owner: Option<&str>, asker: Asker<'_>) -> bool {
    match (owner, asker) {
        (None, _) | (_, Asker::Unverified) => true,
        (Some(o), Asker::Identity(id)) => o == id,
        (Some(_), Asker::Anonymous) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use Asker::*;
        for (owner, asker, want) in [
            (None, Unverified, true),
            (None, Anonymous, true),
            (None, Identity("jwt:a"), true),
            (Some("jwt:a"), Identity("jwt:a"), true),
            (Some("jwt:a"), Identity("jwt:b"), false),
            // Identities of two kinds never match.
            (Some("jwt:a"), Identity("key:a"), false),
            (Some("jwt:a"), Anonymous, false),
            // A route without auth has no owners to respect (a record
            // written while it had auth, read after a reload removed it).
            (Some("jwt:a"), Unverified, true),
        ] {
            assert_eq!(moves_state(owner, asker), want, "{owner:?} {asker:?}");
        }
        assert_eq!(Identity("key:k").owner(), Some("key:k"));
        assert_eq!(Anonymous.owner(), None);
        assert_eq!(Unverified.owner(), None);
    }
}
