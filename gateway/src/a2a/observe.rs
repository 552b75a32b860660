//! Reading what a worker's answer says about its task.
//!
//! One JSON document (a whole JSON body, one SSE event's `data`, one WebSocket
//! text frame) becomes one small [`Observation`], read by a borrowing walk in
//! one pass (a cursor over the document, on `super::json`'s scanners, as
//! request bodies are read): only the members policy needs are descended
//! into (the payload's `task`, `message`, `statusUpdate`, `artifactUpdate`,
//! their ids, `status.state`, a status update's budget report), everything
//! else is skipped without being built or checked, the document's UTF-8 is
//! checked once instead of string by string, and nothing is allocated unless
//! a string holds an escape or a budget's spend is reported. This runs for
//! every event of every tracked stream: serde's typed reading of the same
//! event cost about 5,400 instructions, this walk about 2,500
//! (`benches/cpu-split.sh`, `docs/performance.md`).
//!
//! It reads what serde's derived structs (kept as the tests' reference,
//! `tests::reference`) read, and refuses what they refuse among the members
//! it reads:
//! - a member the structs name given twice in one object refuses the
//!   document, as a derived struct does (`duplicate field`): a worker that
//!   names two task ids or two states in one event is not tracked by either
//!   (members the structs do not name may repeat, and a reported spend's
//!   meters are a map: the last one wins);
//! - a member of the wrong type (a task id that is not a string, a `status`
//!   that is not an object, a `task` without an `id`) refuses it;
//! - serde also reads a struct from an array of its fields in declaration
//!   order, and so does this walk (no peer sends that; it is read so that
//!   the two never disagree on a document both accept).
//!
//! The one deliberate difference: it does not check the syntax of what it
//! skips (numbers, literals, escapes and UTF-8 of strings it does not keep,
//! control characters, the UTF-8 of keys, which bracket closes what), so a
//! document that is malformed only there is read where the reference
//! refuses it. On every well-formed document (what `serde_json::Value`
//! accepts) the two give the same answer, refusals included
//! (`tests::agrees_with_the_serde_reference`); what this walk reads from a
//! malformed one is what its members say, never a pick between two of them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use policies::TaskState;

use super::json;
use super::{Binding, Observation};

// The members read of each object, by name, at the index of the
// reference's field order (which its array form follows).

/// A JSON-RPC answer (a WebSocket frame is one too): `result`, `error`.
fn rpc_member(k: &[u8]) -> Option<usize> {
    Some(match k {
        b"result" => 0,
        b"error" => 1,
        _ => return None,
    })
}

/// A StreamResponse (`task` / `message` / `statusUpdate` / `artifactUpdate`),
/// a SendMessage response (`task` / `message`), or a bare Task (GetTask,
/// CancelTask): the union of their relevant members.
fn payload_member(k: &[u8]) -> Option<usize> {
    Some(match k {
        b"task" => 0,
        b"message" => 1,
        b"statusUpdate" => 2,
        b"artifactUpdate" => 3,
        b"id" => 4,
        b"contextId" => 5,
        b"status" => 6,
        b"error" => 7,
        _ => return None,
    })
}

/// Which object of a payload names the task, in the order the payload is
/// read by: the first one present wins.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Task,
    StatusUpdate,
    ArtifactUpdate,
    Message,
}

impl Kind {
    /// How many members it has (for the array form).
    fn members(self) -> usize {
        match self {
            Kind::Task => 3,
            Kind::Message => 2,
            Kind::StatusUpdate | Kind::ArtifactUpdate => 4,
        }
    }

    /// Its members: 0 the task id (a task's `id`, the others' `taskId`),
    /// 1 the context id, 2 the status, 3 an update's metadata.
    fn member(self, k: &[u8]) -> Option<usize> {
        let i = match k {
            b"id" if self == Kind::Task => 0,
            b"taskId" if self != Kind::Task => 0,
            b"contextId" => 1,
            b"status" => 2,
            b"metadata" => 3,
            _ => return None,
        };
        (i < self.members()).then_some(i)
    }
}

/// What one of the objects that name a task says.
#[derive(Default)]
struct Holder<'a> {
    task_id: Option<Cow<'a, str>>,
    context_id: Option<Cow<'a, str>>,
    /// `Some` when a status was given (not `null`), with its state when
    /// known.
    status: Option<Option<TaskState>>,
    spent: Option<BTreeMap<String, u64>>,
}

