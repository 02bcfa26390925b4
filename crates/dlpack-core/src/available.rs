//! How much memory this process can still have, so that a large allocation is refused with a
//! `MemoryError` before anything is allocated, instead of the kernel's OOM killer ending this
//! process (or another) once the pages are touched: Linux overcommits, so `malloc`, `mmap` and
//! `memfd_create` all succeed for sizes the machine can't back. What can be had is the least of
//! the kernel's `MemAvailable`, for each cgroup from this process's up to the root its memory
//! limit minus what it uses (cgroup v2 and v1; file cache it could drop counts as free), and
//! under an address-space limit (`RLIMIT_AS`) that limit minus what the process maps.
//! Elsewhere nothing is known and nothing is refused.

use crate::error::{Error, Result};

/// Allocations smaller than this are not checked: reading the limits costs tens of
/// microseconds, and exchanges that copy small arrays must not pay it.
pub const CHECK_FROM: u64 = 16 << 20;

/// Memory that can be had, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    pub bytes: u64,
    /// e.g. `MemAvailable` or `cgroup /user.slice (limit 4.0 GiB, 1.2 GiB in use)`.
    pub figure_from: String,
}

/// A `MemoryError` unless `bytes` (of `what`, e.g. "shared memory") can be had; sizes under
/// `CHECK_FROM` pass unchecked.
pub fn check(bytes: u64, what: &str) -> Result<()> {
    if bytes < CHECK_FROM {
        return Ok(());
    }
    match available() {
        Some(free) if bytes > free.bytes => Err(Error::Memory(format!(
            "can't allocate {bytes} bytes ({}) of {what}: only {} can be had ({})",
            human(bytes),
            human(free.bytes),
            free.figure_from
        ))),
        _ => Ok(()),
    }
}

/// What this process can still allocate: the least of the limits found; `None` where none can
/// be read.
pub fn available() -> Option<Available> {
    #[cfg(target_os = "linux")]
    {
        let mut least: Option<Available> = None;
        let mut consider = |found: Available| {
            if least.as_ref().is_none_or(|l| found.bytes < l.bytes) {
                least = Some(found);
            }
        };
        if let Some(bytes) = read("/proc/meminfo").as_deref().and_then(mem_available) {
            consider(Available {
                bytes,
                figure_from: "MemAvailable".into(),
            });
        }
        if let Some(groups) = read("/proc/self/cgroup") {
            for found in cgroup_headroom(&groups, read) {
                consider(found);
            }
        }
        if let Some(found) = address_space() {
            consider(found);
        }
        least
    }
    #[cfg(not(target_os = "linux"))]
    None
}

#[cfg(target_os = "linux")]
fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Under an address-space limit (`RLIMIT_AS`, which `ulimit -v` sets), what this process can
/// still map: the limit less what it maps now (`/proc/self/statm`'s size, in pages).
#[cfg(target_os = "linux")]
pub fn address_space() -> Option<Available> {
    use rustix::process::{Resource, getrlimit};
    let limit = getrlimit(Resource::As).current?; // None: no limit
    let pages = statm_size(&read("/proc/self/statm")?)?;
    let mapped = pages.checked_mul(rustix::param::page_size() as u64)?;
    Some(Available {
        bytes: limit.saturating_sub(mapped),
        figure_from: format!(
            "RLIMIT_AS: limit {}, {} mapped",
            human(limit),
            human(mapped)
        ),
    })
}

/// The size field (the first, in pages) of a `/proc/<pid>/statm` text.
fn statm_size(statm: &str) -> Option<u64> {
    statm.split_whitespace().next()?.parse().ok()
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A cgroup limit file's value: `None` for no limit (`max`, or v1's huge page-rounded default).
fn limit(text: &str) -> Option<u64> {
    let value: u64 = text.trim().parse().ok()?;
    (value < 1 << 62).then_some(value)
}

/// The value of `key` in a `memory.stat` text (0 when absent).
fn stat(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(name, _)| *name == key)
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

/// The headroom of every memory cgroup this process is in, from its own up to the root, read
/// through `read` (a path to its text). cgroup v2 (`0::/path`): `memory.max` minus
/// `memory.current`; v1 (a `memory` controller line): `memory.limit_in_bytes` minus
/// `memory.usage_in_bytes`; inactive file cache counts as free in both.
fn cgroup_headroom(groups: &str, read: impl Fn(&str) -> Option<String>) -> Vec<Available> {
    let mut found = Vec::new();
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, max, current, inactive) = if controllers.is_empty() {
            (
                "/sys/fs/cgroup",
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        } else {
            continue;
        };
        let mut group = path.trim_end_matches('/').to_owned();
        loop {
            let dir = format!("{root}{group}");
            let limited = read(&format!("{dir}/{max}")).as_deref().and_then(limit);
            if let Some(limit) = limited {
                let used = read(&format!("{dir}/{current}"))
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let cache =
                    read(&format!("{dir}/memory.stat")).map_or(0, |text| stat(&text, inactive));
                let used = used.saturating_sub(cache);
                let shown = if group.is_empty() { "/" } else { &group };
                found.push(Available {
                    bytes: limit.saturating_sub(used),
                    figure_from: format!(
                        "cgroup {shown}: limit {}, {} in use",
                        human(limit),
                        human(used)
                    ),
                });
            }
            match group.rfind('/') {
                Some(cut) => group.truncate(cut),
                None => break,
            }
        }
    }
    found
}

/// Bytes for people: `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn reads_mem_available() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2000 kB\n";
        assert_eq!(mem_available(text), Some(2000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn reads_statm_size() {
        assert_eq!(statm_size("2711 450 390 3 0 180 0\n"), Some(2711));
        assert_eq!(statm_size(""), None);
        assert_eq!(statm_size("x 1"), None);
    }

    #[test]
    fn reads_limits() {
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("9223372036854771712\n"), None); // v1's "no limit"
        assert_eq!(limit("3221225472\n"), Some(3 << 30));
        assert_eq!(
            stat("anon 5\ninactive_file 7\nactive_file 9\n", "inactive_file"),
            7
        );
        assert_eq!(stat("anon 5\n", "inactive_file"), 0);
    }

    fn files(entries: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |path| map.get(path).cloned()
    }

    #[test]
    fn cgroup_v2_every_level_up() {
        let read = files(&[
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "3221225472\n"),
            ("/sys/fs/cgroup/a/memory.current", "1073741824\n"),
            (
                "/sys/fs/cgroup/a/memory.stat",
                "anon 1\ninactive_file 536870912\n",
            ),
        ]);
        let found = cgroup_headroom("0::/a/b\n", read);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].bytes, (3 << 30) - (512 << 20));
        assert!(
            found[0].figure_from.starts_with("cgroup /a: limit 3.0 GiB"),
            "{found:?}"
        );
    }

    #[test]
    fn cgroup_v1_memory_controller() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/docker/x/memory.limit_in_bytes",
                "1073741824",
            ),
            (
                "/sys/fs/cgroup/memory/docker/x/memory.usage_in_bytes",
                "2147483648",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712",
            ),
        ]);
        let groups = "12:cpu,cpuacct:/docker/x\n4:memory:/docker/x\n";
        let found = cgroup_headroom(groups, read);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].bytes, 0); // over its limit already
    }

    #[test]
    fn small_sizes_pass_and_huge_ones_are_refused_here() {
        assert!(check(CHECK_FROM - 1, "memory").is_ok());
        if cfg!(target_os = "linux") {
            let err = check(1 << 60, "shared memory").unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(
                    "can't allocate 1152921504606846976 bytes (1.0 EiB) of shared memory: only"
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
