//! `limits.max_memory`'s default ("auto"): an eighth of the memory
//! palletd may use, between [`AUTO_MIN`] and [`AUTO_MAX`].
//!
//! The memory palletd may use is the least of the box's RAM (`sysinfo(2)`:
//! it needs no `/proc/meminfo`, which the systemd unit's `ProcSubset=pid`
//! hides) and every cgroup v2 `memory.max` from palletd's cgroup up to the
//! root (a systemd `MemoryMax=`, a container's memory limit). cgroup v1
//! limits are not read.
//!
//! Why an eighth, and why these bounds: the budget is a ceiling, not what
//! palletd holds (10,000 sensors x 0.5/s hold 50 MB in all whatever the
//! budget); it is reached when the database cannot keep up and the flush
//! delay stretches to carry more readings per statement (100,000 sensors
//! x 0.1/s need about a million held readings, about 70 MB, for the
//! two-minute delay that keeps up with about 1,000 statements a second),
//! and during an outage. On the 512 MB - 2 GB boxes an edge gateway lives
//! on, shared with the broker, an eighth is 64-256 MiB; more than
//! [`AUTO_MAX`] only if the operator says so.

/// The budget when the box's memory is not known, or small.
pub(crate) const AUTO_MIN: u64 = 64 << 20;

/// The budget "auto" never exceeds.
pub(crate) const AUTO_MAX: u64 = 256 << 20;

/// The budget for a box where palletd may use `available` bytes.
pub(crate) fn auto_budget(available: Option<u64>) -> u64 {
    available.map_or(AUTO_MIN, |bytes| (bytes / 8).clamp(AUTO_MIN, AUTO_MAX))
}

/// "auto": the budget for this box, and what it was made from.
pub fn auto() -> (u64, super::MemoryBudgetFrom) {
    let available = available();
    (
        auto_budget(available),
        super::MemoryBudgetFrom::Auto { available },
    )
}

/// The memory palletd may use: the box's RAM or a cgroup's limit, the
/// least (`None` when neither can be read).
pub(crate) fn available() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limit = |path: Option<&str>, file: &str| {
        path.and_then(|path| {
            cgroup_limit(path, |dir| {
                std::fs::read_to_string(format!("/sys/fs/cgroup{file}{dir}")).ok()
            })
        })
    };
    [
        physical(),
        limit(cgroup_path(&own, false), "/memory.max"),
        limit(cgroup_path(&own, true), "/memory/memory.limit_in_bytes"),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// The box's RAM.
fn physical() -> Option<u64> {
    // SAFETY: sysinfo fills the struct it is given and reads nothing else.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    (info.totalram as u64).checked_mul(info.mem_unit.max(1) as u64)
}

/// The path in `/proc/self/cgroup` (lines `id:controllers:path`) of
/// the cgroup v2 hierarchy (`0::path`) or, with `v1_memory`, of the v1
/// hierarchy the memory controller is in.
fn cgroup_path(text: &str, v1_memory: bool) -> Option<&str> {
    text.lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let found = match v1_memory {
                false => id == "0" && controllers.is_empty(),
                true => controllers.split(',').any(|c| c == "memory"),
            };
            found.then_some(path.trim())
        })
        .filter(|p| p.starts_with('/'))
}

/// The least limit from `path` up to the root, as `read` gives each
/// directory's file ("max" or not there: no limit at that level; v1's
/// "no limit" is a number beyond any box and loses to the RAM).
fn cgroup_limit(path: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut dir = path.trim_end_matches('/');
    let mut least: Option<u64> = None;
    loop {
        if let Some(limit) = read(dir).and_then(|t| t.trim().parse::<u64>().ok()) {
            least = Some(least.map_or(limit, |l| l.min(limit)));
        }
        if dir.is_empty() {
            return least;
        }
        dir = &dir[..dir.rfind('/').unwrap_or(0)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn an_eighth_of_the_box_between_64_and_256_mib() {
        assert_eq!(auto_budget(None), 64 * MIB);
        assert_eq!(auto_budget(Some(256 * MIB)), 64 * MIB);
        assert_eq!(auto_budget(Some(512 * MIB)), 64 * MIB);
        assert_eq!(auto_budget(Some(GIB)), 128 * MIB);
        assert_eq!(auto_budget(Some(2 * GIB)), 256 * MIB);
        assert_eq!(auto_budget(Some(24 * GIB)), 256 * MIB);
    }

    #[test]
    fn the_least_cgroup_limit_up_to_the_root() {
        let text = "12:cpu:/old-v1\n4:memory:/v1/box\n0::/system.slice/palletd.service\n";
        assert_eq!(cgroup_path(text, true), Some("/v1/box"));
        let path = cgroup_path(text, false).unwrap();
        assert_eq!(path, "/system.slice/palletd.service");
        let files = |dir: &str| match dir {
            "/system.slice/palletd.service" => Some("max\n".to_owned()),
            "/system.slice" => Some(format!("{}\n", GIB)),
            "" => None,
            other => panic!("read {other:?}"),
        };
        assert_eq!(cgroup_limit(path, files), Some(GIB));
        let tighter = |dir: &str| match dir {
            "/system.slice/palletd.service" => Some(format!("{}", 300 * MIB)),
            _ => Some("max".to_owned()),
        };
        assert_eq!(cgroup_limit(path, tighter), Some(300 * MIB));
        // A container: its cgroup is the namespace's root.
        assert_eq!(cgroup_path("0::/\n", false), Some("/"));
        let root = |dir: &str| (dir.is_empty()).then(|| format!("{}", 512 * MIB));
        assert_eq!(cgroup_limit("/", root), Some(512 * MIB));
        assert_eq!(cgroup_limit("/a/b", |_| None), None);
        assert_eq!(cgroup_path("1:memory:/x\n", false), None, "cgroup v1 only");
        assert_eq!(cgroup_path("1:cpu,memory:/x\n", true), Some("/x"));
    }

    #[test]
    fn this_box_has_memory() {
        let bytes = available().expect("sysinfo");
        assert!(bytes >= 64 * MIB, "{bytes}");
    }
}
