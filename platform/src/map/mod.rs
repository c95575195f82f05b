//! Mapping a region: regular and /dev/shm files, memfds (hugetlb or not) and
//! device DAX. Every mapping is `MAP_SHARED` and at least 64-byte aligned;
//! device DAX mappings are aligned to the device's own alignment.

pub mod devdax;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use cxlkv_core::mem::View;

use crate::error::{Error, Result};

/// Where a region lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A regular file or a file in /dev/shm.
    File(PathBuf),
    /// An anonymous memfd (shared with children through fork or
    /// `/proc/<pid>/fd/<n>`), backed by huge pages when `hugetlb`.
    Memfd {
        /// Use `MFD_HUGETLB`.
        hugetlb: bool,
    },
    /// A device-DAX character device (`/dev/daxX.Y`).
    DevDax(PathBuf),
}

impl Source {
    /// Picks the source for a path: `/dev/dax*` is device DAX, else a file.
    pub fn for_path(p: &Path) -> Source {
        let s = p.as_os_str().as_bytes();
        if s.starts_with(b"/dev/dax") {
            Source::DevDax(p.to_path_buf())
        } else {
            Source::File(p.to_path_buf())
        }
    }
}

/// A live shared mapping; unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    fd: OwnedFd,
    source: Source,
    populate: Mutex<Populate>,
}

/// How far this process's page tables for a mapping are populated
/// ([`Mapping::populate_background`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Populate {
    /// Not asked for: pages fault in on first touch.
    #[default]
    Lazy,
    /// A background thread is populating; `done` bytes so far.
    Running {
        /// Bytes populated.
        done: usize,
    },
    /// Every page is mapped: no page fault on the data path.
    Done,
    /// The kernel refused (`errno`, e.g. `EINVAL` before Linux 5.14); pages
    /// fault in on first touch.
    Refused {
        /// The `madvise` error.
        errno: i32,
    },
}

/// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Bytes populated per step of the background thread: small enough that a
/// closing node waits at most a few milliseconds for it, and that the
/// address-space lock a step holds is held briefly.
const POPULATE_STEP: usize = 2 << 20;

// SAFETY: the mapping is plain shared memory; all access goes through View
// views, whose accesses are atomic or validated copies.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::Core(cxlkv_core::Error::InvalidArgument))
}

