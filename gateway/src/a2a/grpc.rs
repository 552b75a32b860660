//! The gRPC binding (`lf.a2a.v1.A2AService`): gRPC's length-prefixed
//! messages read as they pass, and the few fields of A2A's protobuf
//! messages that policy needs.
//!
//! Sends (`SendMessage`, `SendStreamingMessage`), read before the worker
//! sees them, and answers, read once per streamed message, are walked field
//! by field on prost's own wire primitives and borrow their bytes
//! (`send_view`, [`observe`]): an answer costs no allocation, a send only
//! the few facts policy keeps. Other requests, and the messages the gateway
//! writes, use prost views of the published `proto/a2a_v1/a2a.proto`
//! (package `lf.a2a.v1`, shipped with the `a2a-protocol-*` 0.15 crates):
//! the same field numbers and types, only the fields the gateway reads or
//! writes; prost skips every other field without decoding it. The tests
//! check all of them against the generated types of `a2a-protocol-types`
//! (its `proto` feature): a message those types encode reads here as they
//! wrote it (for sends, also on thousands of random mutations: accepted,
//! refused and read as prost's decode does), and what the gateway writes
//! reads back with them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use policies::TaskState;
use prost::Message as _;

use super::request::{budget_grant, lease_grant, RequestFacts, BUDGET_KEY, LEASE_KEY};
use super::A2aMethod;
use super::Observation;

/// The path every A2A gRPC method sits under.
pub const SERVICE_PREFIX: &str = "/lf.a2a.v1.A2AService/";

/// Whether a `content-type` is gRPC's (`application/grpc`, `+proto` and
/// other suffixes included).
pub fn is_grpc_content_type(ct: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    ct.len() >= GRPC.len()
        && ct[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// Whether a gRPC content type names the protobuf codec the gateway reads
/// (`application/grpc`, `application/grpc+proto`, parameters aside), not
/// another (`application/grpc+json`), which it cannot.
pub fn is_proto_codec(ct: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(rest) = ct.get(GRPC.len()..) else {
        return false;
    };
    let codec = rest.split(|&b| b == b';').next().unwrap_or(b"");
    is_grpc_content_type(ct) && (codec.is_empty() || codec.eq_ignore_ascii_case(b"+proto"))
}

/// The service a gRPC path names: `pkg.Service` of `/pkg.Service/Method`
/// (neither part empty, nothing after the method).
pub fn service_of(path: &str) -> Option<&str> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/')).then_some(service)
}

/// The A2A method a gRPC path names: `Some(None)` for a path of the A2A
/// service with a method this version does not know (passed untracked),
/// `None` for another service.
pub fn method_of(path: &str) -> Option<Option<A2aMethod>> {
    let name = path.strip_prefix(SERVICE_PREFIX)?;
    Some(A2aMethod::from_jsonrpc(name))
}

/// What [`GrpcFrames::feed`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum GrpcItem<'a> {
    /// One whole, uncompressed message (borrowed from the chunk when it
    /// arrived in one, else from the reader's buffer).
    Message(&'a [u8]),
    /// A compressed message (flag 1): passed unread. Its bytes, for a
    /// reader that forwards whole messages only.
    Compressed(&'a [u8]),
    /// A message longer than the reader's limit: passed unread. Its bytes
    /// follow as [`GrpcItem::Skipped`] pieces, prefix first, as they pass.
    Overlong,
    /// A piece of an overlong message, as it passed.
    Skipped(&'a [u8]),
}

/// gRPC's message framing read incrementally: a 1-byte compressed flag, a
/// 4-byte big-endian length, the message. Chunks may split a message (or
/// its prefix) at any byte, or hold several; only a message split across
/// chunks is copied, into a buffer bounded by `limit`.
#[derive(Debug)]
pub struct GrpcFrames {
    head: [u8; 5],
    /// Bytes of `head` read (5: reading the message).
    have: usize,
    /// The message's length.
    need: usize,
    /// The part of a split message read so far.
    buf: Vec<u8>,
    /// Skipping a message over `limit` (its bytes left in `need`).
    skipping: bool,
    limit: usize,
}

impl GrpcFrames {
    pub fn new(limit: usize) -> Self {
        GrpcFrames {
            head: [0; 5],
            have: 0,
            need: 0,
            buf: Vec::new(),
            skipping: false,
            limit,
        }
    }

    /// Reads `chunk`, calling `f` for each message it completes.
    pub fn feed(&mut self, mut chunk: &[u8], mut f: impl FnMut(GrpcItem<'_>)) {
        loop {
            if self.have < 5 {
                if chunk.is_empty() {
                    return;
                }
                let n = (5 - self.have).min(chunk.len());
                self.head[self.have..self.have + n].copy_from_slice(&chunk[..n]);
                self.have += n;
                chunk = &chunk[n..];
                if self.have < 5 {
                    return;
                }
                self.need =
                    u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]])
                        as usize;
                self.skipping = self.need > self.limit;
                if self.skipping {
                    f(GrpcItem::Overlong);
                    f(GrpcItem::Skipped(&self.head));
                }
            }
            let compressed = self.head[0] & 1 == 1;
            if self.skipping {
                let n = self.need.min(chunk.len());
                if n > 0 {
                    f(GrpcItem::Skipped(&chunk[..n]));
                }
                self.need -= n;
                chunk = &chunk[n..];
                if self.need > 0 {
                    return;
                }
                self.have = 0;
                continue;
            }
            if self.buf.is_empty() && chunk.len() >= self.need {
                let (msg, rest) = chunk.split_at(self.need);
                chunk = rest;
                self.have = 0;
                f(if compressed {
                    GrpcItem::Compressed(msg)
                } else {
                    GrpcItem::Message(msg)
                });
                continue;
            }
            if chunk.is_empty() {
                return;
            }
            let n = (self.need - self.buf.len()).min(chunk.len());
            self.buf.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            if self.buf.len() < self.need {
                return;
            }
            self.have = 0;
            f(if compressed {
                GrpcItem::Compressed(&self.buf)
            } else {
                GrpcItem::Message(&self.buf)
            });
            self.buf.clear();
        }
    }
}

/// `buf` as one uncompressed gRPC message: its 5-byte prefix and `msg`.
pub fn frame(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + msg.len());
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// A whole request body as the one uncompressed message it holds: `None`
/// for anything else (compressed, several messages, a short prefix).
pub fn single_message(body: &[u8]) -> Option<&[u8]> {
    let (head, msg) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    (head[0] == 0 && msg.len() == len).then_some(msg)
}

// The views. Field numbers and types are `a2a.proto`'s.

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbStruct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, PbValue>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbValue {
    #[prost(oneof = "PbKind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<PbKind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum PbKind {
    /// `NullValue` (an enum: a varint on the wire).
    #[prost(int32, tag = "1")]
    Null(i32),
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
    #[prost(message, tag = "5")]
    Struct(PbStruct),
    #[prost(message, tag = "6")]
    List(PbList),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<PbValue>,
}

/// JSON as a protobuf value (numbers as doubles, as on this wire).
pub fn from_json(v: &serde_json::Value) -> PbValue {
    use serde_json::Value;
    let kind = match v {
        Value::Null => PbKind::Null(0),
        Value::Bool(b) => PbKind::Bool(*b),
        Value::Number(n) => PbKind::Number(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => PbKind::Text(s.clone()),
        Value::Array(a) => PbKind::List(PbList {
            values: a.iter().map(from_json).collect(),
        }),
        Value::Object(o) => PbKind::Struct(struct_from_json(o)),
    };
    PbValue { kind: Some(kind) }
}

fn struct_from_json(o: &serde_json::Map<String, serde_json::Value>) -> PbStruct {
    PbStruct {
        fields: o.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
    }
}

/// A protobuf value as the JSON the other bindings carry. A number is a
/// double on this wire; an integral one reads as a JSON integer, as the
/// a2a-rust SDK converts it (so a grant of `{"ttlMs": 2000}` reads alike).
pub fn to_json(v: &PbValue) -> serde_json::Value {
    use serde_json::Value;
    match &v.kind {
        None | Some(PbKind::Null(_)) => Value::Null,
        Some(PbKind::Number(n)) => {
            if n.fract() == 0.0 && *n >= 0.0 && *n <= u64::MAX as f64 {
                Value::from(*n as u64)
            } else if n.fract() == 0.0 && *n < 0.0 && *n >= i64::MIN as f64 {
                Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
        }
        Some(PbKind::Text(s)) => Value::String(s.clone()),
        Some(PbKind::Bool(b)) => Value::Bool(*b),
        Some(PbKind::Struct(s)) => Value::Object(
            s.fields
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
        Some(PbKind::List(l)) => Value::Array(l.values.iter().map(to_json).collect()),
    }
}

/// `GetTaskRequest`, `CancelTaskRequest`, `SubscribeToTaskRequest`: a
/// tenant and a task id (GetTask's `history_length` is field 3).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskRequest {
    #[prost(string, tag = "1")]
    pub tenant: String,
    #[prost(string, tag = "2")]
    pub id: String,
    #[prost(int32, optional, tag = "3")]
    pub history_length: Option<i32>,
}

/// A push-notification config call's tenant and task: `Get`/`Delete`
/// requests (tenant 1, task 2, config id 3) and a created
/// `TaskPushNotificationConfig` (tenant 1, config id 2, task 3).
#[derive(Clone, PartialEq, prost::Message)]
struct PushConfigRequest {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(string, tag = "2")]
    second: String,
    #[prost(string, tag = "3")]
    third: String,
}

/// `ListTaskPushNotificationConfigsRequest`: task 1, tenant 4.
#[derive(Clone, PartialEq, prost::Message)]
struct ListPushConfigsRequest {
    #[prost(string, tag = "1")]
    task_id: String,
    #[prost(string, tag = "4")]
    tenant: String,
}

/// `Task`.
#[derive(Clone, PartialEq, prost::Message)]
struct Task {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    context_id: String,
    #[prost(message, optional, tag = "3")]
    status: Option<Status>,
}

/// `TaskStatus`.
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    /// `TaskState`, in `policies::TaskState::ALL`'s order.
    #[prost(int32, tag = "1")]
    state: i32,
}

/// A status's state: the wire value indexes `TaskState::ALL` (the proto
/// enum's order). 0 reads as none: proto3 cannot tell an unspecified state
/// from an absent one.
fn state_of(s: Option<&Status>) -> Option<TaskState> {
    state_at(u64::try_from(s?.state).ok()?)
}

fn state_at(n: u64) -> Option<TaskState> {
    let n = usize::try_from(n).ok().filter(|n| *n > 0)?;
    TaskState::ALL.get(n).copied()
}

/// One field of a protobuf message, its value borrowed from the message.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-width value (a `double`, a `fixed64`): not read.
    Fixed64,
    /// A 32-bit fixed-width value: not read.
    Fixed32,
    /// A group: not read.
    Group,
}

