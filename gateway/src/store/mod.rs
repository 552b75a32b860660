//! Where tracked-task state lives between hooks, requests and replicas.
//!
//! The trait is narrow on purpose: one read-modify-write (`update`) that a
//! Redis implementation does as one atomic script, one read, and a listing
//! for the admin endpoint. Callers' credentials and message contents are
//! never stored.

pub mod memory;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use policies::TaskState;

use crate::a2a::Binding;

/// A task as the gateway names it: the route it went through, the tenant it
/// was sent in (`""` for none) and the worker's task id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub route: Arc<str>,
    pub tenant: Arc<str>,
    pub task_id: Arc<str>,
}

impl TaskKey {
    pub fn tenant(&self) -> Option<&str> {
        (!self.tenant.is_empty()).then_some(&*self.tenant)
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.route, self.tenant, self.task_id)
    }
}

/// How the gateway reaches the worker to cancel a task: the binding the
/// caller used and the worker path it used it on (the JSON-RPC endpoint, or
/// the REST base path below which `/{tenant}/tasks/{id}:cancel` lives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelTarget {
    pub binding: Binding,
    pub path: String,
}

/// What the store holds about one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    pub key: TaskKey,
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub target: Option<CancelTarget>,
    /// Callers streaming the task through the gateway right now (any replica).
    pub watchers: u32,
    /// Unix milliseconds of the last update.
    pub updated_ms: u64,
}

/// One change to a task's record; absent fields keep their value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskUpdate {
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub target: Option<CancelTarget>,
    /// Added to `watchers` (saturating at zero).
    pub watchers_delta: i32,
}

/// A store that could not answer.
#[derive(Debug)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// The tracked-task state, shared by every hook and background service.
#[async_trait]
pub trait TaskStore: Send + Sync + fmt::Debug + 'static {
    /// Applies `update` to the task's record (creating it), atomically with
    /// respect to every other replica sharing the store; returns the result.
    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError>;

    /// The task's record, if the store holds one.
    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError>;

    /// Up to `limit` records, for the admin endpoint (order unspecified).
    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError>;

    /// `memory` or `redis`, for logs and metrics.
    fn kind(&self) -> &'static str;
}

impl TaskRecord {
    /// A record for a task seen for the first time.
    pub fn new(key: TaskKey, now_ms: u64) -> Self {
        TaskRecord {
            key,
            context_id: None,
            state: None,
            target: None,
            watchers: 0,
            updated_ms: now_ms,
        }
    }

    /// Applies an update; the one definition every store shares.
    pub fn apply(&mut self, u: TaskUpdate, now_ms: u64) {
        if u.context_id.is_some() {
            self.context_id = u.context_id;
        }
        // A terminal state is final: a late non-terminal report never undoes it.
        if let Some(s) = u.state {
            if !self.state.is_some_and(TaskState::is_terminal) {
                self.state = Some(s);
            }
        }
        if u.target.is_some() {
            self.target = u.target;
        }
        self.watchers = self.watchers.saturating_add_signed(u.watchers_delta);
        self.updated_ms = now_ms;
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
pub(crate) mod conformance {
    //! The behaviour every store must have; each implementation runs it.

    use super::*;

    fn key(id: &str) -> TaskKey {
        TaskKey {
            route: "r".into(),
            tenant: "".into(),
            task_id: id.into(),
        }
    }

    pub async fn run(store: &dyn TaskStore) {
        assert_eq!(store.get(&key("t1")).await.unwrap(), None);

        let target = CancelTarget {
            binding: Binding::JsonRpc,
            path: "/".into(),
        };
        let rec = store
            .update(
                &key("t1"),
                TaskUpdate {
                    context_id: Some("c1".into()),
                    state: Some(TaskState::Working),
                    target: Some(target.clone()),
                    watchers_delta: 1,
                },
                10,
            )
            .await
            .unwrap();
        assert_eq!(rec.watchers, 1);
        assert_eq!(rec.state, Some(TaskState::Working));

        // A second watcher, then both leave: never below zero.
        let up = |d| TaskUpdate {
            watchers_delta: d,
            ..TaskUpdate::default()
        };
        assert_eq!(
            store.update(&key("t1"), up(1), 11).await.unwrap().watchers,
            2
        );
        assert_eq!(
            store.update(&key("t1"), up(-1), 12).await.unwrap().watchers,
            1
        );
        assert_eq!(
            store.update(&key("t1"), up(-1), 13).await.unwrap().watchers,
            0
        );
        assert_eq!(
            store.update(&key("t1"), up(-1), 14).await.unwrap().watchers,
            0
        );

        // Terminal is final.
        let state = |s| TaskUpdate {
            state: Some(s),
            ..TaskUpdate::default()
        };
        store
            .update(&key("t1"), state(TaskState::Completed), 15)
            .await
            .unwrap();
        let rec = store
            .update(&key("t1"), state(TaskState::Working), 16)
            .await
            .unwrap();
        assert_eq!(rec.state, Some(TaskState::Completed));
        assert_eq!(rec.context_id.as_deref(), Some("c1"));
        assert_eq!(rec.target, Some(target));
        assert_eq!(rec.updated_ms, 16);

        // Interrupted is not final: a continuation works again.
        store
            .update(&key("t2"), state(TaskState::InputRequired), 20)
            .await
            .unwrap();
        let rec = store
            .update(&key("t2"), state(TaskState::Working), 21)
            .await
            .unwrap();
        assert_eq!(rec.state, Some(TaskState::Working));

        // Tenants are separate tasks.
        let other = TaskKey {
            tenant: "acme".into(),
            ..key("t1")
        };
        assert_eq!(store.get(&other).await.unwrap(), None);

        let listed = store.list(10).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(store.list(1).await.unwrap().len(), 1);
    }
}
