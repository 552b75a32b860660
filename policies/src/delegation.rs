//! Delegation trees: how a request through the gateway names itself to the
//! worker (its reference in the W3C trace context), how a send that carries
//! such a reference becomes a child of the task that request fed, and what
//! the end of a parent means for its children.
//!
//! The reference travels as the gateway's own `tracestate` list member
//! ([`MEMBER`]), which OpenTelemetry-instrumented agents propagate unchanged
//! to the calls they make while serving the request; or as a `baggage`
//! member of the same name. Its value is minted and checked by the gateway
//! (a keyed hash: see `gateway/src/link.rs`); this module only formats,
//! finds and decides.

use crate::TaskState;

/// The gateway's `tracestate` list member key (and `baggage` member name).
pub const MEMBER: &str = "a2agw";

/// The most `tracestate` list members forwarded (W3C Trace Context: a
/// vendor may drop members beyond 32, from the end).
pub const TRACESTATE_MEMBERS: usize = 32;

/// Bytes in a reference and in its tag.
pub const REF_BYTES: usize = 8;

/// The deepest a tree may grow unless the config says otherwise: a send
/// whose parent is this deep is not linked.
pub const DEFAULT_MAX_DEPTH: u8 = 8;

/// A reference as it travels: which request (`reference`, a keyed hash of
/// its route, tenant and message or task), how deep its task is in its
/// tree, the deadline of its budget if it has one (Unix ms: its children
/// inherit it), whether the store keeps its budget's meters for children
/// on other replicas (`metered`), and the tag that proves the gateway
/// wrote them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wire {
    pub reference: [u8; REF_BYTES],
    /// At most [`MAX_DEPTH`].
    pub depth: u8,
    pub deadline_ms: Option<u64>,
    pub metered: bool,
    pub tag: [u8; REF_BYTES],
}

/// The deepest any tree may be configured to grow: depth travels in the
/// low 7 bits of its byte, `metered` in the high bit.
pub const MAX_DEPTH: u8 = 0x7f;
const METERED: u8 = 0x80;

/// Hex digits of a value without, and with, a deadline.
const SHORT: usize = 2 * (2 * REF_BYTES + 1);
const LONG: usize = SHORT + 16;

impl Wire {
    /// The member's value: 34 lowercase hex digits (reference, depth, tag),
    /// or 50 with a deadline (reference, depth, deadline, tag), within
    /// what `tracestate` and `baggage` values allow unescaped.
    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(LONG);
        hex_into(&mut s, &self.reference);
        hex_into(&mut s, &[self.depth_byte()]);
        if let Some(d) = self.deadline_ms {
            hex_into(&mut s, &d.to_be_bytes());
        }
        hex_into(&mut s, &self.tag);
        s
    }

    /// Reads a member's value; anything but exactly [`Wire::encode`]'s
    /// forms is `None` (not the gateway's, or altered).
    pub fn decode(value: &str) -> Option<Wire> {
        let b = value.as_bytes();
        if b.len() != SHORT && b.len() != LONG {
            return None;
        }
        let mut out = [0u8; LONG / 2];
        let out = &mut out[..b.len() / 2];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
        }
        let mut reference = [0u8; REF_BYTES];
        let mut tag = [0u8; REF_BYTES];
        reference.copy_from_slice(&out[..REF_BYTES]);
        tag.copy_from_slice(&out[out.len() - REF_BYTES..]);
        let deadline_ms = (b.len() == LONG).then(|| {
            let mut d = [0u8; 8];
            d.copy_from_slice(&out[REF_BYTES + 1..REF_BYTES + 9]);
            u64::from_be_bytes(d)
        });
        Some(Wire {
            reference,
            depth: out[REF_BYTES] & MAX_DEPTH,
            deadline_ms,
            metered: out[REF_BYTES] & METERED != 0,
            tag,
        })
    }

    /// Depth and `metered` as one byte, as encoded (and tagged).
    pub fn depth_byte(&self) -> u8 {
        (self.depth & MAX_DEPTH) | if self.metered { METERED } else { 0 }
    }
}

