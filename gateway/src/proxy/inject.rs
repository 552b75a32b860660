//! Stage 4, inject: the request head that goes to the worker. The worker's
//! path and `Host`; identity encoding where the gateway reads the answer;
//! the route's header policy (strip, set, `A2A-Extensions` merged); the
//! length of a re-written or held body; the budget extension activated for
//! a send that carries a grant. On a WebSocket upgrade this is the only
//! chance: nothing travels with the frames.

use pingora::http::RequestHeader;
use pingora::{Error, ErrorType, Result};

use super::ctx::{Ctx, RequestBody};
use crate::a2a::extensions::A2A_EXTENSIONS;
use crate::a2a::{A2aMethod, Call};
use crate::metrics::Untracked;
use crate::route::Route;

/// Rewrites `upstream` for the worker.
pub fn upstream_head(upstream: &mut RequestHeader, ctx: &Ctx) -> Result<()> {
    if ctx.req.continued {
        upstream.remove_header(&http::header::EXPECT);
    }
    // The caller's own target, when it is already the worker's path (no
    // base path, no stripped prefix), is kept as is: pingora writes
    // `raw_path()` on an HTTP/1 request line and takes an HTTP/2 `:path`
    // from it (an HTTP/2 caller's URI has an authority, its path is still
    // the caller's `:path`), so only an absolute-form target or another
    // path needs a new URI.
    if upstream.raw_path() != ctx.req.upstream_path.as_bytes() {
        let uri: http::Uri = ctx
            .req
            .upstream_path
            .parse()
            .map_err(|e| Error::because(ErrorType::InternalError, "upstream path", e))?;
        upstream.set_uri(uri);
    }
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    match &ctx.req.replica {
        Some(r) => upstream.insert_header("host", r.authority())?,
        None => upstream.insert_header("host", route.host_header.clone())?,
    }
    let reads_answer = matches!(ctx.call, Call::AgentCard)
        || (matches!(ctx.call, Call::JsonRpcCandidate) && ctx.req.method.is_none())
        || ctx.tracked_shape().is_some()
        || ctx.req.method.is_some_and(A2aMethod::returns_card);
    if reads_answer {
        upstream.remove_header(&http::header::ACCEPT_ENCODING);
        // gRPC's own per-message compression, likewise.
        upstream.remove_header("grpc-accept-encoding");
    }
    verified_identity(upstream, route, ctx)?;
    header_policy(upstream, route, &ctx.call)?;
    match &ctx.body {
        // HTTP/2 frames a gRPC body: a length only where the caller gave one.
        RequestBody::Replace(b)
            if !ctx.req.grpc || upstream.headers.contains_key(http::header::CONTENT_LENGTH) =>
        {
            upstream.insert_header("content-length", b.len().to_string())?;
        }
        RequestBody::Replace(_) => {}
        RequestBody::Hold(_) => {
            // Its length may change when its grant is written.
            upstream.remove_header(&http::header::CONTENT_LENGTH);
            upstream.insert_header("transfer-encoding", "chunked")?;
        }
        RequestBody::Pass | RequestBody::Copy(_) => {}
    }
    // A send with a grant activates the extension, as the SDK's client
    // does (a held body's grant is decided later: every budgeted send gets
    // one).
    if ctx.budget.is_some() || matches!(ctx.body, RequestBody::Hold(_)) {
        add_extensions(
            upstream,
            &[policies::budget::BUDGET_EXTENSION_URI.to_owned()],
        )?;
    }
    Ok(())
}

