//! The few URL shapes a config names: workers, the public base URL, the store.
//!
//! A small splitter of our own rather than `http::Uri`, which silently drops
//! fragments and out-of-range ports.

use std::fmt;
use std::net::Ipv6Addr;

/// Where a route sends its requests: `http(s)://host[:port][/base/path]`.
///
/// Requests reach the worker as `base_path` followed by the caller's path
/// (less the route's prefix when it strips it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerUrl {
    /// `https`: connect with TLS (SNI and certificate checks use `host`).
    pub tls: bool,
    /// Lowercase host name or IP address; an IPv6 address keeps its brackets.
    pub host: String,
    /// The URL's port, else 80 (http) or 443 (https).
    pub port: u16,
    /// `""` or a path like `"/x/y"`, never ending in `/`.
    pub base_path: String,
}

impl WorkerUrl {
    /// Reads a worker URL: http or https, a host, an optional port and base
    /// path; no user info, query or fragment. A trailing `/` is dropped.
    pub fn parse(s: &str) -> Result<WorkerUrl, String> {
        let shape = || format!("expected an http or https URL with a host, found {s:?}");
        let u = split_url(s).map_err(|e| match e {
            UrlError::Shape => shape(),
            UrlError::Invalid(why) => format!("invalid worker URL {s:?}: {why}"),
        })?;
        let tls = match u.scheme.as_str() {
            "http" => false,
            "https" => true,
            _ => return Err(shape()),
        };
        if u.userinfo.is_some() {
            return Err(format!(
                "invalid worker URL {s:?}: user info is not supported; use worker_credential"
            ));
        }
        if u.query.is_some() || u.fragment.is_some() {
            return Err(format!(
                "invalid worker URL {s:?}: a worker URL takes no query or fragment"
            ));
        }
        Ok(WorkerUrl {
            tls,
            host: u.host,
            port: u.port.unwrap_or(if tls { 443 } else { 80 }),
            base_path: u.path.trim_end_matches('/').to_owned(),
        })
    }

    /// `host:port`, the address to connect to and the `Host` the worker expects.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `http://host:port` or `https://host:port`, without the base path.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.authority())
    }
}

/// The full URL: origin and base path.
impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.origin(), self.base_path)
    }
}

/// `s` with the password of its user info (`scheme://user:PASSWORD@host`)
/// replaced by `***`, for messages and logs; a URL without one (or not a
/// URL) is returned as it is, a user info without `:` (a bare password, as
/// `redis://secret@host` reads) replaced whole.
pub fn redact_url(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..end].rfind('@') else {
        return s.to_owned();
    };
    let user = match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{scheme}://{user}{}", &rest[at..])
}

/// A Redis store found through Sentinel:
/// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db]`.
/// The user info and database are the data nodes'; the sentinels are asked
/// (over plain TCP, without a password) which node is the primary of
/// `master`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, `host:port` (port 26379 unless given).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary by.
    pub master: String,
    pub userinfo: Option<String>,
    pub db: Option<u32>,
}

/// The default port of a sentinel.
pub const SENTINEL_PORT: u16 = 26379;

impl SentinelUrl {
    /// Reads `s`; `None` when it is not a `redis+sentinel://` URL at all,
    /// `Some(Err)` with why a sentinel URL is malformed (no password in it).
    pub fn parse(s: &str) -> Option<Result<SentinelUrl, String>> {
        let rest = s.strip_prefix("redis+sentinel://")?;
        Some(Self::parse_rest(rest))
    }

    fn parse_rest(rest: &str) -> Result<SentinelUrl, String> {
        if rest.contains(['?', '#']) {
            return Err("a sentinel URL has no query or fragment".into());
        }
        let (authority, path) = rest.split_once('/').ok_or(
            "a sentinel URL names the primary after its sentinels: redis+sentinel://host:26379/mymaster",
        )?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_owned()), h),
            None => (None, authority),
        };
        let sentinels = host_list(hosts, SENTINEL_PORT, "sentinel")?;
        let (master, db) = match path.split_once('/') {
            Some((m, d)) => (
                m,
                Some(d.parse::<u32>().map_err(|_| {
                    format!("the database after the primary's name is a number, found {d:?}")
                })?),
            ),
            None => (path, None),
        };
        if master.is_empty() || !master.chars().all(url_char) {
            return Err("a sentinel URL names the primary after its sentinels: redis+sentinel://host:26379/mymaster".into());
        }
        Ok(SentinelUrl {
            sentinels,
            master: master.to_owned(),
            userinfo,
            db,
        })
    }

    /// The `redis://` URL of the primary at `host:port`, with this URL's
    /// user info and database.
    pub fn data_url(&self, host: &str, port: u16) -> String {
        let user = self
            .userinfo
            .as_ref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let db = self.db.map(|d| format!("/{d}")).unwrap_or_default();
        format!("redis://{user}{host}:{port}{db}")
    }
}

