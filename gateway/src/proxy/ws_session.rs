//! A WebSocket's per-socket state (what `proxy/websocket.rs` reads its
//! frames into), apart from the code that reads them so that the request's
//! context can hold it.

use std::collections::HashMap;
use std::sync::Arc;

use policies::cascade::Seen;

use crate::a2a::ws::WsParser;
use crate::a2a::A2aMethod;

/// A request whose answer may name a task.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) method: A2aMethod,
    pub(super) tenant: Option<String>,
    pub(super) lease_grant: Option<u64>,
    /// A send: the task it continues (`message.taskId`), else its
    /// message's `messageId`, by which its child is found if the socket
    /// ends before an answer names it.
    pub(super) task_id: Option<String>,
    pub(super) message_id: Option<String>,
    /// A non-blocking send: its caller does not wait on the socket.
    pub(super) return_immediately: bool,
    /// An answer or event named the call's task.
    pub(super) named: bool,
}

/// A task seen on this socket.
#[derive(Debug)]
pub struct SocketTask {
    pub seen: Seen,
    pub tenant: Option<String>,
    /// Counted as a watcher in the store (a stream on this socket).
    pub watching: bool,
    /// This socket holds an imposed lease on it.
    pub held: bool,
}

/// Per-socket state, created at the `101`.
#[derive(Debug)]
pub struct WsSession {
    pub(super) client: WsParser,
    pub(super) worker: WsParser,
    pub(super) pending: HashMap<String, Pending>,
    pub tasks: HashMap<Arc<str>, SocketTask>,
}

impl WsSession {
    pub fn new(max_message: usize) -> Self {
        WsSession {
            client: WsParser::new(max_message),
            worker: WsParser::new(max_message),
            pending: HashMap::new(),
            tasks: HashMap::new(),
        }
    }
}

impl WsSession {
    /// A send on this socket still awaits the answer that names its task.
    pub fn awaits_a_task(&self) -> bool {
        self.pending.values().any(|p| {
            matches!(
                p.method,
                A2aMethod::SendMessage | A2aMethod::SendStreamingMessage
            ) && !p.named
        })
    }
}