/// A document being read, and where.
struct Reader<'a> {
    b: &'a [u8],
    /// The whole document as text, when it is UTF-8 (checked once: the
    /// strings kept are then cut from it instead of being checked one by
    /// one; a document that is not is read all the same, string by string,
    /// as the reference does not check the strings it skips).
    text: Option<&'a str>,
    i: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        // Most documents have none.
        if self.b.get(self.i).is_some_and(|&c| c > b' ') {
            return;
        }
        self.i = json::skip_ws(self.b, self.i);
    }

    /// Skips the value here.
    fn skip(&mut self) -> Option<()> {
        self.i += json::skip(&self.b[self.i..])?;
        Some(())
    }

    /// The raw value here, skipped.
    fn raw(&mut self) -> Option<&'a [u8]> {
        let n = json::skip(&self.b[self.i..])?;
        let raw = &self.b[self.i..self.i + n];
        self.i += n;
        Some(raw)
    }

    /// Whether the value here is `null` (then skipped). An optional member
    /// (serde's `Option`) is `None` when it is.
    fn null(&mut self) -> Option<bool> {
        if self.peek() != Some(b'n') {
            return Some(false);
        }
        (self.raw()? == b"null").then_some(true)
    }

    /// An optional string.
    fn text(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.null()? {
            return Some(None);
        }
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.i + 1;
        let stop = json::plain_end(self.b, start)?;
        if self.b[stop] != b'"' {
            // An escape (or a control character, refused).
            let (n, s) = json::take_string(&self.b[self.i..])?;
            self.i += n;
            return Some(Some(s));
        }
        self.i = stop + 1;
        let s = match self.text {
            Some(text) => text.get(start..stop)?,
            None => std::str::from_utf8(&self.b[start..stop]).ok()?,
        };
        Some(Some(Cow::Borrowed(s)))
    }

    /// A member whose value is not read (`Option<IgnoredAny>`): whether it
    /// is there, not `null`.
    fn present(&mut self) -> Option<bool> {
        Some(self.raw()? != b"null")
    }

    /// The index `member` gives the key here (`None` inside: a member not
    /// read), the reader left past its colon at the value.
    fn key(&mut self, member: &impl Fn(&[u8]) -> Option<usize>) -> Option<Option<usize>> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.i + 1;
        let stop = json::plain_end(self.b, start)?;
        let index = if self.b[stop] == b'"' {
            self.i = stop + 1;
            member(&self.b[start..stop])
        } else {
            // An escape (seldom in a key): decoded.
            let (n, key) = json::take_key(&self.b[self.i..])?;
            self.i += n;
            member(&key)
        };
        self.ws();
        if self.peek() != Some(b':') {
            return None;
        }
        self.i += 1;
        self.ws();
        Some(index)
    }

    /// Walks the object here, calling `f(self, index)` at the value of each
    /// member that `member` names (by its index), which reads it; other
    /// members are skipped. A named member given twice refuses the object,
    /// and an array is read as the `count` named members in order (serde's
    /// derive does both). `None`: neither, malformed, or `f` refused a value.
    fn fields(
        &mut self,
        count: usize,
        member: impl Fn(&[u8]) -> Option<usize>,
        mut f: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        let close = match self.peek()? {
            b'{' => b'}',
            b'[' => b']',
            _ => return None,
        };
        self.i += 1;
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
            return Some(());
        }
        let mut seen = 0u32;
        let mut at = 0;
        loop {
            if close == b'}' {
                match self.key(&member)? {
                    Some(i) if seen & 1 << i != 0 => return None,
                    Some(i) => {
                        seen |= 1 << i;
                        f(self, i)?;
                    }
                    None => self.skip()?,
                }
            } else {
                if at == count {
                    return None;
                }
                f(self, at)?;
                at += 1;
            }
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                c if c == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A `status`: `Some` when given (not `null`), with its state when known.
    fn status(&mut self) -> Option<Option<Option<TaskState>>> {
        if self.null()? {
            return Some(None);
        }
        let mut state = None;
        let member = |k: &[u8]| (k == b"state").then_some(0);
        self.fields(1, member, |r, _| {
            state = r.text()?.as_deref().and_then(TaskState::from_wire);
            Some(())
        })?;
        Some(Some(state))
    }

    /// An update's `metadata`: its budget report's `spent`, when given
    /// (`{"a2a-rust.com/budget":{"remainingMs","meters","spent"}}`: only
    /// `spent` is read).
    fn metadata(&mut self) -> Option<Option<BTreeMap<String, u64>>> {
        let mut spent = None;
        if self.null()? {
            return Some(None);
        }
        let budget = |k: &[u8]| (k == b"a2a-rust.com/budget").then_some(0);
        self.fields(1, budget, |r, _| {
            if r.null()? {
                return Some(());
            }
            r.fields(
                1,
                |k| (k == b"spent").then_some(0),
                |r, _| {
                    spent = if r.null()? { None } else { Some(r.spent()?) };
                    Some(())
                },
            )
        })?;
        Some(spent)
    }

    /// Reported spend, meter by meter (a meter named twice: the last);
    /// amounts that are not whole numbers (a Python peer's `12.0` counts)
    /// are skipped. Read with serde_json, as the reference does: this is
    /// the one part of a document that allocates, and only a budget's
    /// report has it.
    fn spent(&mut self) -> Option<BTreeMap<String, u64>> {
        let spent: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(self.raw()?).ok()?;
        let spent = spent
            .into_iter()
            .filter_map(|(name, v)| {
                let n = v.as_u64().or_else(|| {
                    v.as_f64()
                        .and_then(|f| policies::budget::Amount::Float(f).whole())
                })?;
                Some((name, n))
            })
            .collect();
        Some(spent)
    }

    /// A task (its `id` required), a message or an update.
    fn holder(&mut self, kind: Kind) -> Option<Option<Holder<'a>>> {
        if self.null()? {
            return Some(None);
        }
        let mut h = Holder::default();
        self.fields(
            kind.members(),
            |k| kind.member(k),
            |r, i| {
                match i {
                    0 => h.task_id = r.text()?,
                    1 => h.context_id = r.text()?,
                    2 => h.status = r.status()?,
                    _ => h.spent = r.metadata()?,
                }
                Some(())
            },
        )?;
        if kind == Kind::Task && h.task_id.is_none() {
            return None;
        }
        Some(Some(h))
    }

    /// A payload (see [`payload_member`]).
    fn payload(&mut self) -> Option<Observation<'a>> {
        let mut error = false;
        let mut best: Option<(Kind, Holder<'a>)> = None;
        let mut bare = Holder::default();
        self.fields(8, payload_member, |r, i| {
            let kind = match i {
                0 => Kind::Task,
                1 => Kind::Message,
                2 => Kind::StatusUpdate,
                3 => Kind::ArtifactUpdate,
                4 => return r.text().map(|s| bare.task_id = s),
                5 => return r.text().map(|s| bare.context_id = s),
                6 => return r.status().map(|s| bare.status = s),
                _ => return r.present().map(|e| error = e),
            };
            if let Some(h) = r.holder(kind)? {
                if best.as_ref().is_none_or(|(k, _)| kind < *k) {
                    best = Some((kind, h));
                }
            }
            Some(())
        })?;
        if error {
            return Some(Observation {
                error: true,
                ..Observation::default()
            });
        }
        Some(match best {
            Some((kind, h)) => Observation {
                state: match kind {
                    Kind::Task | Kind::StatusUpdate => h.status.flatten(),
                    _ => None,
                },
                message_only: kind == Kind::Message && h.task_id.is_none(),
                spent: h.spent.filter(|_| kind == Kind::StatusUpdate),
                task_id: h.task_id,
                context_id: h.context_id,
                ..Observation::default()
            },
            None if bare.task_id.is_some() && bare.status.is_some() => Observation {
                state: bare.status.flatten(),
                task_id: bare.task_id,
                context_id: bare.context_id,
                ..Observation::default()
            },
            None => Observation::default(),
        })
    }

    /// A JSON-RPC answer: its error, else its result's payload.
    fn rpc(&mut self) -> Option<Option<Observation<'a>>> {
        let mut result = None;
        let mut error = false;
        self.fields(2, rpc_member, |r, i| {
            if i == 0 {
                result = if r.null()? { None } else { Some(r.payload()?) };
            } else {
                error = r.present()?;
            }
            Some(())
        })?;
        if error {
            return Some(Some(Observation {
                error: true,
                ..Observation::default()
            }));
        }
        Some(result)
    }
}