/// `open(2)` of `path` with `flags` (and `mode` when creating), owned.
pub(crate) fn open_fd(path: &Path, flags: libc::c_int, mode: u32, what: &'static str) -> Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path; `mode` is only read with O_CREAT.
    let fd = unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(Error::io(what));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Maps `len` bytes of `fd` shared, at an address aligned to `align`.
pub(crate) fn map_aligned(fd: &OwnedFd, len: usize, align: usize) -> Result<*mut u8> {
    if len == 0 || !align.is_power_of_two() {
        return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
    }
    let page = 4096usize;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    if align <= page {
        // SAFETY: a fresh shared mapping of a valid fd; the kernel picks the
        // address (page aligned, so 64-byte aligned).
        let p = unsafe { libc::mmap(core::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(Error::io("mmap"));
        }
        return Ok(p.cast());
    }
    // Reserve len + align of address space, then map the device at an aligned
    // address inside the reservation and release the slop.
    let span = len.checked_add(align).ok_or(Error::Core(cxlkv_core::Error::TooLarge))?;
    // SAFETY: an anonymous PROT_NONE reservation; nothing is accessed.
    let r = unsafe {
        libc::mmap(core::ptr::null_mut(), span, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if r == libc::MAP_FAILED {
        return Err(Error::io("mmap reserve"));
    }
    let base = r as usize;
    let aligned = (base + align - 1) & !(align - 1);
    // SAFETY: `aligned..aligned+len` lies inside the reservation we own, so
    // MAP_FIXED replaces only our own PROT_NONE pages.
    let p = unsafe {
        libc::mmap(aligned as *mut libc::c_void, len, prot, libc::MAP_SHARED | libc::MAP_FIXED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        let e = Error::io("mmap fixed");
        // SAFETY: unmapping our own reservation.
        unsafe { libc::munmap(r, span) };
        return Err(e);
    }
    if aligned > base {
        // SAFETY: the slop before the mapping is part of our reservation.
        unsafe { libc::munmap(r, aligned - base) };
    }
    let end = aligned + len;
    if base + span > end {
        // SAFETY: the slop after the mapping is part of our reservation.
        unsafe { libc::munmap(end as *mut libc::c_void, base + span - end) };
    }
    Ok(aligned as *mut u8)
}

/// `Io` (permission denied) when a file at `path` exists and another user
/// owns it: a region file is replaced only by its owner.
pub(crate) fn refuse_foreign(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::symlink_metadata(path) else { return Ok(()) };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(Error::Io {
            what: "replace a region file owned by another user",
            err: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
    }
    Ok(())
}

fn fd_len(fd: &OwnedFd) -> Result<u64> {
    // SAFETY: zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::io("fstat"));
    }
    Ok(st.st_size as u64)
}

impl Mapping {
    /// Creates a file of `size` bytes with exactly the permissions `mode`
    /// (whatever the umask; owner-only by default: 0o600) and maps it. With
    /// `overwrite`, an existing file at `path` is unlinked first and a new
    /// one created, never truncated: a process that still maps the old one
    /// keeps its pages (truncating a mapped file kills its users with
    /// SIGBUS). A file another user owns is never replaced (`Io`,
    /// permission denied), even where the directory would allow it: its
    /// owner's nodes would keep working on a region nobody else sees.
    pub fn create_file(path: &Path, size: u64, mode: u32, overwrite: bool) -> Result<Mapping> {
        if mode & !0o777 != 0 || mode & 0o600 != 0o600 {
            // Permission bits only, and the owner reads and writes.
            return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
        }
        if overwrite {
            refuse_foreign(path)?;
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::Io { what: "replace region file", err }),
            }
        }
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_EXCL;
        let fd = open_fd(path, flags, mode, "open region file")?;
        // The mode as asked, not as the umask left it (a group option means
        // the group can write).
        // SAFETY: `fd` is an open file this call created.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } != 0 {
            return Err(Error::io("fchmod region file"));
        }
        let len = usize::try_from(size).map_err(|_| Error::Core(cxlkv_core::Error::TooLarge))?;
        // SAFETY: `fd` is an open regular file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(Error::io("ftruncate"));
        }
        let ptr = map_aligned(&fd, len, 4096)?;
        Ok(Mapping { ptr, len, fd, source: Source::File(path.to_path_buf()), populate: Mutex::default() })
    }

    /// Opens and maps an existing region file (its whole length).
    pub fn open_file(path: &Path) -> Result<Mapping> {
        let fd = open_fd(path, libc::O_RDWR | libc::O_CLOEXEC, 0, "open region file")?;
        let size = fd_len(&fd)?;
        if size < 4096 {
            return Err(Error::Core(cxlkv_core::Error::TooSmall));
        }
        let len = usize::try_from(size).map_err(|_| Error::Core(cxlkv_core::Error::TooLarge))?;
        let ptr = map_aligned(&fd, len, 4096)?;
        Ok(Mapping { ptr, len, fd, source: Source::File(path.to_path_buf()), populate: Mutex::default() })
    }

    /// Creates an anonymous memfd region of `size` bytes (huge pages when
    /// `hugetlb`; the size is then rounded up to 2 MiB).
    pub fn memfd(size: u64, hugetlb: bool) -> Result<Mapping> {
        let name = c"cxlkv";
        let mut flags = libc::MFD_CLOEXEC;
        let mut size = size;
        if hugetlb {
            flags |= libc::MFD_HUGETLB;
            size = size.div_ceil(2 << 20) * (2 << 20);
        }
        // SAFETY: `name` is a valid C string; flags are valid memfd flags.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if fd < 0 {
            return Err(Error::io("memfd_create"));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `fd` is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(Error::io("ftruncate memfd"));
        }
        let len = usize::try_from(size).map_err(|_| Error::Core(cxlkv_core::Error::TooLarge))?;
        let align = if hugetlb { 2 << 20 } else { 4096 };
        let ptr = map_aligned(&fd, len, align)?;
        Ok(Mapping { ptr, len, fd, source: Source::Memfd { hugetlb }, populate: Mutex::default() })
    }

    /// Opens a region at `path`: device DAX for `/dev/dax*`, else a file.
    pub fn open(path: &Path) -> Result<Mapping> {
        match Source::for_path(path) {
            Source::DevDax(p) => devdax::open(&p),
            _ => Mapping::open_file(path),
        }
    }

    pub(crate) fn from_parts(ptr: *mut u8, len: usize, fd: OwnedFd, source: Source) -> Mapping {
        Mapping { ptr, len, fd, source, populate: Mutex::default() }
    }

    /// A core view of the mapping.
    pub fn view(&self) -> View {
        // SAFETY: `ptr..ptr+len` stays mapped until `self` drops, callers keep the
        // Mapping alive while they use the view (Node owns both), and the shared
        // memory is only accessed through View views.
        match unsafe { View::new(self.ptr, self.len) } {
            Ok(r) => r,
            // mmap returns page-aligned non-null addresses.
            Err(_) => unreachable!("mmap returned an unaligned address"),
        }
    }

    /// Faults every page of the mapping in for writing now, so first touches
    /// on the data path cost no page fault (`MADV_POPULATE_WRITE`).
    pub fn prefault(&self) -> Result<()> {
        self.populate_range(0, self.len).map_err(|_| Error::io("madvise(MADV_POPULATE_WRITE)"))?;
        self.set_populate(Populate::Done);
        Ok(())
    }

    /// Populates `off..off+len` of the mapping for writing; the `errno` on
    /// refusal.
    fn populate_range(&self, off: usize, len: usize) -> core::result::Result<(), i32> {
        let len = len.min(self.len.saturating_sub(off));
        if len == 0 {
            return Ok(());
        }
        // SAFETY: `off + len <= self.len` (clamped above), so the range lies in
        // our live mapping; the advice only maps pages (the bytes do not
        // change: a write fault of a shared page maps it, it stores nothing).
        let r = unsafe { libc::madvise(self.ptr.wrapping_add(off).cast(), len, MADV_POPULATE_WRITE) };
        if r != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
        }
        Ok(())
    }

    fn set_populate(&self, p: Populate) {
        if let Ok(mut g) = self.populate.lock() {
            *g = p;
        }
    }

    /// How far the page tables are populated.
    pub fn populated(&self) -> Populate {
        self.populate.lock().map_or(Populate::Lazy, |g| *g)
    }

    /// Starts populating the whole mapping's page tables on a background
    /// thread (once per mapping), so attaching a large region returns at
    /// once and the data path stops taking first-touch page faults within
    /// about a second per few GiB. Asks for transparent huge pages first
    /// (they apply where the file system offers them: shmem set to
    /// `advise`; hugetlb and device DAX map huge pages anyway). The thread
    /// holds the mapping only while it populates one 32 MiB step: dropping
    /// the last handle stops it.
    pub fn populate_background(self: &Arc<Mapping>) -> Result<()> {
        {
            let mut g = self.populate.lock().map_err(|_| Error::Unsupported("mapping lock poisoned"))?;
            if *g != Populate::Lazy {
                return Ok(());
            }
            *g = Populate::Running { done: 0 };
        }
        if matches!(self.source, Source::File(_) | Source::Memfd { hugetlb: false }) {
            // SAFETY: our live mapping; the advice changes only how pages are
            // allocated, never their contents. Refusal is harmless.
            unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_HUGEPAGE) };
        }
        let weak: Weak<Mapping> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("cxlkv-populate".into()).spawn(move || {
            // Not at a low priority: each step holds the process's
            // address-space lock while it faults pages in, and a thread
            // starved in the middle of one (nice 19 on an overloaded host)
            // kept every other thread's page faults and thread starts
            // waiting behind it for seconds: heartbeats stopped, and live
            // nodes were declared dead. Small steps at the normal priority,
            // with a yield between, hold it briefly.
            let mut off = 0usize;
            while let Some(m) = weak.upgrade() {
                if off >= m.len {
                    m.set_populate(Populate::Done);
                    break;
                }
                match m.populate_range(off, POPULATE_STEP) {
                    Ok(()) => {
                        off = off.saturating_add(POPULATE_STEP).min(m.len);
                        m.set_populate(if off >= m.len { Populate::Done } else { Populate::Running { done: off } });
                        std::thread::yield_now();
                    }
                    Err(errno) => {
                        m.set_populate(Populate::Refused { errno });
                        break;
                    }
                }
            }
        });
        if let Err(err) = spawned {
            self.set_populate(Populate::Lazy);
            return Err(Error::Io { what: "spawn populate thread", err });
        }
        Ok(())
    }

    /// Mapped length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never, for a valid mapping).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the region lives.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The file descriptor (for passing a memfd to other processes).
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is our mapping; nothing uses it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_mapping_is_shared_between_mappings() {
        let dir = std::env::temp_dir().join(format!("cxlkv-map-{}", std::process::id()));
        let a = Mapping::create_file(&dir, 1 << 20, 0o600, true).unwrap();
        let b = Mapping::open_file(&dir).unwrap();
        a.view().store_u64(4096, 0xfeed).unwrap();
        assert_eq!(b.view().load_u64(4096).unwrap(), 0xfeed);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(Mapping::create_file(&dir, 1 << 20, 0o600, false).is_err(), "no silent overwrite");
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn aligned_mapping_honours_large_alignment() {
        let m = Mapping::memfd(4 << 20, false).unwrap();
        let p = map_aligned(&m.fd, 4 << 20, 2 << 20).unwrap();
        assert_eq!(p as usize % (2 << 20), 0);
        // SAFETY: unmapping the mapping just made.
        unsafe { libc::munmap(p.cast(), 4 << 20) };
    }

    #[test]
    fn hugetlb_memfd_maps_or_reports_a_typed_error() {
        match Mapping::memfd(2 << 20, true) {
            Ok(m) => assert_eq!(m.view().base() as usize % (2 << 20), 0),
            Err(Error::Io { .. }) => {} // no huge pages configured on this host
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn open_missing_or_tiny_file_fails_cleanly() {
        assert!(matches!(Mapping::open_file(Path::new("/nonexistent/cxlkv")), Err(Error::Io { .. })));
        let p = std::env::temp_dir().join(format!("cxlkv-tiny-{}", std::process::id()));
        std::fs::write(&p, [0u8; 100]).unwrap();
        assert!(matches!(Mapping::open_file(&p), Err(Error::Core(cxlkv_core::Error::TooSmall))));
        std::fs::remove_file(&p).unwrap();
    }

    /// Resident bytes of the mapping starting at `addr`, from
    /// `/proc/self/smaps`.
    fn resident(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&format!("{addr:x}-")));
        assert!(lines.next().is_some(), "the mapping is listed");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn background_population_maps_every_page_and_changes_no_byte() {
        let m = Arc::new(Mapping::memfd(96 << 20, false).unwrap());
        let r = m.view();
        r.copy_in(5 << 20, b"kept").unwrap();
        let addr = m.ptr as usize;
        assert!(resident(addr) < 1 << 20, "a fresh mapping is lazy");
        assert_eq!(m.populated(), Populate::Lazy);
        m.populate_background().unwrap();
        m.populate_background().unwrap(); // a second call starts nothing
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while m.populated() != Populate::Done {
            assert!(std::time::Instant::now() < deadline, "population stalled at {:?}", m.populated());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(resident(addr), 96 << 20);
        let mut b = [0u8; 4];
        r.copy_out(5 << 20, &mut b).unwrap();
        assert_eq!(&b, b"kept");
    }

    #[test]
    fn dropping_the_mapping_stops_its_population() {
        let m = Arc::new(Mapping::memfd(256 << 20, false).unwrap());
        let weak = Arc::downgrade(&m);
        m.populate_background().unwrap();
        drop(m);
        // The thread lets go within one step; then the mapping is gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while weak.strong_count() > 0 {
            assert!(std::time::Instant::now() < deadline, "the populate thread kept the mapping");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
