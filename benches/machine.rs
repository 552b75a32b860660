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

/// CPU time of the whole machine so far, from `/proc/stat`: (all, stolen),
/// in clock ticks. "Stolen" is time the hypervisor ran something else while
/// this machine's vCPUs had work: on a shared host it stalls every process
/// here at once, which is what makes tail latencies jump between runs.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user)
    Some((f.iter().take(8).sum(), *f.get(7)?))
}

/// The share of CPU time stolen by the host between two [`machine_ticks`].
pub fn steal_pct(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> String {
    match (before, after) {
        (Some((t0, s0)), Some((t1, s1))) if t1 > t0 => {
            format!("{:.1}%", (s1 - s0) as f64 * 100.0 / (t1 - t0) as f64)
        }
        _ => "unknown".to_string(),
    }
}