impl super::Gateway {
    /// Delegation trees (`[delegation]`): a send's request to the worker
    /// carries the request's reference as the gateway's `tracestate`
    /// member (first, the caller's members kept; a `traceparent` added
    /// when the caller sent none, or none valid); a send that starts a task
    /// and carries a parent's reference (the caller's `tracestate` member,
    /// else its `baggage` member; or the task the caller names itself in
    /// `A2A-Parent-Task`, which wins and is not forwarded: counted at
    /// depth 0) is linked as that task's child, once,
    /// through the tracker (off the request's path). Sends over a WebSocket
    /// are not: the upgrade's headers are the socket's, not a send's.
    pub(super) fn delegation(&self, upstream: &mut RequestHeader, ctx: &mut Ctx) -> Result<()> {
        use policies::delegation::{self as d, Link};
        let linker = self.cascade.tree().linker();
        if !linker.on
            || !ctx.req.is_send()
            || ctx.req.binding == Some(crate::a2a::Binding::WebSocket)
        {
            return Ok(());
        }
        let Some(route) = ctx.route.clone() else {
            return Ok(());
        };
        // A route that strips the trace context keeps it from its worker:
        // the gateway adds none back (and links nothing through it).
        if route
            .cfg
            .headers
            .strip_headers
            .iter()
            .any(|h| h == "traceparent" || h == "tracestate")
        {
            return Ok(());
        }
        let names = match (&ctx.req.task_id, &ctx.req.message_id) {
            (Some(t), _) => crate::link::Names::Task(t),
            (None, Some(m)) => crate::link::Names::Message(m),
            // A body not read before the worker was asked: not named.
            (None, None) => return Ok(()),
        };
        let tenant = ctx.req.tenant.as_deref().unwrap_or("");
        let tracestate = joined(&upstream.headers, &TRACESTATE);
        let parent = self.parent_in(&upstream.headers, tracestate.as_deref());
        // The header is the gateway's, not the worker's.
        if upstream.headers.contains_key(&PARENT_TASK) {
            upstream.remove_header(&PARENT_TASK);
        }
        let link = d::link(
            parent.as_ref().map(|p| p.depth),
            ctx.req.task_id.is_none(),
            linker.max_depth,
        );
        let own = linker.reference(&route.name, tenant, names);
        let deadline = ctx.budget.as_ref().and_then(|b| b.child.deadline_ms());
        // Where this send's task is found: what its budget's store entry
        // and a link under its parent name (built only for those).
        let located = ctx.budget.is_some() || parent.is_some();
        let me = match (
            &ctx.req.message_id,
            located.then(|| self.cancel_target(ctx)),
        ) {
            (Some(message_id), Some(Some(target))) => Some(crate::store::ChildLink {
                route: route.name.clone(),
                tenant: tenant.into(),
                message_id: message_id.clone(),
                target,
                replica: ctx.replica_name(),
                sent_ms: ctx.req.received_ms,
                depth: link.depth(),
            }),
            _ => None,
        };
        // The children this send's task starts find its budget by its
        // reference (on this replica, or in the store: `metered`), and
        // spend from it.
        let metered = ctx.budget.as_ref().is_some_and(|b| {
            b.child
                .register_reference(&self.budgets, crate::link::hex(&own), me.clone())
        });
        let value = linker.wire(own, link.depth(), deadline, metered);
        let mut parents = upstream.headers.get_all(&TRACEPARENT).iter();
        let traced = match (parents.next(), parents.next()) {
            (Some(tp), None) => tp.to_str().is_ok_and(d::traceparent_valid),
            _ => false,
        };
        let caller_state = if traced {
            tracestate.as_deref()
        } else {
            // A tracestate without a valid traceparent is discarded by
            // the worker: a fresh trace, with only the gateway's member.
            upstream.insert_header("traceparent", per_call(crate::link::new_traceparent())?)?;
            None
        };
        upstream.insert_header(
            "tracestate",
            per_call(d::with_member(caller_state, d::MEMBER, &value))?,
        )?;
        if std::mem::replace(&mut ctx.req.linked, true) {
            return Ok(());
        }
        let Some(parent) = parent else {
            return Ok(());
        };
        let Link::Child { depth } = link else {
            crate::metrics::TREE_LINKS
                .with_label_values(&[&route.name, link.as_str()])
                .inc();
            if link == Link::TooDeep {
                tracing::warn!(route = %route.name, max_depth = linker.max_depth, "a send's parent is as deep as a delegation tree may grow; not linked");
            }
            return Ok(());
        };
        let Some(me) = me else {
            return Ok(());
        };
        debug_assert_eq!(me.depth, depth);
        self.cascade.tracker().link(
            crate::link::hex(&parent.reference),
            crate::link::hex(&own),
            me,
        );
        Ok(())
    }
}

/// A send's parent, as its request names it.
#[derive(Debug)]
pub(super) struct Parent {
    pub reference: [u8; policies::delegation::REF_BYTES],
    pub depth: u8,
    /// When the parent's budget ends (Unix ms), if it has a deadline.
    pub deadline_ms: Option<u64>,
    /// The store keeps the parent's budget's meters.
    pub metered: bool,
}

