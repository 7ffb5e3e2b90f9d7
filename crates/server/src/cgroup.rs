//! Per-tenant CPU weights: every worker of a tenant runs in the tenant's own cgroup, whose CPU
//! weight the operator sets (`cpu_weight`, at start or with `wh tenant set`). The kernel's
//! scheduler then splits the CPU between busy tenants by weight, whatever number of sessions
//! and threads each one has.
//!
//! Both cgroup versions: v2 (a unified hierarchy whose groups list `cpu` in
//! `cgroup.controllers`; the weight goes to `cpu.weight`) and v1 (a hierarchy mounted with the
//! `cpu` controller; the weight goes to `cpu.shares`, scaled so that 100 is v1's 1024). The
//! tenants' groups are made in `wormhole/` under the server's own group, or in a group the
//! operator names. Every path is read from the texts and directories it is given, so the tests
//! run it against a made-up tree.

use std::io;
use std::path::{Path, PathBuf};

/// Which cgroup interface holds the CPU controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The file of a group that holds its CPU weight.
    fn weight_file(self) -> &'static str {
        match self {
            Version::V1 => "cpu.shares",
            Version::V2 => "cpu.weight",
        }
    }

    /// What is written there for a weight of cgroup v2's scale (1..=10000, 100 ordinary).
    pub fn weight_value(self, weight: u32) -> u64 {
        match self {
            Version::V2 => u64::from(weight),
            // v1's shares: 1024 is an ordinary share, 2 the least.
            Version::V1 => (u64::from(weight) * 1024 / 100).max(2),
        }
    }
}

/// The group in which the server makes its tenants' groups, and which ones it made.
#[derive(Debug)]
pub struct CpuGroups {
    version: Version,
    dir: PathBuf,
    /// Whether this server made `dir` (it removes it at exit, if it is empty by then).
    made_dir: bool,
    /// The tenants' groups this server made.
    made: Vec<PathBuf>,
}

/// One line of /proc/mounts: mount point, file system type, options.
fn mount_entries(mounts: &str) -> impl Iterator<Item = (PathBuf, &str, &str)> {
    mounts.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (_dev, at, fstype, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
        Some((PathBuf::from(unescape_mount(at)), fstype, opts))
    })
}

/// /proc/mounts writes a space, tab, newline and backslash in a path as octal escapes.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|o| b[i] == b'\\' && o.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|o| o.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')));
        match octal.and_then(|v| u8::try_from(v).ok()) {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The group a path of /proc/self/cgroup names, under the hierarchy mounted at `mount`; the
/// mount itself when that group is not visible there (a cgroup namespace or a container's
/// view, whose mount is its own group).
fn group_under(mount: &Path, rel: &str) -> PathBuf {
    let g = mount.join(rel.trim_start_matches('/'));
    if g.is_dir() {
        g
    } else {
        mount.to_path_buf()
    }
}

fn lists_cpu(controllers: &str) -> bool {
    controllers
        .split_whitespace()
        .any(|c| c.trim_start_matches('+') == "cpu")
}

/// Finds the CPU controller and the group the server runs in there, from the texts of
/// /proc/mounts and /proc/self/cgroup: cgroup v2 if its hierarchy offers `cpu`, else a v1
/// hierarchy mounted with `cpu`. Err says why there is none.
pub fn find(mounts: &str, own: &str) -> Result<(Version, PathBuf), String> {
    let mut why = Vec::new();
    if let Some((at, _, _)) = mount_entries(mounts).find(|(_, t, _)| *t == "cgroup2") {
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/");
        let base = group_under(&at, rel);
        let controllers =
            std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
        if lists_cpu(&controllers) {
            return Ok((Version::V2, base));
        }
        why.push(format!(
            "cgroup v2 ({}) offers no cpu controller to {} (cgroup.controllers: {:?})",
            at.display(),
            base.display(),
            controllers.trim()
        ));
    }
    let v1 = mount_entries(mounts)
        .find(|(_, t, opts)| *t == "cgroup" && opts.split(',').any(|o| o == "cpu"));
    match v1 {
        Some((at, _, _)) => {
            let rel = own
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
                    ctl.split(',').any(|c| c == "cpu").then_some(path)
                })
                .unwrap_or("/");
            Ok((Version::V1, group_under(&at, rel)))
        }
        None => {
            why.push("no cgroup v1 hierarchy with the cpu controller is mounted".into());
            Err(why.join("; "))
        }
    }
}

