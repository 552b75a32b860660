//! Walking a parsed TOML tree while collecting every error with its place.
//!
//! A [`Reader`] wraps one table. Each `opt`/`or`/`required` call names a key
//! and a converter (`fn(&Item) -> Result<T, impl Into<Bad>>`); a bad value is
//! recorded in the shared [`Sink`] at the value's position and reading goes
//! on. [`Reader::finish`] then reports every key nobody asked for. Adding a
//! config key is one line: `let x = r.or("key", default, converter);`.
//!
//! Every key a read asks about is also noted in the [`Sink`] by its shape
//! (`routes.budget.tenants.*.meters`): the set of keys the format accepts,
//! which `docs/config.md` must name exactly (`docs_tests.rs`).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::time::Duration;

use toml_edit::{Item, TableLike, Value};

use crate::units::{format_size, parse_duration, parse_size};
use crate::ConfigError;

/// Where errors accumulate, and the source text to turn byte offsets into
/// line and column.
pub(crate) struct Sink<'a> {
    src: &'a str,
    errors: RefCell<Vec<ConfigError>>,
    /// The shape of every key a read asked about, present or not.
    keys: RefCell<BTreeSet<String>>,
}

impl<'a> Sink<'a> {
    pub fn new(src: &'a str) -> Self {
        Sink {
            src,
            errors: RefCell::new(Vec::new()),
            keys: RefCell::new(BTreeSet::new()),
        }
    }

    /// Records an error at byte `offset` of the source.
    pub fn push(&self, offset: usize, path: &str, message: impl Into<String>) {
        let (line, col) = line_col(self.src, offset);
        self.errors.borrow_mut().push(ConfigError {
            line,
            col,
            path: path.to_owned(),
            message: message.into(),
        });
    }

    pub fn count(&self) -> usize {
        self.errors.borrow().len()
    }

    /// The keys the reads asked about, by shape: dotted, without route
    /// indexes, a user-chosen name (a tenant, a caller) as `*`. A table
    /// that holds keys is listed too (`server.tls` beside
    /// `server.tls.cert`); a table the document lacks was not walked into,
    /// so its keys are missing.
    #[cfg(test)]
    pub fn keys(&self) -> BTreeSet<String> {
        self.keys.borrow().clone()
    }

    /// The errors in source order (stable for errors at the same place).
    pub fn into_errors(self) -> Vec<ConfigError> {
        let mut errors = self.errors.into_inner();
        errors.sort_by_key(|e| (e.line, e.col));
        errors
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(src.len());
    while !src.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &src[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// One or more problems with a value. Most converters fail with a plain
/// `String` about the value itself; converters of arrays point into it.
#[derive(Debug)]
pub(crate) struct Bad(pub Vec<Problem>);

#[derive(Debug)]
pub(crate) struct Problem {
    /// Byte offset, if more precise than the value's own.
    pub at: Option<usize>,
    /// Appended to the value's path, e.g. `"[2]"`.
    pub sub: String,
    pub message: String,
}

impl From<String> for Bad {
    fn from(message: String) -> Self {
        Bad(vec![Problem {
            at: None,
            sub: String::new(),
            message,
        }])
    }
}

/// A key's value with where to report about it.
pub(crate) struct Field<'a> {
    pub item: &'a Item,
    pub at: usize,
    pub path: String,
}

/// Reads the keys of one table (or of a missing one, which yields defaults).
pub(crate) struct Reader<'a> {
    sink: &'a Sink<'a>,
    table: Option<&'a dyn TableLike>,
    /// Where "missing key" errors point: the table's header.
    at: usize,
    path: String,
    /// `path` without indexes, user-chosen names as `*` (see [`Sink::keys`]).
    shape: String,
    known: Vec<&'static str>,
}

impl<'a> Reader<'a> {
    /// A reader of the document's root table.
    pub fn root(sink: &'a Sink<'a>, table: &'a dyn TableLike) -> Self {
        Reader {
            sink,
            table: Some(table),
            at: 0,
            path: String::new(),
            shape: String::new(),
            known: Vec::new(),
        }
    }

    fn child_path(&self, sub: &str) -> String {
        if self.path.is_empty() {
            sub.to_owned()
        } else {
            format!("{}.{sub}", self.path)
        }
    }

