//! Stage 4, inject: the request head that goes to the worker. The worker's
//! path and `Host`; identity encoding where the gateway reads the answer;
//! the route's header policy (strip, set, `A2A-Extensions` merged); the
//! length of a re-written or held body; the budget extension activated for
//! a send that carries a grant. On a WebSocket upgrade this is the only
//! chance: nothing travels with the frames.

use pingora::http::RequestHeader;
use pingora::{Error, ErrorType, Result};

use super::ctx::{Ctx, RequestBody};
use super::route::Route;
use crate::a2a::extensions::A2A_EXTENSIONS;
use crate::a2a::{A2aMethod, Call};
use crate::metrics::Untracked;

/// Rewrites `upstream` for the worker.
pub fn upstream_head(upstream: &mut RequestHeader, ctx: &Ctx) -> Result<()> {
    if ctx.req.continued {
        upstream.remove_header(&http::header::EXPECT);
    }
    // The caller's own origin-form target, when it is already the worker's
    // path (no base path, no stripped prefix), is kept as is.
    let unchanged = upstream.uri.authority().is_none()
        && upstream
            .uri
            .path_and_query()
            .is_some_and(|pq| pq.as_str() == ctx.req.upstream_path);
    if !unchanged {
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
    upstream.insert_header("host", route.host_header.clone())?;
    let reads_answer = matches!(ctx.call, Call::AgentCard)
        || (matches!(ctx.call, Call::JsonRpcCandidate) && ctx.req.method.is_none())
        || ctx.tracked_shape().is_some()
        || ctx.req.method.is_some_and(A2aMethod::returns_card);
    if reads_answer {
        upstream.remove_header(&http::header::ACCEPT_ENCODING);
        // gRPC's own per-message compression, likewise.
        upstream.remove_header("grpc-accept-encoding");
    }
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