/// The cgroup version of the hierarchy `dir` lies in (the mount of /proc/mounts that holds
/// it), for a group the operator names.
pub fn version_of(mounts: &str, dir: &Path) -> Result<Version, String> {
    let holder = mount_entries(mounts)
        .filter(|(at, _, _)| dir.starts_with(at))
        .max_by_key(|(at, _, _)| at.components().count());
    match holder {
        Some((_, "cgroup2", _)) => Ok(Version::V2),
        Some((_, "cgroup", opts)) if opts.split(',').any(|o| o == "cpu") => Ok(Version::V1),
        Some((at, fstype, opts)) => Err(format!(
            "{} is not in a cgroup hierarchy with the cpu controller ({} is {fstype}, {opts})",
            dir.display(),
            at.display()
        )),
        None => Err(format!("{} is on no mounted file system", dir.display())),
    }
}

/// Makes `dir` (its parent must exist); false if it was there already.
fn make_dir(dir: &Path) -> io::Result<bool> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// cgroup v2: lets the children of `group` have a CPU weight (`+cpu` in its
/// `cgroup.subtree_control`), if `group` has the controller itself.
fn enable_cpu_below(group: &Path, check_offered: bool) -> Result<(), String> {
    if check_offered {
        let offered = std::fs::read_to_string(group.join("cgroup.controllers"))
            .map_err(|e| format!("cannot read {}/cgroup.controllers: {e}", group.display()))?;
        if !lists_cpu(&offered) {
            return Err(format!(
                "{} has no cpu controller (cgroup.controllers: {:?})",
                group.display(),
                offered.trim()
            ));
        }
    }
    let file = group.join("cgroup.subtree_control");
    if lists_cpu(&std::fs::read_to_string(&file).unwrap_or_default()) {
        return Ok(());
    }
    std::fs::write(&file, "+cpu").map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            format!(
                "cannot enable the cpu controller below {}: that group holds processes, and \
                 cgroup v2 passes no controller on from such a group (give the server a group \
                 whose parent it may manage, e.g. systemd's Delegate=yes, and name it in cgroup = \"...\")",
                group.display()
            )
        } else {
            format!("cannot write {}: {e}", file.display())
        }
    })
}

impl CpuGroups {
    /// Opens (making it if missing) the group `dir` of a hierarchy of `version`, in which the
    /// tenants' groups are made. Err says why it cannot be used.
    pub fn open(version: Version, dir: PathBuf) -> Result<CpuGroups, String> {
        let parent = dir
            .parent()
            .ok_or_else(|| format!("{} has no parent group", dir.display()))?;
        if version == Version::V2 {
            enable_cpu_below(parent, true)?;
        }
        let made_dir =
            make_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let groups = CpuGroups {
            version,
            dir,
            made_dir,
            made: Vec::new(),
        };
        if version == Version::V2 {
            // A group just made below a parent that passes `cpu` on has it: no need to check.
            if let Err(e) = enable_cpu_below(&groups.dir, !made_dir) {
                groups.cleanup();
                return Err(e);
            }
        }
        Ok(groups)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The group of `tenant`'s workers.
    pub fn group_of(&self, tenant: &str) -> PathBuf {
        self.dir.join(format!("tenant-{}", escape(tenant)))
    }

    /// Makes `tenant`'s group if it is missing (someone may have removed an empty one) and
    /// gives it `weight`.
    pub fn set_weight(&mut self, tenant: &str, weight: u32) -> io::Result<PathBuf> {
        let g = self.group_of(tenant);
        if make_dir(&g)? {
            self.made.push(g.clone());
        }
        let value = self.version.weight_value(weight);
        std::fs::write(g.join(self.version.weight_file()), value.to_string()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot write {}: {e}",
                    g.join(self.version.weight_file()).display()
                ),
            )
        })?;
        Ok(g)
    }

    /// Moves process `pid` (all its threads) into `tenant`'s group, making the group with
    /// `weight` if it is missing.
    pub fn add(&mut self, tenant: &str, weight: u32, pid: u32) -> io::Result<()> {
        let g = self.group_of(tenant);
        if !g.is_dir() {
            self.set_weight(tenant, weight)?;
        }
        std::fs::write(g.join("cgroup.procs"), pid.to_string()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot move process {pid} into {}: {e}", g.display()),
            )
        })
    }

    /// Removes the groups this server made that are empty now (a group with processes cannot
    /// be removed: those of sessions still running stay, and a later server uses them again).
    /// Returns the groups that stay.
    pub fn cleanup(&self) -> Vec<PathBuf> {
        let mut kept = Vec::new();
        for g in self.made.iter().rev() {
            if std::fs::remove_dir(g).is_err() && g.exists() {
                kept.push(g.clone());
            }
        }
        if self.made_dir && std::fs::remove_dir(&self.dir).is_err() && self.dir.exists() {
            kept.push(self.dir.clone());
        }
        kept
    }
}