    fn child_shape(&self, sub: &str) -> String {
        if self.shape.is_empty() {
            sub.to_owned()
        } else {
            format!("{}.{sub}", self.shape)
        }
    }

    /// Marks `key` as one this table accepts.
    fn know(&mut self, key: &'static str) {
        self.known.push(key);
        self.sink.keys.borrow_mut().insert(self.child_shape(key));
    }

    /// The value of `key`, if present. Marks `key` as known either way.
    pub fn field(&mut self, key: &'static str) -> Option<Field<'a>> {
        self.know(key);
        let (k, item) = self.table?.get_key_value(key)?;
        let at = start(item)
            .or_else(|| k.span().map(|s| s.start))
            .unwrap_or(self.at);
        Some(Field {
            item,
            at,
            path: self.child_path(key),
        })
    }

    /// Records the problems of a field's value.
    pub fn report(&self, field: &Field<'_>, bad: Bad) {
        for p in bad.0 {
            let path = format!("{}{}", field.path, p.sub);
            self.sink.push(p.at.unwrap_or(field.at), &path, p.message);
        }
    }

    /// Records an error about the whole table (at its header).
    pub fn table_error(&self, message: impl Into<String>) {
        self.sink.push(self.at, &self.path, message);
    }

    /// The converted value of `key`; `None` if absent or bad (and recorded).
    pub fn opt<T, E: Into<Bad>>(
        &mut self,
        key: &'static str,
        convert: impl FnOnce(&'a Item) -> Result<T, E>,
    ) -> Option<T> {
        let field = self.field(key)?;
        match convert(field.item) {
            Ok(v) => Some(v),
            Err(e) => {
                self.report(&field, e.into());
                None
            }
        }
    }

    /// The converted value of `key`, or `default` if absent (or bad: the
    /// error is recorded, so the config is refused anyway).
    pub fn or<T, E: Into<Bad>>(
        &mut self,
        key: &'static str,
        default: T,
        convert: impl FnOnce(&'a Item) -> Result<T, E>,
    ) -> T {
        self.opt(key, convert).unwrap_or(default)
    }

    /// The converted value of `key`, recording an error at the table's
    /// header if it is missing.
    pub fn required<T, E: Into<Bad>>(
        &mut self,
        key: &'static str,
        convert: impl FnOnce(&'a Item) -> Result<T, E>,
    ) -> Option<T> {
        if !self.has(key) {
            self.know(key);
            self.sink
                .push(self.at, &self.child_path(key), "missing required key");
            return None;
        }
        self.opt(key, convert)
    }

    /// Where `key`'s value is, or the table's header if it is absent.
    pub fn pos(&self, key: &str) -> usize {
        self.table
            .and_then(|t| t.get_key_value(key))
            .and_then(|(k, item)| start(item).or_else(|| k.span().map(|s| s.start)))
            .unwrap_or(self.at)
    }

    /// A reader of the sub-table `key`; an empty one if absent or not a table.
    pub fn section(&mut self, key: &'static str) -> Reader<'a> {
        let mut sub = Reader {
            sink: self.sink,
            table: None,
            at: self.at,
            path: self.child_path(key),
            shape: self.child_shape(key),
            known: Vec::new(),
        };
        if let Some(field) = self.field(key) {
            sub.at = field.at;
            match as_table(field.item) {
                Some(t) => sub.table = Some(t),
                None => self.report(&field, expected("a table", field.item).into()),
            }
        }
        sub
    }

    /// Readers of each table of the array of tables `key` (`[[key]]` or
    /// `key = [{...}]`); `None` if absent or not an array.
    pub fn tables(&mut self, key: &'static str) -> Option<(Field<'a>, Vec<Reader<'a>>)> {
        let field = self.field(key)?;
        let shape = self.child_shape(key);
        let mut readers = Vec::new();
        let mut push = |i: usize, t: Option<&'a dyn TableLike>, at: Option<usize>, item: &Item| {
            let path = format!("{}[{i}]", field.path);
            let at = at.unwrap_or(field.at);
            match t {
                Some(table) => readers.push(Reader {
                    sink: self.sink,
                    table: Some(table),
                    at,
                    path,
                    shape: shape.clone(),
                    known: Vec::new(),
                }),
                None => self.sink.push(at, &path, expected("a table", item)),
            }
        };
        match field.item {
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    let at = t.span().map(|s| s.start);
                    push(i, Some(t), at, &Item::None);
                }
            }
            Item::Value(Value::Array(a)) => {
                for (i, v) in a.iter().enumerate() {
                    let at = v.span().map(|s| s.start);
                    let t = v.as_inline_table().map(|t| t as &dyn TableLike);
                    push(i, t, at, &Item::Value(v.clone()));
                }
            }
            other => {
                let message = expected("an array of tables", other);
                self.report(&field, message.into());
                return None;
            }
        }
        Some((field, readers))
    }

    /// Readers of every entry of this table, for a table whose keys are
    /// names the user chooses (tenants, callers) rather than known keys.
    /// `segment` gives the path of entry `i` named `name` below this table
    /// (`".acme"`, or `"[1]"` to keep a secret name out of messages). An
    /// entry that is not a table is reported. Consumes the reader, as there
    /// is no unknown key to report.
    pub fn entries(self, segment: impl Fn(usize, &str) -> String) -> Vec<Entry<'a>> {
        let Some(table) = self.table else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, (name, item)) in table.iter().enumerate() {
            let at = start(item)
                .or_else(|| {
                    let (k, _) = table.get_key_value(name)?;
                    k.span().map(|s| s.start)
                })
                .unwrap_or(self.at);
            let path = format!("{}{}", self.path, segment(i, name));
            match as_table(item) {
                Some(t) => out.push(Entry {
                    name,
                    reader: Reader {
                        sink: self.sink,
                        table: Some(t),
                        at,
                        path,
                        shape: format!("{}.*", self.shape),
                        known: Vec::new(),
                    },
                }),
                None => self.sink.push(at, &path, expected("a table", item)),
            }
        }
        out
    }

