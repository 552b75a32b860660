//! Credentials out of the log, at every level.
//!
//! At `debug` and `trace` pingora prints whole request and response heads:
//! `Sending header to upstream {req:?}` (HTTP/1), `Request to h2: {req:?}`,
//! `Request to custom: {req:?}`, `Response header: {resp:?}` and the
//! `upstream event` tasks (a `RequestHeader`'s or `ResponseHeader`'s
//! `Debug`: an `http::HeaderMap`, `"authorization": "Bearer …"`), and at
//! `trace` the bytes it writes and reads (`Writing request header: {wire:?}`,
//! `Raw Response header: {raw:?}`: `\r\nAuthorization: Bearer …\r\n`). The
//! gateway's own cancels and probes go out through the same client, with the
//! route's `worker_credential` and `inject_headers`. h2 leaves header blocks
//! out of its frames' `Debug` (it prints only a bad `te` value), hyper is
//! not in the gateway's build, and the gateway's own lines (audited) name
//! no header values, at any level.
//!
//! So the log's writer is wrapped: [`Redacting`] rewrites each formatted
//! line before it reaches stderr, replacing with `[redacted]`
//!
//! - the value of every header whose name is a credential's (see
//!   [`Secrets`]: `authorization`, `proxy-authorization`, `cookie`,
//!   `set-cookie`, every route's API-key header, `caller_header` and
//!   `inject_headers` names), in the forms those lines take: a header map's
//!   `"name": "value"` and a head's wire form `name: value` up to its line
//!   end, either as written, escaped once (`Debug` of bytes or a string:
//!   `\r\n`) or escaped again by the JSON log format (`\"`, `\\r\\n`), the
//!   escape depth read from the line itself (the quote or line break before
//!   the name), so one scrubber serves both formats;
//! - every occurrence of a secret the config holds (the admin token, each
//!   `worker_credential` and the token after its scheme, `inject_headers`
//!   values, the store's password), whatever line it turns up in, when at
//!   least [`MIN_VALUE`] bytes long (shorter ones, such as a tenant name
//!   injected as a header, would blank ordinary words; the name rule covers
//!   them wherever they are printed as headers).
//!
//! A value's end is found by its escape depth, so an escaped quote or line
//! break inside it does not end it early: when unsure, more is redacted,
//! never less. A header value pingora marks sensitive prints as `Sensitive`
//! and is left alone.
//!
//! **Cost.** Whether the writer is wrapped is decided once, at start-up,
//! from the filter ([`needed`]): only when `A2A_GATEWAY_LOG` enables `debug`
//! or `trace` for some target. At the default (`info`, pingora at `warn`) the
//! plain stderr writer is installed and nothing is scanned: no line at
//! `info` or above carries a header value (what the integration test
//! `security::logs` also checks at the default filter). When wrapped, every
//! line at every level is scanned (one `memchr3` pass for quotes, line
//! breaks and backslashes, and one substring search per known secret), and
//! copied only when something is replaced; a debug run already formats
//! several lines per request.
//!
//! **Why here and hand-written.** Not in the pingora fork: the lines are
//! pingora's, and patching each (and h2's, and any a later release adds)
//! would grow the fork and miss the next one; a writer sees every line of
//! every crate. No crate redacts `http`'s `Debug` forms: log-redaction
//! crates mark values at the call site (useless for lines pingora writes) or
//! run regular expressions over each line (a dependency and a slower scan
//! for what is a few anchored byte comparisons).
//!
//! **Reloads.** [`learn`] adds a config's names and secrets to the set the
//! writer reads (one atomic load per line); it never forgets any, because
//! routes a reload removed keep sending their owed cancels with their old
//! credentials. `main.rs` calls it at start-up and on every config a reload
//! reads.

use std::borrow::Cow;
use std::io;
use std::sync::{Arc, LazyLock};

use arc_swap::ArcSwap;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// What replaces a credential.
pub const REDACTED: &str = "[redacted]";

/// The shortest secret value scrubbed wherever it appears (see the module
/// doc): shorter values are redacted only where printed as a header's.
pub const MIN_VALUE: usize = 12;

/// The header names whose values are credentials on every route.
pub const ALWAYS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// The header names whose values are redacted and the secret values scrubbed
/// wherever they appear. `Debug` shows how many of each, never them.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets {
    /// Lower-case header names.
    names: Vec<Box<[u8]>>,
    /// Each at least [`MIN_VALUE`] bytes.
    values: Vec<Box<[u8]>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("names", &self.names.len())
            .field("values", &self.values.len())
            .finish()
    }
}