impl super::Gateway {
    /// The parent a request's headers name: the task its caller names in
    /// `A2A-Parent-Task` (depth 0, no deadline known), else the reference
    /// the gateway gave in its `tracestate` member, else in its `baggage`
    /// member, if the tag holds.
    pub(super) fn parent_of(&self, headers: &http::HeaderMap) -> Option<Parent> {
        if !self.cascade.tree().linker().on {
            return None;
        }
        self.parent_in(headers, joined(headers, &TRACESTATE).as_deref())
    }

    /// [`Self::parent_of`] with linking on, the request's `tracestate`
    /// lines already joined.
    fn parent_in(&self, headers: &http::HeaderMap, tracestate: Option<&str>) -> Option<Parent> {
        use policies::delegation as d;
        let linker = self.cascade.tree().linker();
        if let Some(p) = joined(headers, &PARENT_TASK)
            .as_deref()
            .and_then(d::explicit_parent)
        {
            return Some(Parent {
                reference: linker.reference(p.route, p.tenant, crate::link::Names::Task(p.task)),
                depth: 0,
                deadline_ms: None,
                metered: false,
            });
        }
        let w = tracestate
            .and_then(|ts| d::tracestate_member(ts, d::MEMBER))
            .or_else(|| {
                headers
                    .get_all(&BAGGAGE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(|b| d::baggage_member(b, d::MEMBER))
            })
            .and_then(|v| linker.verify(v))?;
        Some(Parent {
            reference: w.reference,
            depth: w.depth,
            deadline_ms: w.deadline_ms,
            metered: w.metered,
        })
    }
}

/// A header value the gateway makes anew for each call (its `tracestate`
/// member, a fresh `traceparent`), marked sensitive: HPACK then sends it as
/// a never-indexed literal on an HTTP/2 connection to the worker. Indexed,
/// each call would add an entry that no later call uses to both ends'
/// dynamic tables (4 KiB by default), pushing out the entries that
/// repeat (`content-type`, `:authority`, `user-agent`, ...) so that they
/// are sent and decoded as literals again. HTTP/1 ignores the mark.
fn per_call(value: String) -> Result<http::HeaderValue> {
    let mut v = http::HeaderValue::try_from(value)
        .map_err(|e| Error::because(ErrorType::InvalidHTTPHeader, "a delegation header", e))?;
    v.set_sensitive(true);
    Ok(v)
}

// The trace-context headers, named once (a name given as `&str` is parsed
// and lower-cased on every lookup).
static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
static BAGGAGE: http::HeaderName = http::HeaderName::from_static("baggage");
static PARENT_TASK: http::HeaderName =
    http::HeaderName::from_static(policies::delegation::PARENT_HEADER);

/// A header's lines joined by `,` (a list header sent in several lines is
/// one list); `None` when absent.
fn joined(headers: &http::HeaderMap, name: &http::HeaderName) -> Option<String> {
    let mut out: Option<String> = None;
    for v in headers.get_all(name) {
        let Ok(v) = v.to_str() else { continue };
        match &mut out {
            Some(s) => {
                s.push(',');
                s.push_str(v);
            }
            None => out = Some(v.to_owned()),
        }
    }
    out
}

/// On a route with `[routes.auth]`, what the worker is told of the caller:
/// the identity the gateway verified in `identity_header` (a value a
/// caller sent there is removed, so the worker can trust it), and only
/// credentials the gateway checked or the route's own: an `Authorization`
/// it did not verify (beside an API key, or on a route that checks API keys
/// only) is replaced by the route's `worker_credential`, or removed.
/// (Two `Authorization` or API-key headers were refused already.)
fn verified_identity(req: &mut RequestHeader, route: &Route, ctx: &Ctx) -> Result<()> {
    let Some(policy) = &route.cfg.auth else {
        return Ok(());
    };
    req.remove_header(policy.identity_header.as_str());
    if let Some(caller) = &ctx.req.caller {
        req.insert_header(policy.identity_header.clone(), caller.name.as_str())?;
    }
    if !ctx.req.checked_jwt {
        req.remove_header(&http::header::AUTHORIZATION);
        if let Some(cred) = &route.cfg.worker_credential {
            req.insert_header(http::header::AUTHORIZATION, cred.as_str())?;
        }
    }
    Ok(())
}

/// Applies the route's header policy to a request going to its worker:
/// strip, set, and merge extension URIs into `A2A-Extensions`. On a
/// WebSocket upgrade, `Sec-WebSocket-Extensions` is removed too, declining
/// permessage-deflate so that frames stay readable.
fn header_policy(req: &mut RequestHeader, route: &Route, call: &Call) -> Result<()> {
    let policy = &route.cfg.headers;
    for name in &policy.strip_headers {
        req.remove_header(name.as_str());
    }
    for (name, value) in &policy.inject_headers {
        req.insert_header(name.clone(), value.as_str())?;
    }
    let upgrade = matches!(call, Call::Upgrade);
    if !policy.inject_extensions.is_empty() {
        let added = add_extensions(req, &policy.inject_extensions)?;
        if !added.is_empty() {
            tracing::debug!(route = %route.name, injected = ?added, upgrade, "A2A-Extensions injected");
        }
    }
    if upgrade
        && req
            .headers
            .contains_key(http::header::SEC_WEBSOCKET_EXTENSIONS)
    {
        req.remove_header(&http::header::SEC_WEBSOCKET_EXTENSIONS);
        Untracked::WsExtensionsDeclined.count();
    }
    Ok(())
}

/// Merges `inject` into the request's `A2A-Extensions` (one header line,
/// no URI twice); returns the URIs it added.
fn add_extensions<'a>(req: &mut RequestHeader, inject: &'a [String]) -> Result<Vec<&'a str>> {
    let existing: Vec<String> = req
        .headers
        .get_all(&A2A_EXTENSIONS)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let list = crate::a2a::extensions::parse(existing.iter().map(String::as_str));
    let (merged, added) = crate::a2a::extensions::merge(&list, inject);
    if !added.is_empty() {
        req.insert_header("a2a-extensions", merged)?;
    }
    Ok(added)
}

