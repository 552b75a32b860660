//! Stage 3, admit: `policies`' verdicts on what the body carried, in this
//! order: the tenant it names, where the route binds tenants to
//! identities; a v0.3 send on a route that checks sends; the lease grant's bounds (where
//! the gateway enforces grants); the store's health for a send whose lease
//! the gateway must hold (`on_store_error`); the budget (admitted,
//! reserved, its grant written into the message). The first refusal wins.
//! Lease renewals (`GetTask` with the lease extension active; on a route
//! with `poll_lease`, every `GetTask` and `SubscribeToTask`) are applied
//! here too, and the poll lease a non-blocking send's task will get is
//! decided.

use bytes::Bytes;
use policies::track::{RenewBy, StoreOutage};

use super::ctx::{Budget, Ctx, RequestBody};
use super::inspect::Grants;
use super::refusal::Refusal;
use super::Gateway;
use crate::a2a::Binding;
use crate::metrics::{self, Untracked};
use crate::store::{Renewal, TaskKey};

impl Gateway {
    /// `[routes.auth] tenants`: the tenant the request names (path, query,
    /// body) must be one its caller may use (`policies::owner::
    /// may_name_tenant`). Asked once the tenant is known: after the body is
    /// read, or from the head when the body is not.
    pub(super) fn tenant_refusal(ctx: &Ctx) -> Option<Refusal> {
        // Only an A2A call names a tenant.
        ctx.req.method?;
        let route = ctx.route.as_ref()?;
        let bound = route.cfg.auth.as_ref()?.tenants.as_ref()?;
        let allowed = ctx
            .req
            .caller
            .as_ref()
            .and_then(|c| bound.get(c.name.as_str()))
            .map(Vec::as_slice);
        let tenant = ctx.req.tenant.as_deref().unwrap_or("");
        (!policies::owner::may_name_tenant(allowed, tenant)).then_some(Refusal::TenantNotAllowed)
    }

    /// Admits the call, or leaves a refusal in the context. `body`: the
    /// whole body when it can still be re-written with an admitted budget
    /// grant (`None` when it is already on its way to the worker).
    pub(super) async fn admit(&self, ctx: &mut Ctx, grants: Grants, body: Option<&[u8]>) {
        let Some(route) = ctx.route.clone() else {
            return;
        };
        if let Some(r) = Self::tenant_refusal(ctx) {
            return ctx.refuse(r);
        }
        if grants.v03_send && route.checks_sends() {
            return ctx.refuse(Refusal::V03Send);
        }
        // Grants are checked only where the gateway enforces them; a worker
        // that enforces its own leases judges its own grants.
        let enforces = route.gateway_enforces_leases();
        if let (true, Some(grant)) = (enforces, grants.lease.clone()) {
            let max = route.cfg.lease.max_ttl.as_millis() as u64;
            match grant
                .map_err(policies::lease::LeaseRefusal::Malformed)
                .and_then(|ttl| policies::lease::validate_ttl(ttl, max))
            {
                Ok(ttl) => ctx.lease.grant = Some(ttl),
                Err(refusal) => return ctx.refuse(Refusal::Lease(refusal)),
            }
        }
        ctx.lease.poll_ms = policies::track::poll_lease(
            ctx.req.shape(),
            ctx.req.return_immediately,
            ctx.lease.grant.is_some(),
            &super::observe::lease_rules(&route),
        );
        let outage = policies::track::store_outage(
            ctx.req.shape(),
            ctx.lease.grant.is_some(),
            ctx.lease.poll_ms.is_some(),
            route.cfg.lease.impose_ttl.is_some(),
            self.health.is_healthy(),
            self.on_store_error == config::OnStoreError::FailClosed,
        );
        match outage {
            StoreOutage::Proceed => {}
            StoreOutage::ProceedUntracked => Untracked::StoreUnavailable.count(),
            StoreOutage::Refuse => return ctx.refuse(Refusal::LeaseStoreUnavailable),
        }
        if let (Some(body), true) = (body, ctx.req.is_send()) {
            self.admit_budget(ctx, &route, grants, body).await;
        }
    }