impl Default for Secrets {
    fn default() -> Self {
        let mut s = Secrets {
            names: Vec::new(),
            values: Vec::new(),
        };
        for name in ALWAYS {
            s.add_name(name);
        }
        s
    }
}

impl Secrets {
    /// The [`ALWAYS`] names and everything `cfg` names or holds.
    pub fn of(cfg: &config::Config) -> Secrets {
        let mut s = Secrets::default();
        s.learn(cfg);
        s
    }

    /// Adds `cfg`'s credential header names and secret values.
    pub fn learn(&mut self, cfg: &config::Config) {
        if let Some(token) = &cfg.server.admin_token {
            self.add_value(token.expose());
        }
        if let Some(password) = &cfg.store.password {
            self.add_value(password.expose());
        }
        if let config::StoreKind::Redis { url } = &cfg.store.kind {
            if let Some(password) = url_password(url) {
                self.add_value(password);
            }
        }
        for route in &cfg.routes {
            if let Some(cred) = &route.worker_credential {
                self.add_value(cred);
                // `Bearer <token>`: the token alone too.
                if let Some((_, token)) = cred.split_once(' ') {
                    self.add_value(token.trim());
                }
            }
            for (name, value) in &route.headers.inject_headers {
                self.add_name(name);
                self.add_value(value);
            }
            if let Some(keys) = route.auth.as_ref().and_then(|a| a.api_keys.as_ref()) {
                self.add_name(&keys.header);
            }
            if let Some(name) = &route.budget.caller_header {
                self.add_name(name);
            }
        }
    }

    /// Adds a header name whose values are redacted.
    pub fn add_name(&mut self, name: &str) {
        let name = name.trim().to_ascii_lowercase().into_bytes();
        if !name.is_empty() && !self.names.iter().any(|n| **n == *name) {
            self.names.push(name.into_boxed_slice());
        }
    }

    /// Adds a secret scrubbed wherever it appears (ignored when shorter than
    /// [`MIN_VALUE`]).
    pub fn add_value(&mut self, value: &str) {
        let value = value.as_bytes();
        if value.len() >= MIN_VALUE && !self.values.iter().any(|v| **v == *value) {
            self.values.push(value.into());
        }
    }

    /// Whether everything `other` redacts, this redacts too.
    fn covers(&self, other: &Secrets) -> bool {
        other.names.iter().all(|n| self.names.contains(n))
            && other.values.iter().all(|v| self.values.contains(v))
    }
}

/// The password of a `redis://user:password@host` URL.
fn url_password(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split(['/', '?', '#']).next()?.rsplit_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (!password.is_empty()).then_some(password)
}

/// The set [`Redacting`] writers read.
static KNOWN: LazyLock<ArcSwap<Secrets>> = LazyLock::new(ArcSwap::default);

/// Adds `cfg`'s names and secrets to what every [`Redacting`] writer
/// redacts, keeping those it had (see the module doc on reloads).
pub fn learn(cfg: &config::Config) {
    let new = Secrets::of(cfg);
    KNOWN.rcu(|known| {
        if known.covers(&new) {
            Arc::clone(known)
        } else {
            let mut merged = Secrets::clone(known);
            for n in &new.names {
                if !merged.names.contains(n) {
                    merged.names.push(n.clone());
                }
            }
            for v in &new.values {
                if !merged.values.contains(v) {
                    merged.values.push(v.clone());
                }
            }
            Arc::new(merged)
        }
    });
}

/// Whether a filter whose most verbose level is `max` (an `EnvFilter`'s
/// `max_level_hint`) needs the writer wrapped: it enables `debug` or
/// `trace` somewhere, or cannot say.
pub fn needed(max: Option<LevelFilter>) -> bool {
    max.is_none_or(|max| max >= LevelFilter::DEBUG)
}

/// A `MakeWriter` whose writers scrub each line ([`scrub`]) with the set
/// [`learn`] built before passing it on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Redacting<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Redacting<M> {
    type Writer = Scrubbing<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Scrubbing(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Scrubbing(self.0.make_writer_for(meta))
    }
}

/// One event's writer: the formatter hands it the whole line in one
/// `write_all` (a line split across writes would be scrubbed in pieces).
#[derive(Debug)]
pub struct Scrubbing<W>(W);