/// Skips a group's fields up to its end (`tag`'s END_GROUP), nested
/// groups with it, at most `depth` deep.
fn skip_group(buf: &mut &[u8], tag: u32, depth: u32) -> Result<(), ()> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let depth = depth.checked_sub(1).ok_or(())?;
    loop {
        let (t, wire) = decode_key(buf).map_err(|_| ())?;
        let skip = match wire {
            WireType::Varint => {
                decode_varint(buf).map_err(|_| ())?;
                0
            }
            WireType::LengthDelimited => {
                usize::try_from(decode_varint(buf).map_err(|_| ())?).map_err(|_| ())?
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::StartGroup => {
                skip_group(buf, t, depth)?;
                0
            }
            WireType::EndGroup if t == tag => return Ok(()),
            WireType::EndGroup => return Err(()),
        };
        *buf = buf.get(skip..).ok_or(())?;
    }
}

/// The fields of a protobuf message in wire order, on prost's own wire
/// primitives, borrowing: answers are read along the copy without an
/// allocation per message. `Err`: not a protobuf message (a bad key or
/// length, an unmatched END_GROUP).
fn fields(mut buf: &[u8]) -> impl Iterator<Item = Result<(u32, Field<'_>), ()>> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let next = (|| {
            let (tag, wire) = decode_key(&mut buf).map_err(|_| ())?;
            let field = match wire {
                WireType::Varint => Field::Varint(decode_varint(&mut buf).map_err(|_| ())?),
                WireType::LengthDelimited => {
                    let len = usize::try_from(decode_varint(&mut buf).map_err(|_| ())?)
                        .map_err(|_| ())?;
                    let (value, rest) = buf.split_at_checked(len).ok_or(())?;
                    buf = rest;
                    Field::Bytes(value)
                }
                WireType::SixtyFourBit => {
                    buf = buf.get(8..).ok_or(())?;
                    Field::Fixed64
                }
                WireType::ThirtyTwoBit => {
                    buf = buf.get(4..).ok_or(())?;
                    Field::Fixed32
                }
                // A group (long deprecated): skipped whole, as prost
                // skips one.
                WireType::StartGroup => {
                    skip_group(&mut buf, tag, NESTING)?;
                    Field::Group
                }
                WireType::EndGroup => return Err(()),
            };
            Ok((tag, field))
        })();
        if next.is_err() {
            buf = &[];
        }
        Some(next)
    })
}

/// Which message [`task_facts`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// `Task`: 1 id, 2 context_id, 3 status.
    Task,
    /// `TaskStatusUpdateEvent`: 1 task_id, 2 context_id, 3 status, 4
    /// metadata.
    StatusUpdate,
    /// `TaskArtifactUpdateEvent`: 1 task_id, 2 context_id.
    ArtifactUpdate,
    /// `Message`: 2 context_id, 3 task_id.
    Message,
}