    /// Whether the table has no key at all (or is missing).
    pub fn is_empty(&self) -> bool {
        self.table.is_none_or(|t| t.is_empty())
    }

    /// Whether the table has `key` (without marking it known).
    pub fn has(&self, key: &str) -> bool {
        self.table.is_some_and(|t| t.contains_key(key))
    }

    /// Records an error at byte `at` about this table's `key`.
    pub fn report_at(&self, at: usize, key: &str, message: impl Into<String>) {
        self.sink.push(at, &self.child_path(key), message);
    }

    /// Reports every key of the table that no read asked for. Call it after
    /// every key has been read.
    pub fn finish(&self) {
        let Some(table) = self.table else { return };
        for (name, _) in table.iter() {
            if self.known.contains(&name) {
                continue;
            }
            let at = table
                .get_key_value(name)
                .and_then(|(k, _)| k.span())
                .map_or(self.at, |s| s.start);
            let mut message = format!("unknown key {name:?}");
            if let Some(close) = self.known.iter().find(|k| near(k, name)) {
                message.push_str(&format!(" (did you mean {close:?}?)"));
            }
            message.push_str(&format!("; expected one of: {}", self.known.join(", ")));
            self.sink.push(at, &self.child_path(name), message);
        }
    }
}

/// One entry of a table of user-chosen names ([`Reader::entries`]).
pub(crate) struct Entry<'a> {
    pub name: &'a str,
    pub reader: Reader<'a>,
}

/// How a user-chosen key reads in a path: bare when TOML would take it
/// bare, else quoted (`tenants.acme`, `meters."gpu.seconds"`).
pub(crate) fn key_segment(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if bare {
        format!(".{name}")
    } else {
        format!(".{name:?}")
    }
}

/// Byte offset where an item starts in the source.
fn start(item: &Item) -> Option<usize> {
    item.span().map(|s| s.start)
}

fn as_table(item: &Item) -> Option<&dyn TableLike> {
    match item {
        Item::Table(t) => Some(t),
        Item::Value(Value::InlineTable(t)) => Some(t),
        _ => None,
    }
}

/// Whether two keys are one typo apart (edit distance at most 2).
fn near(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()] <= 2
}

/// How a value looks in an error message: strings quoted, others with
/// their type (`integer 5`), compound values by type only.
pub(crate) fn found(item: &Item) -> String {
    match item {
        Item::None => "nothing".into(),
        Item::Table(_) => "a table".into(),
        Item::ArrayOfTables(_) => "an array of tables".into(),
        Item::Value(v) => match v {
            Value::String(s) => format!("{:?}", s.value()),
            Value::Integer(i) => format!("integer {}", i.value()),
            Value::Float(f) => format!("float {}", f.value()),
            Value::Boolean(b) => format!("boolean {}", b.value()),
            Value::Datetime(d) => format!("datetime {}", d.value()),
            Value::Array(_) => "an array".into(),
            Value::InlineTable(_) => "a table".into(),
        },
    }
}