/// A whole document: one value, whitespace around it.
fn document<'a, T>(doc: &'a [u8], read: impl FnOnce(&mut Reader<'a>) -> Option<T>) -> Option<T> {
    let mut r = Reader {
        b: doc,
        text: std::str::from_utf8(doc).ok(),
        i: 0,
    };
    r.ws();
    let t = read(&mut r)?;
    r.ws();
    (r.i == doc.len()).then_some(t)
}

/// Reads one document of the given binding. Anything that is not JSON, or not
/// an A2A answer, gives `None`: the caller counts it and tracks nothing.
pub fn observe(binding: Binding, doc: &[u8]) -> Option<Observation<'_>> {
    match binding {
        Binding::JsonRpc | Binding::WebSocket => document(doc, Reader::rpc)?,
        Binding::Rest => document(doc, Reader::payload),
        // A whole gRPC answer body: one framed `Task` (GetTask, CancelTask).
        Binding::Grpc => {
            super::grpc::observe(super::A2aMethod::GetTask, super::grpc::single_message(doc)?)
        }
    }
}

/// The longest name of a state (`TASK_STATE_INPUT_REQUIRED`).
const LONGEST_STATE_NAME: usize = 25;

/// Where a settled state's name may end: `ed"` and `ED"`.
static SETTLED_ENDS: std::sync::LazyLock<[memchr::memmem::Finder<'static>; 2]> =
    std::sync::LazyLock::new(|| {
        [
            memchr::memmem::Finder::new(b"ed\""),
            memchr::memmem::Finder::new(b"ED\""),
        ]
    });

/// Whether [`observe`] may read a settled state from `doc`: it holds an
/// escape (a name can be spelled with one), or a settled state's name as a
/// whole string (`"TASK_STATE_COMPLETED"`, `"completed"`, ...), wherever it
/// is (a struct read from an array has no `state` key). `false` proves that
/// the walk reads no settled state from it, as it reads a state from a
/// string's raw bytes when the string has no escape; the differential
/// tests check that on every document they generate. Every settled name
/// ends in `ed` or `ED`: only the strings that do are looked at (found
/// with `memmem`, each checked back to its opening quote); no allocation.
/// What `false` allows is `policies::track::reads_event`'s. The search is
/// [`SettleScan`]'s, over `doc` alone.
pub fn may_settle(doc: &[u8]) -> bool {
    SettleScan::new(doc).may_settle(doc)
}

/// [`may_settle`] for the events of one chunk of a stream, each a part of
/// the chunk, in order: the chunk is searched once for each pattern (a
/// backslash, `ed"`, `ED"`) instead of once per event, each search's
/// result kept until an event lies past it. A chunk read from the worker
/// often holds several events, nearly all without a hit, so the searches'
/// fixed cost is paid a few times per chunk, not three times per event
/// (under callgrind, a 50-event canned stream: 180,529 instructions
/// before, 173,765 after). An event's answer is
/// [`may_settle`]'s over its own bytes: a hit counts only when its pattern
/// lies wholly inside the event, and a name is checked back to its opening
/// quote inside the event. An event not inside the chunk (one assembled
/// across chunks) is searched on its own.
#[derive(Debug)]
pub struct SettleScan<'c> {
    chunk: &'c [u8],
    /// Per pattern: the first hit at or after `from` (`None`: none there),
    /// once searched.
    found: [Option<(usize, Option<usize>)>; 3],
}

impl<'c> SettleScan<'c> {
    pub fn new(chunk: &'c [u8]) -> Self {
        SettleScan {
            chunk,
            found: [None; 3],
        }
    }

    /// [`may_settle`]`(data)`; searched in the chunk when `data` lies in it.
    pub fn may_settle(&mut self, data: &[u8]) -> bool {
        let base = self.chunk.as_ptr() as usize;
        let at = (data.as_ptr() as usize).wrapping_sub(base);
        if at > self.chunk.len() || self.chunk.len() - at < data.len() {
            return SettleScan::new(data).may_settle(data);
        }
        let end = at + data.len();
        if self.hit(0, at).is_some_and(|h| h < end) {
            return true;
        }
        (1..3).any(|k| {
            let mut from = at;
            while let Some(h) = self.hit(k, from).filter(|h| h + 3 <= end) {
                if settled_name_before(data, h + 2 - at) {
                    return true;
                }
                from = h + 3;
            }
            false
        })
    }

    /// The first hit of pattern `k` at or after `from`: the kept search if
    /// it covers `from` (it started at or before it and found nothing
    /// before it), else a new one from `from`.
    fn hit(&mut self, k: usize, from: usize) -> Option<usize> {
        if let Some((start, hit)) = self.found[k] {
            if start <= from && hit.is_none_or(|h| h >= from) {
                return hit;
            }
        }
        let rest = &self.chunk[from..];
        let hit = match k {
            0 => memchr::memchr(b'\\', rest),
            _ => SETTLED_ENDS[k - 1].find(rest),
        }
        .map(|h| from + h);
        self.found[k] = Some((from, hit));
        hit
    }
}

