//! What sharing asks of the system about itself: this machine's boot id, this process's id,
//! user and limit of open files, random bytes, the size of memory and of a page.

use std::sync::OnceLock;

use rustix::io::Errno;
use rustix::rand::{GetRandomFlags, getrandom};

use crate::error::{Error, Result};

/// This machine's identity in handles: the kernel's boot id, new at every boot and different on
/// every machine, so that a handle opened elsewhere is recognised as foreign (read once).
pub fn boot_id() -> Result<&'static str> {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    if let Some(id) = BOOT_ID.get() {
        return Ok(id);
    }
    let read = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map_err(|err| {
        let errno = Errno::from_io_error(&err).unwrap_or(Errno::IO);
        Error::os("read /proc/sys/kernel/random/boot_id")(errno)
    })?;
    Ok(BOOT_ID.get_or_init(|| read.trim().to_owned()))
}

/// This process's id (asked each time: a forked child has its own).
pub fn pid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// This process's effective user id: the one a Unix socket's peer credentials carry.
pub fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// This process's limit of open files (`RLIMIT_NOFILE`): soft and hard, `None` for none.
pub fn open_files_limit() -> (Option<u64>, Option<u64>) {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    (limit.current, limit.maximum)
}

/// `N` random bytes from the kernel.
pub fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match getrandom(&mut bytes[filled..], GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(errno) => return Err(Error::os("getrandom")(errno)),
        }
    }
    Ok(bytes)
}

/// Bytes of physical memory.
#[allow(
    clippy::useless_conversion,
    reason = "the kernel's counts are `unsigned long`: 32 bits on 32-bit targets"
)]
pub fn physical_memory() -> u64 {
    let info = rustix::system::sysinfo();
    u64::from(info.totalram).saturating_mul(u64::from(info.mem_unit.max(1)))
}

/// Bytes of a page.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id:?}");
        assert_eq!(boot_id().unwrap(), id);
        assert_eq!(pid() as u32, std::process::id());
        let _ = uid();
        let (soft, hard) = open_files_limit();
        assert!(
            soft.is_some_and(|soft| soft > 3) && soft <= hard.or(soft),
            "{soft:?} {hard:?}"
        );
        assert!(physical_memory() > 0);
        assert!(page_size().is_power_of_two());
    }

    #[test]
    fn random_bytes_differ() {
        let (a, b) = (random::<16>().unwrap(), random::<16>().unwrap());
        assert_ne!(a, b);
    }
}
