// a2a-gateway patch: this whole file (see patches/README.md, "Small task pipes").

//! The two task pipes between the halves of an HTTP/1 exchange.
//!
//! `proxy_1to1` runs an exchange as two halves joined in one task (the
//! caller's side and the upstream's side) and passes `HttpTask`s between
//! them through two bounded pipes of 4. pingora used `tokio::sync::mpsc`
//! for them: a channel is an `Arc`ed state with cache-padded halves (about
//! 480 bytes) and a first block of 32 slots allocated at once (about 1.2
//! KiB), so the two pipes cost an exchange about 3.4 KiB and four
//! allocations, held for as long as it lasts (a stream's whole life), and
//! their atomics on every task passed. A pipe here is one allocation of
//! about 210 bytes (heaptrack): the 4 slots inline behind a mutex, which is never
//! contended (both halves run in the same task), and one waker per end.
//!
//! The API is the part of tokio's that `proxy_h1` uses, with the same
//! meaning and tokio's own error types: `send`, `reserve`, `try_reserve`,
//! `is_closed` on the one sender, a `Permit` that holds a slot until it
//! sends or is dropped, `recv` on the receiver (`None` once the sender is
//! gone and the pipe is empty). A pipe is for one sender and one receiver:
//! each end keeps one waker, the last task to wait on it (tokio's mpsc
//! keeps any number; with both halves in one task they are the same).
//! Unlike tokio's, `recv` does not count against tokio's cooperative
//! budget: every loop that receives also reads or writes a socket, which
//! does.
//!
//! Tested in the repository's `tests/upstream_connections.rs` (the pipe
//! alone, and through the gateway with bodies of every shape).

use std::fmt;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

pub use tokio::sync::mpsc::error::{SendError, TrySendError};

/// A bounded pipe of `CAP` values.
pub fn channel<T, const CAP: usize>() -> (Sender<T, CAP>, Receiver<T, CAP>) {
    assert!(
        CAP > 0 && CAP <= u8::MAX as usize,
        "a pipe holds 1 to 255 values"
    );
    let shared = Arc::new(Mutex::new(State {
        slots: std::array::from_fn(|_| None),
        head: 0,
        len: 0,
        reserved: 0,
        sender_alive: true,
        receiver_alive: true,
        sender_waker: None,
        receiver_waker: None,
    }));
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

struct State<T, const CAP: usize> {
    /// A ring: `len` values from `head`.
    slots: [Option<T>; CAP],
    head: u8,
    len: u8,
    /// Slots promised to live permits.
    reserved: u8,
    sender_alive: bool,
    receiver_alive: bool,
    /// The task waiting for a free slot.
    sender_waker: Option<Waker>,
    /// The task waiting for a value.
    receiver_waker: Option<Waker>,
}

impl<T, const CAP: usize> State<T, CAP> {
    fn has_room(&self) -> bool {
        usize::from(self.len) + usize::from(self.reserved) < CAP
    }

    fn push(&mut self, value: T) {
        debug_assert!(usize::from(self.len) < CAP);
        let tail = (usize::from(self.head) + usize::from(self.len)) % CAP;
        self.slots[tail] = Some(value);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let value = self.slots[usize::from(self.head)].take();
        self.head = ((usize::from(self.head) + 1) % CAP) as u8;
        self.len -= 1;
        value
    }
}

/// Stores `cx`'s waker in `slot` unless the one there wakes the same task.
fn park(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(w) if w.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

type Shared<T, const CAP: usize> = Arc<Mutex<State<T, CAP>>>;

fn lock<T, const CAP: usize>(shared: &Shared<T, CAP>) -> MutexGuard<'_, State<T, CAP>> {
    // A panic while locked leaves the state consistent (no step of it can
    // panic half-way), so a poisoned lock is used as it is.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The sending end. Dropping it ends the pipe for the receiver once the
/// values already in it are taken.
pub struct Sender<T, const CAP: usize> {
    shared: Shared<T, CAP>,
}

/// The receiving end. Dropping it closes the pipe: sends fail, and the
/// values still in it are dropped.
pub struct Receiver<T, const CAP: usize> {
    shared: Shared<T, CAP>,
}

/// A slot held for one value: [`Permit::send`] fills it, dropping the
/// permit gives it back.
pub struct Permit<'a, T, const CAP: usize> {
    sender: &'a Sender<T, CAP>,
}

impl<T, const CAP: usize> Sender<T, CAP> {
    /// Waits for a free slot and holds it. Fails once the receiver is gone.
    pub async fn reserve(&self) -> Result<Permit<'_, T, CAP>, SendError<()>> {
        poll_fn(|cx| {
            let mut state = lock(&self.shared);
            if !state.receiver_alive {
                return Poll::Ready(Err(SendError(())));
            }
            if state.has_room() {
                state.reserved += 1;
                return Poll::Ready(Ok(Permit { sender: self }));
            }
            park(&mut state.sender_waker, cx.waker());
            Poll::Pending
        })
        .await
    }

    /// Holds a free slot if there is one now.
    pub fn try_reserve(&self) -> Result<Permit<'_, T, CAP>, TrySendError<()>> {
        let mut state = lock(&self.shared);
        if !state.receiver_alive {
            return Err(TrySendError::Closed(()));
        }
        if !state.has_room() {
            return Err(TrySendError::Full(()));
        }
        state.reserved += 1;
        Ok(Permit { sender: self })
    }

    /// Waits for a free slot and puts `value` in it; gives `value` back
    /// once the receiver is gone.
    pub async fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.reserve().await {
            Ok(permit) => {
                permit.send(value);
                Ok(())
            }
            Err(SendError(())) => Err(SendError(value)),
        }
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        !lock(&self.shared).receiver_alive
    }
}