/// A Redis Cluster: `redis+cluster://[user:password@]host[:port][,host[:port]...]`,
/// or `rediss+cluster://` over TLS. The nodes are where the client starts:
/// it learns the rest of the cluster (and every change to it) from them,
/// so any few of its primaries will do. A cluster has database 0 only, so
/// the URL names none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The nodes, `host:port` (port 6379 unless given).
    pub nodes: Vec<String>,
    pub userinfo: Option<String>,
    /// `rediss+cluster://`: every node over TLS.
    pub tls: bool,
}

/// The default port of a Redis node.
pub const REDIS_PORT: u16 = 6379;

impl ClusterUrl {
    /// Reads `s`; `None` when it is not a `redis+cluster://` or
    /// `rediss+cluster://` URL at all, `Some(Err)` with why a cluster URL is
    /// malformed (no password in it).
    pub fn parse(s: &str) -> Option<Result<ClusterUrl, String>> {
        let (tls, rest) = match s.strip_prefix("redis+cluster://") {
            Some(rest) => (false, rest),
            None => (true, s.strip_prefix("rediss+cluster://")?),
        };
        Some(Self::parse_rest(rest, tls))
    }

    fn parse_rest(rest: &str, tls: bool) -> Result<ClusterUrl, String> {
        if rest.contains(['?', '#']) {
            return Err("a cluster URL has no query or fragment".into());
        }
        let authority = match rest.split_once('/') {
            None => rest,
            Some((a, "")) => a,
            Some(_) => {
                return Err(
                    "a cluster URL names no database (a Redis Cluster has only database 0)".into(),
                )
            }
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_owned()), h),
            None => (None, authority),
        };
        Ok(ClusterUrl {
            nodes: host_list(hosts, REDIS_PORT, "node")?,
            userinfo,
            tls,
        })
    }

    /// Each node's own URL (`redis://` or `rediss://`), with this URL's
    /// user info: what the cluster client starts from.
    pub fn node_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let user = self
            .userinfo
            .as_ref()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        self.nodes
            .iter()
            .map(|n| format!("{scheme}://{user}{n}"))
            .collect()
    }
}

/// `host[:port],host[:port]...` as `host:port` each (`default` when no
/// port is given); `what` names one in errors.
fn host_list(hosts: &str, default: u16, what: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = match h.rsplit_once(':') {
            Some((host, p)) => (
                host,
                p.parse::<u16>()
                    .map_err(|_| format!("{what} {h:?}: the port is not a number"))?,
            ),
            None => (h, default),
        };
        if host.is_empty() || !host.chars().all(url_char) {
            return Err(format!("{what} {h:?}: not a host[:port]"));
        }
        out.push(format!("{host}:{port}"));
    }
    Ok(out)
}

/// A URL taken apart; `scheme` and `host` are lowercase.
#[derive(Debug)]
pub(crate) struct UrlParts<'a> {
    pub scheme: String,
    pub userinfo: Option<&'a str>,
    pub host: String,
    pub port: Option<u16>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub fragment: Option<&'a str>,
}

#[derive(Debug, PartialEq)]
pub(crate) enum UrlError {
    /// Not `scheme://host...` at all.
    Shape,
    /// The right shape with a bad part.
    Invalid(String),
}

/// Splits `scheme://[userinfo@]host[:port][path][?query][#fragment]`.
pub(crate) fn split_url(s: &str) -> Result<UrlParts<'_>, UrlError> {
    let (scheme, rest) = s.split_once("://").ok_or(UrlError::Shape)?;
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(UrlError::Shape);
    }
    if let Some(c) = s.chars().find(|&c| !url_char(c)) {
        return Err(UrlError::Invalid(format!("character {c:?} is not allowed")));
    }
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| UrlError::Invalid("unclosed '[' in the host".into()))?;
        addr.parse::<Ipv6Addr>()
            .map_err(|_| UrlError::Invalid(format!("{addr:?} is not an IPv6 address")))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                UrlError::Invalid(format!("unexpected {p:?} after the IPv6 address"))
            })?),
        };
        (&hostport[..addr.len() + 2], port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::Shape);
    }
    if !host.starts_with('[') {
        if let Some(c) = host
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
        {
            return Err(UrlError::Invalid(format!(
                "character {c:?} is not allowed in a host"
            )));
        }
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return Err(UrlError::Invalid("port 0 is not allowed".into())),
            Ok(n) if p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(UrlError::Invalid(format!("invalid port {p:?}"))),
        },
    };
    Ok(UrlParts {
        scheme: scheme.to_ascii_lowercase(),
        userinfo,
        host: host.to_ascii_lowercase(),
        port,
        path,
        query,
        fragment,
    })
}

