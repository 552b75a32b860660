//! Fire-and-poll: a task started by a non-blocking send is cancelled when
//! nobody polls it for `poll_lease` (issue: "No orphan in any call shape").
