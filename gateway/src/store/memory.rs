//! The embedded store: one gateway process, no dependencies.

use std::time::Duration;

use async_trait::async_trait;
use moka::sync::Cache;

use super::{StoreError, TaskKey, TaskRecord, TaskStore, TaskUpdate};

/// Tracked tasks in a bounded in-process cache (moka). Records idle longer
/// than the retention are dropped; past capacity the least useful go first
/// (moka's TinyLFU), which at worst forgets a task and so skips its cancel:
/// size `limits.max_tracked_tasks` above the live tasks you expect.
#[derive(Debug)]
pub struct MemoryStore {
    tasks: Cache<TaskKey, TaskRecord>,
}

impl MemoryStore {
    pub fn new(capacity: u64, retention: Duration) -> Self {
        MemoryStore {
            tasks: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(retention)
                .build(),
        }
    }
}

#[async_trait]
impl TaskStore for MemoryStore {
    async fn update(
        &self,
        key: &TaskKey,
        update: TaskUpdate,
        now_ms: u64,
    ) -> Result<TaskRecord, StoreError> {
        let entry = self.tasks.entry_by_ref(key).and_upsert_with(|old| {
            let mut rec =
                old.map_or_else(|| TaskRecord::new(key.clone(), now_ms), |e| e.into_value());
            rec.apply(update, now_ms);
            rec
        });
        Ok(entry.into_value())
    }

    async fn get(&self, key: &TaskKey) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.tasks.get(key))
    }

    async fn list(&self, limit: usize) -> Result<Vec<TaskRecord>, StoreError> {
        Ok(self.tasks.iter().take(limit).map(|(_, v)| v).collect())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() {
        let store = MemoryStore::new(1000, Duration::from_secs(60));
        super::super::conformance::run(&store).await;
    }
}
