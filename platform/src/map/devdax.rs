//! Device DAX (`/dev/daxX.Y`): CXL Type-3 memory exposed as a character
//! device. Its size and alignment come from sysfs; the mapping must start at
//! a multiple of the alignment (2 MiB or 1 GiB) or mmap fails.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::{map_aligned, open_fd, Mapping, Source};
use crate::error::{Error, Result};

/// Size and alignment of a device-DAX device, from sysfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DaxGeometry {
    /// Bytes.
    pub size: u64,
    /// Required mapping alignment in bytes.
    pub align: u64,
}

fn read_u64(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    s.strip_prefix("0x").map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
}

/// Reads a device's geometry from `/sys/dev/char/MAJ:MIN/{size,align}`.
pub fn geometry(fd: &OwnedFd) -> Result<DaxGeometry> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is open and `st` a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::io("fstat dax"));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return Err(Error::Unsupported("not a character device"));
    }
    let (maj, min) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
    let dir = std::path::PathBuf::from(format!("/sys/dev/char/{maj}:{min}"));
    let size = read_u64(&dir.join("size")).ok_or(Error::Unsupported("device DAX size not in sysfs"))?;
    let align = read_u64(&dir.join("align")).unwrap_or(2 << 20);
    geometry_checked(size, align)
}

/// Validates a geometry: power-of-two alignment, non-zero size.
pub fn geometry_checked(size: u64, align: u64) -> Result<DaxGeometry> {
    if size == 0 || !align.is_power_of_two() || align < 4096 {
        return Err(Error::Core(cxlkv_core::Error::InvalidArgument));
    }
    Ok(DaxGeometry { size: size / align * align, align })
}

/// Opens and maps a device-DAX device, aligned as sysfs requires.
pub fn open(path: &Path) -> Result<Mapping> {
    let fd = open_fd(path, libc::O_RDWR | libc::O_CLOEXEC, 0, "open device DAX")?;
    let g = geometry(&fd)?;
    let len = usize::try_from(g.size).map_err(|_| Error::Core(cxlkv_core::Error::TooLarge))?;
    let ptr = map_aligned(&fd, len, g.align as usize)?;
    Ok(Mapping::from_parts(ptr, len, fd, Source::DevDax(path.to_path_buf())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_rounds_size_down_to_alignment() {
        assert_eq!(geometry_checked((5 << 20) + 7, 2 << 20).unwrap(), DaxGeometry { size: 4 << 20, align: 2 << 20 });
        assert!(geometry_checked(0, 2 << 20).is_err());
        assert!(geometry_checked(1 << 30, 3 << 20).is_err());
    }

    #[test]
    fn opening_a_non_dax_path_fails_with_a_typed_error() {
        assert!(open(Path::new("/dev/dax-does-not-exist")).is_err());
        match open(Path::new("/dev/null")) {
            Err(Error::Unsupported(_)) | Err(Error::Io { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