/// Lowercase hex of `bytes`, appended.
pub fn hex_into(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// The value of list member `key` in a `tracestate` (the header's lines
/// joined by `,`): members are `key=value`, separated by commas with
/// optional spaces and tabs; the first member of that key counts.
pub fn tracestate_member<'a>(tracestate: &'a str, key: &str) -> Option<&'a str> {
    tracestate.split(',').find_map(|m| {
        let (k, v) = m.trim_matches([' ', '\t']).split_once('=')?;
        (k == key).then_some(v)
    })
}

/// The value of member `key` in a `baggage` header (`key=value;props`,
/// comma separated; the value as sent, not percent-decoded: the gateway's
/// own value needs none).
pub fn baggage_member<'a>(baggage: &'a str, key: &str) -> Option<&'a str> {
    baggage.split(',').find_map(|m| {
        let m = m.split(';').next()?;
        let (k, v) = m.split_once('=')?;
        (k.trim_matches([' ', '\t']) == key).then(|| v.trim_matches([' ', '\t']))
    })
}

/// The `tracestate` a worker gets: `key=value` first (W3C: a vendor that
/// updates its member moves it to the front), then the caller's members
/// in their order, without any other of `key` and without empty ones, at
/// most [`TRACESTATE_MEMBERS`] in all (the last ones dropped).
pub fn with_member(tracestate: Option<&str>, key: &str, value: &str) -> String {
    let mut out =
        String::with_capacity(key.len() + value.len() + 1 + tracestate.map_or(0, str::len));
    out.push_str(key);
    out.push('=');
    out.push_str(value);
    let mut members = 1;
    for m in tracestate.unwrap_or("").split(',') {
        if members == TRACESTATE_MEMBERS {
            break;
        }
        let m = m.trim_matches([' ', '\t']);
        if m.is_empty() || m.split_once('=').is_some_and(|(k, _)| k == key) {
            continue;
        }
        out.push(',');
        out.push_str(m);
        members += 1;
    }
    out
}

/// Whether a `traceparent` is one the gateway can keep: version `00`
/// form (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero) or a later
/// version that starts so (W3C: read its first four fields).
pub fn traceparent_valid(tp: &str) -> bool {
    let b = tp.trim_matches([' ', '\t']).as_bytes();
    if b.len() < 55 || (b.len() > 55 && (b[..2] == *b"00" || b[55] != b'-')) {
        return false;
    }
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(|c| nibble(*c).is_some());
    let nonzero = |r: std::ops::Range<usize>| b[r].iter().any(|c| *c != b'0');
    b[2] == b'-'
        && b[35] == b'-'
        && b[52] == b'-'
        && hex(0..2)
        && b[..2] != *b"ff"
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
        && nonzero(3..35)
        && nonzero(36..52)
}

/// The request header by which a caller names its send's parent task
/// itself: `route=<route>;task=<task id>[;tenant=<tenant>]` (the route as
/// the gateway's config names it; values as they are, no quoting). It
/// wins over a reference in the trace context.
pub const PARENT_HEADER: &str = "a2a-parent-task";

/// A parent named by [`PARENT_HEADER`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExplicitParent<'a> {
    pub route: &'a str,
    pub task: &'a str,
    /// `""`: none.
    pub tenant: &'a str,
}

/// Reads [`PARENT_HEADER`]'s value; `None` unless it names a route and a
/// task, each once, and nothing else.
pub fn explicit_parent(value: &str) -> Option<ExplicitParent<'_>> {
    let (mut route, mut task, mut tenant) = (None, None, None);
    for part in value.split(';') {
        let (k, v) = part.trim_matches([' ', '\t']).split_once('=')?;
        let slot = match k.trim_matches([' ', '\t']) {
            "route" => &mut route,
            "task" => &mut task,
            "tenant" => &mut tenant,
            _ => return None,
        };
        if slot.replace(v.trim_matches([' ', '\t'])).is_some() {
            return None;
        }
    }
    let (route, task) = (
        route.filter(|r| !r.is_empty())?,
        task.filter(|t| !t.is_empty())?,
    );
    Some(ExplicitParent {
        route,
        task,
        tenant: tenant.unwrap_or(""),
    })
}

