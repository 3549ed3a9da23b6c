//! Where the node's cgroup2 hierarchy is mounted: the socket programs hang on its root, the
//! one cgroup every process of the node is below (on a hybrid hierarchy, such as
//! `/sys/fs/cgroup/unified` here, as much as on a pure cgroup2 one at `/sys/fs/cgroup`).
use std::path::PathBuf;

use anyhow::{Context as _, Result};

/// The mount point of the first cgroup2 mount of `mountinfo` (proc(5)'s format) that shows
/// its hierarchy's root; `None` when there is none.
pub fn cgroup2_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fields = mount.split(' ');
        let root = fields.nth(3)?;
        let point = fields.next()?;
        (fs.split(' ').next() == Some("cgroup2") && root == "/")
            .then(|| PathBuf::from(unescape(point)))
    })
}

/// The cgroup2 root as this process's mount namespace has it.
pub fn cgroup2_root() -> Result<Option<PathBuf>> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(cgroup2_in(&info))
}

/// A mountinfo path field: space, tab, newline and backslash are written as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_root_mount() {
        // This machine's hybrid hierarchy, abridged, and a bind mount of a sub-cgroup first.
        let hybrid = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
90 23 0:38 /system.slice /mnt/sub rw,relatime - cgroup2 cgroup2 rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            cgroup2_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(cgroup2_in(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let spaced = r"29 23 0:26 / /run/my\040cgroup rw - cgroup2 none rw";
        assert_eq!(cgroup2_in(spaced), Some(PathBuf::from("/run/my cgroup")));
        let v1 = "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd";
        assert_eq!(cgroup2_in(v1), None);
    }
}
