//! Host identity and process liveness.

/// A stable id of this boot of this host: a hash of the kernel's boot id.
///
/// `CXLKV_HOST_ID` (a number) replaces it, so that processes of one machine
/// can act as different hosts (tests of multi-host behaviour): such
/// processes never probe each other's pids (their heartbeats alone tell
/// liveness) and may each run an SSD tier.
pub fn host_id() -> u64 {
    if let Some(v) = std::env::var("CXLKV_HOST_ID").ok().and_then(|v| {
        let v = v.trim();
        v.strip_prefix("0x").map_or_else(|| v.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
    }) {
        return mix(v) | 1;
    }
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in s.trim().bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h | 1
}

fn mix(v: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ 0x686f_7374;
    for b in v.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// This process's PID namespace: a hash of the device and inode of
/// `/proc/self/ns/pid` (0 when it cannot be read). Two processes of one host
/// in different containers see different pid spaces: a pid recorded by one
/// means nothing to the other.
pub fn pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(m) => cxlkv_core::hash::mix64(m.dev() ^ m.ino().rotate_left(32)) | 1,
        Err(_) => 0,
    }
}

/// Who this process is, as other nodes' info lines name theirs: can it probe
/// their pids?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Locality {
    /// [`host_id`].
    pub host: u64,
    /// [`pid_ns`].
    pub pid_ns: u64,
}

impl Locality {
    /// This process's.
    pub fn here() -> Locality {
        Locality { host: host_id(), pid_ns: pid_ns() }
    }

    /// True when node `info`'s pid can be probed from here: same host and
    /// same (known) PID namespace. Otherwise only its heartbeat tells.
    pub fn can_probe(&self, info: &cxlkv_core::layout::NodeInfo) -> bool {
        info.host_id == self.host && self.pid_ns != 0 && info.pid_ns == self.pid_ns
    }
}

/// True if a process (or thread) with id `pid` runs on this host. A zombie
/// (killed, not yet reaped by its parent) is dead: it will never release
/// anything it held.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence; no signal is sent.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !is_zombie(pid)
}

/// Reads the state letter of `/proc/<pid>/stat` (after the command name).
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

thread_local! {
    /// This thread's kernel id once asked for (0: not yet). A lock word is
    /// made with it at every host-local lock and every manager step: a
    /// system call each time cost more than the rest of the lock.
    static TID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// In a child made by `fork`, the forking thread's id kept in its copy of
/// that thread's storage is its parent's: forgotten there.
extern "C" fn forget_tid_in_child() {
    TID.with(|t| t.set(0));
}

/// This thread's kernel id.
pub fn tid() -> u32 {
    TID.with(|t| {
        let known = t.get();
        if known != 0 {
            return known;
        }
        static FORK_HOOK: std::sync::Once = std::sync::Once::new();
        FORK_HOOK.call_once(|| {
            // SAFETY: registers a child handler that only writes this
            // library's thread-local; no memory is passed.
            unsafe { libc::pthread_atfork(None, None, Some(forget_tid_in_child)) };
        });
        // SAFETY: gettid has no preconditions.
        let id = unsafe { libc::gettid() as u32 };
        t.set(id);
        id
    })
}

/// A random 64-bit value (for nonces and creation ids).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a valid writable buffer of 8 bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    cxlkv_core::hash::mix64(t as u64 ^ (std::process::id() as u64) << 32)
}

/// Gives the calling thread the highest best-effort I/O priority
/// (`ioprio_set`, open to any process). True when it took.
pub(crate) fn raise_io_priority() -> bool {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_BE: libc::c_long = 2;
    const IOPRIO_CLASS_SHIFT: u32 = 13;
    // SAFETY: ioprio_set takes three integers (who 0: the calling thread)
    // and touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT,
        )
    };
    r == 0
}

/// Asks for nice -5 for the calling thread: granted with `CAP_SYS_NICE` or
/// an `RLIMIT_NICE` that allows it, refused quietly otherwise. True when
/// it took.
pub(crate) fn raise_cpu_priority() -> bool {
    // SAFETY: `gettid` has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes integers only; on Linux a thread id names
    // that thread alone.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -5) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn killed_unreaped_child_is_dead() {
        let mut c = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(pid_alive(c.id()));
        c.kill().unwrap();
        // Not reaped yet: a zombie. Give the kernel a moment to deliver.
        let mut dead = false;
        for _ in 0..500 {
            if !pid_alive(c.id()) {
                dead = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(dead, "a zombie counts as dead");
        c.wait().unwrap();
        assert!(!pid_alive(c.id()));
        assert!(pid_alive(std::process::id()));
    }

    #[test]
    fn the_kept_thread_id_is_each_threads_own_and_a_forked_childs_own() {
        let here = tid();
        // SAFETY: gettid has no preconditions.
        assert_eq!(here, unsafe { libc::gettid() as u32 });
        let there = std::thread::spawn(tid).join().unwrap();
        assert_ne!(here, there);
        // SAFETY: the child only reads its thread id and exits at once
        // (`_exit`: nothing of the parent's is run or flushed).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above.
            let own = unsafe { libc::gettid() as u32 };
            // SAFETY: ends the child without unwinding or running handlers.
            unsafe { libc::_exit(if tid() == own && own != here { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child kept its parent's id");
    }
}
