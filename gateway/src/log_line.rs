//! The text log's lines, written without `core::fmt` where that is safe.
//!
//! Every call through the gateway logs its access line (`a2agw::access`,
//! 15 fields) at the default `info`. tracing-subscriber's default text
//! format writes each part through `write!`: the level padded by a
//! `Formatter`, the target and every field name through a no-op ANSI style
//! (even with colour off), each string field through `str`'s `Debug`,
//! one `char` at a time. Under callgrind that was about 15,000
//! instructions per call, a seventh of a passed `SendMessage`.
//!
//! [`Line`] and [`Fields`] write the same bytes for what they can do
//! directly: no colour, no span around the event, not a `log` record, and
//! fields that are integers, booleans, floats from 1e-4 to 1e16 (`ryu`
//! writes those as `Debug` does) and strings of printable ASCII without a
//! quote or a backslash (whose `Debug` is the string in quotes).
//! Everything else (colour on a terminal, the `message` field, other
//! floats, errors, `Debug` values, other strings) is handed to
//! tracing-subscriber's own `Full` format and `DefaultFields`, so a line
//! reads the same either way; the tests compare both on the same events.
//! The timestamp is [`Utc`]: tracing-subscriber's `SystemTime` clock,
//! written without `core::fmt`. The JSON format is tracing-subscriber's,
//! untouched.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Format, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of the text log: tracing-subscriber's `Full` format,
/// timestamp, level, target, fields, written directly when no colour and
/// no span are involved.
#[derive(Debug)]
pub struct Line<T = Utc> {
    timer: T,
    full: Format<tracing_subscriber::fmt::format::Full, T>,
}

impl Default for Line {
    fn default() -> Self {
        Line::with_timer(Utc)
    }
}

impl<T: FormatTime + Clone> Line<T> {
    /// With another clock (the tests' fixed one).
    pub fn with_timer(timer: T) -> Self {
        Line {
            full: Format::default().with_timer(timer.clone()),
            timer,
        }
    }
}

impl<S, N, T> FormatEvent<S, N> for Line<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        // A `log` record's metadata is its fields' (tracing-log); a span
        // prints its name and fields first.
        if writer.has_ansi_escapes() || meta.target() == "log" || ctx.event_scope().is_some() {
            return self.full.format_event(ctx, writer, event);
        }
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str(match *meta.level() {
            Level::TRACE => " TRACE ",
            Level::DEBUG => " DEBUG ",
            Level::INFO => "  INFO ",
            Level::WARN => "  WARN ",
            Level::ERROR => " ERROR ",
        })?;
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The clock of the text log: the time as tracing-subscriber's
/// `SystemTime` writes it (`2026-12-07T21:00:00.123456Z`: UTC, RFC 3339,
/// microseconds), without its two `write!`s and six padded integers (about
/// 2,700 instructions a line under callgrind). Times before 1970 or after
/// 9999 are left to `SystemTime`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Utc;

impl FormatTime for Utc {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(t) if t.as_secs() < END_OF_9999 => w.write_str(Stamp::of(t).as_str()),
            _ => SystemTime.format_time(w),
        }
    }
}

/// Seconds from 1970 to the end of year 9999, the last year written with
/// four digits (and the last `Stamp` can hold).
const END_OF_9999: u64 = 253_402_300_800;

/// `YYYY-MM-DDTHH:MM:SS.uuuuuuZ`.
struct Stamp([u8; 27]);