/// What a request's reference makes of the send that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// The send's new task is a child of the reference's task, at `depth`.
    Child { depth: u8 },
    /// No parent: the task is a root (depth 0).
    Root,
    /// The parent is [`DEFAULT_MAX_DEPTH`] (or the configured most) deep:
    /// not linked, counted; the task is a root.
    TooDeep,
    /// A send that continues a task: an existing task never gains a parent
    /// (so that no link can close a cycle), whatever it carries.
    Continues,
}

/// Whether a send becomes a child. `parent_depth`: the depth a valid
/// reference it carries names (`None`: it carries none, or one the gateway
/// did not write); `new_task`: it names no task (it starts one).
pub fn link(parent_depth: Option<u8>, new_task: bool, max_depth: u8) -> Link {
    match (parent_depth, new_task) {
        (None, _) => Link::Root,
        (Some(_), false) => Link::Continues,
        (Some(d), true) if d >= max_depth => Link::TooDeep,
        (Some(d), true) => Link::Child { depth: d + 1 },
    }
}

impl Link {
    /// The depth of the task the request feeds, which its own reference
    /// carries on: a child's, else 0 (a continued task's depth is not
    /// known here; its reference says 0, so a tree under it may grow
    /// `max_depth` below it: bounded all the same).
    pub fn depth(self) -> u8 {
        match self {
            Link::Child { depth } => depth,
            _ => 0,
        }
    }

    /// Label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Link::Child { .. } => "child",
            Link::Root => "root",
            Link::TooDeep => "too_deep",
            Link::Continues => "continues",
        }
    }
}

/// What a route does with the running children of a parent that ended
/// well (completed): the parent may have meant them to outlive it (a
/// background job it started and reported), or may have dropped them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnParentCompleted {
    /// Left running (the default: cancelling is irreversible, a child kept
    /// costs what its own budget and lease allow).
    #[default]
    Keep,
    /// Cancelled, as the a2a-rust SDK's `Delegation` cancels a child whose
    /// handle is dropped before it settled.
    Cancel,
}

/// Why a tree's children are cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeCause {
    /// The parent ended CANCELED.
    ParentCanceled,
    /// The parent ended FAILED or REJECTED.
    ParentFailed,
    /// The parent COMPLETED and the route cancels children left running.
    ParentCompleted,
}

impl TreeCause {
    /// Label for logs and metrics (and the cancel's `cause`).
    pub fn as_str(self) -> &'static str {
        match self {
            TreeCause::ParentCanceled => "parent_canceled",
            TreeCause::ParentFailed => "parent_failed",
            TreeCause::ParentCompleted => "parent_completed",
        }
    }
}

/// Whether a parent's end in `state` cancels its unsettled children.
/// Interrupted states (input-required, auth-required) hand the parent
/// back: its children wait with it.
pub fn on_parent_end(state: TaskState, completed: OnParentCompleted) -> Option<TreeCause> {
    match state {
        TaskState::Canceled => Some(TreeCause::ParentCanceled),
        TaskState::Failed | TaskState::Rejected => Some(TreeCause::ParentFailed),
        TaskState::Completed => {
            (completed == OnParentCompleted::Cancel).then_some(TreeCause::ParentCompleted)
        }
        TaskState::Unspecified
        | TaskState::Submitted
        | TaskState::Working
        | TaskState::InputRequired
        | TaskState::AuthRequired => None,
    }
}

/// How a cancel of the gateway's for a task ended, as its children care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelSeen {
    /// The worker accepted it.
    Canceled,
    /// The task had ended already.
    NotCancelable,
    /// The worker does not know the task.
    NotFound,
    /// Every attempt failed (the worker unreachable, or refusing).
    Failed,
    /// Another replica carries it now.
    NotOwed,
}

/// What follows for a task's children from a cancel of the gateway's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterCancel {
    /// The task ended so: its children follow ([`on_parent_end`]).
    Ended(TaskState),
    /// It ended, how is not known: the worker is asked.
    Ask,
    /// Nothing yet.
    Nothing,
}