/// Whether the string that the quote at `close` ends is a settled state's
/// name. With no escape in the document, no string holds a quote: the one
/// before `close` opens it.
fn settled_name_before(doc: &[u8], close: usize) -> bool {
    let from = close.saturating_sub(LONGEST_STATE_NAME + 1);
    memchr::memrchr(b'"', &doc[from..close]).is_some_and(|open| {
        TaskState::from_wire_bytes(&doc[from + open + 1..close]).is_some_and(TaskState::is_settled)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    /// Every name [`TaskState::from_wire`] reads as a settled state
    /// (`TASK_STATE_COMPLETED`, `completed`, ...); each ends in `ed` or `ED`.
    fn settled_names() -> Vec<&'static str> {
        TaskState::ALL
            .into_iter()
            .filter(|s| s.is_settled())
            .flat_map(|s| s.wire_names().iter().copied())
            .collect()
    }

    /// The rule of [`may_settle`] written plainly, for one document: the
    /// reference [`SettleScan`]'s kept searches are checked against.
    fn may_settle_alone(doc: &[u8]) -> bool {
        if doc.contains(&b'\\') {
            return true;
        }
        (2..doc.len()).any(|close| {
            doc[close] == b'"'
                && matches!(&doc[close - 2..close], b"ed" | b"ED")
                && settled_name_before(doc, close)
        })
    }

    #[test]
    fn a_chunk_scan_answers_as_each_event_alone() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let pieces: &[&[u8]] = &[
            b"\"",
            b"ed\"",
            b"ED\"",
            b"\\",
            b"\"completed\"",
            b"\"TASK_STATE_COMPLETED\"",
            b"\"TASK_STATE_WORKING\"",
            b"\"canceled\"",
            b"{\"state\":",
            b"\"failed",
            b"rejected\"",
            b"e",
            b"d",
            b"x",
            b"data: ",
            b"\n\n",
        ];
        let (mut events, mut settling) = (0, 0);
        for _ in 0..20_000 {
            let mut chunk = Vec::new();
            for _ in 0..next() % 40 {
                chunk.extend_from_slice(pieces[(next() % pieces.len() as u64) as usize]);
            }
            let mut scan = SettleScan::new(&chunk);
            // Events in order, as a parser hands them on, sometimes
            // touching, sometimes one asked again or out of order.
            let mut at = 0;
            while at < chunk.len() {
                let start = (at + (next() % 3) as usize).min(chunk.len());
                let end = (start + (next() % 40) as usize).min(chunk.len());
                let data = &chunk[start..end];
                let want = may_settle_alone(data);
                assert_eq!(may_settle(data), want);
                assert_eq!(
                    scan.may_settle(data),
                    want,
                    "{:?} in {:?}",
                    String::from_utf8_lossy(data),
                    String::from_utf8_lossy(&chunk)
                );
                events += 1;
                settling += usize::from(want);
                at = if next() % 10 == 0 { at / 2 } else { end + 1 };
            }
            // An event assembled elsewhere (not inside the chunk).
            let copy = chunk.clone();
            assert_eq!(scan.may_settle(&copy), may_settle_alone(&copy));
        }
        // Both answers were asked for, many times.
        assert!(
            events > 100_000 && settling > 20_000 && events - settling > 20_000,
            "{events} {settling}"
        );
    }

    #[test]
    fn settled_names_are_whole_strings_that_end_in_ed() {
        assert_eq!(settled_names().len(), 12);
        let longest = TaskState::ALL
            .iter()
            .flat_map(|s| s.wire_names())
            .map(|n| n.len());
        assert_eq!(longest.max(), Some(LONGEST_STATE_NAME));
        for text in settled_names() {
            assert!(TaskState::from_wire(text).is_some_and(TaskState::is_settled));
            assert!(text.ends_with("ed") || text.ends_with("ED"), "{text}");
            let quoted = format!(r#"{{"state":"{text}"}}"#);
            assert!(may_settle(quoted.as_bytes()), "{quoted}");
            // Not as a part of a longer string, nor unquoted.
            for other in [
                format!(r#"{{"state":"x{text}"}}"#),
                format!(r#"{{"state":"{text}x"}}"#),
                format!(r#"{{"note":{text}}}"#),
            ] {
                assert!(!may_settle(other.as_bytes()), "{other}");
            }
        }
        for doc in [
            r#"{"state":"TASK_STATE_WORKING"}"#,
            r#"{"state":"submitted","contextId":"canned"}"#,
            "",
            r#"""#,
            r#"ed""#,
        ] {
            assert!(!may_settle(doc.as_bytes()), "{doc}");
        }
        assert!(may_settle(br#"{"state":"TASK_STATE_\u0043ANCELED"}"#));
        assert!(may_settle(br#"{"status":["failed"]}"#));
    }

    /// Events as the peers send them: progress is cleared, a settling
    /// event is not, and a progress event that merely holds a settled
    /// name as a string is read (and found to settle nothing).
    #[test]
    fn progress_events_are_told_from_settling_ones() {
        let rpc = |result: &str| format!(r#"{{"jsonrpc":"2.0","id":"1","result":{result}}}"#);
        let update = |state: &str| {
            rpc(&format!(
                r#"{{"statusUpdate":{{"taskId":"t1","contextId":"c1","status":{{"state":"{state}","timestamp":"2026-12-07T18:00:00Z"}}}}}}"#
            ))
        };
        let artifact = |text: &str| {
            rpc(&format!(
                r#"{{"artifactUpdate":{{"taskId":"t1","contextId":"c1","artifact":{{"artifactId":"a","parts":[{{"text":"{text}"}}]}},"append":true}}}}"#
            ))
        };
        let table = [
            (update("TASK_STATE_WORKING"), false, Some(Working)),
            (update("working"), false, Some(Working)),
            (artifact("step 3 of 5, nothing failed"), false, None),
            (update("TASK_STATE_COMPLETED"), true, Some(Completed)),
            (
                update("TASK_STATE_INPUT_REQUIRED"),
                true,
                Some(InputRequired),
            ),
            (update("auth-required"), true, Some(AuthRequired)),
            (artifact("completed"), true, None),
            (artifact(r#"a \"quoted\" word"#), true, None),
        ];
        for (doc, may, state) in table {
            assert_eq!(may_settle(doc.as_bytes()), may, "{doc}");
            let o = observe(Binding::JsonRpc, doc.as_bytes()).expect(&doc);
            assert_eq!(o.state, state, "{doc}");
            assert_eq!(o.task_id.as_deref(), Some("t1"), "{doc}");
        }
    }

    /// The reader this walk replaced: serde's derived structs, typed and
    /// borrowing. The reference the walk is compared with.
    pub(super) mod reference {
        use std::borrow::Cow;
        use std::collections::BTreeMap;

        use policies::TaskState;
        use serde::Deserialize;

        use super::super::Binding;
        use super::Observation;

        #[derive(Deserialize)]
        struct Rpc<'a> {
            #[serde(borrow, default)]
            result: Option<Payload<'a>>,
            #[serde(default)]
            error: Option<serde::de::IgnoredAny>,
        }

        /// A StreamResponse (`task` / `message` / `statusUpdate` / `artifactUpdate`),
        /// a SendMessage response (`task` / `message`), or a bare Task (GetTask,
        /// CancelTask): the union of their relevant fields.
        #[derive(Deserialize)]
        struct Payload<'a> {
            #[serde(borrow, default)]
            task: Option<TaskObj<'a>>,
            #[serde(borrow, default)]
            message: Option<MessageObj<'a>>,
            #[serde(borrow, default, rename = "statusUpdate")]
            status_update: Option<UpdateObj<'a>>,
            #[serde(borrow, default, rename = "artifactUpdate")]
            artifact_update: Option<UpdateObj<'a>>,
            // Bare Task fields.
            #[serde(borrow, default, deserialize_with = "borrowed")]
            id: Option<Cow<'a, str>>,
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
            context_id: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            status: Option<StatusObj<'a>>,
            #[serde(default)]
            error: Option<serde::de::IgnoredAny>,
        }

        #[derive(Deserialize)]
        struct TaskObj<'a> {
            #[serde(borrow)]
            id: Cow<'a, str>,
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
            context_id: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            status: Option<StatusObj<'a>>,
        }

        #[derive(Deserialize)]
        struct MessageObj<'a> {
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "taskId")]
            task_id: Option<Cow<'a, str>>,
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
            context_id: Option<Cow<'a, str>>,
        }

        #[derive(Deserialize)]
        struct UpdateObj<'a> {
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "taskId")]
            task_id: Option<Cow<'a, str>>,
            #[serde(borrow, default, deserialize_with = "borrowed", rename = "contextId")]
            context_id: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            status: Option<StatusObj<'a>>,
            #[serde(default)]
            metadata: Option<UpdateMeta>,
        }

        #[derive(Deserialize)]
        struct UpdateMeta {
            #[serde(default, rename = "a2a-rust.com/budget")]
            budget: Option<BudgetStatus>,
        }

        /// `{"remainingMs","meters","spent"}`: only `spent` is read.
        #[derive(Deserialize)]
        struct BudgetStatus {
            #[serde(default)]
            spent: Option<BTreeMap<String, serde_json::Value>>,
        }

        /// Reported spend, meter by meter; amounts that are not whole numbers
        /// (a Python peer's `12.0` counts) are skipped.
        fn spent_of(meta: Option<UpdateMeta>) -> Option<BTreeMap<String, u64>> {
            let spent = meta?.budget?.spent?;
            Some(
                spent
                    .into_iter()
                    .filter_map(|(name, v)| {
                        let n = v.as_u64().or_else(|| {
                            v.as_f64()
                                .and_then(|f| policies::budget::Amount::Float(f).whole())
                        })?;
                        Some((name, n))
                    })
                    .collect(),
            )
        }

        #[derive(Deserialize)]
        struct StatusObj<'a> {
            #[serde(borrow, default, deserialize_with = "borrowed")]
            state: Option<Cow<'a, str>>,
        }

        /// An optional string borrowed from the document when it has no escapes.
        /// (`#[serde(borrow)]` borrows a bare `Cow` only: on an `Option<Cow>` it
        /// always copies, which would allocate on every event.)
        fn borrowed<'de: 'a, 'a, D>(d: D) -> Result<Option<Cow<'a, str>>, D::Error>
        where
            D: serde::Deserializer<'de>,
        {
            #[derive(Deserialize)]
            struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
            Option::<Borrowed<'a>>::deserialize(d).map(|o| o.map(|b| b.0))
        }

        fn state_of(s: &Option<StatusObj<'_>>) -> Option<TaskState> {
            s.as_ref()
                .and_then(|s| s.state.as_deref())
                .and_then(TaskState::from_wire)
        }

        impl<'a> Payload<'a> {
            fn into_observation(self) -> Observation<'a> {
                if self.error.is_some() {
                    return Observation {
                        error: true,
                        ..Observation::default()
                    };
                }
                if let Some(t) = self.task {
                    return Observation {
                        state: state_of(&t.status),
                        task_id: Some(t.id),
                        context_id: t.context_id,
                        ..Observation::default()
                    };
                }
                if let Some(u) = self.status_update {
                    return Observation {
                        state: state_of(&u.status),
                        task_id: u.task_id,
                        context_id: u.context_id,
                        spent: spent_of(u.metadata),
                        ..Observation::default()
                    };
                }
                if let Some(u) = self.artifact_update {
                    return Observation {
                        task_id: u.task_id,
                        context_id: u.context_id,
                        ..Observation::default()
                    };
                }
                if let Some(m) = self.message {
                    let message_only = m.task_id.is_none();
                    return Observation {
                        task_id: m.task_id,
                        context_id: m.context_id,
                        message_only,
                        ..Observation::default()
                    };
                }
                if let (Some(id), Some(_)) = (self.id, &self.status) {
                    return Observation {
                        state: state_of(&self.status),
                        task_id: Some(id),
                        context_id: self.context_id,
                        ..Observation::default()
                    };
                }
                Observation::default()
            }
        }

        pub fn observe(binding: Binding, doc: &[u8]) -> Option<Observation<'_>> {
            match binding {
                Binding::JsonRpc | Binding::WebSocket => {
                    let rpc: Rpc<'_> = serde_json::from_slice(doc).ok()?;
                    if rpc.error.is_some() {
                        return Some(Observation {
                            error: true,
                            ..Observation::default()
                        });
                    }
                    Some(rpc.result?.into_observation())
                }
                Binding::Rest => {
                    let p: Payload<'_> = serde_json::from_slice(doc).ok()?;
                    Some(p.into_observation())
                }
                // Not JSON: not this reader's.
                Binding::Grpc => super::super::observe(binding, doc),
            }
        }
    }

    fn obs(id: Option<&str>, state: Option<TaskState>) -> Observation<'static> {
        Observation {
            task_id: id.map(|s| Cow::Owned(s.to_string())),
            context_id: Some("c1".into()),
            state,
            ..Observation::default()
        }
    }

    #[test]
    fn strings_are_borrowed_from_the_document() {
        let doc = br#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"}}}"#;
        let o = observe(Binding::Rest, doc).unwrap();
        assert!(matches!(o.task_id, Some(Cow::Borrowed("t1"))), "{o:?}");
        assert!(matches!(o.context_id, Some(Cow::Borrowed("c1"))), "{o:?}");
        // An escaped string cannot be borrowed, and still reads right.
        let o = observe(Binding::Rest, br#"{"task":{"id":"t\"1","status":{}}}"#).unwrap();
        assert_eq!(o.task_id.as_deref(), Some("t\"1"));
    }

    #[test]
    fn rest_documents() {
        let table: Vec<(&str, Option<Observation>)> = vec![
            (
                r#"{"task":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_SUBMITTED"}}}"#,
                Some(obs(Some("t1"), Some(Submitted))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING","timestamp":"x"},"metadata":{"a":[1,2,{"b":null}]}}}"#,
                Some(obs(Some("t1"), Some(Working))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_INPUT_REQUIRED","message":{"parts":[{"text":"?"}]}}}}"#,
                Some(obs(Some("t1"), Some(InputRequired))),
            ),
            (
                r#"{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"},"metadata":{"a2a-rust.com/budget":{"remainingMs":5,"meters":{"tokens":9},"spent":{"tokens":12.0,"calls":3,"odd":1.5}}}}}"#,
                Some(Observation {
                    spent: Some([("calls".to_owned(), 3), ("tokens".to_owned(), 12)].into()),
                    ..obs(Some("t1"), Some(Working))
                }),
            ),
            (
                r#"{"artifactUpdate":{"taskId":"t1","contextId":"c1","artifact":{"parts":[]}}}"#,
                Some(obs(Some("t1"), None)),
            ),
            (
                r#"{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_CANCELED"}}"#,
                Some(obs(Some("t1"), Some(Canceled))),
            ),
            (
                r#"{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[],"contextId":"c1"}}"#,
                Some(Observation {
                    context_id: Some("c1".into()),
                    message_only: true,
                    ..Default::default()
                }),
            ),
            (
                r#"{"message":{"messageId":"m","taskId":"t1","contextId":"c1"}}"#,
                Some(obs(Some("t1"), None)),
            ),
            (
                r#"{"error":{"code":404,"status":"NOT_FOUND","message":"x"}}"#,
                Some(Observation {
                    error: true,
                    ..Default::default()
                }),
            ),
            (
                r#"{"task":{"id":"t\"1","contextId":"c1","status":{"state":"weird"}}}"#,
                Some(obs(Some("t\"1"), None)),
            ),
            ("not json", None),
            (r#"[1,2]"#, None),
            (r#"{}"#, Some(Observation::default())),
        ];
        for (doc, want) in table {
            assert_eq!(observe(Binding::Rest, doc.as_bytes()), want, "{doc}");
            let reference = reference::observe(Binding::Rest, doc.as_bytes());
            assert_eq!(reference, want, "reference: {doc}");
        }
    }

    #[test]
    fn jsonrpc_documents() {
        let table: Vec<(&str, Option<Observation>)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_WORKING"}}}}"#,
                Some(obs(Some("t1"), Some(Working))),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"x","result":{"statusUpdate":{"taskId":"t1","contextId":"c1","status":{"state":"TASK_STATE_COMPLETED"}}}}"#,
                Some(obs(Some("t1"), Some(Completed))),
            ),
            (
                r#"{"id":null,"jsonrpc":"2.0","result":{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_FAILED"}}}"#,
                Some(obs(Some("t1"), Some(Failed))),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Task not found"}}"#,
                Some(Observation {
                    error: true,
                    ..Default::default()
                }),
            ),
            (r#"{"jsonrpc":"2.0","id":1}"#, None),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"status":"stream_complete"}}"#,
                None,
            ),
        ];
        for (doc, want) in table {
            let got = observe(Binding::JsonRpc, doc.as_bytes());
            // `{"status":"stream_complete"}` has a string status: not a task.
            assert_eq!(got.filter(|o| !o.is_empty() || o.error), want, "{doc}");
            let reference = reference::observe(Binding::JsonRpc, doc.as_bytes());
            assert_eq!(
                reference.filter(|o| !o.is_empty() || o.error),
                want,
                "{doc}"
            );
        }
    }

    /// Both readers on one document: the same answer wherever the reference
    /// reads it or `serde_json::Value` does (a well-formed document that the
    /// reference refuses is refused by the walk too), and the same strings
    /// borrowed. Returns the walk's answer, whether it read a document the
    /// reference refused (only a malformed one may be), and whether both
    /// refused a well-formed one.
    fn compare(binding: Binding, doc: &[u8]) -> (Option<Observation<'_>>, bool, bool) {
        let got = observe(binding, doc);
        if !may_settle(doc) {
            let state = got.as_ref().and_then(|o| o.state);
            assert!(
                !state.is_some_and(TaskState::is_settled),
                "may_settle missed {state:?} in {}",
                String::from_utf8_lossy(doc)
            );
        }
        let want = reference::observe(binding, doc);
        let text = String::from_utf8_lossy(doc);
        let well_formed = serde_json::from_slice::<serde_json::Value>(doc).is_ok();
        if want.is_some() || well_formed {
            assert_eq!(got, want, "{binding:?} {text}");
            if let (Some(g), Some(w)) = (&got, &want) {
                let borrowed = |o: &Observation| {
                    [&o.task_id, &o.context_id].map(|c| matches!(c, Some(Cow::Borrowed(_))))
                };
                assert_eq!(borrowed(g), borrowed(w), "{binding:?} {text}");
            }
        }
        let lenient = want.is_none() && got.is_some();
        (got, lenient, well_formed && want.is_none())
    }

    /// Generated answers (JSON-RPC and REST): the members the readers look
    /// for, at the places they look and elsewhere, with escapes in keys and
    /// strings, `null`s, values of the wrong type, members given twice,
    /// structs as arrays of their fields, budget reports, whitespace; each
    /// also cut short at a random byte and with a random byte changed.
    #[test]
    fn agrees_with_the_serde_reference() {
        struct Gen(u64);
        impl Gen {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn one_in(&mut self, n: u64) -> bool {
                self.next().is_multiple_of(n)
            }
            fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
                of[(self.next() % of.len() as u64) as usize]
            }
            fn ws(&mut self) -> &'static str {
                self.pick(&["", "", "", "", " ", "\n  ", "\t"])
            }
            /// The members an object under `parent` is made of, in the
            /// reference's field order (for the array form) and then some
            /// it does not read; spelt as JSON keys, sometimes escaped.
            fn names(parent: &str) -> (&'static [&'static str], &'static [&'static str]) {
                match parent {
                    "rpc" => (&["result", "error"], &["jsonrpc", "id", "task"]),
                    "result" => (
                        &[
                            "task",
                            "message",
                            "statusUpdate",
                            "artifactUpdate",
                            "id",
                            "contextId",
                            "status",
                            "error",
                        ],
                        &["kind", "artifacts", "taskId", "state"],
                    ),
                    "task" => (
                        &["id", "contextId", "status"],
                        &["artifacts", "history", "taskId"],
                    ),
                    "message" => (
                        &["taskId", "contextId"],
                        &["messageId", "parts", "role", "id"],
                    ),
                    "statusUpdate" | "artifactUpdate" => (
                        &["taskId", "contextId", "status", "metadata"],
                        &["final", "artifact", "id", "state"],
                    ),
                    "status" => (&["state"], &["message", "timestamp", "id"]),
                    "metadata" => (&["a2a-rust.com/budget"], &["a2a-rust.com/lease", "x"]),
                    "a2a-rust.com/budget" => (&["spent"], &["remainingMs", "meters"]),
                    "spent" => (&[], &["tokens", "calls", "odd"]),
                    _ => (&[], &["x", "id", "state", "taskId", "spent"]),
                }
            }
            fn key(&mut self, name: &str, out: &mut String) {
                out.push('"');
                if self.one_in(8) && name.len() > 1 {
                    // The same key with an escape: `\u0074` for its
                    // second character, or `\/` for a slash.
                    let mut chars = name.chars();
                    let first = chars.next().unwrap();
                    let second = chars.next().unwrap();
                    out.push(first);
                    if second == '/' {
                        out.push_str("\\/");
                    } else {
                        out.push_str(&format!("\\u{:04x}", second as u32));
                    }
                    out.extend(chars);
                } else {
                    out.push_str(&name.replace('/', if self.one_in(6) { "\\/" } else { "/" }));
                }
                out.push('"');
            }
            fn string(&mut self, name: &str) -> &'static str {
                match name {
                    "state" => self.pick(&[
                        r#""TASK_STATE_WORKING""#,
                        r#""TASK_STATE_COMPLETED""#,
                        r#""TASK_STATE_\u0043ANCELED""#,
                        r#""working""#,
                        r#""weird""#,
                        r#""""#,
                    ]),
                    _ => self.pick(&[
                        r#""t1""#,
                        r#""t2""#,
                        r#""c1""#,
                        r#""t\"1""#,
                        r#""\u00e9\\ ]}""#,
                        r#""é""#,
                        r#""""#,
                        r#""TASK_STATE_FAILED""#,
                    ]),
                }
            }
            fn scalar(&mut self) -> &'static str {
                self.pick(&[
                    "0",
                    "3",
                    "12.0",
                    "1.5",
                    "-3",
                    "1e2",
                    "-0",
                    "18446744073709551615",
                    "18446744073709551616",
                    "1e999",
                    "null",
                    "true",
                    "false",
                    r#""x""#,
                    r#""t1""#,
                ])
            }
            /// A value for the member `name`: mostly of the type the
            /// reference reads it as, sometimes not.
            fn value(&mut self, name: &str, depth: u32, out: &mut String) {
                let (fields, _) = Self::names(name);
                let is_struct = !fields.is_empty() || matches!(name, "spent" | "x" | "meters");
                let is_text = matches!(name, "id" | "taskId" | "contextId" | "state");
                if self.one_in(12) || depth > 7 {
                    return out.push_str(if self.one_in(2) {
                        "null"
                    } else {
                        self.scalar()
                    });
                }
                if self.one_in(30) {
                    // Of another type.
                    return match self.next() % 3 {
                        0 => out.push_str(self.scalar()),
                        1 => self.object("x", depth + 1, out),
                        _ => self.array("x", depth + 1, out),
                    };
                }
                if is_text {
                    out.push_str(self.string(name));
                } else if is_struct && !fields.is_empty() && self.one_in(25) {
                    // The array form: the fields in order, maybe one too
                    // many or too few.
                    out.push('[');
                    let n = (self.next() % (fields.len() as u64 + 2)) as usize;
                    for i in 0..n {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(self.ws());
                        let f = fields.get(i).copied().unwrap_or("x");
                        self.value(f, depth + 1, out);
                    }
                    out.push(']');
                } else if is_struct {
                    self.object(name, depth + 1, out);
                } else if name == "tokens" || name == "calls" || name == "odd" {
                    out.push_str(self.scalar());
                } else {
                    match self.next() % 3 {
                        0 => self.array("x", depth + 1, out),
                        1 => out.push_str(self.string("")),
                        _ => out.push_str(self.scalar()),
                    }
                }
            }
            fn array(&mut self, name: &str, depth: u32, out: &mut String) {
                out.push('[');
                let n = self.next() % 3;
                for i in 0..n {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(self.ws());
                    self.value(name, depth + 1, out);
                }
                out.push(']');
            }
            fn object(&mut self, parent: &str, depth: u32, out: &mut String) {
                let (fields, others) = Self::names(parent);
                // Members in a random order, mostly each once; sometimes
                // one again (a duplicate).
                let mut names = Vec::new();
                for (i, name) in fields.iter().chain(others).enumerate() {
                    // An error hides the rest: seldom.
                    let known = i < fields.len() && (*name != "error" || self.one_in(5));
                    if (known && !self.one_in(4)) || self.one_in(3) {
                        names.push(*name);
                    }
                }
                for i in (1..names.len()).rev() {
                    let j = (self.next() % (i as u64 + 1)) as usize;
                    names.swap(i, j);
                }
                names.truncate(6);
                if self.one_in(16) && !names.is_empty() {
                    let again = names[(self.next() % names.len() as u64) as usize];
                    names.push(again);
                }
                out.push('{');
                for (i, name) in names.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(self.ws());
                    self.key(name, out);
                    out.push_str(self.ws());
                    out.push(':');
                    out.push_str(self.ws());
                    self.value(name, depth, out);
                    out.push_str(self.ws());
                }
                out.push('}');
            }
        }

        let mut g = Gen(0x2545_F491_4F6C_DD1D);
        let (mut read, mut tasks, mut spent, mut lenient, mut refused) = (0, 0, 0, 0, 0);
        // Documents `may_settle` clears, and of them those read with a state.
        let (mut unsettling, mut stated) = (0, 0);
        for round in 0..40_000 {
            let binding = if round % 2 == 0 {
                Binding::JsonRpc
            } else {
                Binding::Rest
            };
            let mut doc = String::new();
            doc.push_str(g.ws());
            if g.one_in(40) {
                g.value(
                    if binding == Binding::Rest {
                        "result"
                    } else {
                        "rpc"
                    },
                    0,
                    &mut doc,
                );
            } else {
                g.object(
                    if binding == Binding::Rest {
                        "result"
                    } else {
                        "rpc"
                    },
                    0,
                    &mut doc,
                );
            }
            doc.push_str(g.ws());
            let (o, _, no) = compare(binding, doc.as_bytes());
            // The same document without its escapes (some then malformed),
            // for `may_settle`: most generated documents hold one.
            let plain = doc.replace('\\', "");
            let (p, _, _) = compare(binding, plain.as_bytes());
            if !may_settle(plain.as_bytes()) {
                unsettling += 1;
                stated += usize::from(p.is_some_and(|p| p.state.is_some()));
            }
            refused += usize::from(no);
            if let Some(o) = o {
                read += 1;
                tasks += usize::from(o.task_id.is_some());
                spent += usize::from(o.spent.as_ref().is_some_and(|s| !s.is_empty()));
            }
            let mut bytes = doc.into_bytes();
            let cut = (g.next() as usize) % (bytes.len() + 1);
            let (_, more, no) = compare(binding, &bytes[..cut]);
            (lenient, refused) = (lenient + usize::from(more), refused + usize::from(no));
            let at = (g.next() as usize) % bytes.len();
            bytes[at] = *g
                .pick(&[
                    "\"", "\\", "{", "}", "[", "]", ",", ":", "x", "0", " ", "\u{1}", "\u{ff}",
                ])
                .as_bytes()
                .last()
                .unwrap();
            let (_, more, no) = compare(binding, &bytes);
            (lenient, refused) = (lenient + usize::from(more), refused + usize::from(no));
        }
        assert!(read > 8_000, "only {read} documents were read");
        assert!(tasks > 3_000, "only {tasks} named a task");
        assert!(spent > 100, "only {spent} reported a spend");
        assert!(
            unsettling > 5_000 && stated > 20,
            "may_settle cleared {unsettling} documents, {stated} of them with a state"
        );
        // Well-formed documents both refuse (a member given twice or of the
        // wrong type): many.
        assert!(refused > 5_000, "only {refused} well-formed refusals");
        // Changed bytes the walk does not look at: read, where serde
        // refuses the whole document.
        assert!(lenient > 0);
    }

    /// What the walk reads that the reference refuses: documents malformed
    /// only where the walk skips. And what both refuse.
    #[test]
    fn malformed_where_skipped() {
        #[rustfmt::skip]
        let lenient: &[&str] = &[
            r#"{"result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING"},"artifacts":[1,]}}}"#,
            r#"{"id":01,"result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING"}}}}"#,
            r#"{"jsonrpc":"2.0\x","result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING"}}}}"#,
            r#"{"jsonrpc":nul,"result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING"}}}}"#,
            r#"{"result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING","x":{]}}}}"#,
        ];
        for doc in lenient {
            assert_eq!(
                reference::observe(Binding::JsonRpc, doc.as_bytes()),
                None,
                "{doc}"
            );
            assert_eq!(
                observe(Binding::JsonRpc, doc.as_bytes()),
                Some(Observation {
                    context_id: None,
                    ..obs(Some("t1"), Some(Working))
                }),
                "{doc}"
            );
        }
        #[rustfmt::skip]
        let refused: &[&str] = &[
            // The members read, given twice or of the wrong type.
            r#"{"result":{"task":{"id":"t1","id":"t2","status":{}}}}"#,
            r#"{"result":{"task":{"id":"t1","status":{"state":"TASK_STATE_WORKING","state":"TASK_STATE_COMPLETED"}}}}"#,
            r#"{"result":{"statusUpdate":{"taskId":"t1","taskI\u0064":"t2"}}}"#,
            r#"{"result":{"task":{"id":"t1"},"task":{"id":"t2"}}}"#,
            r#"{"result":{},"result":{"task":{"id":"t1"}}}"#,
            r#"{"result":{"task":{"id":"t1"}},"error":null,"error":null}"#,
            r#"{"result":{"task":{"id":1}}}"#,
            r#"{"result":{"task":{"contextId":"c1"}}}"#,
            r#"{"result":{"task":{"id":null}}}"#,
            r#"{"result":{"task":"t1"}}"#,
            r#"{"result":{"task":{"id":"t1","status":"TASK_STATE_WORKING"}}}"#,
            r#"{"result":{"task":{"id":"t1","status":{"state":5}}}}"#,
            r#"{"result":{"task":["t1",null,null,null]}}"#,
            r#"{"result":{"statusUpdate":{"taskId":"t1","metadata":{"a2a-rust.com/budget":{"spent":[1]}}}}}"#,
            r#"{"result":{"statusUpdate":{"taskId":"t1","metadata":{"a2a-rust.com/budget":{"spent":{"tokens":1e999}}}}}}"#,
            // Kept strings that are not text, and not JSON at all.
            "{\"result\":{\"task\":{\"id\":\"t\u{1}1\"}}}",
            r#"{"result":{"task":{"id":"t\ud8001"}}}"#,
            r#"{"result":{"task":{"id":"t1"}}} x"#,
            r#"{"result":{"task":{"id":"t1"}}"#,
            "",
            "null",
        ];
        for doc in refused {
            let walk = observe(Binding::JsonRpc, doc.as_bytes());
            let reference = reference::observe(Binding::JsonRpc, doc.as_bytes());
            assert_eq!(walk, None, "{doc}");
            assert_eq!(reference, None, "reference: {doc}");
        }
        let invalid_utf8 = b"{\"result\":{\"task\":{\"id\":\"t\xff\"}}}";
        assert_eq!(observe(Binding::JsonRpc, invalid_utf8), None);
    }

    /// serde's derive reads a struct from an array of its fields in order;
    /// so does the walk, that the two agree.
    #[test]
    fn structs_as_arrays() {
        #[rustfmt::skip]
        let table: &[(&str, Option<Observation>)] = &[
            (r#"[{"task":["t1","c1",["TASK_STATE_WORKING"]]}]"#, Some(obs(Some("t1"), Some(Working)))),
            (r#"[null,{"code":1}]"#, Some(Observation { error: true, ..Default::default() })),
            (r#"{"result":[]}"#, Some(Observation::default())),
            (r#"{"result":[null,null,{"taskId":"t1","contextId":"c1"}]}"#, Some(obs(Some("t1"), None))),
            (r#"{"result":{"task":[]}}"#, None),
            (r#"{"result":{"task":["t1",null,null,1]}}"#, None),
            (r#"[]"#, None),
        ];
        for (doc, want) in table {
            assert_eq!(&observe(Binding::JsonRpc, doc.as_bytes()), want, "{doc}");
            assert_eq!(
                &reference::observe(Binding::JsonRpc, doc.as_bytes()),
                want,
                "{doc}"
            );
        }
    }
}
