//! Who may move a task's gateway state.
//!
//! On a route that verifies its callers (`[routes.auth]`), the identity that
//! started a task owns it: only its owner's requests keep it alive by
//! watching, renew its lease, or trigger a cascade for it. Another caller's
//! request still reaches the worker (the worker decides what that caller may
//! see), but it moves nothing in the gateway. On a route without `auth`
//! there are no owners and every caller moves state, as before.
//!
//! A task is one record per route and worker task id, whatever tenant a
//! caller names it in: the tenant its first record named is kept with it,
//! and a request naming the task in another tenant moves nothing either,
//! on any route. A tenant is the caller's word; a worker that ignores it on
//! lookup (the Python SDK does) would serve the same task under every
//! name, so a name must not buy a second, ownerless record of it.

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

/// Whether `asker`'s request, naming the task in `asker_tenant` (`""` for
/// none), may move the gateway state of a task recorded in `tenant` and
/// owned by `owner` (`None`: the task has no owner, because it was started
/// on a route without `auth`, anonymously, or out of the gateway's sight).
pub fn moves_state(
    owner: Option<&str>,
    tenant: &str,
    asker: Asker<'_>,
    asker_tenant: &str,
) -> bool {
    if tenant != asker_tenant {
        return false;
    }
    match (owner, asker) {
        (None, _) | (_, Asker::Unverified) => true,
        (Some(o), Asker::Identity(id)) => o == id,
        (Some(_), Asker::Anonymous) => false,
    }
}

/// Whether a caller may name `tenant` (`""` for none) on a route that
/// binds tenants to identities (`[routes.auth] tenants`): `allowed` is the
/// caller's entry (`None`: an anonymous caller, or an identity the table
/// does not list), whose `"*"` is any tenant and `""` no tenant. An
/// unlisted caller may name none. On a route without the table every
/// tenant is the caller's word, and this is not asked.
pub fn may_name_tenant(allowed: Option<&[String]>, tenant: &str) -> bool {
    match allowed {
        None => tenant.is_empty(),
        Some(list) => list.iter().any(|t| t == "*" || t == tenant),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_named() {
        let acme = ["acme".to_string()];
        let acme_or_none = ["acme".to_string(), String::new()];
        let any = ["*".to_string()];
        for (allowed, tenant, want) in [
            (None, "", true),
            (None, "acme", false),
            (Some(&acme[..]), "acme", true),
            (Some(&acme[..]), "", false),
            (Some(&acme[..]), "acme1", false),
            (Some(&acme[..]), "ACME", false),
            (Some(&acme_or_none[..]), "", true),
            (Some(&acme_or_none[..]), "beta", false),
            (Some(&any[..]), "beta", true),
            (Some(&any[..]), "", true),
            (Some(&[][..]), "", false),
        ] {
            assert_eq!(
                may_name_tenant(allowed, tenant),
                want,
                "{allowed:?} {tenant:?}"
            );
        }
    }

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
            assert_eq!(
                moves_state(owner, "t", asker, "t"),
                want,
                "{owner:?} {asker:?}"
            );
            // Another tenant's name moves nothing, whoever asks.
            assert!(!moves_state(owner, "t", asker, "u"), "{owner:?} {asker:?}");
            assert!(!moves_state(owner, "t", asker, ""), "{owner:?} {asker:?}");
            assert!(!moves_state(owner, "", asker, "t"), "{owner:?} {asker:?}");
        }
        assert_eq!(Identity("key:k").owner(), Some("key:k"));
        assert_eq!(Anonymous.owner(), None);
        assert_eq!(Unverified.owner(), None);
    }
}