/// Printable ASCII that may appear in a URL (RFC 3986 reserved and
/// unreserved characters and `%`).
fn url_char(c: char) -> bool {
    c.is_ascii_graphic() && !matches!(c, '"' | '<' | '>' | '\\' | '^' | '`' | '{' | '|' | '}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(tls: bool, host: &str, port: u16, base_path: &str) -> WorkerUrl {
        WorkerUrl {
            tls,
            host: host.into(),
            port,
            base_path: base_path.into(),
        }
    }

    #[test]
    fn worker_urls() {
        let ok = [
            (
                "http://127.0.0.1:9000/base",
                w(false, "127.0.0.1", 9000, "/base"),
            ),
            ("http://127.0.0.1:9000", w(false, "127.0.0.1", 9000, "")),
            ("http://worker", w(false, "worker", 80, "")),
            ("https://worker", w(true, "worker", 443, "")),
            (
                "https://Worker.Example.COM/",
                w(true, "worker.example.com", 443, ""),
            ),
            ("HTTP://w:8080/a/b/", w(false, "w", 8080, "/a/b")),
            ("http://w/A/b", w(false, "w", 80, "/A/b")),
            ("http://[::1]:9000/x", w(false, "[::1]", 9000, "/x")),
            ("https://[::1]", w(true, "[::1]", 443, "")),
            ("http://my_host.local", w(false, "my_host.local", 80, "")),
        ];
        for (s, want) in ok {
            assert_eq!(WorkerUrl::parse(s), Ok(want), "{s}");
        }
        let bad = [
            (
                "ftp://x",
                "expected an http or https URL with a host, found \"ftp://x\"",
            ),
            ("worker:9000", "expected an http or https URL"),
            ("127.0.0.1:9000", "expected an http or https URL"),
            ("http://", "expected an http or https URL"),
            ("http:///x", "expected an http or https URL"),
            ("http://:80", "expected an http or https URL"),
            ("", "expected an http or https URL"),
            ("http://a:99999", "invalid port \"99999\""),
            ("http://a:", "invalid port \"\""),
            ("http://a:+80", "invalid port \"+80\""),
            ("http://a:0", "port 0"),
            ("http://a/b?x=1", "no query or fragment"),
            ("http://a/b#top", "no query or fragment"),
            ("http://u:p@a/", "user info"),
            ("http://a b/", "character ' ' is not allowed"),
            ("http://a/é", "character 'é' is not allowed"),
            ("http://a$b/", "not allowed in a host"),
            ("http://[::1/", "unclosed"),
            ("http://[zz]/", "not an IPv6 address"),
            ("http://[::1]x/", "after the IPv6 address"),
        ];
        for (s, want) in bad {
            let err = WorkerUrl::parse(s).expect_err(s);
            assert!(err.contains(want), "{s}: {err}");
        }
    }

    #[test]
    fn worker_url_parts() {
        let u = WorkerUrl::parse("https://w.example:8443/base/").unwrap();
        assert_eq!(u.authority(), "w.example:8443");
        assert_eq!(u.origin(), "https://w.example:8443");
        assert_eq!(u.to_string(), "https://w.example:8443/base");
        let u = WorkerUrl::parse("http://[::1]").unwrap();
        assert_eq!(u.authority(), "[::1]:80");
        assert_eq!(u.origin(), "http://[::1]:80");
    }

    #[test]
    fn redacts_passwords() {
        for (url, want) in [
            ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
            ("redis://user:p%40ss@cache/1", "redis://user:***@cache/1"),
            ("redis://secret@cache", "redis://***@cache"),
            ("redis://a:b:c@h?x=@y", "redis://a:***@h?x=@y"),
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            ("memory://", "memory://"),
            ("not a url @ all", "not a url @ all"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn split() {
        let u = split_url("rediss://:pw@Cache:6380/2?timeout=1#f").unwrap();
        assert_eq!(u.scheme, "rediss");
        assert_eq!(u.userinfo, Some(":pw"));
        assert_eq!(u.host, "cache");
        assert_eq!(u.port, Some(6380));
        assert_eq!(u.path, "/2");
        assert_eq!(u.query, Some("timeout=1"));
        assert_eq!(u.fragment, Some("f"));
        assert!(matches!(split_url("memory"), Err(UrlError::Shape)));
        assert!(matches!(split_url("1x://a"), Err(UrlError::Shape)));
    }
}