impl<T, const CAP: usize> Drop for Sender<T, CAP> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.shared);
            state.sender_alive = false;
            state.receiver_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T, const CAP: usize> Permit<'_, T, CAP> {
    /// Puts `value` in the held slot (dropped at once if the receiver is
    /// gone, as tokio's permit does).
    pub fn send(self, value: T) {
        let (waker, dropped) = {
            let mut state = lock(&self.sender.shared);
            state.reserved -= 1;
            if state.receiver_alive {
                state.push(value);
                (state.receiver_waker.take(), None)
            } else {
                (None, Some(value))
            }
        };
        std::mem::forget(self);
        drop(dropped);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T, const CAP: usize> Drop for Permit<'_, T, CAP> {
    fn drop(&mut self) {
        let waker = {
            let mut state = lock(&self.sender.shared);
            state.reserved -= 1;
            state.sender_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T, const CAP: usize> Receiver<T, CAP> {
    /// The next value; `None` once the sender is gone and the pipe is
    /// empty. Cancel-safe: a value is taken only when this returns it.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let (value, waker) = {
                let mut state = lock(&self.shared);
                match state.pop() {
                    Some(value) => (value, state.sender_waker.take()),
                    None if !state.sender_alive => return Poll::Ready(None),
                    None => {
                        park(&mut state.receiver_waker, cx.waker());
                        return Poll::Pending;
                    }
                }
            };
            if let Some(w) = waker {
                w.wake();
            }
            Poll::Ready(Some(value))
        })
        .await
    }
}

impl<T, const CAP: usize> Drop for Receiver<T, CAP> {
    fn drop(&mut self) {
        let (waker, left) = {
            let mut state = lock(&self.shared);
            state.receiver_alive = false;
            state.head = 0;
            state.len = 0;
            let left = std::mem::replace(&mut state.slots, std::array::from_fn(|_| None));
            (state.sender_waker.take(), left)
        };
        // The values left behind are dropped outside the lock.
        drop(left);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T, const CAP: usize> fmt::Debug for Sender<T, CAP> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").field("capacity", &CAP).finish()
    }
}

impl<T, const CAP: usize> fmt::Debug for Receiver<T, CAP> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").field("capacity", &CAP).finish()
    }
}

impl<T, const CAP: usize> fmt::Debug for Permit<'_, T, CAP> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").finish()
    }
}
