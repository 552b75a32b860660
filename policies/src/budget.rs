//! Budget arithmetic: a child gets no more time or meter than the network
//! allows, and an account is never promised twice.
//!
//! Mirrors the a2a-rust SDK's budget extension (ADR 0023,
//! `a2a-protocol-types` 0.15 `budget.rs`, `budget/handle.rs`): a grant on
//! the message that starts or continues a task names the time left
//! (`remainingMs`, relative, so clock skew does not move it) and an amount
//! of each named meter (`meters`). The gateway checks the grant as the SDK's
//! server does ([`validate`]), holds it to the route's, tenant's and
//! caller's caps ([`apply_caps`]), reserves it from the caller's accounts
//! ([`Account`]), and stops the child once its deadline passes
//! ([`is_past`]) or a reported spend passes the grant ([`over_cap`]).
//! Times are Unix milliseconds.

use std::collections::BTreeMap;
use std::fmt;

/// `https://a2a-rust.com/extensions/budget/v1`.
pub const BUDGET_EXTENSION_URI: &str = "https://a2a-rust.com/extensions/budget/v1";
/// The metadata key of a grant (`Message.metadata`) and of a status
/// (`TaskStatusUpdateEvent.metadata`: `{"remainingMs","meters","spent"}`).
pub const BUDGET_METADATA_KEY: &str = "a2a-rust.com/budget";
/// `https://a2a-rust.com/extensions/failure/v1`: named in
/// `status.message.extensions` of a failure that carries a class.
pub const FAILURE_EXTENSION_URI: &str = "https://a2a-rust.com/extensions/failure/v1";
/// The `status.message.metadata` key of a failure's class.
pub const FAILURE_METADATA_KEY: &str = "a2a-rust.com/failure";
/// The failure class of a turn stopped by its budget (the SDK's
/// `FailureClass::BudgetExhausted`); not retryable as it stands.
pub const BUDGET_EXHAUSTED_CLASS: &str = "budget-exhausted";
/// The most meters one grant may name (the SDK's `MAX_METERS`).
pub const MAX_METERS: usize = 16;
/// The longest meter name, in bytes (the SDK's `MAX_METER_NAME_LEN`).
pub const MAX_METER_NAME_LEN: usize = 64;
/// The meter the SDK's tool loop charges a model's input + output tokens to.
pub const TOKENS_METER: &str = "tokens";
/// The wire name of the grant's time, as [`Admitted`] lists it among
/// changed fields. No meter can be named so: meter names are lower case.
pub const REMAINING_MS: &str = "remainingMs";
/// The least time a child grant keeps back (the SDK's `MIN_GRANT_RESERVE`).
pub const MIN_GRANT_RESERVE_MS: u64 = 100;
/// The most time a child grant keeps back (the SDK's `MAX_GRANT_RESERVE`).
pub const MAX_GRANT_RESERVE_MS: u64 = 5_000;

/// A number as it arrived in a grant, before it is known to be whole.
///
/// Not a bare `f64`: a Rust peer may send any `u64` (its `with_time`
/// saturates at `u64::MAX`), which an `f64` cannot hold exactly. From a
/// `serde_json::Number` `n`:
/// `n.as_u64().map_or_else(|| Amount::from(n.as_f64().unwrap_or(f64::NAN)), Amount::Whole)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// A non-negative integer.
    Whole(u64),
    /// Any other number: a float (`30000.0` from a Python peer), a negative,
    /// or one beyond `u64`.
    Float(f64),
}

impl Amount {
    /// The whole, non-negative value: an integral float counts (Python
    /// peers send `30000.0`, and the gateway forwards it as `30000`), while
    /// a negative, a fraction, NaN, an infinity or anything of 2^64 or more
    /// does not.
    pub fn whole(self) -> Option<u64> {
        match self {
            Amount::Whole(n) => Some(n),
            // 2^64 is exact in f64; every integral float below it fits.
            Amount::Float(f)
                if f.is_finite() && f.fract() == 0.0 && f >= 0.0 && f < 2f64.powi(64) =>
            {
                Some(f as u64)
            }
            Amount::Float(_) => None,
        }
    }
}

impl From<u64> for Amount {
    fn from(n: u64) -> Self {
        Amount::Whole(n)
    }
}

impl From<f64> for Amount {
    fn from(f: f64) -> Self {
        Amount::Float(f)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Whole(n) => write!(f, "{n}"),
            Amount::Float(x) => write!(f, "{x}"),
        }
    }
}

/// A checked grant: the time and the amount of each meter a child may
/// spend on one turn. At least one part is present, at most
/// [`MAX_METERS`] meters, every name valid.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Grant {
    /// The time left when the message was sent, in ms; `None` sets no
    /// deadline.
    pub remaining_ms: Option<u64>,
    /// The amount of each meter, by name. A meter not named is unlimited.
    pub meters: BTreeMap<String, u64>,
}

/// Why a grant is refused: JSON-RPC `-32602` InvalidParams (HTTP 400), and
/// no child is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BudgetRefusal {
    /// The grant is not an object of the right shape (the gateway's parser
    /// says why, as the SDK passes on its serde error).
    Malformed(String),
    /// `remainingMs` or a meter is not a whole number from 0 to `u64::MAX`.
    BadNumber {
        /// The meter's name, or `None` for `remainingMs`.
        meter: Option<String>,
        /// The value as it arrived.
        value: String,
    },
    /// Neither `remainingMs` nor a meter.
    Empty,
    /// More than [`MAX_METERS`] meters.
    TooManyMeters(usize),
    /// A meter name that is not 1 to 64 of `[a-z0-9._-]`.
    BadMeterName(String),
    /// `remainingMs` is 0: refused rather than run for no time.
    DeadlinePassed,
    /// [`OverCap::Refuse`]: the grant asks for more than a cap.
    AboveCap {
        /// The meter's name, or `None` for `remainingMs`.
        meter: Option<String>,
        asked: u64,
        cap: u64,
    },
    /// With the capped meters it omits (which go as 0), the child's grant
    /// would name more meters than its server accepts.
    TooManyWithCaps(usize),
}

impl fmt::Display for BudgetRefusal {
    /// The SDK's own wording where the SDK has the check, so a caller sees
    /// the same error from the gateway as from the worker.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetRefusal::Malformed(why) => write!(f, "malformed budget: {why}"),
            BudgetRefusal::BadNumber { meter: None, value } => write!(
                f,
                "malformed budget: {REMAINING_MS} is {value}, not a whole number from 0 to {}",
                u64::MAX
            ),
            BudgetRefusal::BadNumber {
                meter: Some(name),
                value,
            } => write!(
                f,
                "malformed budget: meter {name:?} is {value}, not a whole number from 0 to {}",
                u64::MAX
            ),
            BudgetRefusal::Empty => {
                f.write_str("malformed budget: it names neither remainingMs nor a meter")
            }
            BudgetRefusal::TooManyMeters(n) => {
                write!(f, "malformed budget: {n} meters, more than {MAX_METERS}")
            }
            BudgetRefusal::BadMeterName(name) => write!(
                f,
                "malformed budget: meter name {name:?} is not 1 to {MAX_METER_NAME_LEN} of [a-z0-9._-]"
            ),
            BudgetRefusal::DeadlinePassed => {
                f.write_str("the budget's deadline has already passed (remainingMs is 0)")
            }
            BudgetRefusal::AboveCap {
                meter: None,
                asked,
                cap,
            } => write!(
                f,
                "budget over the gateway's cap: {REMAINING_MS} is {asked}, the cap is {cap}"
            ),
            BudgetRefusal::AboveCap {
                meter: Some(name),
                asked,
                cap,
            } => write!(
                f,
                "budget over the gateway's cap: meter {name:?} is {asked}, the cap is {cap}"
            ),
            BudgetRefusal::TooManyWithCaps(n) => write!(
                f,
                "budget over the gateway's caps: with the capped meters it omits (granted as 0) \
                 it would name {n} meters, more than {MAX_METERS}"
            ),
        }
    }
}