impl<W: io::Write> io::Write for Scrubbing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let known = KNOWN.load();
        self.0.write_all(&scrub(buf, &known))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// How the header name at some position was introduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `"name": "value"` with each quote behind this many backslashes
    /// (0 as printed by `Debug`, 1 inside a JSON string).
    Quoted(usize),
    /// `name: value` at the start of a line, the line break behind this
    /// many backslashes (0: a real one; 1: `Debug`'s `\n`; 2: JSON's `\\n`).
    Line(usize),
}

/// `line` with every credential replaced by [`REDACTED`] (see the module
/// doc); borrowed when there is none.
pub fn scrub<'a>(line: &'a [u8], secrets: &Secrets) -> Cow<'a, [u8]> {
    let mut ranges = Vec::new();
    header_values(line, &secrets.names, &mut ranges);
    let mut out = Cow::Borrowed(line);
    if !ranges.is_empty() {
        out = Cow::Owned(replace(line, &ranges));
    }
    for value in &secrets.values {
        let finder = memchr::memmem::Finder::new(value);
        ranges.clear();
        ranges.extend(finder.find_iter(&out).map(|at| (at, at + value.len())));
        if !ranges.is_empty() {
            out = Cow::Owned(replace(&out, &ranges));
        }
    }
    out
}

