//! The names of the capsules the Python DLPack protocol passes around.

use std::ffi::CStr;

/// Capsule names of the Python DLPack protocol; consumers rename a capsule to the `used_` form
/// when they take ownership of its tensor.
pub static CAPSULE_LEGACY: &CStr = name(&NAMES.legacy);
pub static CAPSULE_VERSIONED: &CStr = name(&NAMES.versioned);
pub static CAPSULE_LEGACY_USED: &CStr = name(&NAMES.legacy_used);
pub static CAPSULE_VERSIONED_USED: &CStr = name(&NAMES.versioned_used);

/// The four names side by side at a page's start. CPython compares capsule names with
/// `strcmp` (an exchange compares these four times), and glibc's vectorised `strcmp` takes a
/// slower path, about twice the instructions, where either string lies within 128 bytes of a
/// page's end: at a page's start these never do, wherever the linker puts them.
#[repr(C, align(4096))]
struct Names {
    legacy: [u8; 9],
    versioned: [u8; 19],
    legacy_used: [u8; 14],
    versioned_used: [u8; 24],
}

static NAMES: Names = Names {
    legacy: *b"dltensor\0",
    versioned: *b"dltensor_versioned\0",
    legacy_used: *b"used_dltensor\0",
    versioned_used: *b"used_dltensor_versioned\0",
};

/// `bytes` (one C string, its NUL last) as a `CStr`; evaluated at compile time.
const fn name(bytes: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(bytes) {
        Ok(name) => name,
        Err(_) => panic!("a capsule name is one C string, its NUL last"),
    }
}

/// Capsule name of the DLPack C exchange API table (`__dlpack_c_exchange_api__`).
pub const CAPSULE_EXCHANGE_API: &CStr = c"dlpack_exchange_api";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_lie_in_a_pages_first_128_bytes() {
        for name in [
            CAPSULE_LEGACY,
            CAPSULE_VERSIONED,
            CAPSULE_LEGACY_USED,
            CAPSULE_VERSIONED_USED,
        ] {
            let at = name.as_ptr() as usize % 4096;
            assert!(
                at + name.to_bytes_with_nul().len() <= 128,
                "{name:?} at {at}"
            );
        }
        assert_eq!(CAPSULE_VERSIONED_USED, c"used_dltensor_versioned");
        assert_eq!(CAPSULE_LEGACY, c"dltensor");
    }
}
