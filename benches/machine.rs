//! What a bench report says about the machine it ran on: shared by the
//! benches that print a table (`#[path]`-included).

/// A command's standard output (its standard error when that is empty,
/// as `nginx -v` prints there), trimmed; `""` if it cannot run.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                s = String::from_utf8_lossy(&o.stderr).trim().to_string();
            }
            s
        })
        .unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `nproc N (CPU model)`.
pub fn cpus() -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    format!("nproc {nproc} ({cpu})")
}

/// Now, as `2026-12-02 15:51 UTC`.
pub fn utc_now() -> String {
    sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
}