/// The task facts of one of the [`Holder`] messages into `into`. The last
/// occurrence of a field wins, as protobuf reads scalars.
fn task_facts<'a>(buf: &'a [u8], holder: Holder, into: &mut Observation<'a>) -> Option<()> {
    let (id_tag, status_tag) = match holder {
        Holder::Task | Holder::StatusUpdate => (1, 3),
        Holder::ArtifactUpdate => (1, 0),
        Holder::Message => (3, 0),
    };
    let text = |b: &'a [u8]| -> Option<Option<Cow<'a, str>>> {
        let s = std::str::from_utf8(b).ok()?;
        Some((!s.is_empty()).then_some(Cow::Borrowed(s)))
    };
    for f in fields(buf) {
        match f.ok()? {
            (t, Field::Bytes(b)) if t == id_tag => into.task_id = text(b)?,
            (2, Field::Bytes(b)) => into.context_id = text(b)?,
            (t, Field::Bytes(b)) if t == status_tag => {
                into.state = None;
                for g in fields(b) {
                    if let (1, Field::Varint(n)) = g.ok()? {
                        into.state = state_at(n);
                    }
                }
            }
            // A status update's metadata: decoded only when it holds a
            // budget's report.
            (4, Field::Bytes(b))
                if holder == Holder::StatusUpdate
                    && memchr::memmem::find(b, BUDGET_KEY.as_bytes()).is_some() =>
            {
                into.spent = PbStruct::decode(b).ok().as_ref().and_then(spent_of);
            }
            _ => {}
        }
    }
    Some(())
}

/// What one message of a worker's answer says about its task: a
/// `StreamResponse` (streams), a `SendMessageResponse` (`SendMessage`) or a
/// `Task` (`GetTask`, `CancelTask`), by `method`. `None`: not such a
/// message. Its strings are borrowed from the message.
pub fn observe(method: A2aMethod, msg: &[u8]) -> Option<Observation<'_>> {
    let mut o = Observation::default();
    if matches!(method, A2aMethod::GetTask | A2aMethod::CancelTask) {
        task_facts(msg, Holder::Task, &mut o)?;
        return Some(o);
    }
    // StreamResponse: 1 task, 2 message, 3 status update, 4 artifact
    // update (a oneof: the last one given is the one).
    let mut payload = None;
    for f in fields(msg) {
        if let (tag @ 1..=4, Field::Bytes(b)) = f.ok()? {
            payload = Some((tag, b));
        }
    }
    match payload {
        Some((1, b)) => task_facts(b, Holder::Task, &mut o)?,
        Some((2, b)) => {
            task_facts(b, Holder::Message, &mut o)?;
            o.message_only = o.task_id.is_none();
        }
        Some((3, b)) => task_facts(b, Holder::StatusUpdate, &mut o)?,
        Some((_, b)) => task_facts(b, Holder::ArtifactUpdate, &mut o)?,
        None => {}
    }
    Some(o)
}

/// `metadata["a2a-rust.com/budget"].spent`, whole amounts per meter.
fn spent_of(meta: &PbStruct) -> Option<BTreeMap<String, u64>> {
    let budget = match &meta.fields.get(BUDGET_KEY)?.kind {
        Some(PbKind::Struct(s)) => s,
        _ => return None,
    };
    let spent = match &budget.fields.get("spent")?.kind {
        Some(PbKind::Struct(s)) => s,
        _ => return None,
    };
    Some(
        spent
            .fields
            .iter()
            .filter_map(|(name, v)| match v.kind {
                Some(PbKind::Number(n)) if n >= 0.0 && n.fract() == 0.0 => {
                    Some((name.clone(), n as u64))
                }
                _ => None,
            })
            .collect(),
    )
}

/// What a gRPC request message says, as far as policy cares: the tenant,
/// the task, the sent message's lease and budget grants, whether the send
/// returns at once. `None`: not the message `method` takes.
pub fn request_facts(method: A2aMethod, msg: &[u8]) -> Option<RequestFacts> {
    let mut facts = RequestFacts {
        method: Some(method),
        ..RequestFacts::default()
    };
    match method {
        A2aMethod::SendMessage | A2aMethod::SendStreamingMessage => {
            let r = send_view(msg)?;
            facts.tenant = r.tenant.map(str::to_owned);
            facts.return_immediately = r.return_immediately;
            facts.task_id = r.task_id.map(str::to_owned);
            facts.context_id = r
                .context_id
                .filter(|_| r.task_id.is_none())
                .map(str::to_owned);
            facts.message_id = r
                .message_id
                .filter(|_| r.task_id.is_none())
                .map(str::to_owned);
            let grant = |v: &[u8]| PbValue::decode(v).map(|v| to_json(&v)).ok();
            facts.lease = match &r.lease {
                Some(v) => Some(lease_grant(&grant(v)?)),
                None => None,
            };
            facts.budget = match &r.budget {
                Some(v) => Some(budget_grant(&grant(v)?)),
                None => None,
            };
        }
        A2aMethod::GetTask | A2aMethod::CancelTask | A2aMethod::SubscribeToTask => {
            let r = TaskRequest::decode(msg).ok()?;
            facts.tenant = (!r.tenant.is_empty()).then_some(r.tenant);
            facts.task_id = (!r.id.is_empty()).then_some(r.id);
        }
        A2aMethod::CreateTaskPushNotificationConfig
        | A2aMethod::GetTaskPushNotificationConfig
        | A2aMethod::DeleteTaskPushNotificationConfig => {
            let r = PushConfigRequest::decode(msg).ok()?;
            let task = match method {
                A2aMethod::CreateTaskPushNotificationConfig => r.third,
                _ => r.second,
            };
            facts.tenant = (!r.tenant.is_empty()).then_some(r.tenant);
            facts.task_id = (!task.is_empty()).then_some(task);
        }
        A2aMethod::ListTaskPushNotificationConfigs => {
            let r = ListPushConfigsRequest::decode(msg).ok()?;
            facts.tenant = (!r.tenant.is_empty()).then_some(r.tenant);
            facts.task_id = (!r.task_id.is_empty()).then_some(r.task_id);
        }
        _ => {}
    }
    Some(facts)
}

/// What policy reads of a `SendMessageRequest`, borrowed from it: empty
/// strings as `None`, the lease and budget grants as their encoded
/// `Value`s.
#[derive(Debug, Default, PartialEq)]
struct SendView<'a> {
    tenant: Option<&'a str>,
    message_id: Option<&'a str>,
    context_id: Option<&'a str>,
    task_id: Option<&'a str>,
    return_immediately: bool,
    lease: Option<Cow<'a, [u8]>>,
    budget: Option<Cow<'a, [u8]>>,
}

/// How deep `Struct`s and lists may nest in a send (prost's own limit for
/// a decode).
const NESTING: u32 = 100;

/// Reads a `SendMessageRequest` by a borrowing walk (every send passes
/// here, and its metadata may be large: decoding it whole cost a gRPC call
/// an allocation per entry). It accepts and refuses what decoding it with
/// prost accepts and refuses: the fields it knows with their wire types,
/// strings in UTF-8, a metadata `Struct` valid to its depth; a field given
/// twice reads as protobuf merges it (the last scalar, map entries by key).
/// `None`: not a `SendMessageRequest`.
fn send_view(msg: &[u8]) -> Option<SendView<'_>> {
    let mut v = SendView::default();
    for f in fields(msg) {
        match f.ok()? {
            // tenant
            (1, Field::Bytes(b)) => v.tenant = text(b)?,
            // message: 1 message_id, 2 context_id, 3 task_id, 6 metadata
            (2, Field::Bytes(b)) => {
                for g in fields(b) {
                    match g.ok()? {
                        (1, Field::Bytes(b)) => v.message_id = text(b)?,
                        (2, Field::Bytes(b)) => v.context_id = text(b)?,
                        (3, Field::Bytes(b)) => v.task_id = text(b)?,
                        (6, Field::Bytes(b)) => metadata(b, &mut v)?,
                        (1..=3 | 6, _) => return None,
                        _ => {}
                    }
                }
            }
            // configuration: 4 return_immediately
            (3, Field::Bytes(b)) => {
                for g in fields(b) {
                    match g.ok()? {
                        (4, Field::Varint(n)) => v.return_immediately = n != 0,
                        (4, _) => return None,
                        _ => {}
                    }
                }
            }
            (1..=3, _) => return None,
            _ => {}
        }
    }
    Some(v)
}