impl std::error::Error for BudgetRefusal {}

/// A meter name is 1 to 64 bytes of `[a-z0-9._-]`.
pub fn is_meter_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_METER_NAME_LEN
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
}

/// Checks a received grant, as the SDK's server does before any work.
///
/// Takes the grant's parts already out of JSON (the gateway refuses a
/// grant that is not `{"remainingMs"?: number, "meters"?: {name: number}}`
/// with [`BudgetRefusal::Malformed`]; `null` counts as absent). A meter
/// named twice keeps its last amount, as a JSON map does.
///
/// The order of checks is the SDK's, so the same grant gets the same error:
/// numbers (its parse), then neither part, too many meters, the first bad
/// name in name order, and last `remainingMs` 0.
pub fn validate(
    remaining_ms: Option<Amount>,
    meters: &[(String, Amount)],
) -> Result<Grant, BudgetRefusal> {
    let remaining_ms = match remaining_ms {
        None => None,
        Some(a) => Some(a.whole().ok_or_else(|| BudgetRefusal::BadNumber {
            meter: None,
            value: a.to_string(),
        })?),
    };
    let mut named = BTreeMap::new();
    for (name, a) in meters {
        let n = a.whole().ok_or_else(|| BudgetRefusal::BadNumber {
            meter: Some(name.clone()),
            value: a.to_string(),
        })?;
        named.insert(name.clone(), n);
    }
    let grant = Grant {
        remaining_ms,
        meters: named,
    };
    check(&grant)?;
    if grant.remaining_ms == Some(0) {
        return Err(BudgetRefusal::DeadlinePassed);
    }
    Ok(grant)
}

/// The SDK's `Budget::validate`: a part present, at most [`MAX_METERS`]
/// meters, every name valid.
fn check(grant: &Grant) -> Result<(), BudgetRefusal> {
    if grant.remaining_ms.is_none() && grant.meters.is_empty() {
        return Err(BudgetRefusal::Empty);
    }
    if grant.meters.len() > MAX_METERS {
        return Err(BudgetRefusal::TooManyMeters(grant.meters.len()));
    }
    match grant.meters.keys().find(|n| !is_meter_name(n)) {
        Some(bad) => Err(BudgetRefusal::BadMeterName(bad.clone())),
        None => Ok(()),
    }
}

/// The most a child may be given through the gateway: the route's,
/// tenant's and caller's caps, merged (smallest wins) by the caller.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Caps {
    /// The longest `remainingMs`; should be at least 1 (an injected 0 would
    /// be refused by the worker).
    pub max_deadline_ms: Option<u64>,
    /// The most of each meter one task may be granted.
    pub meters: BTreeMap<String, u64>,
}

impl Caps {
    /// No cap at all: grants pass untouched and none is injected.
    pub fn is_empty(&self) -> bool {
        self.max_deadline_ms.is_none() && self.meters.is_empty()
    }

    /// The caps that hold under both `self` and `other` (a route's, then a
    /// tenant's, then a caller's): the smaller of each cap both name, and
    /// every cap only one names.
    pub fn tighten(&self, other: &Caps) -> Caps {
        let max_deadline_ms = match (self.max_deadline_ms, other.max_deadline_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut meters = self.meters.clone();
        for (name, &cap) in &other.meters {
            meters
                .entry(name.clone())
                .and_modify(|c| *c = (*c).min(cap))
                .or_insert(cap);
        }
        Caps {
            max_deadline_ms,
            meters,
        }
    }
}

/// What a route does with a grant that asks for more than a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OverCap {
    /// Lower it to the cap and let the child start.
    #[default]
    Clamp,
    /// Refuse the send (`-32602`): the caller asked for what it cannot have.
    Refuse,
}

impl OverCap {
    /// The spelling used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            OverCap::Clamp => "clamp",
            OverCap::Refuse => "refuse",
        }
    }

    /// Reads the config spelling (`"clamp"`, `"refuse"`).
    pub fn parse(s: &str) -> Option<OverCap> {
        match s {
            "clamp" => Some(OverCap::Clamp),
            "refuse" => Some(OverCap::Refuse),
            _ => None,
        }
    }
}

/// The grant a child gets, and how it differs from what the caller sent.
/// Field lists hold [`REMAINING_MS`] or meter names, in that order, for
/// logs and the clamp metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The grant to put on the child's message (metadata and extension).
    pub grant: Grant,
    /// Fields the caller asked more of than a cap allows, lowered to it.
    pub clamped: Vec<String>,
    /// Fields the caller's grant left out that the caps set:
    /// `remainingMs` to its cap (no deadline asked is asking for no
    /// limit), a capped meter to 0 (a child cannot spend outside its
    /// grant by omission). Set in either mode: omitting is not over-asking.
    pub filled: Vec<String>,
    /// There was no grant; the caps made one, each in full.
    pub injected: bool,
}

/// Holds a (validated) grant to `caps`, deciding the grant the child gets.
///
/// * `remainingMs`: min(asked, cap); absent with a cap → the cap.
/// * A capped meter: min(asked, cap); one the grant omits → 0, as the SDK's
///   `BudgetHandle::grant` does.
/// * A meter only the grant names passes through unchanged.
/// * No grant: with caps, one is injected with every cap in full; with no
///   caps, `Ok(None)` — nothing to attach, nothing to reserve.
///
/// Under [`OverCap::Refuse`] the first ask over a cap (time first, then
/// meters by name) refuses the send instead of being lowered.
///
/// # Errors
///
/// [`BudgetRefusal::AboveCap`] under `Refuse`, and
/// [`BudgetRefusal::TooManyWithCaps`] when the omitted capped meters would
/// take the child past [`MAX_METERS`] (the SDK's client would drop the
/// grant's own meters there; the gateway refuses rather than forward a
/// grant looser than the caller's).
/// A linked child's grant bounded by its parent's deadline (`parent_ms`:
/// what the parent has left when the child's send arrives): a child
/// cannot outlive its parent's budget. A deadline beyond it, or none, is
/// lowered to it (never refused: the caller did not choose the parent's
/// deadline); a send with no grant at all gets one with that deadline
/// alone. `None` parent: the admission as it was.
pub fn inherit_deadline(admitted: Option<Admitted>, parent_ms: Option<u64>) -> Option<Admitted> {
    let Some(parent_ms) = parent_ms else {
        return admitted;
    };
    // An injected 0 would be refused by the worker.
    let parent_ms = parent_ms.max(1);
    let mut a = admitted.unwrap_or(Admitted {
        grant: Grant::default(),
        clamped: Vec::new(),
        filled: Vec::new(),
        injected: true,
    });
    match a.grant.remaining_ms {
        Some(ms) if ms <= parent_ms => {}
        Some(_) => {
            a.grant.remaining_ms = Some(parent_ms);
            if !a.injected && !a.clamped.iter().any(|f| f == REMAINING_MS) {
                a.clamped.push(REMAINING_MS.to_owned());
            }
        }
        None => {
            a.grant.remaining_ms = Some(parent_ms);
            if !a.injected {
                a.filled.push(REMAINING_MS.to_owned());
            }
        }
    }
    Some(a)
}

