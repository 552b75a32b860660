//! The log's way to stderr (`server.log_flush`): `info` and `debug` lines
//! wait in a bounded buffer and are written together, at most
//! `log_flush` after the first of them, instead of one `write` per line.
//!
//! Every request ends with an access line at the default `info`; written
//! alone, each costs the gateway a system call (and, when stderr is a pipe
//! to a container runtime, a wake-up of its reader): about as much as the
//! line's formatting. Buffered, a second's lines go out in one write.
//! A warning or an error is written at once, after the lines that waited
//! before it (the order of lines is kept); so is a full buffer. The
//! buffer is flushed when the gateway stops and before a panic's message
//! is printed, so what is lost to a crash is at most the last `log_flush`
//! of `info` lines, and only to one the process cannot see (SIGKILL, OOM).
//! nginx's `access_log ... buffer= flush=` and Envoy's file flush interval
//! do the same; `log_flush = "0s"` writes every line at once.

use std::io::{self, Write as _};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;

/// Bytes of lines that may wait; a line that would overflow it writes
/// what waited first.
pub const BUFFER: usize = 64 * 1024;

/// The process's buffered log, for [`flush`].
static INSTALLED: OnceLock<Arc<Buffered>> = OnceLock::new();

/// Lines waiting for stderr, shared by every thread that logs.
#[derive(Debug)]
pub struct Buffered {
    waiting: Mutex<Vec<u8>>,
    limit: usize,
}

impl Buffered {
    /// A buffer of `limit` bytes, written to stderr by a thread of its own
    /// every `every`, and by [`flush`]. The first one made is the one
    /// [`flush`] and the panic hook write out.
    pub fn start(every: Duration, limit: usize) -> Arc<Self> {
        let b = Arc::new(Buffered {
            waiting: Mutex::new(Vec::with_capacity(limit)),
            limit,
        });
        if INSTALLED.set(b.clone()).is_ok() {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // Not `flush`: a panic on a thread that holds the buffer
                // (inside `push`) would wait for itself.
                if let Some(b) = INSTALLED.get() {
                    if let Ok(mut waiting) = b.waiting.try_lock() {
                        let _ = write_all(&mut waiting);
                    }
                }
                previous(info);
            }));
        }
        let weak = Arc::downgrade(&b);
        std::thread::Builder::new()
            .name("log-flush".into())
            .spawn(move || {
                while let Some(b) = weak.upgrade() {
                    b.write_out();
                    drop(b);
                    std::thread::sleep(every);
                }
            })
            .expect("a thread for the log");
        b
    }

    /// Adds a line; writes what waited (and the line) when `urgent` or
    /// when the line would not fit.
    fn push(&self, line: &[u8], urgent: bool) -> io::Result<()> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.len() + line.len() > self.limit {
            write_all(&mut waiting)?;
        }
        if line.len() > self.limit {
            // A line longer than the buffer (a debug dump) goes alone.
            return io::stderr().lock().write_all(line);
        }
        waiting.extend_from_slice(line);
        if urgent {
            write_all(&mut waiting)?;
        }
        Ok(())
    }

    /// Writes what waits.
    pub fn write_out(&self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        // Nowhere to report a failed write to stderr.
        let _ = write_all(&mut waiting);
    }
}

/// Writes `waiting` to stderr and empties it (also when the write failed:
/// a stderr that fails would otherwise hold the buffer full).
fn write_all(waiting: &mut Vec<u8>) -> io::Result<()> {
    if waiting.is_empty() {
        return Ok(());
    }
    let r = io::stderr().lock().write_all(waiting);
    waiting.clear();
    r
}

/// Writes out the installed buffer, if any (the gateway stopping).
pub fn flush() {
    if let Some(b) = INSTALLED.get() {
        b.write_out();
    }
}

/// The `MakeWriter` of the buffered log.
#[derive(Clone, Debug)]
pub struct ToStderr(pub Arc<Buffered>);

impl<'a> MakeWriter<'a> for ToStderr {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            to: &self.0,
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line<'a> {
        Line {
            to: &self.0,
            // WARN and ERROR (the less verbose levels compare lower).
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

/// One event's writer: the formatter hands it the whole line in one
/// `write_all`.
#[derive(Debug)]
pub struct Line<'a> {
    to: &'a Buffered,
    urgent: bool,
}

impl io::Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.to.push(buf, self.urgent)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(b: &Buffered) -> Vec<u8> {
        b.waiting.lock().unwrap().clone()
    }

    #[test]
    fn info_lines_wait_and_a_warning_takes_them_along() {
        let b = Buffered {
            waiting: Mutex::new(Vec::new()),
            limit: 64,
        };
        b.push(b"info 1\n", false).unwrap();
        b.push(b"info 2\n", false).unwrap();
        assert_eq!(lines(&b), b"info 1\ninfo 2\n");
        // A warning: everything out, in order (to the test's stderr).
        b.push(b"warn\n", true).unwrap();
        assert!(lines(&b).is_empty());
        // A line that would overflow writes what waited, then waits.
        b.push(&[b'a'; 40], false).unwrap();
        b.push(&[b'b'; 40], false).unwrap();
        assert_eq!(lines(&b), [b'b'; 40]);
        // One longer than the buffer goes alone; what waited went first.
        b.push(&[b'c'; 100], false).unwrap();
        assert!(lines(&b).is_empty());
    }
}