/// A cancelled task ended CANCELED; one that had ended already, as the
/// worker will say. A task whose lease lapsed (`lapsed`: its caller is gone
/// for good) takes its children with it even when its own worker lost it or
/// cannot be reached: a parent SIGKILLed with its worker leaves orphans that
/// only the gateway can still stop.
pub fn after_cancel(seen: CancelSeen, lapsed: bool) -> AfterCancel {
    match seen {
        CancelSeen::Canceled => AfterCancel::Ended(TaskState::Canceled),
        CancelSeen::NotCancelable => AfterCancel::Ask,
        CancelSeen::NotFound | CancelSeen::Failed if lapsed => {
            AfterCancel::Ended(TaskState::Canceled)
        }
        CancelSeen::NotFound | CancelSeen::Failed | CancelSeen::NotOwed => AfterCancel::Nothing,
    }
}

/// What a tree cancel does to one child, from its state as known (`None`:
/// not known: the worker is asked first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildAction {
    /// Ask the worker its state, then decide again.
    Probe,
    /// Send `CancelTask`.
    Cancel,
    /// Leave it: it ended, or it is handed back (input-required,
    /// auth-required: as the cascade, never cancelled).
    Keep,
}

pub fn child_action(state: Option<TaskState>) -> ChildAction {
    match state {
        None => ChildAction::Probe,
        Some(s) if s.is_settled() => ChildAction::Keep,
        Some(_) => ChildAction::Cancel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trips_and_refuses_anything_else() {
        let w = Wire {
            reference: [0, 1, 2, 0xab, 0xcd, 0xef, 0x10, 0xff],
            depth: 3,
            deadline_ms: None,
            metered: false,
            tag: [9; 8],
        };
        let s = w.encode();
        assert_eq!(s, "000102abcdef10ff030909090909090909");
        assert_eq!(Wire::decode(&s), Some(w));
        let with = Wire {
            deadline_ms: Some(0x0102_0304_0506_0708),
            ..w
        };
        let s = with.encode();
        assert_eq!(s, "000102abcdef10ff0301020304050607080909090909090909");
        assert_eq!(Wire::decode(&s), Some(with));
        assert_eq!(Wire::decode(&s[..49]), None);
        let metered = Wire {
            metered: true,
            ..with
        };
        let s = metered.encode();
        assert_eq!(s, "000102abcdef10ff8301020304050607080909090909090909");
        assert_eq!(Wire::decode(&s), Some(metered));
        for bad in [
            "",
            "000102abcdef10ff03090909090909090",
            "000102abcdef10ff0309090909090909090",
            "000102ABCDEF10ff030909090909090909",
            "000102abcdef10ff03090909090909090g",
            " 00102abcdef10ff030909090909090909",
        ] {
            assert_eq!(Wire::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tracestate_members_found() {
        let cases: &[(&str, Option<&str>)] = &[
            ("a2agw=1", Some("1")),
            ("x=1,a2agw=2", Some("2")),
            ("x=1 , \ta2agw=2 ,y=3", Some("2")),
            ("x=1,a2agw=2,a2agw=3", Some("2")),
            ("xa2agw=1", None),
            ("a2agw", None),
            ("", None),
            ("vendor@a2agw=1", None),
        ];
        for (ts, want) in cases {
            assert_eq!(tracestate_member(ts, MEMBER), *want, "{ts:?}");
        }
    }

    #[test]
    fn baggage_members_found() {
        let cases: &[(&str, Option<&str>)] = &[
            ("a2agw=1", Some("1")),
            ("user=x, a2agw = 2 ;prop=1", Some("2")),
            ("a2agwx=1", None),
            ("user=a2agw=1", None),
        ];
        for (b, want) in cases {
            assert_eq!(baggage_member(b, MEMBER), *want, "{b:?}");
        }
    }

    #[test]
    fn member_goes_first_and_the_callers_stay() {
        assert_eq!(with_member(None, MEMBER, "v"), "a2agw=v");
        assert_eq!(with_member(Some(""), MEMBER, "v"), "a2agw=v");
        assert_eq!(
            with_member(Some("x=1, a2agw=old ,y=2,,"), MEMBER, "v"),
            "a2agw=v,x=1,y=2"
        );
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let out = with_member(Some(&many.join(",")), MEMBER, "v");
        let members: Vec<&str> = out.split(',').collect();
        assert_eq!(members.len(), TRACESTATE_MEMBERS);
        assert_eq!(members[0], "a2agw=v");
        assert_eq!(members[1], "k0=v");
        assert_eq!(members[31], "k30=v");
    }

    #[test]
    fn traceparents() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(traceparent_valid(ok));
        assert!(traceparent_valid(&format!("01{}-extra", &ok[2..])));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!traceparent_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn explicit_parents() {
        let p = |route, task, tenant| {
            Some(ExplicitParent {
                route,
                task,
                tenant,
            })
        };
        let cases: &[(&str, Option<ExplicitParent<'_>>)] = &[
            ("route=p;task=t-1", p("p", "t-1", "")),
            (" task = t-1 ; route=p ;tenant=acme", p("p", "t-1", "acme")),
            ("route=p;task=a=b", p("p", "a=b", "")),
            ("route=p", None),
            ("task=t", None),
            ("route=;task=t", None),
            ("route=p;task=t;route=q", None),
            ("route=p;task=t;other=x", None),
            ("route=p;task=t;", None),
            ("", None),
        ];
        for (v, want) in cases {
            assert_eq!(explicit_parent(v), *want, "{v:?}");
        }
    }

    #[test]
    fn link_table() {
        let cases = [
            (None, true, 8, Link::Root),
            (None, false, 8, Link::Root),
            (Some(0), true, 8, Link::Child { depth: 1 }),
            (Some(7), true, 8, Link::Child { depth: 8 }),
            (Some(8), true, 8, Link::TooDeep),
            (Some(255), true, 8, Link::TooDeep),
            (Some(0), false, 8, Link::Continues),
            (Some(0), true, 0, Link::TooDeep),
        ];
        for (parent, new_task, max, want) in cases {
            assert_eq!(link(parent, new_task, max), want, "{parent:?} {new_task}");
        }
        assert_eq!(Link::Child { depth: 3 }.depth(), 3);
        assert_eq!(Link::TooDeep.depth(), 0);
    }

    #[test]
    fn parent_end_table() {
        use OnParentCompleted::{Cancel, Keep};
        for s in TaskState::ALL {
            let want = match s {
                TaskState::Canceled => Some(TreeCause::ParentCanceled),
                TaskState::Failed | TaskState::Rejected => Some(TreeCause::ParentFailed),
                _ => None,
            };
            assert_eq!(on_parent_end(s, Keep), want, "{s}");
        }
        assert_eq!(
            on_parent_end(TaskState::Completed, Cancel),
            Some(TreeCause::ParentCompleted)
        );
        assert_eq!(on_parent_end(TaskState::InputRequired, Cancel), None);
    }

    #[test]
    fn after_cancel_table() {
        use AfterCancel::*;
        use CancelSeen::*;
        let cases = [
            (Canceled, false, Ended(TaskState::Canceled)),
            (Canceled, true, Ended(TaskState::Canceled)),
            (NotCancelable, false, Ask),
            (NotCancelable, true, Ask),
            (NotFound, false, Nothing),
            (NotFound, true, Ended(TaskState::Canceled)),
            (Failed, false, Nothing),
            (Failed, true, Ended(TaskState::Canceled)),
            (NotOwed, false, Nothing),
            (NotOwed, true, Nothing),
        ];
        for (seen, lapsed, want) in cases {
            assert_eq!(after_cancel(seen, lapsed), want, "{seen:?} {lapsed}");
        }
    }

    #[test]
    fn child_table() {
        assert_eq!(child_action(None), ChildAction::Probe);
        for s in TaskState::ALL {
            let want = if s.is_settled() {
                ChildAction::Keep
            } else {
                ChildAction::Cancel
            };
            assert_eq!(child_action(Some(s)), want, "{s}");
        }
        assert_eq!(
            child_action(Some(TaskState::InputRequired)),
            ChildAction::Keep
        );
    }
}