/// What a parent's grant has left of each meter it limits: its grant less
/// what it and its children spent.
pub fn remaining_meters(grant: &Grant, spent: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    remaining_meters_of(&grant.meters, spent)
}

/// [`remaining_meters`] of a grant's meters alone (a parent's budget as
/// the store keeps it).
pub fn remaining_meters_of(
    grant: &BTreeMap<String, u64>,
    spent: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    grant
        .iter()
        .map(|(m, &g)| {
            (
                m.clone(),
                g.saturating_sub(spent.get(m).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// A linked child whose own send carries no grant is granted what its
/// parent has left of each meter (`parent_left`; the route's caps, if any,
/// still bound it): its spend is its parent's. A send that carries a grant
/// keeps its own meters (its caller chose them; the parent is charged what
/// it spends all the same).
pub fn inherit_meters(
    admitted: Option<Admitted>,
    parent_left: Option<&BTreeMap<String, u64>>,
    sent_grant: bool,
) -> Option<Admitted> {
    let Some(left) = parent_left.filter(|l| !l.is_empty() && !sent_grant) else {
        return admitted;
    };
    let mut a = admitted.unwrap_or(Admitted {
        grant: Grant::default(),
        clamped: Vec::new(),
        filled: Vec::new(),
        injected: true,
    });
    for (meter, &n) in left {
        let e = a.grant.meters.entry(meter.clone()).or_insert(n);
        *e = (*e).min(n);
    }
    Some(a)
}

/// Spend past the grant: the first meter whose `spent` (a task's own and
/// its children's) exceeds it.
pub fn over_grant(
    own: &BTreeMap<String, u64>,
    children: &BTreeMap<String, u64>,
    grant: &Grant,
) -> Option<String> {
    grant.meters.iter().find_map(|(m, &g)| {
        let s = own.get(m).copied().unwrap_or(0) + children.get(m).copied().unwrap_or(0);
        (s > g).then(|| m.clone())
    })
}

/// The first meter of `grant` that `spent` exceeds: a parent's budget as
/// the store keeps it for its children on every replica (where the spend
/// is already summed). A meter the grant does not name limits nothing.
pub fn meters_over(grant: &BTreeMap<String, u64>, spent: &BTreeMap<String, u64>) -> Option<String> {
    grant
        .iter()
        .find(|(m, &g)| spent.get(*m).is_some_and(|&s| s > g))
        .map(|(m, _)| m.clone())
}

pub fn apply_caps(
    grant: Option<&Grant>,
    caps: &Caps,
    over: OverCap,
) -> Result<Option<Admitted>, BudgetRefusal> {
    let Some(asked) = grant else {
        if caps.is_empty() {
            return Ok(None);
        }
        return Ok(Some(Admitted {
            grant: Grant {
                remaining_ms: caps.max_deadline_ms,
                meters: caps.meters.clone(),
            },
            clamped: Vec::new(),
            filled: Vec::new(),
            injected: true,
        }));
    };
    let mut out = Admitted {
        grant: asked.clone(),
        clamped: Vec::new(),
        filled: Vec::new(),
        injected: false,
    };
    if let Some(cap) = caps.max_deadline_ms {
        match asked.remaining_ms {
            None => {
                out.grant.remaining_ms = Some(cap);
                out.filled.push(REMAINING_MS.to_owned());
            }
            Some(ms) if ms > cap => {
                if over == OverCap::Refuse {
                    return Err(BudgetRefusal::AboveCap {
                        meter: None,
                        asked: ms,
                        cap,
                    });
                }
                out.grant.remaining_ms = Some(cap);
                out.clamped.push(REMAINING_MS.to_owned());
            }
            Some(_) => {}
        }
    }
    for (name, &cap) in &caps.meters {
        match asked.meters.get(name) {
            None => {
                out.grant.meters.insert(name.clone(), 0);
                out.filled.push(name.clone());
            }
            Some(&n) if n > cap => {
                if over == OverCap::Refuse {
                    return Err(BudgetRefusal::AboveCap {
                        meter: Some(name.clone()),
                        asked: n,
                        cap,
                    });
                }
                out.grant.meters.insert(name.clone(), cap);
                out.clamped.push(name.clone());
            }
            Some(_) => {}
        }
    }
    if out.grant.meters.len() > MAX_METERS {
        return Err(BudgetRefusal::TooManyWithCaps(out.grant.meters.len()));
    }
    Ok(Some(out))
}

/// Not enough left: an account cannot cover a reservation, or a parent's
/// time cannot cover a child's grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// What there was to give: the account's [`Account::left`], or the
    /// time a child could have had after the reserve ([`child_time`]).
    pub left: u64,
}

/// One meter's total for one tenant or caller over one window.
///
/// A grant is reserved when its child starts, so concurrent children (on
/// any replica, when the store applies these steps atomically) cannot each
/// take the whole; only spend reported beyond a reservation can take
/// `spent + reserved` past `limit`, since real spend is never refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Account {
    pub limit: u64,
    /// Settled spend, overdraft included.
    pub spent: u64,
    /// Held for children not yet settled.
    pub reserved: u64,
}

impl Account {
    /// A fresh account of `limit`.
    pub fn new(limit: u64) -> Self {
        Account {
            limit,
            spent: 0,
            reserved: 0,
        }
    }

    /// What a new child may still be granted: `limit − spent − reserved`,
    /// never below 0.
    pub fn left(&self) -> u64 {
        self.limit
            .saturating_sub(self.spent.saturating_add(self.reserved))
    }

    /// Reserves `ask` for a child that is starting, all or nothing, and
    /// returns the amount reserved (`ask`) to hand back to [`settle`] or
    /// [`release`]. A 0 ask always succeeds, even on an overdrawn account
    /// (a child granted 0 of a meter spends none of it).
    ///
    /// # Errors
    ///
    /// [`Exhausted`] with what is left when `ask` is more; nothing is
    /// reserved then, and the child must not start.
    ///
    /// [`settle`]: Account::settle
    /// [`release`]: Account::release
    pub fn reserve(&mut self, ask: u64) -> Result<u64, Exhausted> {
        let left = self.left();
        if ask > left {
            return Err(Exhausted { left });
        }
        self.reserved += ask;
        Ok(ask)
    }

    /// The child settled (or ended any other way): its reservation is
    /// replaced by the spend it reported, less refunding the rest, more
    /// charged as overdraft. With no report (lost stream, cancel, a
    /// settling update without the meter) the whole reservation stays
    /// spent, as the SDK's `ChildGrant::settle` does.
    pub fn settle(&mut self, reserved: u64, reported_spent: Option<u64>) {
        self.reserved = self.reserved.saturating_sub(reserved);
        self.spent = self
            .spent
            .saturating_add(reported_spent.unwrap_or(reserved));
    }

    /// The send was refused (no child started: a transport error, an error
    /// reply, an auth or endpoint failure): the whole reservation goes back.
    pub fn release(&mut self, reserved: u64) {
        self.reserved = self.reserved.saturating_sub(reserved);
    }
}

/// The tenant a send's caps and `per = "tenant"` account go by: the one it
/// names when the route's config names that tenant (a cap table, or
/// `[routes.auth] tenants`), else none. A tenant is chosen by the caller:
/// a name the config does not know must not open a fresh account (a caller
/// could name a new one for every send, and grow the store without bound),
/// so every such name shares the account of sends that name no tenant.
pub fn budget_tenant(tenant: Option<&str>, named: impl Fn(&str) -> bool) -> Option<&str> {
    tenant.filter(|t| named(t))
}

/// The start of the fixed window holding `now_ms`, windows aligned to the
/// Unix epoch (a daily window starts at 00:00 UTC), so that every replica
/// keys the same account. A `window_ms` of 0 is one window forever (0).
///
/// A reservation is settled in the window it was made in, even once a new
/// window has begun: the store should remember that window with it.
pub fn window_start(now_ms: u64, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return 0;
    }
    now_ms - now_ms % window_ms
}

/// When the window holding `now_ms` ends (the next one starts): the
/// account's expiry in a store, and the `Retry-After` of an exhausted one.
/// `u64::MAX` for a `window_ms` of 0.
pub fn window_end(now_ms: u64, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return u64::MAX;
    }
    window_start(now_ms, window_ms).saturating_add(window_ms)
}

/// The first meter, by name, whose reported spend passes its grant; the
/// child must then be cancelled. Reaching the grant exactly is within it
/// (the SDK's `charge` fails only past it); a meter the grant does not name
/// is unlimited.
pub fn over_cap(spent: &BTreeMap<String, u64>, grant: &Grant) -> Option<String> {
    spent
        .iter()
        .find(|(name, &s)| grant.meters.get(*name).is_some_and(|&g| s > g))
        .map(|(name, _)| name.clone())
}

/// A grant's deadline: the request's receipt (before any queueing at the
/// gateway) plus `remainingMs`.
pub fn deadline_ms(received_ms: u64, remaining_ms: u64) -> u64 {
    received_ms.saturating_add(remaining_ms)
}

/// Past the deadline: no time is left once `now` reaches it (the SDK's
/// time left is then zero). Unlike a lease, which lapses only after it.
pub fn is_past(now_ms: u64, deadline_ms: u64) -> bool {
    now_ms >= deadline_ms
}

/// The time left at `now_ms`: the `remainingMs` to forward when the child's
/// message leaves the gateway later than the caller's arrived.
pub fn time_left(now_ms: u64, deadline_ms: u64) -> u64 {
    deadline_ms.saturating_sub(now_ms)
}

/// The time a parent with `left_ms` may give a child that asks `asked_ms`
/// (the SDK's `BudgetHandle::grant`): what is left less a reserve for
/// transit and the parent's wrap-up (5% of it, 100 ms to 5 s), no more
/// than asked.
///
/// # Errors
///
/// [`Exhausted`] (with the time after the reserve) when that is under
/// 1 ms: it would go out as `remainingMs: 0`, which the child refuses.
pub fn child_time(left_ms: u64, asked_ms: Option<u64>) -> Result<u64, Exhausted> {
    let reserve = (left_ms / 20).clamp(MIN_GRANT_RESERVE_MS, MAX_GRANT_RESERVE_MS);
    let after = left_ms.saturating_sub(reserve);
    let time = asked_ms.map_or(after, |a| a.min(after));
    if time < 1 {
        return Err(Exhausted { left: after });
    }
    Ok(time)
}

/// What stopped a child: its deadline, or a meter's spend past its grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exhaustion {
    Time,
    Meter(String),
}