/// A tenant's name as one path component: letters, digits, `.`, `_` and `-` as they are,
/// every other byte as `%XX` (the `tenant-` prefix keeps `.` and `..` harmless).
fn escape(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The CPU groups for a server's `cgroup` setting: `None` for off, else the group to make
/// the tenants' groups in (`dir`), or the one found from the running system.
pub fn setup(dir: Option<&Path>) -> Result<CpuGroups, String> {
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
    match dir {
        Some(d) => CpuGroups::open(version_of(&mounts, d)?, d.to_path_buf()),
        None => {
            let own = std::fs::read_to_string("/proc/self/cgroup")
                .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
            let (version, base) = find(&mounts, &own)?;
            CpuGroups::open(version, base.join("wormhole"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up cgroup tree under a fresh temporary directory.
    struct Tree(PathBuf);

    impl Tree {
        fn new(tag: &str) -> Tree {
            let d =
                std::env::temp_dir().join(format!("wh-cgroup-test-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            Tree(d)
        }
        fn put(&self, rel: &str, text: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }
        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.0.join(rel)).unwrap()
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn v2_makes_the_groups_enables_cpu_and_writes_cpu_weight() {
        let t = Tree::new("v2");
        let root = t.0.join("unified");
        t.put("unified/cgroup.controllers", "cpuset cpu io memory pids\n");
        t.put("unified/cgroup.subtree_control", "");
        t.put("unified/svc/cgroup.controllers", "cpu io memory\n");
        t.put("unified/svc/cgroup.subtree_control", "memory\n");
        let mounts = format!(
            "sysfs /sys sysfs rw 0 0\ncgroup2 {} cgroup2 rw,nosuid 0 0\n",
            root.display()
        );
        let (v, base) = find(&mounts, "0::/svc\n").unwrap();
        assert_eq!((v, base.clone()), (Version::V2, root.join("svc")));
        let mut g = CpuGroups::open(v, base.join("wormhole")).unwrap();
        assert_eq!(t.read("unified/svc/cgroup.subtree_control"), "+cpu");
        assert_eq!(
            t.read("unified/svc/wormhole/cgroup.subtree_control"),
            "+cpu"
        );
        let group = g.set_weight("a b/c", 300).unwrap();
        assert_eq!(group, root.join("svc/wormhole/tenant-a%20b%2Fc"));
        assert_eq!(
            t.read("unified/svc/wormhole/tenant-a%20b%2Fc/cpu.weight"),
            "300"
        );
        g.add("a b/c", 300, 4242).unwrap();
        assert_eq!(
            t.read("unified/svc/wormhole/tenant-a%20b%2Fc/cgroup.procs"),
            "4242"
        );
        // A group removed meanwhile is made again, with its weight, when a worker comes.
        std::fs::remove_dir_all(root.join("svc/wormhole/tenant-x")).ok();
        g.add("x", 50, 7).unwrap();
        assert_eq!(t.read("unified/svc/wormhole/tenant-x/cpu.weight"), "50");
        assert_eq!(t.read("unified/svc/wormhole/tenant-x/cgroup.procs"), "7");
    }

    #[test]
    fn v2_without_cpu_falls_back_to_v1_and_writes_cpu_shares() {
        let t = Tree::new("v1");
        t.put("fs/unified/cgroup.controllers", "memory pids\n");
        t.put("fs/cpu,cpuacct/user.slice/cpu.shares", "1024\n");
        let mounts = format!(
            "cgroup2 {0}/fs/unified cgroup2 rw 0 0\ncgroup {0}/fs/cpu\\054cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\ncgroup {0}/fs/cpuset cgroup rw,cpuset 0 0\n",
            t.0.display()
        );
        let own = "5:cpuset:/\n4:cpu,cpuacct:/user.slice\n0::/\n";
        let (v, base) = find(&mounts, own).unwrap();
        assert_eq!(v, Version::V1);
        assert_eq!(base, t.0.join("fs/cpu,cpuacct/user.slice"));
        let mut g = CpuGroups::open(v, base.join("wormhole")).unwrap();
        g.set_weight("alice", 300).unwrap();
        assert_eq!(
            t.read("fs/cpu,cpuacct/user.slice/wormhole/tenant-alice/cpu.shares"),
            "3072"
        );
        g.set_weight("alice", 1).unwrap();
        assert_eq!(
            t.read("fs/cpu,cpuacct/user.slice/wormhole/tenant-alice/cpu.shares"),
            "10"
        );
    }

    #[test]
    fn a_group_not_visible_in_the_mount_is_the_mount_itself() {
        let t = Tree::new("ns");
        t.put("cpu/cpu.shares", "1024\n");
        let mounts = format!("cgroup {}/cpu cgroup rw,cpu 0 0\n", t.0.display());
        let (v, base) = find(&mounts, "3:cpu:/docker/abc\n").unwrap();
        assert_eq!((v, base), (Version::V1, t.0.join("cpu")));
    }

    #[test]
    fn no_cpu_controller_says_why() {
        let t = Tree::new("none");
        t.put("unified/cgroup.controllers", "hugetlb\n");
        let mounts = format!("cgroup2 {}/unified cgroup2 rw 0 0\n", t.0.display());
        let why = find(&mounts, "0::/\n").unwrap_err();
        assert!(why.contains("offers no cpu controller"), "{why}");
        assert!(why.contains("no cgroup v1 hierarchy"), "{why}");
        // Named by the operator: a directory in a hierarchy without cpu is refused.
        let err = CpuGroups::open(Version::V2, t.0.join("unified/wormhole")).unwrap_err();
        assert!(err.contains("has no cpu controller"), "{err}");
        assert!(!t.0.join("unified/wormhole").exists());
    }

    #[test]
    fn a_named_group_takes_the_version_of_its_mount() {
        let mounts = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\ncgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n";
        let v = |d: &str| version_of(mounts, Path::new(d));
        assert_eq!(v("/sys/fs/cgroup/cpu/mine"), Ok(Version::V1));
        assert_eq!(v("/sys/fs/cgroup/unified/mine"), Ok(Version::V2));
        assert!(v("/sys/fs/cgroup/cpuset/mine").is_err());
        assert!(v("/sys/fs/cgroup/mine").unwrap_err().contains("tmpfs"));
    }

    #[test]
    fn weights_scale_to_v1_shares() {
        assert_eq!(Version::V1.weight_value(100), 1024);
        assert_eq!(Version::V1.weight_value(300), 3072);
        assert_eq!(Version::V1.weight_value(10000), 102400);
        assert_eq!(Version::V1.weight_value(1), 10);
        assert_eq!(Version::V2.weight_value(1), 1);
        assert_eq!(unescape_mount("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape_mount("/plain\\"), "/plain\\");
    }
}