    /// Decides and reserves the budget of a send (see [`crate::budget`]);
    /// writes the body to send instead when the grant changed.
    async fn admit_budget(
        &self,
        ctx: &mut Ctx,
        route: &crate::route::Route,
        grants: Grants,
        body: &[u8],
    ) {
        // Tenants the config names keep accounts and caps of their own;
        // any other name shares the no-tenant account (policies::budget).
        let named = |t: &str| {
            route.cfg.budget.tenants.contains_key(t)
                || route
                    .cfg
                    .auth
                    .as_ref()
                    .and_then(|a| a.tenants.as_ref())
                    .is_some_and(|b| b.values().flatten().any(|n| n == t))
        };
        let tenant = policies::budget::budget_tenant(ctx.req.tenant.as_deref(), named);
        let admitted = self
            .budgets
            .admit(
                &route.name,
                &route.cfg.budget,
                tenant,
                ctx.req.caller.as_deref(),
                grants.budget,
                ctx.req.received_ms,
                &ctx.req.parent,
            )
            .await;
        let child = match admitted {
            Ok(None) => return,
            Ok(Some(child)) => child,
            Err(e) => return ctx.refuse(Refusal::Budget(e)),
        };
        if child.rewrite {
            let jsonrpc = ctx.req.binding == Some(Binding::JsonRpc);
            let rewritten = if ctx.req.grpc {
                crate::a2a::grpc::rewrite_send(
                    body,
                    policies::budget::BUDGET_METADATA_KEY,
                    &crate::budget::grant_json(child.grant()),
                    policies::budget::BUDGET_EXTENSION_URI,
                )
            } else {
                crate::budget::rewrite_message(body, jsonrpc, child.grant())
            };
            match rewritten {
                Some(b) => ctx.body = RequestBody::Replace(Bytes::from(b)),
                None => {
                    child.settle(&self.budgets, true, None);
                    return ctx.refuse(Refusal::BudgetNotAttached);
                }
            }
        }
        ctx.budget = Some(Box::new(Budget {
            child,
            sse_pending: Vec::new(),
            failure_sent: false,
        }));
    }

    /// A `GetTask` whose request activates the lease extension renews the
    /// task's lease (as the SDK's lease store does); a plain one renews
    /// nothing, except on a route with `poll_lease`, where every `GetTask`
    /// and `SubscribeToTask` renews (`policies::track::renews`). Before the
    /// worker is asked: a poll that comes in time is never too late for
    /// its lease because the worker was slow to answer it.
    pub(super) async fn renew_if_asked(&self, ctx: &Ctx) {
        let Some(route) = &ctx.route else { return };
        let Some(by) = policies::track::renews(ctx.req.shape(), ctx.lease.extension, route.polls())
        else {
            return;
        };
        if let Some(id) = &ctx.req.task_id {
            self.renew_by(ctx, ctx.req.tenant.as_deref(), id, by).await;
        }
    }

    /// Renews the lease on (route, tenant, task) for a `GetTask` with the
    /// lease extension, counting the outcome.
    pub(super) async fn renew(&self, ctx: &Ctx, tenant: Option<&str>, task_id: &str) {
        self.renew_by(ctx, tenant, task_id, RenewBy::GetTask).await;
    }

    /// Renews the lease on (route, tenant, task), counting the outcome
    /// under `by`'s source label.
    async fn renew_by(&self, ctx: &Ctx, tenant: Option<&str>, task_id: &str, by: RenewBy) {
        let Some(route) = &ctx.route else { return };
        let key = TaskKey::new(&route.name, tenant, task_id);
        if route.auth.is_some() {
            // Only the task's owner renews its lease (policies::owner); the
            // request itself still goes to the worker.
            let asker = ctx.asker(route);
            if let Ok(rec) = self.store.get(&key).await {
                if !asker.moves(&key.tenant, rec.as_ref()) {
                    metrics::LEASE_RENEWALS
                        .with_label_values(&[&route.name, by.as_str(), "not_owner"])
                        .inc();
                    return;
                }
            }
        }
        let outcome = match self.store.lease_renew(&key, self.store.clock_ms()).await {
            Ok(Renewal::Renewed { .. }) => "renewed",
            Ok(Renewal::Lapsed) => "lapsed",
            Ok(Renewal::NoLease) => "no_lease",
            Err(e) => {
                metrics::STORE_ERRORS
                    .with_label_values(&["lease_renew"])
                    .inc();
                tracing::warn!(task = %key, error = %e, "could not renew a lease");
                "store_error"
            }
        };
        metrics::LEASE_RENEWALS
            .with_label_values(&[&route.name, by.as_str(), outcome])
            .inc();
    }
}