impl Exhaustion {
    /// Label for logs and metrics.
    pub fn as_str(&self) -> &str {
        match self {
            Exhaustion::Time => "time",
            Exhaustion::Meter(name) => name,
        }
    }
}

/// The text of the budget-exhausted failure the gateway ends the caller's
/// stream with: the `status.message` part and `metadata.error`, as
/// `[code] message`, failure class [`BUDGET_EXHAUSTED_CLASS`].
///
/// The deadline's text is the SDK server's exactly. The meter's is the
/// gateway's own wording: the SDK server never stops a turn for a meter
/// (its executors do, with `the budget's meter "tokens" is spent`).
pub fn exhausted_text(by: &Exhaustion) -> String {
    match by {
        Exhaustion::Time => "[-32603] the caller's budget deadline passed".to_owned(),
        Exhaustion::Meter(name) => format!("[-32603] the budget's {name} meter is exhausted"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parents_meters_bound_its_child() {
        let grant = Grant {
            remaining_ms: None,
            meters: BTreeMap::from([("tokens".to_owned(), 100), ("calls".to_owned(), 3)]),
        };
        let left = remaining_meters(
            &grant,
            &BTreeMap::from([("tokens".to_owned(), 40), ("x".to_owned(), 9)]),
        );
        assert_eq!(
            left,
            BTreeMap::from([("tokens".to_owned(), 60), ("calls".to_owned(), 3)])
        );
        // No grant of its own: the parent's left, within the route's caps.
        let made = inherit_meters(None, Some(&left), false).unwrap();
        assert_eq!(made.grant.meters, left);
        assert!(made.injected);
        let capped = Admitted {
            grant: Grant {
                remaining_ms: Some(5000),
                meters: BTreeMap::from([("tokens".to_owned(), 50)]),
            },
            clamped: Vec::new(),
            filled: Vec::new(),
            injected: true,
        };
        let both = inherit_meters(Some(capped.clone()), Some(&left), false).unwrap();
        assert_eq!(
            both.grant.meters,
            BTreeMap::from([("tokens".to_owned(), 50), ("calls".to_owned(), 3)])
        );
        assert_eq!(both.grant.remaining_ms, Some(5000));
        // Its own grant, or no parent: unchanged.
        assert_eq!(
            inherit_meters(Some(capped.clone()), Some(&left), true),
            Some(capped.clone())
        );
        assert_eq!(
            inherit_meters(Some(capped.clone()), None, false),
            Some(capped)
        );
        assert_eq!(inherit_meters(None, Some(&BTreeMap::new()), false), None);
        // Over: own and children's together.
        let own = BTreeMap::from([("tokens".to_owned(), 60)]);
        let kids = BTreeMap::from([("tokens".to_owned(), 41)]);
        assert_eq!(over_grant(&own, &kids, &grant), Some("tokens".to_owned()));
        assert_eq!(over_grant(&own, &BTreeMap::new(), &grant), None);
    }

    #[test]
    fn a_parents_deadline_bounds_its_child() {
        let admitted = |ms: Option<u64>, injected: bool| Admitted {
            grant: Grant {
                remaining_ms: ms,
                meters: BTreeMap::from([("tokens".to_owned(), 5)]),
            },
            clamped: Vec::new(),
            filled: Vec::new(),
            injected,
        };
        // No parent: unchanged, none made.
        assert_eq!(inherit_deadline(None, None), None);
        assert_eq!(
            inherit_deadline(Some(admitted(Some(9), false)), None),
            Some(admitted(Some(9), false))
        );
        // No grant: one with the parent's deadline alone.
        let made = inherit_deadline(None, Some(700)).unwrap();
        assert_eq!(
            (
                made.grant.remaining_ms,
                made.grant.meters.len(),
                made.injected
            ),
            (Some(700), 0, true)
        );
        // A longer deadline is lowered, a shorter one kept, none filled.
        let lowered = inherit_deadline(Some(admitted(Some(9000), false)), Some(700)).unwrap();
        assert_eq!(
            (lowered.grant.remaining_ms, lowered.clamped.clone()),
            (Some(700), vec![REMAINING_MS.to_owned()])
        );
        assert_eq!(lowered.grant.meters.get("tokens"), Some(&5));
        let kept = inherit_deadline(Some(admitted(Some(300), false)), Some(700)).unwrap();
        assert_eq!(
            (kept.grant.remaining_ms, kept.clamped.len()),
            (Some(300), 0)
        );
        let filled = inherit_deadline(Some(admitted(None, false)), Some(700)).unwrap();
        assert_eq!(
            (filled.grant.remaining_ms, filled.filled.clone()),
            (Some(700), vec![REMAINING_MS.to_owned()])
        );
        // A parent already past its deadline leaves 1 ms, not 0.
        assert_eq!(
            inherit_deadline(None, Some(0)).unwrap().grant.remaining_ms,
            Some(1)
        );
    }

    #[test]
    fn unknown_tenants_share_the_untenanted_account() {
        let named = |t: &str| t == "acme";
        assert_eq!(budget_tenant(Some("acme"), named), Some("acme"));
        for t in [Some("acme1"), Some("ACME"), Some(""), None] {
            assert_eq!(budget_tenant(t, named), None, "{t:?}");
        }
    }

    fn meters(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|&(n, v)| (n.to_owned(), v)).collect()
    }

    fn grant(ms: Option<u64>, pairs: &[(&str, u64)]) -> Grant {
        Grant {
            remaining_ms: ms,
            meters: meters(pairs),
        }
    }

    fn asks(pairs: &[(&str, Amount)]) -> Vec<(String, Amount)> {
        pairs.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect()
    }

    #[test]
    fn tighten_table() {
        let caps = |ms: Option<u64>, pairs: &[(&str, u64)]| Caps {
            max_deadline_ms: ms,
            meters: meters(pairs),
        };
        let table = [
            (caps(None, &[]), caps(None, &[]), caps(None, &[])),
            (caps(Some(10), &[]), caps(None, &[]), caps(Some(10), &[])),
            (caps(None, &[]), caps(Some(7), &[]), caps(Some(7), &[])),
            (caps(Some(10), &[]), caps(Some(7), &[]), caps(Some(7), &[])),
            (caps(Some(5), &[]), caps(Some(7), &[]), caps(Some(5), &[])),
            (
                caps(None, &[("tokens", 100), ("calls", 3)]),
                caps(None, &[("tokens", 50), ("usd", 9)]),
                caps(None, &[("calls", 3), ("tokens", 50), ("usd", 9)]),
            ),
            (
                caps(None, &[("tokens", 10)]),
                caps(None, &[("tokens", 50)]),
                caps(None, &[("tokens", 10)]),
            ),
        ];
        for (a, b, want) in table {
            assert_eq!(a.tighten(&b), want, "{a:?} + {b:?}");
            assert_eq!(b.tighten(&a), want, "symmetric: {b:?} + {a:?}");
        }
    }

    #[test]
    fn amounts_table() {
        let table = [
            (Amount::Whole(0), Some(0)),
            (Amount::Whole(u64::MAX), Some(u64::MAX)),
            (Amount::Float(30000.0), Some(30_000)),
            (Amount::Float(0.0), Some(0)),
            (Amount::Float(-0.0), Some(0)),
            (Amount::Float(1.5), None),
            (Amount::Float(-1.0), None),
            (Amount::Float(f64::NAN), None),
            (Amount::Float(f64::INFINITY), None),
            (Amount::Float(f64::NEG_INFINITY), None),
            (Amount::Float(2f64.powi(64)), None),
            (Amount::Float(2f64.powi(63)), Some(1 << 63)),
            (Amount::Float(1e300), None),
        ];
        for (a, want) in table {
            assert_eq!(a.whole(), want, "{a:?}");
        }
    }

    #[test]
    fn validate_table() {
        let seventeen: Vec<(String, Amount)> = (0..17)
            .map(|i| (format!("m{i:02}"), Amount::Whole(1)))
            .collect();
        let sixteen = &seventeen[..16];
        let long = "x".repeat(MAX_METER_NAME_LEN);
        let too_long = "x".repeat(MAX_METER_NAME_LEN + 1);
        type Row<'a> = (
            &'a str,
            Option<Amount>,
            Vec<(String, Amount)>,
            Result<Grant, &'a str>,
        );
        let table: Vec<Row> = vec![
            (
                "the golden grant",
                Some(30_000.into()),
                asks(&[("tokens", 50_000.into())]),
                Ok(grant(Some(30_000), &[("tokens", 50_000)])),
            ),
            ("time only", Some(1.into()), vec![], Ok(grant(Some(1), &[]))),
            (
                "meters only",
                None,
                asks(&[("tokens", 0.into()), ("usd_micros", 7.into())]),
                Ok(grant(None, &[("tokens", 0), ("usd_micros", 7)])),
            ),
            (
                "integral floats from Python",
                Some(30000.0.into()),
                asks(&[("tokens", 50000.0.into())]),
                Ok(grant(Some(30_000), &[("tokens", 50_000)])),
            ),
            (
                "u64::MAX, as a saturated Rust duration",
                Some(u64::MAX.into()),
                vec![],
                Ok(grant(Some(u64::MAX), &[])),
            ),
            (
                "a name twice keeps the last",
                None,
                asks(&[("tokens", 1.into()), ("tokens", 2.into())]),
                Ok(grant(None, &[("tokens", 2)])),
            ),
            (
                "sixteen meters",
                None,
                sixteen.to_vec(),
                Ok(Grant {
                    remaining_ms: None,
                    meters: sixteen
                        .iter()
                        .map(|(n, _)| (n.clone(), 1))
                        .collect(),
                }),
            ),
            (
                "the longest name, every allowed byte",
                None,
                asks(&[(long.as_str(), 1.into()), ("a.b-c_9", 1.into())]),
                Ok(grant(None, &[(long.as_str(), 1), ("a.b-c_9", 1)])),
            ),
            (
                "empty",
                None,
                vec![],
                Err("malformed budget: it names neither remainingMs nor a meter"),
            ),
            (
                "seventeen meters",
                Some(1.into()),
                seventeen.clone(),
                Err("malformed budget: 17 meters, more than 16"),
            ),
            (
                "upper case",
                None,
                asks(&[("Tokens", 1.into())]),
                Err(r#"malformed budget: meter name "Tokens" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "space",
                None,
                asks(&[("tok ens", 1.into())]),
                Err(r#"malformed budget: meter name "tok ens" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "non-ascii",
                None,
                asks(&[("tök", 1.into())]),
                Err(r#"malformed budget: meter name "tök" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "empty name",
                None,
                asks(&[("", 1.into())]),
                Err(r#"malformed budget: meter name "" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "name quoted as Rust does",
                None,
                asks(&[("a\"b\n", 1.into())]),
                Err(r#"malformed budget: meter name "a\"b\n" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "65 bytes",
                None,
                asks(&[(too_long.as_str(), 1.into())]),
                Err("malformed budget: meter name \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\" is not 1 to 64 of [a-z0-9._-]"),
            ),
            (
                "first bad name by name order",
                None,
                asks(&[("zz Z", 1.into()), ("B", 1.into())]),
                Err(r#"malformed budget: meter name "B" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "zero time",
                Some(0.into()),
                asks(&[("tokens", 5.into())]),
                Err("the budget's deadline has already passed (remainingMs is 0)"),
            ),
            (
                "zero time as a float",
                Some(0.0.into()),
                vec![],
                Err("the budget's deadline has already passed (remainingMs is 0)"),
            ),
            (
                "a bad name is found before zero time",
                Some(0.into()),
                asks(&[("X", 1.into())]),
                Err(r#"malformed budget: meter name "X" is not 1 to 64 of [a-z0-9._-]"#),
            ),
            (
                "negative time",
                Some((-1.0).into()),
                vec![],
                Err("malformed budget: remainingMs is -1, not a whole number from 0 to 18446744073709551615"),
            ),
            (
                "fractional time",
                Some(1.5.into()),
                vec![],
                Err("malformed budget: remainingMs is 1.5, not a whole number from 0 to 18446744073709551615"),
            ),
            (
                "NaN meter",
                None,
                asks(&[("tokens", f64::NAN.into())]),
                Err(r#"malformed budget: meter "tokens" is NaN, not a whole number from 0 to 18446744073709551615"#),
            ),
            (
                "beyond u64",
                None,
                asks(&[("tokens", 1e20.into())]),
                Err(r#"malformed budget: meter "tokens" is 100000000000000000000, not a whole number from 0 to 18446744073709551615"#),
            ),
            (
                "numbers are checked before names and counts (the SDK parses first)",
                Some(1.into()),
                {
                    let mut v = seventeen.clone();
                    v.push(("Bad".into(), (-3.0).into()));
                    v
                },
                Err(r#"malformed budget: meter "Bad" is -3, not a whole number from 0 to 18446744073709551615"#),
            ),
        ];
        for (name, ms, ms_meters, want) in table {
            let got = validate(ms, &ms_meters).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_owned), "{name}");
        }
    }

    #[test]
    fn refusal_variants() {
        assert_eq!(
            validate(None, &[]),
            Err(BudgetRefusal::Empty),
            "typed, not only text"
        );
        assert_eq!(
            validate(Some(0.into()), &[]),
            Err(BudgetRefusal::DeadlinePassed)
        );
        assert_eq!(
            BudgetRefusal::Malformed("invalid type: string \"soon\", expected u64".into())
                .to_string(),
            "malformed budget: invalid type: string \"soon\", expected u64"
        );
        for r in [
            BudgetRefusal::Malformed("x".into()),
            BudgetRefusal::BadNumber {
                meter: None,
                value: "-1".into(),
            },
            BudgetRefusal::Empty,
            BudgetRefusal::TooManyMeters(17),
            BudgetRefusal::BadMeterName("X".into()),
        ] {
            assert!(r.to_string().starts_with("malformed budget: "), "{r:?}");
        }
    }

    #[test]
    fn caps_table() {
        use OverCap::*;
        let caps = Caps {
            max_deadline_ms: Some(60_000),
            meters: meters(&[("tokens", 50_000)]),
        };
        let time_cap = Caps {
            max_deadline_ms: Some(60_000),
            meters: BTreeMap::new(),
        };
        let none = Caps::default();
        let admitted = |g: Grant, clamped: &[&str], filled: &[&str], injected: bool| {
            Ok(Some(Admitted {
                grant: g,
                clamped: clamped.iter().map(|s| (*s).to_owned()).collect(),
                filled: filled.iter().map(|s| (*s).to_owned()).collect(),
                injected,
            }))
        };
        type Row<'a> = (
            &'a str,
            Option<Grant>,
            &'a Caps,
            OverCap,
            Result<Option<Admitted>, BudgetRefusal>,
        );
        let table: Vec<Row> = vec![
            ("no grant, no caps", None, &none, Clamp, Ok(None)),
            ("no grant, no caps, refuse", None, &none, Refuse, Ok(None)),
            (
                "no caps: passes untouched",
                Some(grant(Some(u64::MAX), &[("tokens", u64::MAX)])),
                &none,
                Refuse,
                admitted(
                    grant(Some(u64::MAX), &[("tokens", u64::MAX)]),
                    &[],
                    &[],
                    false,
                ),
            ),
            (
                "no grant: injected in full",
                None,
                &caps,
                Clamp,
                admitted(grant(Some(60_000), &[("tokens", 50_000)]), &[], &[], true),
            ),
            (
                "no grant: injected in full under refuse too",
                None,
                &caps,
                Refuse,
                admitted(grant(Some(60_000), &[("tokens", 50_000)]), &[], &[], true),
            ),
            (
                "no grant, time cap only",
                None,
                &time_cap,
                Clamp,
                admitted(grant(Some(60_000), &[]), &[], &[], true),
            ),
            (
                "within caps",
                Some(grant(Some(30_000), &[("tokens", 50_000)])),
                &caps,
                Refuse,
                admitted(grant(Some(30_000), &[("tokens", 50_000)]), &[], &[], false),
            ),
            (
                "time over: clamped",
                Some(grant(Some(3_600_000), &[("tokens", 10)])),
                &caps,
                Clamp,
                admitted(
                    grant(Some(60_000), &[("tokens", 10)]),
                    &["remainingMs"],
                    &[],
                    false,
                ),
            ),
            (
                "both over: clamped",
                Some(grant(Some(60_001), &[("tokens", 50_001)])),
                &caps,
                Clamp,
                admitted(
                    grant(Some(60_000), &[("tokens", 50_000)]),
                    &["remainingMs", "tokens"],
                    &[],
                    false,
                ),
            ),
            (
                "time over: refused",
                Some(grant(Some(60_001), &[("tokens", 50_001)])),
                &caps,
                Refuse,
                Err(BudgetRefusal::AboveCap {
                    meter: None,
                    asked: 60_001,
                    cap: 60_000,
                }),
            ),
            (
                "meter over: refused",
                Some(grant(Some(10), &[("tokens", 80_000)])),
                &caps,
                Refuse,
                Err(BudgetRefusal::AboveCap {
                    meter: Some("tokens".into()),
                    asked: 80_000,
                    cap: 50_000,
                }),
            ),
            (
                "no time asked: the cap fills it",
                Some(grant(None, &[("tokens", 5)])),
                &caps,
                Refuse,
                admitted(
                    grant(Some(60_000), &[("tokens", 5)]),
                    &[],
                    &["remainingMs"],
                    false,
                ),
            ),
            (
                "capped meter omitted: goes as 0",
                Some(grant(Some(1_000), &[])),
                &caps,
                Clamp,
                admitted(
                    grant(Some(1_000), &[("tokens", 0)]),
                    &[],
                    &["tokens"],
                    false,
                ),
            ),
            (
                "capped meter omitted under refuse: still 0, not refused",
                Some(grant(None, &[("usd", 9)])),
                &caps,
                Refuse,
                admitted(
                    grant(Some(60_000), &[("tokens", 0), ("usd", 9)]),
                    &[],
                    &["remainingMs", "tokens"],
                    false,
                ),
            ),
            (
                "uncapped meter passes through unchanged",
                Some(grant(Some(5), &[("tokens", 99_999), ("usd", u64::MAX)])),
                &caps,
                Clamp,
                admitted(
                    grant(Some(5), &[("tokens", 50_000), ("usd", u64::MAX)]),
                    &["tokens"],
                    &[],
                    false,
                ),
            ),
            (
                "time cap only leaves meters alone",
                Some(grant(None, &[("tokens", 99_999)])),
                &time_cap,
                Clamp,
                admitted(
                    grant(Some(60_000), &[("tokens", 99_999)]),
                    &[],
                    &["remainingMs"],
                    false,
                ),
            ),
        ];
        for (name, g, caps, over, want) in table {
            assert_eq!(apply_caps(g.as_ref(), caps, over), want, "{name}");
        }
    }

    #[test]
    fn caps_never_take_a_child_past_sixteen_meters() {
        let sixteen: BTreeMap<String, u64> = (0..16).map(|i| (format!("m{i:02}"), 1)).collect();
        let full = Grant {
            remaining_ms: None,
            meters: sixteen.clone(),
        };
        let caps = Caps {
            max_deadline_ms: None,
            meters: meters(&[("tokens", 10)]),
        };
        assert_eq!(
            apply_caps(Some(&full), &caps, OverCap::Clamp),
            Err(BudgetRefusal::TooManyWithCaps(17))
        );
        // Capping a meter the grant names adds none.
        let caps = Caps {
            max_deadline_ms: None,
            meters: meters(&[("m00", 0)]),
        };
        let got = apply_caps(Some(&full), &caps, OverCap::Clamp)
            .unwrap()
            .unwrap();
        assert_eq!(got.grant.meters.len(), 16);
        assert_eq!(got.clamped, ["m00"]);
    }

    #[test]
    fn cap_refusal_texts() {
        let table = [
            (
                BudgetRefusal::AboveCap {
                    meter: Some("tokens".into()),
                    asked: 80_000,
                    cap: 50_000,
                },
                r#"budget over the gateway's cap: meter "tokens" is 80000, the cap is 50000"#,
            ),
            (
                BudgetRefusal::AboveCap {
                    meter: None,
                    asked: 7_200_000,
                    cap: 3_600_000,
                },
                "budget over the gateway's cap: remainingMs is 7200000, the cap is 3600000",
            ),
            (
                BudgetRefusal::TooManyWithCaps(17),
                "budget over the gateway's caps: with the capped meters it omits (granted as 0) \
                 it would name 17 meters, more than 16",
            ),
        ];
        for (r, want) in table {
            assert_eq!(r.to_string(), want);
        }
    }

    #[test]
    fn over_cap_spellings() {
        for mode in [OverCap::Clamp, OverCap::Refuse] {
            assert_eq!(OverCap::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(OverCap::parse("Clamp"), None);
        assert_eq!(OverCap::default(), OverCap::Clamp);
        assert!(Caps::default().is_empty());
    }

    /// `(step, ask or amount, report) → (result, account after)`.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Reserve(u64, Result<u64, Exhausted>),
        Settle(u64, Option<u64>),
        Release(u64),
    }

    #[test]
    fn account_sequences() {
        use Step::*;
        let acct = |limit, spent, reserved| Account {
            limit,
            spent,
            reserved,
        };
        type Row<'a> = (&'a str, Account, Vec<(Step, Account)>);
        let table: Vec<Row> = vec![
            (
                "reserve, settle under: the rest comes back",
                Account::new(100),
                vec![
                    (Reserve(60, Ok(60)), acct(100, 0, 60)),
                    (Settle(60, Some(25)), acct(100, 25, 0)),
                ],
            ),
            (
                "settle with no report: all of it stays spent",
                Account::new(100),
                vec![
                    (Reserve(60, Ok(60)), acct(100, 0, 60)),
                    (Settle(60, None), acct(100, 60, 0)),
                ],
            ),
            (
                "settle over: overdraft is charged, nothing left",
                Account::new(100),
                vec![
                    (Reserve(60, Ok(60)), acct(100, 0, 60)),
                    (Settle(60, Some(130)), acct(100, 130, 0)),
                    (Reserve(1, Err(Exhausted { left: 0 })), acct(100, 130, 0)),
                    (Reserve(0, Ok(0)), acct(100, 130, 0)),
                ],
            ),
            (
                "release: the send was refused",
                Account::new(100),
                vec![
                    (Reserve(100, Ok(100)), acct(100, 0, 100)),
                    (Reserve(1, Err(Exhausted { left: 0 })), acct(100, 0, 100)),
                    (Release(100), acct(100, 0, 0)),
                    (Reserve(100, Ok(100)), acct(100, 0, 100)),
                ],
            ),
            (
                "all or nothing",
                Account::new(100),
                vec![
                    (Reserve(70, Ok(70)), acct(100, 0, 70)),
                    (Reserve(31, Err(Exhausted { left: 30 })), acct(100, 0, 70)),
                    (Reserve(30, Ok(30)), acct(100, 0, 100)),
                    (Settle(70, Some(0)), acct(100, 0, 30)),
                    (Reserve(70, Ok(70)), acct(100, 0, 100)),
                ],
            ),
            (
                "a zero ask on a zero limit",
                Account::new(0),
                vec![
                    (Reserve(0, Ok(0)), acct(0, 0, 0)),
                    (Reserve(1, Err(Exhausted { left: 0 })), acct(0, 0, 0)),
                ],
            ),
            (
                "huge numbers saturate",
                acct(u64::MAX, u64::MAX - 1, 0),
                vec![
                    (Reserve(1, Ok(1)), acct(u64::MAX, u64::MAX - 1, 1)),
                    (Settle(1, Some(u64::MAX)), acct(u64::MAX, u64::MAX, 0)),
                    (Release(5), acct(u64::MAX, u64::MAX, 0)),
                ],
            ),
        ];
        for (name, mut account, steps) in table {
            for (i, (step, want)) in steps.into_iter().enumerate() {
                match step {
                    Reserve(ask, result) => assert_eq!(account.reserve(ask), result, "{name} #{i}"),
                    Settle(r, report) => account.settle(r, report),
                    Release(r) => account.release(r),
                }
                assert_eq!(account, want, "{name} #{i} {step:?}");
            }
        }
    }

    #[test]
    fn ten_concurrent_children_never_exceed_the_limit() {
        // (limit, each child's ask, children that start)
        let table = [
            (1_000, 100, 10),
            (1_000, 150, 6),
            (999, 100, 9),
            (50, 100, 0),
            (0, 0, 10),
            (1_000_000, 1_000_000, 1),
        ];
        for (limit, ask, want) in table {
            let mut account = Account::new(limit);
            // All ten reserve before any settles, as concurrent starts do.
            let started: Vec<u64> = (0..10).filter_map(|_| account.reserve(ask).ok()).collect();
            assert_eq!(started.len(), want, "{limit}/{ask}");
            assert!(account.spent + account.reserved <= limit, "{limit}/{ask}");
            assert_eq!(account.left(), limit - ask * want as u64);
            for r in started {
                account.settle(r, None);
            }
            assert!(account.spent <= limit, "{limit}/{ask}");
            assert_eq!(account.reserved, 0);
        }
    }

    #[test]
    fn interleaved_children_stay_within_the_limit() {
        // A deterministic shuffle of reserves, settles within the
        // reservation and releases: only reported overdraft could pass the
        // limit, and none is reported here.
        let mut account = Account::new(10_000);
        let mut held: Vec<u64> = Vec::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 4 {
                0 | 1 => {
                    let ask = x % 3_000;
                    let left = account.left();
                    match account.reserve(ask) {
                        Ok(r) => held.push(r),
                        Err(e) => assert!(ask > left && e.left == left),
                    }
                }
                2 if !held.is_empty() => {
                    let r = held.swap_remove((x as usize / 4) % held.len());
                    account.settle(r, (!x.is_multiple_of(8)).then_some(r / 2));
                }
                3 if !held.is_empty() => {
                    let r = held.swap_remove((x as usize / 4) % held.len());
                    account.release(r);
                }
                _ => {}
            }
            assert!(account.spent + account.reserved <= account.limit);
            assert_eq!(account.reserved, held.iter().sum::<u64>());
        }
    }

    #[test]
    fn windows_table() {
        const DAY: u64 = 86_400_000;
        // (now, window, start, end)
        let table = [
            (0, DAY, 0, DAY),
            (DAY - 1, DAY, 0, DAY),
            (DAY, DAY, DAY, 2 * DAY),
            (DAY + 5, DAY, DAY, 2 * DAY),
            (1_700_000_123_456, DAY, 1_699_920_000_000, 1_700_006_400_000),
            (
                1_700_000_123_456,
                3_600_000,
                1_699_999_200_000,
                1_700_002_800_000,
            ),
            (12_345, 1, 12_345, 12_346),
            (12_345, 0, 0, u64::MAX),
            (u64::MAX, DAY, u64::MAX - u64::MAX % DAY, u64::MAX),
        ];
        for (now, window, start, end) in table {
            assert_eq!(window_start(now, window), start, "{now} {window}");
            assert_eq!(window_end(now, window), end, "{now} {window}");
        }
    }

    #[test]
    fn over_cap_table() {
        let g = grant(Some(1_000), &[("tokens", 100), ("usd", 5)]);
        type Row<'a> = (&'a [(&'a str, u64)], Option<&'a str>);
        let table: [Row; 8] = [
            (&[], None),
            (&[("tokens", 99)], None),
            (&[("tokens", 100)], None),
            (&[("tokens", 101)], Some("tokens")),
            (&[("other", u64::MAX)], None),
            (&[("tokens", 101), ("usd", 6)], Some("tokens")),
            (&[("tokens", 1), ("usd", 6)], Some("usd")),
            (&[("aaa", 9), ("usd", 6), ("zzz", 9)], Some("usd")),
        ];
        for (spent, want) in table {
            assert_eq!(
                over_cap(&meters(spent), &g),
                want.map(str::to_owned),
                "{spent:?}"
            );
        }
        let zero = grant(None, &[("tokens", 0)]);
        assert_eq!(over_cap(&meters(&[("tokens", 0)]), &zero), None);
        assert_eq!(
            over_cap(&meters(&[("tokens", 1)]), &zero),
            Some("tokens".into())
        );
    }

    #[test]
    fn deadlines() {
        assert_eq!(deadline_ms(1_000, 500), 1_500);
        assert_eq!(deadline_ms(1_000, u64::MAX), u64::MAX);
        // (now, deadline, past, left)
        let table = [
            (1_499, 1_500, false, 1),
            (1_500, 1_500, true, 0),
            (1_501, 1_500, true, 0),
            (0, u64::MAX, false, u64::MAX),
        ];
        for (now, deadline, past, left) in table {
            assert_eq!(is_past(now, deadline), past, "{now} {deadline}");
            assert_eq!(time_left(now, deadline), left, "{now} {deadline}");
        }
    }

    #[test]
    fn child_time_table() {
        // (left, asked, granted)
        let table = [
            (0, None, Err(Exhausted { left: 0 })),
            (50, None, Err(Exhausted { left: 0 })),
            (100, None, Err(Exhausted { left: 0 })),
            (101, None, Ok(1)),
            (101, Some(5), Ok(1)),
            (101, Some(0), Err(Exhausted { left: 1 })),
            (2_000, None, Ok(1_900)),
            // 5% passes the 100 ms floor above 2 s.
            (2_020, None, Ok(1_919)),
            (60_000, None, Ok(57_000)),
            (60_000, Some(10_000), Ok(10_000)),
            (60_000, Some(57_001), Ok(57_000)),
            // …and meets the 5 s ceiling at 100 s.
            (100_000, None, Ok(95_000)),
            (100_020, None, Ok(95_020)),
            (3_600_000, None, Ok(3_595_000)),
            (u64::MAX, None, Ok(u64::MAX - 5_000)),
            (3_600_000, Some(0), Err(Exhausted { left: 3_595_000 })),
        ];
        for (left, asked, want) in table {
            assert_eq!(child_time(left, asked), want, "{left} {asked:?}");
        }
    }

    #[test]
    fn exhausted_texts() {
        let table = [
            (
                Exhaustion::Time,
                "[-32603] the caller's budget deadline passed",
                "time",
            ),
            (
                Exhaustion::Meter("tokens".into()),
                "[-32603] the budget's tokens meter is exhausted",
                "tokens",
            ),
        ];
        for (by, text, label) in table {
            assert_eq!(exhausted_text(&by), text);
            assert_eq!(by.as_str(), label);
        }
    }

    #[test]
    fn wire_names() {
        assert_eq!(
            BUDGET_EXTENSION_URI,
            "https://a2a-rust.com/extensions/budget/v1"
        );
        assert_eq!(BUDGET_METADATA_KEY, "a2a-rust.com/budget");
        assert_eq!(
            FAILURE_EXTENSION_URI,
            "https://a2a-rust.com/extensions/failure/v1"
        );
        assert_eq!(FAILURE_METADATA_KEY, "a2a-rust.com/failure");
        assert_eq!(MAX_METERS, 16);
        assert!(!is_meter_name(REMAINING_MS), "no meter shadows the time");
    }

    #[test]
    fn meters_over_names_the_first_meter_spent_past_its_grant() {
        let m = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        for (grant, spent, want) in [
            (m(&[("tokens", 100)]), m(&[]), None),
            (m(&[("tokens", 100)]), m(&[("tokens", 100)]), None),
            (m(&[("tokens", 100)]), m(&[("tokens", 101)]), Some("tokens")),
            (m(&[("tokens", 0)]), m(&[("tokens", 1)]), Some("tokens")),
            // A meter the grant does not name limits nothing.
            (m(&[("tokens", 100)]), m(&[("calls", 500)]), None),
            (m(&[]), m(&[("tokens", 500)]), None),
            (
                m(&[("calls", 5), ("tokens", 100)]),
                m(&[("calls", 6), ("tokens", 200)]),
                Some("calls"),
            ),
        ] {
            assert_eq!(
                meters_over(&grant, &spent).as_deref(),
                want,
                "{grant:?} {spent:?}"
            );
        }
    }
}