impl Stamp {
    /// The time `since_epoch` after 1970-01-01T00:00:00Z (before the end of
    /// 9999): chrono's calendar, written without `core::fmt`.
    fn of(since_epoch: std::time::Duration) -> Stamp {
        use chrono::{Datelike, Timelike};
        let t = chrono::DateTime::from_timestamp(
            since_epoch.as_secs() as i64,
            since_epoch.subsec_nanos(),
        )
        .unwrap_or_default();
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        let mut put = |at: usize, width: usize, mut n: u32| {
            for i in (at..at + width).rev() {
                b[i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        };
        put(0, 4, t.year() as u32);
        put(5, 2, t.month());
        put(8, 2, t.day());
        put(11, 2, t.hour());
        put(14, 2, t.minute());
        put(17, 2, t.second());
        put(20, 6, since_epoch.subsec_micros());
        Stamp(b)
    }

    fn as_str(&self) -> &str {
        // Digits and the ASCII punctuation above.
        std::str::from_utf8(&self.0).unwrap_or("<unknown time>")
    }
}

/// The field format of the text log: `DefaultFields`' output, integers,
/// booleans, plain floats and plain strings written directly.
#[derive(Debug, Default)]
pub struct Fields;

impl<'w> MakeVisitor<Writer<'w>> for Fields {
    type Visitor = Visitor<'w>;

    fn make_visitor(&self, target: Writer<'w>) -> Self::Visitor {
        Visitor {
            writer: target,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's or span's fields (see [`Fields`]).
#[derive(Debug)]
pub struct Visitor<'w> {
    writer: Writer<'w>,
    is_empty: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    /// Writes `name=`, after a space unless it is the first field; `false`
    /// when writing failed.
    fn name(&mut self, field: &Field) -> bool {
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        if !std::mem::replace(&mut self.is_empty, false) {
            self.result = self.writer.write_char(' ');
        }
        if self.result.is_ok() {
            self.result = self
                .writer
                .write_str(name)
                .and_then(|()| self.writer.write_char('='));
        }
        self.result.is_ok()
    }

    /// `DefaultVisitor`'s way, for one field (not a `log.` one: those are
    /// skipped before this).
    fn default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut v = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut v);
        self.result = v.finish();
        self.is_empty = false;
    }

    /// Whether a field is written at all: not after an error, not a `log`
    /// record's own metadata (`log.target`, ...), as `DefaultVisitor`.
    fn skips(&self, field: &Field) -> bool {
        self.result.is_err() || field.name().starts_with("log.")
    }

    /// Whether `s`'s `Debug` is `s` in quotes.
    fn plain(s: &str) -> bool {
        s.bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.skips(field) {
            return;
        }
        if self.writer.has_ansi_escapes() || field.name() == "message" || !Self::plain(value) {
            return self.default(|v| v.record_str(field, value));
        }
        if self.name(field) {
            self.result = self
                .writer
                .write_char('"')
                .and_then(|()| self.writer.write_str(value))
                .and_then(|()| self.writer.write_char('"'));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.integer(field, value)
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.integer(field, value)
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.skips(field) {
            return;
        }
        if self.writer.has_ansi_escapes() || field.name() == "message" {
            return self.default(|v| v.record_bool(field, value));
        }
        if self.name(field) {
            self.result = self.writer.write_str(if value { "true" } else { "false" });
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.skips(field) {
            return;
        }
        // `f64`'s `Debug` is the shortest decimal that reads back as the
        // value, written out in full from 1e-4 up to 1e16 (and 0), with
        // `.0` on a whole number: what `ryu` writes in that range. Outside
        // it (or for NaN and infinities) the two differ.
        let plain = value == 0.0 || (1e-4..1e16).contains(&value.abs());
        if self.writer.has_ansi_escapes() || field.name() == "message" || !plain {
            return self.default(|v| v.record_f64(field, value));
        }
        if self.name(field) {
            let mut b = ryu::Buffer::new();
            self.result = self.writer.write_str(b.format_finite(value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.skips(field) {
            return;
        }
        self.default(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.skips(field) {
            return;
        }
        self.default(|v| v.record_debug(field, value));
    }
}

impl Visitor<'_> {
    fn integer<I: itoa::Integer + fmt::Debug>(&mut self, field: &Field, value: I) {
        if self.skips(field) {
            return;
        }
        if self.writer.has_ansi_escapes() || field.name() == "message" {
            return self.default(|v| v.record_debug(field, &value));
        }
        if self.name(field) {
            let mut b = itoa::Buffer::new();
            self.result = self.writer.write_str(b.format(value));
        }
    }
}

impl VisitOutput<fmt::Result> for Visitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for Visitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What the subscriber wrote.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    /// A clock that always says the same, or fails.
    #[derive(Clone, Copy, Debug)]
    struct At(bool);

    impl FormatTime for At {
        fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
            if self.0 {
                w.write_str("2026-12-07T21:00:00.000000Z")
            } else {
                Err(fmt::Error)
            }
        }
    }

    /// Events of every kind of field, at every level.
    fn emit() {
        // The access line's shape (gateway/src/proxy/end.rs).
        tracing::info!(
            target: "a2agw::access",
            route = Some("w"),
            http_method = "POST",
            path = "/rpc",
            method = Some("SendMessage"),
            tenant = None::<&str>,
            caller = Some(""),
            status = Some(200u16),
            duration_ms = Some(1.25f64),
            bytes_in = 1024u64,
            bytes_out = 0u64,
            error = None::<&str>,
            "request"
        );
        tracing::warn!(task = %"t-1", error = "a \"quote\"", n = -5i64, ok = true, "a message with {}", 3);
        tracing::error!(
            r#type = "x",
            tab = "a\tb",
            back = "a\\b",
            uni = "é",
            esc = "\x1b[31m",
            "plain"
        );
        let e = std::io::Error::other("boom");
        tracing::debug!(e = &e as &dyn std::error::Error, "an error");
        tracing::trace!(dbg = ?vec![1, 2], f = 0.1f64 + 0.2, whole = 2.0f64, big = u64::MAX, min = i64::MIN, "t");
        // Floats at and past the edges of their plain form.
        for x in [
            0.0f64,
            -0.0,
            1e-4,
            9.99e-5,
            1e-5,
            0.00012,
            123_456.789,
            1e15,
            9.999e15,
            1e16,
            1e17,
            -2.5,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            1.0 / 3.0,
            0.3,
        ] {
            tracing::info!(x, "float");
        }
        tracing::info!("only a message");
        tracing::info!(field = "no message", flag = false);
        tracing::info!(message = "a message as a field", x = 1u64);
        tracing::info!(empty = "", "e");
        let span = tracing::info_span!("outer", id = 7u64, name = "n");
        span.in_scope(|| tracing::info!(x = 1u64, "in a span"));
        tracing::info!(parent: &span, y = 2u64, "explicit parent");
    }

    /// The lines `emit` makes through tracing-subscriber's own format, or
    /// through [`Line`] and [`Fields`].
    fn lines(ansi: bool, ours: bool, clock: At) -> String {
        let buf = Buf::default();
        let b = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(ansi)
            .with_max_level(Level::TRACE);
        if ours {
            let sub = b
                .event_format(Line::with_timer(clock))
                .fmt_fields(Fields)
                .finish();
            tracing::subscriber::with_default(sub, emit);
        } else {
            let sub = b.with_timer(clock).finish();
            tracing::subscriber::with_default(sub, emit);
        }
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    /// `Stamp` against chrono's RFC 3339 on edges of days, months, leap
    /// years, centuries and the range, and on 100,000 random times.
    #[test]
    fn stamps_read_as_chronos() {
        use std::time::Duration;
        let chrono = |t: Duration| {
            chrono::DateTime::from_timestamp(t.as_secs() as i64, t.subsec_nanos())
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string()
        };
        let mut times = vec![
            Duration::ZERO,
            Duration::new(END_OF_9999 - 1, 999_999_999),
            Duration::new(951_782_400, 0),         // 2000-02-29
            Duration::new(951_868_799, 1),         // 2000-02-29T23:59:59
            Duration::new(4_107_542_400, 0),       // 2100-03-01
            Duration::new(4_107_455_999, 0),       // 2100-02-28T23:59:59
            Duration::new(1_796_688_000, 999_000), // 2026-12-08
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            times.push(Duration::new(
                x % END_OF_9999,
                (x >> 20) as u32 % 1_000_000_000,
            ));
        }
        for t in times {
            assert_eq!(Stamp::of(t).as_str(), chrono(t), "{t:?}");
        }
    }

    /// `Utc` writes what tracing-subscriber's `SystemTime` writes now (the
    /// same second: read again if a second began in between).
    #[test]
    fn utc_reads_as_system_time() {
        let write = |clock: &dyn FormatTime| {
            let mut s = String::new();
            clock.format_time(&mut Writer::new(&mut s)).unwrap();
            s
        };
        loop {
            let (a, theirs, b) = (write(&Utc), write(&SystemTime), write(&Utc));
            if a[..19] != b[..19] {
                continue;
            }
            assert_eq!(theirs.len(), a.len(), "{theirs} {a}");
            assert_eq!(theirs[..20], a[..20], "{theirs} {a}");
            assert!(a <= theirs && theirs <= b, "{a} {theirs} {b}");
            assert!(theirs.ends_with('Z'));
            break;
        }
    }

    #[test]
    fn lines_read_as_tracing_subscribers_own() {
        for ansi in [false, true] {
            for clock in [At(true), At(false)] {
                let want = lines(ansi, false, clock);
                assert_eq!(want.lines().count(), 29, "{want}");
                assert_eq!(lines(ansi, true, clock), want, "ansi {ansi}");
            }
        }
        // What the comparison covers, in the form users read.
        let plain = lines(false, true, At(true));
        assert!(
            plain.starts_with(
                "2026-12-07T21:00:00.000000Z  INFO a2agw::access: request route=\"w\" \
                 http_method=\"POST\" path=\"/rpc\" method=\"SendMessage\" caller=\"\" \
                 status=200 duration_ms=1.25 bytes_in=1024 bytes_out=0\n"
            ),
            "{plain}"
        );
        assert!(
            plain.contains(" ERROR a2a_gateway::log_line::tests: plain type=\"x\" tab=\"a\\tb\""),
            "{plain}"
        );
        assert!(lines(false, true, At(false))
            .starts_with("<unknown time>  INFO a2agw::access: request"));
    }
}