/// A string field: `None` if not UTF-8, `Some(None)` if empty.
fn text(b: &[u8]) -> Option<Option<&str>> {
    let s = std::str::from_utf8(b).ok()?;
    Some((!s.is_empty()).then_some(s))
}

/// The sent message's metadata (`Struct`: 1, its entries, each 1 key, 2
/// value): the lease and budget grants kept, every other value checked.
fn metadata<'a>(b: &'a [u8], v: &mut SendView<'a>) -> Option<()> {
    for f in fields(b) {
        let entry = match f.ok()? {
            (1, Field::Bytes(entry)) => entry,
            (1, _) => return None,
            _ => continue,
        };
        let (mut key, mut value) = ("", Cow::Borrowed(&[][..]));
        for g in fields(entry) {
            match g.ok()? {
                (1, Field::Bytes(k)) => key = std::str::from_utf8(k).ok()?,
                (2, Field::Bytes(val)) => {
                    valid_value(val, NESTING)?;
                    // A value given twice is the two merged: read as one.
                    value = match value {
                        Cow::Borrowed([]) => Cow::Borrowed(val),
                        before => Cow::Owned([&before[..], val].concat()),
                    };
                }
                (1 | 2, _) => return None,
                _ => {}
            }
        }
        // A key given twice: the last entry wins, as a map reads.
        match key {
            LEASE_KEY => v.lease = Some(value),
            BUDGET_KEY => v.budget = Some(value),
            _ => {}
        }
    }
    Some(())
}

/// Whether `b` decodes as a `google.protobuf.Value` (1 null, 2 number, 3
/// string, 4 bool, 5 struct, 6 list), nested at most `depth` deep.
fn valid_value(b: &[u8], depth: u32) -> Option<()> {
    let depth = depth.checked_sub(1)?;
    for f in fields(b) {
        match f.ok()? {
            (1 | 4, Field::Varint(_)) | (2, Field::Fixed64) => {}
            (3, Field::Bytes(s)) => {
                std::str::from_utf8(s).ok()?;
            }
            (5, Field::Bytes(st)) => {
                for e in fields(st) {
                    let entry = match e.ok()? {
                        (1, Field::Bytes(entry)) => entry,
                        (1, _) => return None,
                        _ => continue,
                    };
                    for g in fields(entry) {
                        match g.ok()? {
                            (1, Field::Bytes(k)) => {
                                std::str::from_utf8(k).ok()?;
                            }
                            (2, Field::Bytes(val)) => valid_value(val, depth)?,
                            (1 | 2, _) => return None,
                            _ => {}
                        }
                    }
                }
            }
            (6, Field::Bytes(list)) => {
                for e in fields(list) {
                    match e.ok()? {
                        (1, Field::Bytes(val)) => valid_value(val, depth)?,
                        (1, _) => return None,
                        _ => {}
                    }
                }
            }
            (1..=6, _) => return None,
            _ => {}
        }
    }
    Some(())
}

/// A `GetTask`/`CancelTask` request for `id` in `tenant`, framed.
pub fn task_request(tenant: Option<&str>, id: &str, history_length: Option<i32>) -> Vec<u8> {
    let r = TaskRequest {
        tenant: tenant.unwrap_or("").to_owned(),
        id: id.to_owned(),
        history_length,
    };
    frame(&r.encode_to_vec())
}

/// `ListTasksRequest`: the tenant's tasks updated since `since_ms` (Unix
/// ms), up to `page_size`, each with `history_length` messages.
#[derive(Clone, PartialEq, prost::Message)]
struct ListRequest {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(int32, optional, tag = "4")]
    page_size: Option<i32>,
    #[prost(string, tag = "5")]
    page_token: String,
    #[prost(int32, optional, tag = "6")]
    history_length: Option<i32>,
    #[prost(message, optional, tag = "7")]
    status_timestamp_after: Option<Timestamp>,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