/// `expected <what>, found <item>`.
pub(crate) fn expected(what: &str, item: &Item) -> String {
    format!("expected {what}, found {}", found(item))
}

// ---- converters: `fn(&Item) -> Result<T, String>` ----

pub(crate) fn string(item: &Item) -> Result<&str, String> {
    item.as_str().ok_or_else(|| expected("a string", item))
}

pub(crate) fn boolean(item: &Item) -> Result<bool, String> {
    item.as_bool()
        .ok_or_else(|| expected("true or false", item))
}

/// An integer within `range`, converted to `T`.
pub(crate) fn int_in<T: TryFrom<i64>>(
    range: RangeInclusive<i64>,
) -> impl Fn(&Item) -> Result<T, String> {
    move |item| {
        let n = item
            .as_integer()
            .ok_or_else(|| expected("an integer", item))?;
        let (lo, hi) = (*range.start(), *range.end());
        if !range.contains(&n) {
            return Err(if hi == i64::MAX {
                format!("must be at least {lo}, found {n}")
            } else {
                format!("must be between {lo} and {hi}, found {n}")
            });
        }
        T::try_from(n).map_err(|_| format!("{n} is out of range"))
    }
}

/// A duration string such as `"5s"`; a bare number is refused with a hint.
pub(crate) fn duration(item: &Item) -> Result<Duration, String> {
    match item {
        Item::Value(Value::String(s)) => parse_duration(s.value()),
        Item::Value(Value::Integer(_) | Value::Float(_)) => Err(format!(
            "a duration needs a unit, written as a string like \"5s\" or \"250ms\"; found {}",
            found(item)
        )),
        _ => Err(expected("a duration string like \"5s\"", item)),
    }
}

/// A duration that must not be zero.
pub(crate) fn nonzero_duration(item: &Item) -> Result<Duration, String> {
    let d = duration(item)?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

/// A size (`"1MiB"`, or an integer number of bytes) within `range` bytes.
pub(crate) fn size_in(range: RangeInclusive<u64>) -> impl Fn(&Item) -> Result<usize, String> {
    move |item| {
        let n = match item {
            Item::Value(Value::String(s)) => parse_size(s.value())?,
            Item::Value(Value::Integer(i)) => u64::try_from(*i.value())
                .map_err(|_| format!("a size cannot be negative, found {}", i.value()))?,
            _ => return Err(expected("a size like \"1MiB\" or a number of bytes", item)),
        };
        if !range.contains(&n) {
            return Err(format!(
                "must be between {} and {}, found {}",
                format_size(*range.start()),
                format_size(*range.end()),
                found(item)
            ));
        }
        usize::try_from(n).map_err(|_| format!("{} is too large here", found(item)))
    }
}

/// One of a fixed set of strings, each standing for a value.
pub(crate) fn one_of<'a, T: Copy>(
    choices: &'a [(&'a str, T)],
) -> impl Fn(&Item) -> Result<T, String> + 'a {
    move |item| {
        let s = item.as_str();
        choices
            .iter()
            .find(|(name, _)| Some(*name) == s)
            .map(|&(_, v)| v)
            .ok_or_else(|| {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
                expected(&format!("one of {}", names.join(", ")), item)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_cols() {
        let src = "ab\ncdé\n\nx";
        for (offset, want) in [
            (0, (1, 1)),
            (1, (1, 2)),
            (2, (1, 3)),
            (3, (2, 1)),
            (5, (2, 3)),
            (7, (2, 4)),
            (8, (3, 1)),
            (9, (4, 1)),
            (99, (4, 2)),
        ] {
            assert_eq!(line_col(src, offset), want, "{offset}");
        }
    }

    #[test]
    fn typos() {
        for (a, b, want) in [
            ("listen", "listn", true),
            ("listen", "lisetn", true),
            ("threads", "thread", true),
            ("server", "servr", true),
            ("admin", "public_url", false),
            ("host", "name", false),
        ] {
            assert_eq!(near(a, b), want, "{a} {b}");
        }
    }
}