/// The request's `A2A-Extensions` (any number of lines, comma-separated)
/// names the lease extension.
pub fn activates_lease(req: &RequestHeader) -> bool {
    req.headers.get_all(&A2A_EXTENSIONS).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').any(|u| {
                u.trim()
                    .eq_ignore_ascii_case(policies::lease::LEASE_EXTENSION_URI)
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &[u8]) -> RequestHeader {
        RequestHeader::build("POST", target, None).unwrap()
    }

    fn ctx(upstream_path: &str) -> Ctx {
        let mut ctx = Ctx::default();
        ctx.req.upstream_path = upstream_path.into();
        ctx
    }

    #[test]
    fn the_target_is_rewritten_only_where_it_differs() {
        // An HTTP/2 caller's URI carries its authority; the path is its
        // `:path`, kept when it is the worker's.
        let mut h2 = head(b"/lf.a2a.v1.A2AService/SendMessage");
        h2.set_uri(
            "http://gw.example/lf.a2a.v1.A2AService/SendMessage"
                .parse()
                .unwrap(),
        );
        upstream_head(&mut h2, &ctx("/lf.a2a.v1.A2AService/SendMessage")).unwrap();
        assert_eq!(h2.raw_path(), b"/lf.a2a.v1.A2AService/SendMessage");
        assert_eq!(h2.uri.authority().map(|a| a.as_str()), Some("gw.example"));

        // Another path (a base path, a stripped prefix) replaces it.
        let mut based = head(b"/a/v1/message:send?x=1");
        upstream_head(&mut based, &ctx("/agent/v1/message:send?x=1")).unwrap();
        assert_eq!(based.raw_path(), b"/agent/v1/message:send?x=1");

        // An absolute-form target is written in origin form.
        let mut absolute = head(b"http://gw.example/rpc");
        upstream_head(&mut absolute, &ctx("/rpc")).unwrap();
        assert_eq!(absolute.raw_path(), b"/rpc");
        assert!(absolute.uri.authority().is_none());

        // The same path stays as it came.
        let mut same = head(b"/rpc?q=%2F");
        upstream_head(&mut same, &ctx("/rpc?q=%2F")).unwrap();
        assert_eq!(same.raw_path(), b"/rpc?q=%2F");
    }

    #[test]
    fn per_call_values_are_never_indexed() {
        let v = per_call(crate::link::new_traceparent()).unwrap();
        assert!(v.is_sensitive());
        // The mark travels with the value into the head pingora sends.
        let mut h = head(b"/rpc");
        h.insert_header("traceparent", v).unwrap();
        assert!(h.headers["traceparent"].is_sensitive());
        assert!(h.as_owned_parts().headers["traceparent"].is_sensitive());
        assert!(per_call("bad\nvalue".into()).is_err());
    }
}