/// `line` with each of `ranges` (in order, not overlapping) replaced.
fn replace(line: &[u8], ranges: &[(usize, usize)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut from = 0;
    for &(start, end) in ranges {
        if start < from {
            continue;
        }
        out.extend_from_slice(&line[from..start]);
        out.extend_from_slice(REDACTED.as_bytes());
        from = end;
    }
    out.extend_from_slice(&line[from..]);
    out
}

/// The number of backslashes from `at` on.
fn run_from(line: &[u8], at: usize) -> usize {
    line[at..].iter().take_while(|&&b| b == b'\\').count()
}

/// The number of backslashes right before `at`, not before `floor`.
fn run_before(line: &[u8], floor: usize, at: usize) -> usize {
    line[floor..at]
        .iter()
        .rev()
        .take_while(|&&b| b == b'\\')
        .count()
}

/// Pushes onto `out` the byte range of each value of a header named in
/// `names`, in order.
fn header_values(line: &[u8], names: &[Box<[u8]>], out: &mut Vec<(usize, usize)>) {
    let mut pos = 0;
    // A name at the very start of the text counts as one after a line break.
    let mut next = Some((Form::Line(0), 0));
    loop {
        if let Some((form, start)) = next.take() {
            pos = start;
            if let Some(range) = names.iter().find_map(|n| value_of(line, start, n, form)) {
                out.push(range);
                pos = range.1;
            }
        }
        let Some(i) = memchr::memchr3(b'"', b'\n', b'\\', &line[pos..]).map(|i| pos + i) else {
            return;
        };
        match line[i] {
            b'"' => next = Some((Form::Quoted(0), i + 1)),
            b'\n' => next = Some((Form::Line(0), i + 1)),
            _ => {
                let run = run_from(line, i);
                match line.get(i + run) {
                    Some(b'"') => next = Some((Form::Quoted(run), i + run + 1)),
                    Some(b'n') => next = Some((Form::Line(run), i + run + 1)),
                    _ => pos = i + run,
                }
            }
        }
    }
}

/// The range of the value of header `name` if `line` has it at `start`
/// introduced as `form`; `None` otherwise, or when the value is empty.
fn value_of(line: &[u8], start: usize, name: &[u8], form: Form) -> Option<(usize, usize)> {
    let after = start + name.len();
    if !line.get(start..after)?.eq_ignore_ascii_case(name) {
        return None;
    }
    let spaces = |at: usize| {
        at + line[at..]
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count()
    };
    let (vs, ve) = match form {
        Form::Quoted(k) => {
            // `name` + quote, `:`, spaces, quote.
            let quote = |at: usize| {
                (run_from(line, at) == k && line.get(at + k) == Some(&b'"')).then_some(at + k + 1)
            };
            let colon = quote(after)?;
            if line.get(colon) != Some(&b':') {
                return None;
            }
            let vs = quote(spaces(colon + 1))?;
            (vs, quoted_end(line, vs, k))
        }
        Form::Line(k) => {
            if line.get(after) != Some(&b':') {
                return None;
            }
            let vs = spaces(after + 1);
            (vs, line_end(line, vs, k))
        }
    };
    (ve > vs).then_some((vs, ve))
}

/// Where a quoted value starting at `vs` ends: before the first quote behind
/// exactly `k` backslashes (one behind more is a quote inside the value),
/// else at the end of the text line.
fn quoted_end(line: &[u8], vs: usize, k: usize) -> usize {
    let mut at = vs;
    while let Some(q) = memchr::memchr(b'"', &line[at..]).map(|i| at + i) {
        if run_before(line, vs, q) == k {
            return q - k;
        }
        at = q + 1;
    }
    text_line_end(line, vs)
}

/// Where a head line's value starting at `vs` ends: at a real line break,
/// or at `r` or `n` behind exactly `k` backslashes (behind more, it is an
/// escaped backslash of the value's followed by a letter), else at the end
/// of the text line.
fn line_end(line: &[u8], vs: usize, k: usize) -> usize {
    let mut at = vs;
    while let Some(i) = memchr::memchr3(b'\r', b'\n', b'\\', &line[at..]).map(|i| at + i) {
        if line[i] != b'\\' {
            return i;
        }
        let run = run_from(line, i);
        if run == k && matches!(line.get(i + run), Some(b'r' | b'n')) {
            return i;
        }
        at = i + run;
    }
    line.len()
}

/// The end of the text line `at` is on (before its line break).
fn text_line_end(line: &[u8], at: usize) -> usize {
    memchr::memchr(b'\n', &line[at..]).map_or(line.len(), |i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(names: &[&str], values: &[&str]) -> Secrets {
        let mut s = Secrets::default();
        for n in names {
            s.add_name(n);
        }
        for v in values {
            s.add_value(v);
        }
        s
    }

    fn scrubbed(line: &str, s: &Secrets) -> String {
        String::from_utf8(scrub(line.as_bytes(), s).into_owned()).unwrap()
    }

    /// The forms pingora and `http` print, through `Debug` as the gateway's
    /// log does (and once more through JSON escaping for the JSON format).
    #[test]
    fn redact_debug_forms_of_real_heads() {
        let s = secrets(&["x-api-key", "x-worker-secret"], &[]);
        let mut req = pingora::http::RequestHeader::build("POST", b"/a?x=1", None).unwrap();
        req.insert_header("Host", "w").unwrap();
        req.insert_header("Authorization", "Bearer tok.en.SIG")
            .unwrap();
        req.insert_header("X-Api-Key", "ak-SECRET-1").unwrap();
        req.append_header("cookie", "a=1; b=\"q\\x\"").unwrap();
        req.append_header("cookie", "c=SECRET2").unwrap();
        req.insert_header("x-worker-secret", "w\"s, \"y").unwrap();
        req.insert_header("content-type", "application/json")
            .unwrap();
        let mut resp = pingora::http::ResponseHeader::build(200, None).unwrap();
        resp.insert_header("Set-Cookie", "sid=SECRET3; Path=/")
            .unwrap();
        resp.insert_header("content-type", "text/event-stream")
            .unwrap();
        let wire = bytes::Bytes::from(
            "POST /a HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer tok.en.SIG\r\nX-API-KEY:ak-SECRET-1\r\nCookie: a=\\\"q\\n\r\ncontent-type: application/json\r\n\r\n",
        );
        let raw = "HTTP/1.1 200 OK\r\nset-cookie: sid=SECRET3\r\ncontent-length: 2\r\n\r\n";
        let lines = [
            format!("DEBUG pingora_proxy::proxy_h1: Sending header to upstream {req:?}"),
            format!("DEBUG pingora_core: Response header: {resp:?}"),
            format!("TRACE pingora_core: Writing request header: {wire:?}"),
            format!("TRACE pingora_core: Raw Response header: {raw:?}"),
            format!("DEBUG x: upstream event: {:?}", Some(&resp)),
        ];
        let leaked = [
            "tok.en.SIG",
            "SECRET",
            "ak-",
            "a=1",
            "q\\x",
            "w\\\"s",
            "\\\"y",
        ];
        for line in &lines {
            let text = scrubbed(&format!("2026-01-01T00:00:00Z {line}\n"), &s);
            // And inside a JSON log line's message.
            let json = serde_json::json!({"level": "DEBUG", "message": line}).to_string() + "\n";
            let json = scrubbed(&json, &s);
            let parsed: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| {
                panic!("scrubbing broke the JSON line ({e}): {json}");
            });
            for out in [&text, &json] {
                for bad in leaked {
                    assert!(!out.contains(bad), "{bad:?} left in {out}");
                }
                assert!(out.contains(REDACTED), "nothing redacted in {out}");
                assert!(out.ends_with('\n'), "{out}");
            }
            // What is not a credential is kept.
            let msg = parsed["message"].as_str().unwrap();
            for kept in ["content-type", "application/json", "text/event-stream"] {
                if line.contains(kept) {
                    assert!(
                        text.contains(kept) && msg.contains(kept),
                        "{kept} lost: {text}"
                    );
                }
            }
        }
        let first = scrubbed(&lines[0], &s);
        assert!(
            first.contains("\"authorization\": \"[redacted]\"")
                && first.contains("\"x-api-key\": \"[redacted]\"")
                && first.contains("\"cookie\": \"[redacted]\", \"cookie\": \"[redacted]\"")
                && first.contains("\"host\": \"w\""),
            "{first}"
        );
        let wire = scrubbed(&lines[2], &s);
        assert!(
            wire.contains("\\r\\nAuthorization: [redacted]\\r\\nX-API-KEY:[redacted]\\r\\nCookie: [redacted]\\r\\ncontent-type: application/json\\r\\n"),
            "{wire}"
        );
    }

    /// One case per row: the text, and what it becomes.
    #[test]
    fn redact_table() {
        let s = secrets(&["x-api-key"], &["admin-token-0123456789"]);
        let table: &[(&str, &str)] = &[
            // Header map, any case, several headers.
            (
                r#"{"authorization": "Bearer a", "X-Api-Key": "k", "accept": "*/*"}"#,
                r#"{"authorization": "[redacted]", "X-Api-Key": "[redacted]", "accept": "*/*"}"#,
            ),
            // A quote inside the value (escaped by Debug), and one behind a
            // backslash of the value's: the value runs to its real end, or
            // further, never shorter.
            (
                r#"{"cookie": "a\"b", "x": "1"}"#,
                r#"{"cookie": "[redacted]", "x": "1"}"#,
            ),
            (r#"{"cookie": "a\\"}"#, r#"{"cookie": "[redacted]"#),
            // A value pingora marks sensitive prints as Sensitive.
            (r#"{"authorization": Sensitive}"#, r#"{"authorization": Sensitive}"#),
            // Escaped once more (a JSON log line).
            (
                r#"{"message":"h: {\"authorization\": \"Bearer \\\"a\\\" b\", \"x\": \"1\"}"}"#,
                r#"{"message":"h: {\"authorization\": \"[redacted]\", \"x\": \"1\"}"}"#,
            ),
            // A JSON object of headers, no space after the colon.
            (r#"{"x-api-key":"k1","n":2}"#, r#"{"x-api-key":"[redacted]","n":2}"#),
            // Wire forms: a real line break, Debug's, JSON's.
            (
                "GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nHost: h\r\n",
                "GET / HTTP/1.1\r\nAuthorization: [redacted]\r\nHost: h\r\n",
            ),
            (
                r#"b"GET / HTTP/1.1\r\nproxy-authorization: Basic YQ==\r\nx-api-key: a\\nb\r\n\r\n""#,
                r#"b"GET / HTTP/1.1\r\nproxy-authorization: [redacted]\r\nx-api-key: [redacted]\r\n\r\n""#,
            ),
            (
                r#"{"message":"w: b\"GET / HTTP/1.1\\r\\nCookie: a=\\\"1\\\"\\r\\nHost: h\\r\\n\""}"#,
                r#"{"message":"w: b\"GET / HTTP/1.1\\r\\nCookie: [redacted]\\r\\nHost: h\\r\\n\""}"#,
            ),
            // A known secret anywhere.
            (
                "error: token admin-token-0123456789 refused, again admin-token-0123456789",
                "error: token [redacted] refused, again [redacted]",
            ),
            // Ordinary text is left alone: names not as headers, longer
            // names, names inside other words, an empty value.
            (
                "the authorization header was missing; x-api-key-id: 3; \"authorizations\": \"x\"",
                "the authorization header was missing; x-api-key-id: 3; \"authorizations\": \"x\"",
            ),
            (
                "{\"set-cookie-x\": \"v\", \"my-cookie\": \"v\", \"cookie\": \"\"}\nauthorization=x\n",
                "{\"set-cookie-x\": \"v\", \"my-cookie\": \"v\", \"cookie\": \"\"}\nauthorization=x\n",
            ),
            ("plain line with no quotes\n", "plain line with no quotes\n"),
            // Set-Cookie in a response, then an unterminated value.
            (
                "{\"set-cookie\": \"s=1\"}\n",
                "{\"set-cookie\": \"[redacted]\"}\n",
            ),
            ("x \"authorization\": \"Bearer cut\nnext", "x \"authorization\": \"[redacted]\nnext"),
            ("authorization: Bearer at-start", "authorization: [redacted]"),
        ];
        for (line, want) in table {
            assert_eq!(scrubbed(line, &s), *want, "from {line}");
        }
        // Nothing to replace: nothing copied.
        assert!(matches!(scrub(b"a \"b\": \"c\"", &s), Cow::Borrowed(_)));
    }

    /// What a config teaches: names from routes, values from secrets, the
    /// token of a scheme'd credential, short values by name only.
    #[test]
    fn redact_learns_from_config() {
        let toml = "[server]\nadmin = \"127.0.0.1:9099\"\nadmin_token_env = \"TOKEN\"\n\
            [store]\nurl = \"redis://u:store-password-123@127.0.0.1:6379/0\"\n\
            [[routes]]\nname = \"a\"\nworker = \"http://127.0.0.1:1\"\n\
            worker_credential = \"Bearer worker-cred-0123456\"\n\
            inject_headers = { \"x-tenant-id\" = \"short\", \"x-worker-secret\" = \"inject-secret-0123456\" }\n\
            [routes.budget]\ncaller_header = \"x-caller\"\nmax_deadline = \"1m\"\n";
        let env = |name: &str| (name == "TOKEN").then(|| "admin-token-0123456789".to_owned());
        let cfg = config::parse_with_env(toml, &env).unwrap_or_else(|e| panic!("{e}"));
        let s = Secrets::of(&cfg);
        let names: Vec<&[u8]> = s.names.iter().map(|n| &**n).collect();
        for n in [
            "authorization",
            "x-tenant-id",
            "x-worker-secret",
            "x-caller",
        ] {
            assert!(names.contains(&n.as_bytes()), "{n} not learnt");
        }
        for v in [
            "Bearer worker-cred-0123456",
            "worker-cred-0123456",
            "inject-secret-0123456",
            "store-password-123",
            "admin-token-0123456789",
        ] {
            assert!(
                s.values.iter().any(|x| **x == *v.as_bytes()),
                "{v} not learnt"
            );
        }
        assert!(!s.values.iter().any(|x| **x == *b"short"));
        assert_eq!(format!("{s:?}"), "Secrets { names: 7, values: 5 }");
        assert_eq!(
            scrubbed("sent Bearer worker-cred-0123456 and short", &s),
            "sent [redacted] and short"
        );
    }

    #[test]
    fn redact_only_when_debug_or_trace_is_on() {
        use tracing_subscriber::EnvFilter;
        let hint = |f: &str| EnvFilter::new(f).max_level_hint();
        assert!(!needed(hint("info,pingora_core=warn,pingora_proxy=warn")));
        assert!(!needed(hint("warn")));
        assert!(!needed(hint("off")));
        assert!(needed(hint("debug")));
        assert!(needed(hint("trace")));
        assert!(needed(hint("info,a2a_gateway=debug")));
        assert!(needed(hint("warn,pingora_proxy::proxy_h1=trace")));
        assert!(needed(None));
    }

    /// The writer: a whole line in, the scrubbed line out; `learn` only adds.
    #[test]
    fn redact_writer_and_learn() {
        let cfg = config::parse_with_env(
            "[[routes]]\nname = \"a\"\nworker = \"http://127.0.0.1:1\"\n\
             worker_credential = \"learnt-credential-0123\"\n",
            &|_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        learn(&cfg);
        let other = config::parse_with_env(
            "[[routes]]\nname = \"b\"\nworker = \"http://127.0.0.1:1\"\n",
            &|_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        learn(&other);
        let mut w = Scrubbing(Vec::new());
        io::Write::write_all(
            &mut w,
            b"x learnt-credential-0123 {\"authorization\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(w.0).unwrap(),
            "x [redacted] {\"authorization\": \"[redacted]\"}\n"
        );
    }
}