struct Timestamp {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// `ListTasksResponse`, each task with its history's message ids.
#[derive(Clone, PartialEq, prost::Message)]
struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    tasks: Vec<ListedTask>,
    #[prost(string, tag = "2")]
    next_page_token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListedTask {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(message, repeated, tag = "5")]
    history: Vec<HistoryMessage>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HistoryMessage {
    #[prost(string, tag = "1")]
    message_id: String,
}

/// A framed `ListTasks` request: `tenant`'s tasks updated since `since_ms`
/// (Unix ms), 100 of them with 100 history messages each (as the other
/// bindings ask).
pub fn list_request(tenant: Option<&str>, since_ms: u64, page_token: &str) -> Vec<u8> {
    let r = ListRequest {
        tenant: tenant.unwrap_or("").to_owned(),
        page_size: Some(100),
        page_token: page_token.to_owned(),
        history_length: Some(100),
        status_timestamp_after: Some(Timestamp {
            seconds: (since_ms / 1000) as i64,
            nanos: ((since_ms % 1000) * 1_000_000) as i32,
        }),
    };
    frame(&r.encode_to_vec())
}

/// A framed `ListTasks` answer: (message id, task id) of each message
/// `wanted` accepts that a task's history holds, and the next page's token
/// (`""`: the last page).
pub fn list_page(
    body: &[u8],
    wanted: impl Fn(&str) -> bool,
) -> Option<(Vec<(String, String)>, String)> {
    let r = ListResponse::decode(single_message(body)?).ok()?;
    let mut found = Vec::new();
    for t in r.tasks {
        for m in t.history.iter().filter(|m| wanted(&m.message_id)) {
            found.push((m.message_id.clone(), t.id.clone()));
        }
    }
    Some((found, r.next_page_token))
}

/// `SendMessageRequest` with its message's extensions.
#[derive(Clone, PartialEq, prost::Message)]
struct SendExtensions {
    #[prost(message, optional, tag = "2")]
    message: Option<MessageExtensions>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MessageExtensions {
    #[prost(message, optional, tag = "6")]
    metadata: Option<PbStruct>,
    #[prost(string, repeated, tag = "7")]
    extensions: Vec<String>,
}

/// A framed `SendMessageRequest` whose message's metadata holds `value`
/// under `key` and whose extensions name `extension`: the message as the
/// caller sent it, byte for byte, followed by the fields to merge in
/// (protobuf merges a message field given twice, and the map entry given
/// last wins), so nothing else of it is re-encoded. `None`: not one
/// uncompressed message.
pub fn rewrite_send(
    body: &[u8],
    key: &str,
    value: &serde_json::Value,
    extension: &str,
) -> Option<Vec<u8>> {
    let msg = single_message(body)?;
    let had = SendExtensions::decode(msg)
        .ok()?
        .message
        .is_some_and(|m| m.extensions.iter().any(|e| e == extension));
    let patch = SendExtensions {
        message: Some(MessageExtensions {
            metadata: Some(PbStruct {
                fields: BTreeMap::from([(key.to_owned(), from_json(value))]),
            }),
            extensions: if had {
                Vec::new()
            } else {
                vec![extension.to_owned()]
            },
        }),
    }
    .encode_to_vec();
    let mut whole = Vec::with_capacity(msg.len() + patch.len());
    whole.extend_from_slice(msg);
    whole.extend_from_slice(&patch);
    Some(frame(&whole))
}

/// `StreamResponse` with a status update, for the gateway's own events.
#[derive(Clone, PartialEq, prost::Message)]
struct OutStream {
    #[prost(message, optional, tag = "3")]
    status_update: Option<OutUpdate>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OutUpdate {
    #[prost(string, tag = "1")]
    task_id: String,
    #[prost(string, tag = "2")]
    context_id: String,
    #[prost(message, optional, tag = "3")]
    status: Option<OutStatus>,
    #[prost(message, optional, tag = "4")]
    metadata: Option<PbStruct>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OutStatus {
    #[prost(int32, tag = "1")]
    state: i32,
    #[prost(message, optional, tag = "2")]
    message: Option<OutMessage>,
    #[prost(message, optional, tag = "3")]
    timestamp: Option<Timestamp>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OutMessage {
    #[prost(string, tag = "1")]
    message_id: String,
    #[prost(string, tag = "2")]
    context_id: String,
    #[prost(string, tag = "3")]
    task_id: String,
    /// `Role`: 2 is `ROLE_AGENT`.
    #[prost(int32, tag = "4")]
    role: i32,
    #[prost(message, repeated, tag = "5")]
    parts: Vec<OutPart>,
    #[prost(message, optional, tag = "6")]
    metadata: Option<PbStruct>,
    #[prost(string, repeated, tag = "7")]
    extensions: Vec<String>,
}

/// `Part` with text (`content` oneof, field 1).
#[derive(Clone, PartialEq, prost::Message)]
struct OutPart {
    #[prost(string, tag = "1")]
    text: String,
}

/// A status as the other bindings' JSON spells it
/// (`{"state","message":{…},"timestamp"}`), as protobuf.
fn status_from_json(status: &serde_json::Value) -> OutStatus {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
    let state = status["state"]
        .as_str()
        .and_then(|s| TaskState::ALL.iter().position(|t| t.as_wire() == s))
        .unwrap_or(0) as i32;
    let m = &status["message"];
    let message = m.is_object().then(|| OutMessage {
        message_id: text(&m["messageId"]),
        context_id: text(&m["contextId"]),
        task_id: text(&m["taskId"]),
        role: if m["role"] == "ROLE_AGENT" { 2 } else { 1 },
        parts: m["parts"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| OutPart {
                        text: text(&p["text"]),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        metadata: m["metadata"].as_object().map(struct_from_json),
        extensions: m["extensions"]
            .as_array()
            .map(|es| es.iter().map(text).collect())
            .unwrap_or_default(),
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    OutStatus {
        state,
        message,
        timestamp: Some(Timestamp {
            seconds: now.as_secs() as i64,
            nanos: now.subsec_nanos() as i32,
        }),
    }
}

/// The framed `StreamResponse` of a status update the other bindings send
/// as `{"statusUpdate": {…}}` (the budget-exhausted failure).
pub fn status_update_event(update: &serde_json::Value) -> Vec<u8> {
    let u = &update["statusUpdate"];
    let ev = OutStream {
        status_update: Some(OutUpdate {
            task_id: u["taskId"].as_str().unwrap_or("").to_owned(),
            context_id: u["contextId"].as_str().unwrap_or("").to_owned(),
            status: Some(status_from_json(&u["status"])),
            metadata: u["metadata"].as_object().map(struct_from_json),
        }),
    };
    frame(&ev.encode_to_vec())
}

/// The state of the task in a framed `Task` answer.
pub fn task_state(body: &[u8]) -> Option<(String, Option<TaskState>)> {
    let t = Task::decode(single_message(body)?).ok()?;
    Some((t.id, state_of(t.status.as_ref())))
}

/// A `grpc-status` code as the HTTP status the gateway's judgement of a
/// worker's answer reads (as the HTTP+JSON binding maps the same errors).
pub fn http_status(grpc_status: u32) -> u16 {
    match grpc_status {
        0 => 200,
        3 | 11 => 400,
        16 => 401,
        7 => 403,
        5 => 404,
        4 => 504,
        6 | 9 | 10 => 409,
        8 => 429,
        12 => 501,
        14 => 503,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SendMessageRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    struct SendRequest {
        #[prost(string, tag = "1")]
        tenant: String,
        #[prost(message, optional, tag = "2")]
        message: Option<SentMessage>,
        #[prost(message, optional, tag = "3")]
        configuration: Option<SendConfiguration>,
    }

    /// `Message`, as sent.
    #[derive(Clone, PartialEq, prost::Message)]
    struct SentMessage {
        #[prost(string, tag = "1")]
        message_id: String,
        #[prost(string, tag = "2")]
        context_id: String,
        #[prost(string, tag = "3")]
        task_id: String,
        #[prost(message, optional, tag = "6")]
        metadata: Option<PbStruct>,
    }

    /// `SendMessageConfiguration`.
    #[derive(Clone, PartialEq, prost::Message)]
    struct SendConfiguration {
        #[prost(bool, tag = "4")]
        return_immediately: bool,
    }

    use a2a_protocol_types::proto as pb;

    fn state(s: pb::TaskState) -> Option<pb::TaskStatus> {
        Some(pb::TaskStatus {
            state: s as i32,
            ..Default::default()
        })
    }

    fn stream(p: pb::stream_response::Payload) -> Vec<u8> {
        pb::StreamResponse { payload: Some(p) }.encode_to_vec()
    }

    fn id<'a>(o: &'a Observation<'a>) -> Option<&'a str> {
        o.task_id.as_deref()
    }

    #[test]
    fn every_state_reads_as_policies_names_it() {
        use pb::TaskState as P;
        let table = [
            (P::Submitted, TaskState::Submitted),
            (P::Working, TaskState::Working),
            (P::Completed, TaskState::Completed),
            (P::Failed, TaskState::Failed),
            (P::Canceled, TaskState::Canceled),
            (P::InputRequired, TaskState::InputRequired),
            (P::Rejected, TaskState::Rejected),
            (P::AuthRequired, TaskState::AuthRequired),
        ];
        for (p, want) in table {
            let msg = stream(pb::stream_response::Payload::Task(pb::Task {
                id: "t".into(),
                context_id: "c".into(),
                status: state(p),
                ..Default::default()
            }));
            let o = observe(A2aMethod::SendStreamingMessage, &msg).unwrap();
            assert_eq!(o.state, Some(want), "{p:?}");
            assert!(
                matches!(o.task_id, Some(Cow::Borrowed(_))),
                "borrowed from the message, not allocated"
            );
            assert_eq!((id(&o), o.context_id.as_deref()), (Some("t"), Some("c")));
        }
        let unspecified = stream(pb::stream_response::Payload::Task(pb::Task {
            id: "t".into(),
            status: state(P::Unspecified),
            ..Default::default()
        }));
        assert_eq!(
            observe(A2aMethod::SendStreamingMessage, &unspecified)
                .unwrap()
                .state,
            None
        );
    }

    #[test]
    fn stream_responses_of_every_kind() {
        use pb::stream_response::Payload as P;
        let meta = serde_json::json!({
            "a2a-rust.com/budget": {"spent": {"tokens": 12.0, "calls": 1.5}}
        });
        let update = pb::TaskStatusUpdateEvent {
            task_id: "u".into(),
            context_id: "c".into(),
            status: state(pb::TaskState::Working),
            metadata: Some(json_struct(&meta)),
        };
        let wire = stream(P::StatusUpdate(update));
        let o = observe(A2aMethod::SubscribeToTask, &wire).unwrap();
        assert_eq!(id(&o), Some("u"));
        assert_eq!(o.state, Some(TaskState::Working));
        assert_eq!(
            o.spent,
            Some(BTreeMap::from([("tokens".to_string(), 12)])),
            "whole amounts only"
        );

        let art = pb::TaskArtifactUpdateEvent {
            task_id: "a".into(),
            context_id: "c".into(),
            artifact: Some(pb::Artifact {
                artifact_id: "x".into(),
                ..Default::default()
            }),
            append: true,
            last_chunk: true,
            ..Default::default()
        };
        let wire = stream(P::ArtifactUpdate(art));
        let o = observe(A2aMethod::SendStreamingMessage, &wire).unwrap();
        assert_eq!((id(&o), o.state), (Some("a"), None));

        let msg = pb::Message {
            message_id: "m".into(),
            context_id: "c".into(),
            ..Default::default()
        };
        let wire = stream(P::Message(msg));
        let o = observe(A2aMethod::SendMessage, &wire).unwrap();
        assert!(o.message_only && id(&o).is_none());

        // A bare Task (GetTask, CancelTask).
        let t = pb::Task {
            id: "g".into(),
            status: state(pb::TaskState::Canceled),
            history: vec![pb::Message::default(); 3],
            ..Default::default()
        }
        .encode_to_vec();
        let o = observe(A2aMethod::CancelTask, &t).unwrap();
        assert_eq!((id(&o), o.state), (Some("g"), Some(TaskState::Canceled)));
        assert_eq!(
            task_state(&frame(&t)),
            Some(("g".to_string(), Some(TaskState::Canceled)))
        );
        // Not protobuf.
        assert!(observe(A2aMethod::SendStreamingMessage, b"\xff\xff\xff").is_none());
    }

    /// A JSON object as the `Struct` the generated types carry.
    fn json_struct(v: &serde_json::Value) -> pb::prost_types::Struct {
        use pb::prost_types::value::Kind;
        fn val(v: &serde_json::Value) -> pb::prost_types::Value {
            let kind = match v {
                serde_json::Value::Null => Kind::NullValue(0),
                serde_json::Value::Bool(b) => Kind::BoolValue(*b),
                serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap()),
                serde_json::Value::String(s) => Kind::StringValue(s.clone()),
                serde_json::Value::Array(a) => Kind::ListValue(pb::prost_types::ListValue {
                    values: a.iter().map(val).collect(),
                }),
                serde_json::Value::Object(_) => Kind::StructValue(json_struct(v)),
            };
            pb::prost_types::Value { kind: Some(kind) }
        }
        pb::prost_types::Struct {
            fields: v
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), val(v)))
                .collect(),
        }
    }

    /// A SendMessageRequest's facts as prost reads them with the views
    /// above (lease and budget: their `Value`s).
    type Facts = (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        bool,
        Option<PbValue>,
        Option<PbValue>,
    );

    fn by_prost(b: &[u8]) -> Option<Facts> {
        let r = SendRequest::decode(b).ok()?;
        let some = |s: String| (!s.is_empty()).then_some(s);
        let m = r.message.unwrap_or_default();
        let meta = m.metadata.unwrap_or_default();
        Some((
            some(r.tenant),
            some(m.message_id),
            some(m.context_id),
            some(m.task_id),
            r.configuration.is_some_and(|c| c.return_immediately),
            meta.fields.get(LEASE_KEY).cloned(),
            meta.fields.get(BUDGET_KEY).cloned(),
        ))
    }

    fn by_walk(b: &[u8]) -> Option<Facts> {
        let v = send_view(b)?;
        let own = |s: Option<&str>| s.map(str::to_owned);
        let value =
            |v: Option<Cow<'_, [u8]>>| v.map(|v| PbValue::decode(&v[..]).expect("a checked value"));
        Some((
            own(v.tenant),
            own(v.message_id),
            own(v.context_id),
            own(v.task_id),
            v.return_immediately,
            value(v.lease),
            value(v.budget),
        ))
    }

    /// The borrowing walk over a send accepts, refuses and reads what
    /// prost's decode does: on sends of every shape the generated types
    /// write, merged ones (two encodings back to back), one with a group,
    /// and 3,000 random mutations of each (a byte changed, inserted or
    /// removed, the end cut), from a fixed seed.
    #[test]
    fn the_send_walk_reads_as_prost_decodes() {
        let meta = serde_json::json!({
            "a2a-rust.com/lease": {"ttlMs": 2000},
            "a2a-rust.com/budget": {"remainingMs": 5000, "meters": {"tokens": 100}},
            "pad": "x".repeat(40),
            "nested": {"a": [1, "é", null, true, {"b": [[]]}]}
        });
        let full = pb::SendMessageRequest {
            tenant: "acme".into(),
            message: Some(pb::Message {
                message_id: "m1".into(),
                task_id: "t0".into(),
                context_id: "c".into(),
                parts: vec![pb::Part {
                    content: Some(pb::part::Content::Text("hi".into())),
                    ..Default::default()
                }],
                metadata: Some(json_struct(&meta)),
                extensions: vec!["https://a2a-rust.com/extensions/lease/v1".into()],
                ..Default::default()
            }),
            configuration: Some(pb::SendMessageConfiguration {
                return_immediately: true,
                history_length: Some(3),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let other = pb::SendMessageRequest {
            message: Some(pb::Message {
                task_id: "t1".into(),
                metadata: Some(json_struct(
                    &serde_json::json!({"a2a-rust.com/lease": {"ttlMs": 7}}),
                )),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let merged = [full.clone(), other.clone()].concat();
        // An unknown field 20 as a group holding a varint and a nested group.
        let group = [&full[..], &[0xa3, 0x01, 0x08, 0x01, 0x0b, 0x0c, 0xa4, 0x01]].concat();
        let seeds = [full, other, merged, group, Vec::new()];
        assert_eq!(by_walk(&seeds[2]).unwrap().3.as_deref(), Some("t1"));
        assert_eq!(by_walk(&seeds[2]).unwrap().2.as_deref(), Some("c"));
        assert!(by_walk(&seeds[3]).is_some());
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n.max(1) as u64) as usize
        };
        let (mut accepted, mut refused) = (0, 0);
        for seed in &seeds {
            assert_eq!(by_walk(seed), by_prost(seed), "{seed:?}");
            for _ in 0..3000 {
                let mut b = seed.clone();
                match next(4) {
                    0 if !b.is_empty() => {
                        let i = next(b.len());
                        b[i] = next(256) as u8;
                    }
                    1 => {
                        let i = next(b.len() + 1);
                        b.insert(i, next(256) as u8);
                    }
                    2 if !b.is_empty() => {
                        b.remove(next(b.len()));
                    }
                    _ => b.truncate(next(b.len() + 1)),
                }
                let want = by_prost(&b);
                if want.is_some() {
                    accepted += 1;
                } else {
                    refused += 1;
                }
                assert_eq!(by_walk(&b), want, "{b:?}");
            }
        }
        // Both outcomes were exercised.
        assert!(accepted > 1000 && refused > 1000, "{accepted} / {refused}");
    }

    #[test]
    fn send_requests_give_their_facts() {
        let meta = serde_json::json!({
            "a2a-rust.com/lease": {"ttlMs": 2000},
            "a2a-rust.com/budget": {"remainingMs": 5000, "meters": {"tokens": 100}},
            "other": [1, "x", null, true]
        });
        let req = pb::SendMessageRequest {
            tenant: "acme".into(),
            message: Some(pb::Message {
                message_id: "m1".into(),
                task_id: "t0".into(),
                metadata: Some(json_struct(&meta)),
                extensions: vec!["https://a2a-rust.com/extensions/lease/v1".into()],
                ..Default::default()
            }),
            configuration: Some(pb::SendMessageConfiguration {
                return_immediately: true,
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let f = request_facts(A2aMethod::SendMessage, &req).unwrap();
        assert_eq!(f.tenant.as_deref(), Some("acme"));
        assert_eq!(f.task_id.as_deref(), Some("t0"));
        assert_eq!(f.lease, Some(Ok(2000)));
        assert!(matches!(f.budget, Some(Ok(_))), "{:?}", f.budget);
        assert!(f.return_immediately);
        assert_eq!(send_view(&req).unwrap().message_id, Some("m1"));
        // Read only when the send names no task: it needs no search.
        assert_eq!(f.message_id, None);

        // A malformed grant is refused as on the other bindings.
        let bad =
            serde_json::json!({"a2a-rust.com/lease": {"ttlMs": -5}, "a2a-rust.com/budget": "lots"});
        let req = pb::SendMessageRequest {
            message: Some(pb::Message {
                metadata: Some(json_struct(&bad)),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let f = request_facts(A2aMethod::SendStreamingMessage, &req).unwrap();
        assert!(matches!(f.lease, Some(Err(_))), "{:?}", f.lease);
        assert!(matches!(f.budget, Some(Err(_))), "{:?}", f.budget);
        assert_eq!((f.tenant, f.task_id), (None, None));

        for (method, bytes) in [
            (
                A2aMethod::GetTask,
                pb::GetTaskRequest {
                    tenant: "acme".into(),
                    id: "t1".into(),
                    history_length: Some(0),
                }
                .encode_to_vec(),
            ),
            (
                A2aMethod::CancelTask,
                pb::CancelTaskRequest {
                    tenant: "acme".into(),
                    id: "t1".into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
            (
                A2aMethod::SubscribeToTask,
                pb::SubscribeToTaskRequest {
                    tenant: "acme".into(),
                    id: "t1".into(),
                }
                .encode_to_vec(),
            ),
        ] {
            let f = request_facts(method, &bytes).unwrap();
            assert_eq!(
                (f.tenant.as_deref(), f.task_id.as_deref()),
                (Some("acme"), Some("t1")),
                "{method:?}"
            );
        }
        // The gateway's own requests read back with the generated types.
        let ours = task_request(Some("acme"), "t9", Some(0));
        let back = pb::GetTaskRequest::decode(single_message(&ours).unwrap()).unwrap();
        assert_eq!(
            (back.tenant.as_str(), back.id.as_str(), back.history_length),
            ("acme", "t9", Some(0))
        );
    }

    /// The re-written send and the failure event read back with the generated types as the SDK's server would read them.
    #[test]
    fn budget_rewrites_read_back_with_the_generated_types() {
        let meta = serde_json::json!({"keep": "me", "a2a-rust.com/budget": {"remainingMs": 99999}});
        let req = pb::SendMessageRequest {
            tenant: "acme".into(),
            message: Some(pb::Message {
                message_id: "m1".into(),
                parts: vec![pb::Part {
                    content: Some(pb::part::Content::Text("hello".into())),
                    ..Default::default()
                }],
                metadata: Some(json_struct(&meta)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let grant = serde_json::json!({"remainingMs": 1000, "meters": {"tokens": 5}});
        let uri = "https://a2a-rust.com/extensions/budget/v1";
        let out = rewrite_send(&frame(&req.encode_to_vec()), BUDGET_KEY, &grant, uri).unwrap();
        let back = pb::SendMessageRequest::decode(single_message(&out).unwrap()).unwrap();
        let m = back.message.unwrap();
        assert_eq!(
            (back.tenant.as_str(), m.message_id.as_str()),
            ("acme", "m1")
        );
        assert_eq!(m.parts.len(), 1);
        assert_eq!(m.extensions, vec![uri.to_string()]);
        let md = m.metadata.unwrap();
        let as_json = |s: &pb::prost_types::Struct| -> serde_json::Value {
            let v = PbValue::decode(
                pb::prost_types::Value {
                    kind: Some(pb::prost_types::value::Kind::StructValue(s.clone())),
                }
                .encode_to_vec()
                .as_slice(),
            )
            .unwrap();
            to_json(&v)
        };
        assert_eq!(as_json(&md)["keep"], "me");
        assert_eq!(as_json(&md)[BUDGET_KEY], grant, "the gateway's grant wins");
        // Given again, the extension is not repeated.
        let again = rewrite_send(&out, BUDGET_KEY, &grant, uri).unwrap();
        let back = pb::SendMessageRequest::decode(single_message(&again).unwrap()).unwrap();
        assert_eq!(back.message.unwrap().extensions.len(), 1);

        let update = serde_json::json!({"statusUpdate": {
            "taskId": "t1", "contextId": "c1",
            "status": {"state": "TASK_STATE_FAILED", "message": {
                "messageId": "x", "role": "ROLE_AGENT", "taskId": "t1", "contextId": "c1",
                "parts": [{"text": "budget exhausted"}],
                "metadata": {"a2a-rust.com/failure": "budget_exhausted"},
                "extensions": ["https://a2a-rust.com/extensions/failure/v1"]}},
            "metadata": {"error": "budget exhausted", BUDGET_KEY: {"remainingMs": 0}}
        }});
        let ev = status_update_event(&update);
        let ev = pb::StreamResponse::decode(single_message(&ev).unwrap()).unwrap();
        let Some(pb::stream_response::Payload::StatusUpdate(u)) = ev.payload else {
            panic!("{ev:?}")
        };
        assert_eq!((u.task_id.as_str(), u.context_id.as_str()), ("t1", "c1"));
        let st = u.status.unwrap();
        assert_eq!(st.state, pb::TaskState::Failed as i32);
        let sm = st.message.unwrap();
        assert_eq!(sm.role, pb::Role::Agent as i32);
        assert_eq!(sm.extensions.len(), 1);
        assert!(st.timestamp.is_some() && u.metadata.is_some());
    }

    /// A push-notification config call's task is its `task_id`, never the
    /// config's `id`, in each request's own field order.
    #[test]
    fn push_config_calls_name_their_task() {
        let create = pb::TaskPushNotificationConfig {
            tenant: "acme".into(),
            id: "cfg".into(),
            task_id: "t1".into(),
            url: "https://hook".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let get = pb::GetTaskPushNotificationConfigRequest {
            tenant: "acme".into(),
            task_id: "t2".into(),
            id: "cfg".into(),
        }
        .encode_to_vec();
        let list = pb::ListTaskPushNotificationConfigsRequest {
            tenant: "acme".into(),
            task_id: "t3".into(),
            ..Default::default()
        }
        .encode_to_vec();
        for (method, msg, task) in [
            (A2aMethod::CreateTaskPushNotificationConfig, &create, "t1"),
            (A2aMethod::GetTaskPushNotificationConfig, &get, "t2"),
            (A2aMethod::DeleteTaskPushNotificationConfig, &get, "t2"),
            (A2aMethod::ListTaskPushNotificationConfigs, &list, "t3"),
        ] {
            let f = request_facts(method, msg).unwrap();
            assert_eq!(
                (f.tenant.as_deref(), f.task_id.as_deref()),
                (Some("acme"), Some(task)),
                "{method:?}"
            );
        }
    }

    #[test]
    fn list_tasks_finds_the_task_holding_a_message() {
        let msg = |id: &str| pb::Message {
            message_id: id.into(),
            ..Default::default()
        };
        let answer = pb::ListTasksResponse {
            tasks: vec![
                pb::Task {
                    id: "a".into(),
                    history: vec![msg("m0")],
                    ..Default::default()
                },
                pb::Task {
                    id: "b".into(),
                    history: vec![msg("x"), msg("m1")],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
        .encode_to_vec();
        let body = frame(&answer);
        assert_eq!(
            list_page(&body, |m| m == "m1"),
            Some((vec![("m1".into(), "b".into())], String::new()))
        );
        assert_eq!(
            list_page(&body, |m| m == "m1" || m == "m0"),
            Some((
                vec![("m0".into(), "a".into()), ("m1".into(), "b".into())],
                String::new()
            ))
        );
        assert_eq!(
            list_page(&body, |m| m == "m9"),
            Some((vec![], String::new()))
        );
        let more = pb::ListTasksResponse {
            next_page_token: "p2".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(
            list_page(&frame(&more), |m| m == "m1"),
            Some((vec![], "p2".into()))
        );
        let req = list_request(Some("acme"), 1_700_000_000_250, "p2");
        let back = pb::ListTasksRequest::decode(single_message(&req).unwrap()).unwrap();
        assert_eq!(back.tenant, "acme");
        assert_eq!(
            (back.page_size, back.history_length),
            (Some(100), Some(100))
        );
        assert_eq!(back.page_token, "p2");
        let ts = back.status_timestamp_after.unwrap();
        assert_eq!((ts.seconds, ts.nanos), (1_700_000_000, 250_000_000));
    }

    #[test]
    fn frames_split_at_every_byte() {
        let a = stream(pb::stream_response::Payload::Task(pb::Task {
            id: "first".into(),
            status: state(pb::TaskState::Submitted),
            ..Default::default()
        }));
        let mut wire = frame(&a);
        wire.extend_from_slice(&frame(b""));
        // A compressed one, passed unread.
        wire.extend_from_slice(&[1, 0, 0, 0, 3, 9, 9, 9]);
        let long = vec![7u8; 100];
        wire.extend_from_slice(&frame(&long));
        let b = stream(pb::stream_response::Payload::StatusUpdate(
            pb::TaskStatusUpdateEvent {
                task_id: "first".into(),
                status: state(pb::TaskState::Completed),
                ..Default::default()
            },
        ));
        wire.extend_from_slice(&frame(&b));
        for split in 0..=wire.len() {
            for step in [1usize, 3, 64] {
                let mut r = GrpcFrames::new(64);
                let mut got: Vec<String> = Vec::new();
                let mut skipped = 0;
                let mut push = |item: GrpcItem<'_>| {
                    got.push(match item {
                        GrpcItem::Message(m) => match observe(A2aMethod::SendStreamingMessage, m) {
                            Some(o) => format!("{:?}", o.state),
                            None => format!("bad {}", m.len()),
                        },
                        GrpcItem::Compressed(m) => format!("compressed {}", m.len()),
                        GrpcItem::Overlong => "overlong".into(),
                        GrpcItem::Skipped(b) => {
                            skipped += b.len();
                            return;
                        }
                    })
                };
                r.feed(&wire[..split], &mut push);
                for c in wire[split..].chunks(step) {
                    r.feed(c, &mut push);
                }
                assert_eq!(
                    got,
                    [
                        "Some(Submitted)",
                        "None",
                        "compressed 3",
                        "overlong",
                        "Some(Completed)"
                    ],
                    "split {split}, step {step}"
                );
                assert_eq!(skipped, 105, "the overlong message, prefix and all");
                assert!(r.buf.capacity() <= 64, "bounded by the limit");
            }
        }
    }

    #[test]
    fn content_types_and_paths() {
        assert!(is_grpc_content_type(b"application/grpc"));
        assert!(is_grpc_content_type(b"Application/GRPC+proto"));
        assert!(is_grpc_content_type(b"application/grpc;charset=x"));
        assert!(!is_grpc_content_type(b"application/grpc-web"));
        assert!(!is_grpc_content_type(b"application/json"));
        for (ct, proto) in [
            (&b"application/grpc"[..], true),
            (b"application/grpc+proto", true),
            (b"APPLICATION/GRPC+PROTO; charset=x", true),
            (b"application/grpc;x=y", true),
            (b"application/grpc+json", false),
            (b"application/grpc+protobuf", false),
            (b"application/grpc-web", false),
            (b"application/json", false),
            (b"application/grp", false),
        ] {
            assert_eq!(is_proto_codec(ct), proto, "{}", String::from_utf8_lossy(ct));
        }
        assert_eq!(
            method_of("/lf.a2a.v1.A2AService/SendStreamingMessage"),
            Some(Some(A2aMethod::SendStreamingMessage))
        );
        assert_eq!(method_of("/lf.a2a.v1.A2AService/Nope"), Some(None));
        assert_eq!(method_of("/grpc.health.v1.Health/Check"), None);
        assert_eq!(
            service_of("/grpc.health.v1.Health/Check"),
            Some("grpc.health.v1.Health")
        );
        for path in [
            "/grpc.health.v1.Health",
            "/grpc.health.v1.Health/",
            "//Check",
            "/a/b/c",
            "x/y",
        ] {
            assert_eq!(service_of(path), None, "{path}");
        }
        assert_eq!(single_message(&[0, 0, 0, 0, 2, 1]), None);
        assert_eq!(single_message(&[1, 0, 0, 0, 1, 1]), None);
        assert_eq!(single_message(&[0, 0, 0, 0, 1, 1]), Some(&[1u8][..]));
    }
}
